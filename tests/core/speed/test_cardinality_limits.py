"""Cardinality limits in the speed layer: exactly the over-limit events go to quarantine, in any split of batches,
after a crash between table commits, with lost limit states, and with the limits changed within an hour."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.core.kernels.cardinality import CardinalityLimits, limit_hours
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.speed import cardinality_gate
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.replay import ReplayRange, replay
from metrics_lake.core.speed.table_commits import log_files as log_files_commit
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.log_records import LOG_RECORD
from metrics_lake.lake_schemas.tables import Table
from tests.core.kernels.test_cardinality import naive
from tests.core.speed.test_micro_batch import START_MS, TOPIC, batch, produce
from tests.helpers import expected_windows

PARTITIONS = 2
LIMITS = CardinalityLimits.local(series_per_metric=12, values_per_label=20, labels_per_event=4, partitions=PARTITIONS)


def events() -> pa.Table:
    """A small fleet, plus: one agent sending a fresh request id per event (a cardinality bomb), one sending five
    tags, and a metric reported by forty servers."""
    fleet = FleetSimulator(servers=6, metrics=2, seconds=40, rate=1.0, seed=11, start_ms=START_MS).generate()
    extra = []
    for i in range(300):
        extra.append(("bomb-1", "app.requests", {"request_id": f"r{i}", "region": "eu"}))
    for _ in range(10):
        extra.append(("wide-1", "app.requests", {f"t{k}": "x" for k in range(5)}))
    for i in range(40):
        extra.append((f"spread-{i}", "app.spread", {"region": "us"}))
    rows = pa.table(
        {
            "ts": pa.array([START_MS + 1000 * i for i in range(len(extra))], pa.int64()).cast(
                pa.timestamp("ms", "UTC")
            ),
            "server": [server for server, _, _ in extra],
            "metric": [metric for _, metric, _ in extra],
            "value": pa.array(np.arange(len(extra), dtype=np.float64)),
            "tags": pa.array([list(tags.items()) for _, _, tags in extra], LOG_RECORD.field("tags").type),
            "raw": pa.nulls(len(extra), pa.string()),
            "reason": pa.nulls(len(extra), pa.string()),
        }
    )
    return pa.concat_tables([fleet.cast(LOG_RECORD), rows.cast(LOG_RECORD)])


def expected_refused(log, limits: CardinalityLimits, topic: str = TOPIC) -> set[tuple[int, int]]:
    """(partition, offset) of every valid record the record-by-record rule refuses, per partition and hour."""
    rows = pa.concat_tables(read_range(log, topic, p, 0, end) for p, end in end_offsets(log, topic).items())
    valid = rows.filter(pc.is_null(rows.column("reason")))
    hours = limit_hours(valid.column("ingested_at"))
    refused = set()
    for partition in range(log.partitions(topic)):
        for hour in np.unique(hours):
            part = valid.filter(pa.array((valid.column("partition").to_numpy() == partition) & (hours == hour)))
            part = part.sort_by("offset")
            records = [
                {"metric": r["metric"], "server": r["server"], "tags": dict(r["tags"]) if r["tags"] else None}
                for r in part.select(["metric", "server", "tags"]).to_pylist()
            ]
            verdicts = naive(records, limits, {}, {})
            offsets = part.column("offset").to_pylist()
            refused |= {(partition, o) for o, v in zip(offsets, verdicts, strict=True) if v is not None}
    return refused


def positions(table: pa.Table) -> list[tuple[int, int]]:
    return list(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))


def assert_limited_exactly(store, log, limits: CardinalityLimits = LIMITS, topic: str = TOPIC) -> None:
    """Bronze holds every valid record a limit admits, once; quarantine every one it refuses, once, with its
    reason and the event as JSON."""
    rows = pa.concat_tables(read_range(log, topic, p, 0, end) for p, end in end_offsets(log, topic).items())
    valid = set(positions(rows.filter(pc.is_null(rows.column("reason")))))
    refused = expected_refused(log, limits, topic)
    assert refused, "the test data must go over the limits"
    bronze = positions(open_table(store, Table.BRONZE_EVENTS).to_pyarrow_table())
    assert len(bronze) == len(set(bronze))
    assert sorted(bronze) == sorted(valid - refused)
    quarantine = open_table(store, Table.QUARANTINE_EVENTS).to_pyarrow_table()
    limited = quarantine.filter(pc.starts_with(quarantine.column("reason"), "cardinality_limit: "))
    assert sorted(positions(limited)) == sorted(refused)
    assert len(positions(quarantine)) == len(set(positions(quarantine)))
    by_position = {(r["partition"], r["offset"]): r for r in rows.to_pylist()}
    for row in limited.to_pylist():
        event = json.loads(row["raw"])
        original = by_position[(row["partition"], row["offset"])]
        assert (event["server"], event["metric"], event["value"]) == (
            original["server"],
            original["metric"],
            original["value"],
        )
        assert event["tags"] == dict(original["tags"] or [])


def forget_states(store) -> None:
    """Lose every limit state: the objects and this process's memory of them."""
    shutil.rmtree(store.path(f"{keys.consumer_group_prefix(CONSUMER)}/{TOPIC}.limits"), ignore_errors=True)
    cardinality_gate._CACHE.clear()


@pytest.fixture(autouse=True)
def fresh_cache():
    cardinality_gate._CACHE.clear()
    yield
    cardinality_gate._CACHE.clear()


def test_limits_quarantine_exactly_the_over_limit_events_in_any_split(store, log):
    produce(log, events(), partitions=PARTITIONS)
    ends = end_offsets(log, TOPIC)
    outcomes = []
    for fraction in (0.2, 0.5, 0.7, 1.0):
        step = {p: int(end * fraction) for p, end in ends.items()}
        outcomes.append(batch(store, step, chunk_records=37, limits=LIMITS))
    assert_limited_exactly(store, log)
    limited = {}
    for outcome in outcomes:
        for name, count in outcome.limited.items():
            limited[name] = limited.get(name, 0) + count
    assert sum(limited.values()) == len(expected_refused(log, LIMITS))
    assert set(limited) == {"labels_per_event", "series_per_metric", "values_per_label"}
    windows = open_table(store, Table.METRIC_WINDOWS_1M).to_pyarrow_table()
    spread = windows.filter(pc.equal(windows.column("metric"), "app.spread"))
    assert len(set(spread.column("server").to_pylist())) <= LIMITS.series_per_metric * PARTITIONS
    # The windows hold exactly the admitted events (grouped by the series codes the limits computed).
    got = {(w["metric"], w["server"], int(w["window_start"].timestamp() * 1000)): w for w in windows.to_pylist()}
    want = expected_windows(open_table(store, Table.BRONZE_EVENTS).to_pyarrow_table())
    assert got.keys() == want.keys()
    assert all(
        (got[k]["count"], got[k]["min"], got[k]["max"]) == (w["count"], w["min"], w["max"]) for k, w in want.items()
    )


def test_a_crash_between_bronze_and_quarantine_and_lost_states_refuse_the_same_events(store, log, monkeypatch):
    produce(log, events(), partitions=PARTITIONS)
    ends = end_offsets(log, TOPIC)
    batch(store, {p: end // 3 for p, end in ends.items()}, chunk_records=50, limits=LIMITS)
    real = log_files_commit.commit_changes

    def crash(table, name, *args, **kwargs):
        if name == Table.QUARANTINE_EVENTS:
            raise RuntimeError("killed after bronze committed")
        return real(table, name, *args, **kwargs)

    monkeypatch.setattr(log_files_commit, "commit_changes", crash)
    with pytest.raises(RuntimeError, match="killed"):
        batch(store, {p: 2 * end // 3 for p, end in ends.items()}, chunk_records=50, limits=LIMITS)
    monkeypatch.setattr(log_files_commit, "commit_changes", real)
    forget_states(store)  # and the process restarts without its memory or the state objects
    batch(store, ends, chunk_records=64, limits=LIMITS)
    assert_limited_exactly(store, log)


def test_an_hour_keeps_the_limits_it_started_with_and_a_replay_refuses_the_same(store, log):
    produce(log, events(), partitions=PARTITIONS)
    ends = end_offsets(log, TOPIC)
    batch(store, {p: end // 2 for p, end in ends.items()}, limits=LIMITS)
    looser = CardinalityLimits.local(series_per_metric=1000, values_per_label=1000, labels_per_event=10, partitions=2)
    batch(store, ends, limits=looser)  # the same hour: still judged by LIMITS
    assert_limited_exactly(store, log)
    # A replay of the whole log into a new table admits exactly what bronze holds: with the states the speed
    # layer kept (the hour's own limits win over those given), and with them lost (rebuilt from the log).
    bronze = sorted(positions(open_table(store, Table.BRONZE_EVENTS).to_pyarrow_table()))
    ranges = [ReplayRange(p, 0, end) for p, end in ends.items()]
    replay(log, TOPIC, ranges, into="bronze_again", limits=looser)
    assert sorted(positions(open_table(store, "bronze_again").to_pyarrow_table())) == bronze
    forget_states(store)
    replay(log, TOPIC, ranges, into="bronze_rebuilt", limits=LIMITS)
    assert sorted(positions(open_table(store, "bronze_rebuilt").to_pyarrow_table())) == bronze


def test_a_chunk_that_spans_two_limit_hours_is_judged_per_hour(store, log, monkeypatch):
    """The same events appended either side of an hour's end: each hour starts its limits afresh, also within one
    chunk (the gate's path for several hours at once)."""
    from metrics_lake.core.log import log as log_module

    hour_ms = 3_600_000
    clock = {"ms": (int(time.time() * 1000) // hour_ms) * hour_ms - 1_000}  # a second before an hour ends

    class AppendClock:
        """``time`` for the log module, its ``time()`` set by the test (leases keep the real monotonic clock)."""

        def __getattr__(self, name):
            return getattr(time, name)

        def time(self):
            return clock["ms"] / 1000

    with monkeypatch.context() as patch:  # the append clock only: other fixtures' patches stay
        patch.setattr(log_module, "time", AppendClock())
        produce(log, events(), partitions=PARTITIONS)
        clock["ms"] += 2_000  # the next hour
        produce(log, events(), partitions=PARTITIONS)
    rows = pa.concat_tables(read_range(log, TOPIC, p, 0, end) for p, end in end_offsets(log, TOPIC).items())
    assert len(np.unique(limit_hours(rows.column("ingested_at")))) == 2
    batch(store, chunk_records=1_000_000, limits=LIMITS)  # one chunk per partition: both hours in it
    assert_limited_exactly(store, log)
