"""The fleet simulator: deterministic, sized as asked, realistic shapes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.lake_schemas.contract import METRIC_NAME
from metrics_lake.lake_schemas.log_records import LOG_RECORD


def series(table, metric: str, server: str) -> np.ndarray:
    mask = pc.and_(pc.equal(table.column("metric"), metric), pc.equal(table.column("server"), server))
    return table.filter(mask).column("value").to_numpy()


def test_same_seed_same_events_and_exact_size():
    sim = FleetSimulator(servers=7, metrics=10, seconds=30, rate=2.0, seed=5, start_ms=1_800_000_000_000)
    a, b = sim.generate(), sim.generate()
    assert a.equals(b)
    assert a.num_rows == sim.total_events == 7 * 10 * 60
    assert a.schema.equals(LOG_RECORD)
    assert a.column("reason").null_count == a.num_rows


def test_events_are_time_ordered_within_the_span():
    sim = FleetSimulator(servers=3, metrics=4, seconds=20, start_ms=1_800_000_000_000)
    ts = sim.generate().column("ts").cast("int64").to_numpy()
    assert np.all(np.diff(ts) >= 0)
    assert ts.min() >= 1_800_000_000_000 and ts.max() < 1_800_000_000_000 + 20_000


def test_shapes_are_realistic():
    table = FleetSimulator(servers=5, metrics=10, seconds=300, seed=9).generate()
    assert all(METRIC_NAME.fullmatch(m) for m in pc.unique(table.column("metric")).to_pylist())
    for server in ("sim-0000", "sim-0004"):
        cpu = series(table, "host.cpu.utilization", server)
        assert cpu.min() >= 0 and cpu.max() <= 100 and cpu.std() > 0
        latency = series(table, "app.rpc.latency_ms", server)
        assert latency.min() > 0 and np.mean(latency) > np.median(latency)  # right-skewed
        counter = series(table, "app.rpc.count", server)
        assert np.all(np.diff(counter) >= 0) and counter[-1] > counter[0]
        assert series(table, "app.queue.depth", server).min() >= 0


def test_more_metrics_than_the_catalog_get_valid_names():
    table = FleetSimulator(servers=1, metrics=13, seconds=1).generate()
    names = pc.unique(table.column("metric")).to_pylist()
    assert len(names) == 13 and all(METRIC_NAME.fullmatch(n) for n in names)


@pytest.mark.parametrize("bad", [dict(servers=0), dict(seconds=0), dict(rate=0)])
def test_invalid_sizes_are_rejected(bad):
    with pytest.raises(ValueError):
        FleetSimulator(**bad)


def test_second_batches_cover_every_event_once():
    sim = FleetSimulator(servers=4, metrics=3, seconds=10, seed=2)
    batches = list(sim.second_batches())
    assert sum(b.num_rows for _, b in batches) == sim.total_events
    assert [offset for offset, _ in batches] == sorted(offset for offset, _ in batches)


def test_a_silence_drops_one_servers_samples_inside_it_and_nothing_else():
    plain = FleetSimulator(servers=3, metrics=2, seconds=60, seed=5, start_ms=0).generate()
    quiet = FleetSimulator(servers=3, metrics=2, seconds=60, seed=5, start_ms=0, silence=(1, 20, 40)).generate()
    ms = plain.column("ts").cast(pa.int64()).to_numpy()
    dropped = (np.array(plain.column("server").to_pylist()) == "sim-0001") & (ms >= 20_000) & (ms < 40_000)
    assert 0 < dropped.sum() < plain.num_rows and quiet.num_rows == plain.num_rows - dropped.sum()
    assert quiet.equals(plain.filter(pa.array(~dropped)))
