"""Rollups (1h, 1d) and stored queries agree with direct computations over the raw events."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.stored_queries import load_stored_queries, parse_query
from metrics_lake.core.speed.chunk_processing import split_log_rows
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.lake_schemas.log_records import LOG_ROW
from metrics_lake.spark.jobs.evaluate_queries import evaluate_queries_for_day
from metrics_lake.spark.jobs.recompute import recompute
from metrics_lake.spark.jobs.rollups import rollup
from tests.helpers import assert_quantile_within_bound
from tests.spark.test_stream_metrics import table_rows

pytestmark = pytest.mark.spark

DAY = dt.date(2027, 3, 2)
# 2 h 30 min of data across midnight: 22:30 on DAY-1 to 01:00 on DAY.
START_MS = int(dt.datetime(2027, 3, 1, 22, 30, tzinfo=dt.UTC).timestamp() * 1000)
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def land_in_bronze(store, events: pa.Table) -> None:
    """Write simulator events straight into bronze_events as one commit (positions in partition 0)."""
    n = events.num_rows
    rows = pa.table(
        {
            "topic": pa.array(["metrics"] * n),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            **{name: events.column(name) for name in events.column_names},
            "ingested_at": events.column("ts"),
        }
    ).cast(LOG_ROW)
    bronze, _ = split_log_rows(rows)
    files = write_data_files(store, "bronze_events", bronze)
    commit_files(store, "bronze_events", [f.add_action() for f in files], app_id="test-load", batch_id=0)


def raw_values(events: pa.Table, period_ms: int, per_server: bool = True) -> dict[tuple, list[float]]:
    """(metric, server or None, period start ms) -> sorted values: the direct computation."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    ts = pc.cast(events.column("ts"), pa.int64()).to_pylist()
    for t, row in zip(ts, events.select(["server", "metric", "value"]).to_pylist(), strict=True):
        groups[(row["metric"], row["server"] if per_server else None, t - t % period_ms)].append(row["value"])
    return {key: sorted(values) for key, values in groups.items()}


def check_rollup(rows: list[dict], expected: dict[tuple, list[float]]) -> None:
    actual = {(r["metric"], r["server"], int(r["window_start"].timestamp() * 1000)): r for r in rows}
    assert actual.keys() == expected.keys()
    for key, values in expected.items():
        row = actual[key]
        assert row["count"] == len(values)
        assert row["sum"] == pytest.approx(math.fsum(values), rel=1e-12)
        assert (row["min"], row["max"]) == (values[0], values[-1])
        assert row["avg"] == pytest.approx(math.fsum(values) / len(values), rel=1e-12)
        for column, q in QUANTILES.items():
            assert_quantile_within_bound(values, q, row[column])


@pytest.fixture
def fleet_day(spark, settings, store):
    """Bronze for 2.5 h across midnight (3 servers x 2 metrics x 1 Hz), recomputed and rolled up for both days."""
    sim = FleetSimulator(servers=3, metrics=2, seconds=9000, rate=1.0, seed=11, start_ms=START_MS)
    events = sim.generate()
    land_in_bronze(store, events)
    days = [DAY - dt.timedelta(days=1), DAY]
    recompute(spark, settings, days)
    rollup(spark, settings, days)
    return events


def test_rollups_agree_with_the_raw_events(spark, settings, store, fleet_day):
    check_rollup(table_rows(store, "metric_rollup_1h"), raw_values(fleet_day, 3_600_000))
    check_rollup(table_rows(store, "metric_rollup_1d"), raw_values(fleet_day, 86_400_000))

    def exact(rows):  # sketch merges are deterministic: every column repeats bit for bit (sum up to addition order)
        return sorted(
            (
                r["metric"],
                r["server"],
                r["window_start"],
                r["count"],
                r["min"],
                r["max"],
                r["p50"],
                r["p95"],
                r["p99"],
                r["sketch"],
            )
            for r in rows
        )

    before = exact(table_rows(store, "metric_rollup_1h"))
    rollup(spark, settings, [DAY])  # re-running a day replaces it with the same rows
    assert exact(table_rows(store, "metric_rollup_1h")) == before
    check_rollup(table_rows(store, "metric_rollup_1h"), raw_values(fleet_day, 3_600_000))


def test_stored_queries_hopping_and_fleet_wide(spark, settings, store, fleet_day):
    queries = [
        parse_query(
            "lat_hop", "FROM * SELECT app.rpc.latency_ms WINDOW 5m EVERY 1m COMPUTE percentile(99), count, avg"
        ),
        parse_query(
            "cpu_some", "from sim-0001,sim-000? select host.cpu.utilization window 1h compute min, max, sum per server"
        ),
        parse_query("cpu_two", "FROM sim-0000,sim-0002 SELECT host.cpu.utilization WINDOW 30m COMPUTE count, max"),
    ]
    result = evaluate_queries_for_day(spark, settings, queries, DAY)
    rows = table_rows(store, "query_results")
    assert {r["event_date"] for r in rows} == {DAY}
    by_query = defaultdict(dict)
    for r in rows:
        by_query[r["query"]][(r["server"], int(r["window_start"].timestamp() * 1000), r["aggregate"])] = r["value"]

    # Hopping 5m/1m, fleet-wide: every window whose last minute is on DAY and holds data.
    latency = fleet_day.filter(pc.equal(fleet_day.column("metric"), "app.rpc.latency_ms"))
    ts = pc.cast(latency.column("ts"), pa.int64()).to_numpy()
    values = latency.column("value").to_numpy()
    midnight = int(dt.datetime.combine(DAY, dt.time(), dt.UTC).timestamp() * 1000)
    data_end = START_MS + 9000 * 1000
    ends = range(midnight + 60_000, data_end + 300_000, 60_000)  # the last ones are partial: data stops at 01:00
    hop = by_query["lat_hop"]
    assert {k[1] for k in hop} == {end - 300_000 for end in ends}
    for end in ends:
        window = sorted(values[(ts >= end - 300_000) & (ts < end)].tolist())
        assert hop[(None, end - 300_000, "count")] == len(window)
        assert hop[(None, end - 300_000, "avg")] == pytest.approx(math.fsum(window) / len(window), rel=1e-12)
        assert_quantile_within_bound(window, 0.99, hop[(None, end - 300_000, "p99")])

    # Per server, with a glob: sim-0000..sim-0002 all match "sim-000?"; hours ending on DAY.
    cpu = fleet_day.filter(pc.equal(fleet_day.column("metric"), "host.cpu.utilization"))
    expected = {k: v for k, v in raw_values(cpu, 3_600_000).items() if k[2] + 3_600_000 > midnight}
    got = by_query["cpu_some"]
    assert {(s, start) for s, start, _ in got if s is not None} == {(k[1], k[2]) for k in expected}
    for start in {k[2] for k in expected}:  # and its fleet row: every matching server's values together
        fleet = sorted(v for k, window in expected.items() if k[2] == start for v in window)
        assert (got[(None, start, "min")], got[(None, start, "max")]) == (fleet[0], fleet[-1])
        assert got[(None, start, "sum")] == pytest.approx(math.fsum(fleet), rel=1e-12)
    for (_, server, start), window in expected.items():
        assert got[(server, start, "min")] == window[0]
        assert got[(server, start, "max")] == window[-1]
        assert got[(server, start, "sum")] == pytest.approx(math.fsum(window), rel=1e-12)

    # Fleet-wide over two named servers: 30-minute windows ending on DAY.
    two = cpu.filter(pc.is_in(cpu.column("server"), pa.array(["sim-0000", "sim-0002"])))
    expected = {k[2]: v for k, v in raw_values(two, 1_800_000, per_server=False).items() if k[2] + 1_800_000 > midnight}
    got = by_query["cpu_two"]
    assert {start for _, start, _ in got} == set(expected)
    for start, window in expected.items():
        assert (got[(None, start, "count")], got[(None, start, "max")]) == (len(window), window[-1])
    assert result.rows == len(rows)

    # The shipped declarations parse and run.
    shipped = evaluate_queries_for_day(spark, settings, load_stored_queries(), DAY)
    assert shipped.queries == len(load_stored_queries()) and shipped.rows > 0
