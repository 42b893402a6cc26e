"""``dag.test()`` runs of the nightly, compaction, retention and backfill DAGs against a temporary lake."""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table
from tests.core.maintenance.test_retention import AGES, NOW, kept_ages, land_days
from tests.dags.conftest import returned, task_states
from tests.spark.test_rollups import DAY, START_MS, land_in_bronze, raw_values
from tests.spark.test_stream_metrics import table_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]
SUCCESS = "success"


def window_totals(store, table: str) -> dict[tuple, tuple[int, float, float, float]]:
    rows = table_rows(store, table)
    return {
        (r["metric"], r["server"], int(r["window_start"].timestamp() * 1000)): (
            r["count"],
            r["sum"],
            r["min"],
            r["max"],
        )
        for r in rows
    }


def expected_totals(events: pa.Table, period_ms: int, day: dt.date) -> dict[tuple, tuple[int, float, float, float]]:
    midnight = int(dt.datetime.combine(day, dt.time(), dt.UTC).timestamp() * 1000)
    return {
        key: (len(v), math.fsum(v), v[0], v[-1])
        for key, v in raw_values(events, period_ms).items()
        if midnight <= key[2] < midnight + 86_400_000
    }


def assert_totals_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, (count, total, lo, hi) in expected.items():
        assert actual[key][0] == count and (actual[key][2], actual[key][3]) == (lo, hi)
        assert actual[key][1] == pytest.approx(total, rel=1e-12)


@pytest.mark.slow
def test_nightly_recomputes_rolls_up_and_evaluates_yesterday(dagbag, lake_env, store, spark):
    events = FleetSimulator(servers=3, metrics=2, seconds=9000, rate=1.0, seed=11, start_ms=START_MS).generate()
    land_in_bronze(store, events)
    run = dagbag.get_dag("lake_nightly").test(
        logical_date=dt.datetime.combine(DAY + dt.timedelta(days=1), dt.time(0, 30), dt.UTC)
    )
    steps = ["target_day", "recompute", "quality_gate", "rollups", "rollup_quality_gate", "stored_queries"]
    assert task_states(run) == dict.fromkeys([*steps, "alert_rules"], SUCCESS)
    (alerts,) = returned(run, "alert_rules")  # the shipped latency rule: no fleet p99 over 250 ms in this data
    assert (alerts["day"], alerts["episodes"], alerts["rows"], alerts["skipped"]) == (DAY.isoformat(), 0, 0, False)
    assert returned(run, "quality_gate")["tables"]["metric_windows_1m"] == {"rows": 360, "passed": 13, "failed": 0}
    assert returned(run, "target_day") == DAY.isoformat()

    on_day = events.filter(pc.greater_equal(pc.cast(events.column("ts"), pa.int64()), START_MS + 5_400_000))
    assert_totals_equal(window_totals(store, "metric_windows_1m"), expected_totals(on_day, 60_000, DAY))
    assert_totals_equal(window_totals(store, "metric_rollup_1h"), expected_totals(on_day, 3_600_000, DAY))
    assert_totals_equal(window_totals(store, "metric_rollup_1d"), expected_totals(on_day, 86_400_000, DAY))
    (recomputed,) = returned(run, "recompute")
    assert (recomputed["day"], recomputed["events"], recomputed["windows"]) == (DAY.isoformat(), on_day.num_rows, 360)

    # The fleet's hourly CPU max over 00:00-01:00 on DAY, from the shipped stored query.
    results = [r for r in table_rows(store, "query_results") if r["query"] == "fleet_cpu_hourly"]
    cpu = on_day.filter(pc.equal(on_day.column("metric"), "host.cpu.utilization"))
    (hour_max,) = [r["value"] for r in results if r["aggregate"] == "max"]
    assert hour_max == pc.max(cpu.column("value")).as_py()
    assert {r["event_date"] for r in table_rows(store, "query_results")} == {DAY}


@pytest.mark.slow
def test_a_failed_critical_expectation_stops_the_nightly_before_rollups(dagbag, lake_env, store, spark):
    events = FleetSimulator(servers=2, metrics=2, seconds=600, seed=4, start_ms=START_MS + 5_400_000).generate()
    values = events.column("value").to_pylist()
    values[7] = float("nan")  # cannot pass the contract, but a bug or a bad backfill could write it to bronze
    land_in_bronze(store, events.set_column(events.schema.get_field_index("value"), "value", pa.array(values)))
    run = dagbag.get_dag("lake_nightly").test(
        logical_date=dt.datetime.combine(DAY + dt.timedelta(days=1), dt.time(0, 30), dt.UTC)
    )
    states = task_states(run)
    assert (states["recompute"], states["quality_gate"]) == (SUCCESS, "failed")
    assert {states[t] for t in ("rollups", "rollup_quality_gate", "stored_queries", "alert_rules")} == {
        "upstream_failed"
    }
    assert (
        open_table(store, "metric_rollup_1h").to_pyarrow_table().num_rows == 0
        if store.exists("tables/metric_rollup_1h/_delta_log")
        else True
    )
    failures = open_table(store, "dq_results").to_pyarrow_table(filters=[("success", "=", False)]).to_pylist()
    finite = [r for r in failures if r["column"] == "value_is_finite"]
    assert len(finite) == 1 and finite[0]["critical"] and finite[0]["unexpected_count"] == 1


def test_compaction_merges_segments_and_files_without_changing_data(dagbag, lake_env, store, log):
    log.ensure_topic("metrics", 2)
    for seed in range(6):  # six producer sessions: six small segments per partition
        sim = FleetSimulator(servers=16, metrics=2, seconds=30, seed=seed, start_ms=START_MS + seed * 30_000)
        with Producer(log, "metrics", partitions=2) as producer:
            producer.send(sim.generate())
    before_log = {p: read_range(log, "metrics", p, 0, log.index("metrics", p).next_offset) for p in (0, 1)}
    events = FleetSimulator(servers=3, metrics=2, seconds=600, seed=3, start_ms=START_MS).generate()
    for batch in range(5):
        files = write_data_files(store, "bronze_events", land_rows(events, batch))
        commit_files(store, "bronze_events", [f.add_action() for f in files], app_id="load", batch_id=batch)
    before_bronze = sorted_bronze(store)

    run = dagbag.get_dag("lake_compaction").test()
    assert task_states(run) == {"compact_log": SUCCESS, "compact_tables": SUCCESS}
    log_results = returned(run, "compact_log")
    assert [(r["partition"], r["segments_before"], r["segments_after"]) for r in log_results] == [(0, 6, 1), (1, 6, 1)]
    for p in (0, 1):
        assert read_range(log, "metrics", p, 0, log.index("metrics", p).next_offset).equals(before_log[p])
    (bronze,) = [r for r in returned(run, "compact_tables") if r["table"] == "bronze_events"]
    days = len({r["event_date"] for r in before_bronze.to_pylist()})
    assert (bronze["files_before"], bronze["files_after"]) == (5 * days, days)
    assert sorted_bronze(store).equals(before_bronze)
    assert open_table(store, "bronze_events").to_pyarrow_table(filters=[("server", "=", "sim-0001")]).num_rows == (
        5 * 600 * 2
    )


def land_rows(events: pa.Table, batch: int) -> pa.Table:
    """Bronze rows of ``events`` at offsets of batch ``batch`` (distinct positions per batch)."""
    from metrics_lake.core.speed.chunk_processing import split_log_rows
    from metrics_lake.lake_schemas.log_records import LOG_ROW

    n = events.num_rows
    rows = pa.table(
        {
            "topic": ["metrics"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(batch * n, (batch + 1) * n), pa.int64()),
            **{name: events.column(name) for name in events.column_names},
            "ingested_at": events.column("ts"),
        }
    ).cast(LOG_ROW)
    return split_log_rows(rows)[0]


def sorted_bronze(store) -> pa.Table:
    return (
        open_table(store, "bronze_events")
        .to_pyarrow_table()
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
    )


def test_retention_keeps_exactly_each_horizon(dagbag, lake_env, store):
    for table in ("bronze_events", "metric_windows_1m", "metric_rollup_1h", "metric_rollup_1d"):
        land_days(store, table, AGES)
    run = dagbag.get_dag("lake_retention").test(logical_date=NOW)
    assert task_states(run) == {"retain": SUCCESS}
    summary = returned(run, "retain")
    assert summary["applied"] is True
    assert summary["tables"]["bronze_events"] == {"cutoff": "2026-11-14", "files": 8, "rows": 16}
    assert kept_ages(store, "bronze_events") == [0, 1, 6, 7]
    assert kept_ages(store, "metric_windows_1m") == [0, 1, 6, 7, 8, 29, 30]
    assert kept_ages(store, "metric_rollup_1h") == [0, 1, 6, 7, 8, 29, 30, 31, 364, 365]
    assert kept_ages(store, "metric_rollup_1d") == AGES

    dry = dagbag.get_dag("lake_retention").test(logical_date=NOW + dt.timedelta(days=1), run_conf={"dry_run": True})
    assert returned(dry, "retain")["tables"]["bronze_events"]["files"] == 1  # age 7 became 8, but nothing is deleted
    assert kept_ages(store, "bronze_events") == [0, 1, 6, 7]


def test_backfill_replays_and_rebuilds_a_date_range_idempotently(dagbag, lake_env, store, log, settings):
    events = FleetSimulator(servers=2, metrics=2, seconds=9000, rate=0.5, seed=5, start_ms=START_MS).generate()
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(events)
    first, last = DAY - dt.timedelta(days=1), DAY
    conf = {"from_date": first.isoformat(), "to_date": last.isoformat(), "steps": ["replay", "recompute", "rollups"]}
    run = dagbag.get_dag("lake_backfill").test(run_conf=conf)
    assert task_states(run) == {
        "check_range": SUCCESS,
        "replay": SUCCESS,
        "recompute": SUCCESS,
        "rollups": SUCCESS,
        "queries": "skipped",
    }
    assert returned(run, "replay")["written"] == {"bronze_events": events.num_rows, "quarantine_events": 0}
    assert table_rows_count(store, "bronze_events") == events.num_rows
    expected = {**expected_totals(events, 60_000, first), **expected_totals(events, 60_000, last)}
    assert_totals_equal(window_totals(store, "metric_windows_1m"), expected)
    hourly = {**expected_totals(events, 3_600_000, first), **expected_totals(events, 3_600_000, last)}
    assert_totals_equal(window_totals(store, "metric_rollup_1h"), hourly)

    versions = {t: open_table(store, t).version() for t in ("bronze_events", "metric_windows_1m")}
    again = dagbag.get_dag("lake_backfill").test(run_conf={**conf, "steps": ["replay", "recompute"]})
    assert returned(again, "replay")["already_present"] == events.num_rows
    assert {t: open_table(store, t).version() for t in versions} == versions  # nothing new to commit
    assert table_rows_count(store, "bronze_events") == events.num_rows


def table_rows_count(store, table: str) -> int:
    return open_table(store, table).to_pyarrow_table(columns=["offset"]).num_rows


def test_backfill_rejects_a_reversed_range(dagbag, lake_env):
    run = dagbag.get_dag("lake_backfill").test(run_conf={"from_date": "2026-11-02", "to_date": "2026-11-01"})
    states = task_states(run)
    assert states["check_range"] == "failed"  # at once: AirflowFailException is not retried
    assert {states[t] for t in ("replay", "recompute", "rollups", "queries")} == {"upstream_failed"}


@pytest.fixture
def log(store) -> SegmentLog:
    return SegmentLog(store)
