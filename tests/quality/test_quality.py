"""Great Expectations suites: each expectation fails on a crafted bad partition and passes on good data."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from agents.simulator import FleetSimulator
from lake.tables import commit_files, open_table, write_data_files
from lake_schemas import METRIC_WINDOWS_1M
from quality.checkpoint import run_quality
from spark.jobs.recompute import recompute
from tests.dags.test_dag_runs import land_rows

pytestmark = pytest.mark.spark
DAY = dt.date(2027, 1, 15)
START_MS = int(dt.datetime(2027, 1, 15, 10, tzinfo=dt.UTC).timestamp() * 1000)
NOW = dt.datetime(2027, 1, 16, 1, tzinfo=dt.UTC)


def land(store, table: str, rows: pa.Table, batch: int = 0) -> None:
    files = write_data_files(store, table, rows)
    commit_files(store, table, [f.add_action() for f in files], app_id=f"load-{table}", batch_id=batch)


def good_bronze() -> pa.Table:
    events = FleetSimulator(servers=3, metrics=4, seconds=300, seed=2, start_ms=START_MS).generate()
    return land_rows(events, 0)


def failed(report, table: str) -> dict[tuple[str, str | None], object]:
    return {(o.expectation, o.column): o for o in report.outcomes if o.table == table and not o.success}


def test_good_day_passes_and_publishes_docs_and_trend(spark, settings, store):
    land(store, "bronze_events", good_bronze())
    recompute(spark, settings, [DAY])
    report = run_quality(spark, settings, DAY, ["bronze_events", "metric_windows_1m"], now=NOW)
    assert report.rows == {"bronze_events": 3 * 4 * 300, "metric_windows_1m": 3 * 4 * 5}
    assert report.critical_failures() == []
    assert failed(report, "bronze_events") == {} and failed(report, "metric_windows_1m") == {}

    results = open_table(store, "dq_results").to_pyarrow_table().to_pylist()
    assert len(results) == len(report.outcomes) and {r["run_id"] for r in results} == {report.run_id}
    counts = {
        r["table"]: r["observed_value"] for r in results if r["expectation"] == "expect_table_row_count_to_be_between"
    }
    assert counts == {"bronze_events": "3600", "metric_windows_1m": "60"}

    index = report.docs_index.read_text()
    assert report.docs_index.is_relative_to(settings.quality_path)
    assert "bronze_events" in index and "metric_windows_1m" in index
    assert (settings.quality_path / "trend.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "every expectation passed" in (settings.quality_path / "trend.html").read_text()


def bad_windows() -> pa.Table:
    start = dt.datetime(2027, 1, 15, 10, tzinfo=dt.UTC)
    base = {
        "metric": "app.rpc.latency_ms",
        "window_end": start + dt.timedelta(minutes=1),
        "count": 5,
        "sum": 50.0,
        "min": 1.0,
        "max": 20.0,
        "avg": 10.0,
        "p50": 8.0,
        "p95": 15.0,
        "p99": 19.0,
        "event_date": DAY,
    }
    rows = [
        {**base, "server": "ok", "window_start": start},
        {**base, "server": "zero-count", "window_start": start, "count": 0},
        {**base, "server": "avg-above-max", "window_start": start, "avg": 30.0},
        {**base, "server": "p50-above-p95", "window_start": start, "p50": 16.0},
        {**base, "server": "two-minutes", "window_start": start, "window_end": start + dt.timedelta(minutes=2)},
        {**base, "server": "ok", "window_start": start},  # duplicate key
        {**base, "server": "hot", "window_start": start, "metric": "host.cpu.utilization", "max": 150.0, "p99": 140.0},
        {**base, "server": "negative", "window_start": start, "min": -3.0},
    ]
    return pa.Table.from_pylist(rows, schema=METRIC_WINDOWS_1M)


def test_each_expectation_fails_on_a_crafted_bad_partition(spark, settings, store):
    bronze = good_bronze().slice(0, 100)
    values = bronze.column("value").to_pylist()
    values[1] = float("nan")
    servers = bronze.column("server").to_pylist()
    servers[2] = None
    metrics = bronze.column("metric").to_pylist()
    metrics[3] = "Bad-Metric"
    ts = bronze.column("ts").to_pylist()
    ts[4] = dt.datetime(2027, 1, 15, 23, 59, tzinfo=dt.UTC) + dt.timedelta(days=30)  # far in the future
    bad = (
        bronze.set_column(bronze.schema.get_field_index("value"), "value", pa.array(values))
        .set_column(bronze.schema.get_field_index("server"), "server", pa.array(servers))
        .set_column(bronze.schema.get_field_index("metric"), "metric", pa.array(metrics))
        .set_column(bronze.schema.get_field_index("ts"), "ts", pa.array(ts, bronze.schema.field("ts").type))
    )
    bad = pa.concat_tables([bad, bad.slice(10, 1)])  # a duplicated (topic, partition, offset)
    land(store, "bronze_events", bad)
    land(store, "metric_windows_1m", bad_windows())

    report = run_quality(spark, settings, DAY, ["bronze_events", "metric_windows_1m"], now=NOW)
    bronze_failed = failed(report, "bronze_events")
    assert set(bronze_failed) == {
        ("expect_column_values_to_be_in_set", "value_is_finite"),
        ("expect_column_values_to_not_be_null", "server"),
        ("expect_column_values_to_match_regex", "metric"),
        ("expect_column_values_to_be_between", "ts_epoch_s"),
        ("expect_compound_columns_to_be_unique", "topic, partition, offset"),
    }
    assert {key: o.unexpected_count for key, o in bronze_failed.items()} == dict.fromkeys(bronze_failed, 1) | {
        ("expect_compound_columns_to_be_unique", "topic, partition, offset"): 2  # both copies
    }
    assert "Bad-Metric" in bronze_failed[("expect_column_values_to_match_regex", "metric")].sample
    windows_failed = failed(report, "metric_windows_1m")
    assert set(windows_failed) == {
        ("expect_column_values_to_be_between", "count"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "max >= avg"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "p95 >= p50"),
        ("expect_column_values_to_be_in_set", "window_seconds"),
        ("expect_compound_columns_to_be_unique", "metric, server, window_start"),
        ("expect_column_values_to_be_between", "max"),  # utilization 150 %
        ("expect_column_values_to_be_between", "min"),  # a negative latency
    }
    assert windows_failed[("expect_column_values_to_be_in_set", "window_seconds")].sample == "[120]"
    assert {o.table for o in report.critical_failures()} == {"bronze_events", "metric_windows_1m"}

    # The failures are data: observed values and thresholds in dq_results.
    rows = open_table(store, "dq_results").to_pyarrow_table(filters=[("success", "=", False)]).to_pylist()
    by_key = {(r["table"], r["expectation"], r["column"]): r for r in rows}
    count_row = by_key[("metric_windows_1m", "expect_column_values_to_be_between", "count")]
    assert (count_row["unexpected_count"], json.loads(count_row["threshold"])) == (1, {"min_value": 1})
    assert count_row["critical"] and count_row["sample"] == "[0]"


def test_volume_and_reconciliation_and_bounded_history(spark, settings, store):
    settings = settings.model_copy(update={"quality_keep_runs": 2})
    for back in range(1, 4):  # three earlier days of 60 windows each
        day = DAY - dt.timedelta(days=back)
        rows = bad_windows().slice(0, 1).to_pylist()[0]
        start = dt.datetime.combine(day, dt.time(10), dt.UTC)
        table = pa.Table.from_pylist(
            [
                {
                    **rows,
                    "server": f"s{i}",
                    "window_start": start,
                    "window_end": start + dt.timedelta(minutes=1),
                    "event_date": day,
                }
                for i in range(60)
            ],
            schema=METRIC_WINDOWS_1M,
        )
        land(store, "metric_windows_1m", table, batch=back)
    land(store, "metric_windows_1m", bad_windows().slice(0, 1), batch=9)  # 1 row on DAY: far below the band
    for _ in range(3):
        report = run_quality(spark, settings, DAY, ["metric_windows_1m"], now=NOW)
    volume = [o for o in report.outcomes if o.expectation == "expect_table_row_count_to_be_between" and not o.success]
    assert (
        len(volume) == 1
        and volume[0].observed_value == "1"
        and json.loads(volume[0].threshold) == {"min_value": 30, "max_value": 91}
    )
    assert report.critical_failures() == []  # volume is a warning
    stored = list((settings.quality_path / "gx" / "uncommitted" / "validations").rglob("*.json"))
    assert len(stored) == 2  # keep_runs bounds what data docs render
    pages = list(
        (settings.quality_path / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations").rglob("*.html")
    )
    assert len(pages) == 2
    assert pc.sum(open_table(store, "dq_results").to_pyarrow_table().column("success").cast(pa.int64())).as_py() > 0


def test_cli_prints_a_summary_and_exits_1_on_a_critical_failure(spark, settings, store, monkeypatch):
    from typer.testing import CliRunner

    from lake.cli import app

    land(store, "metric_windows_1m", bad_windows())
    monkeypatch.setenv("LAKE_ROOT", settings.root)
    monkeypatch.setenv("LAKE_CHECKPOINT_DIR", settings.checkpoint_dir)
    result = CliRunner().invoke(app, ["quality", "--table", "metric_windows_1m", "--date", DAY.isoformat()])
    assert result.exit_code == 1, result.output
    assert "metric_windows_1m" in result.output and "CRITICAL" in result.output
    assert "critical expectations failed" in result.output and "dq_results WHERE run_id" in result.output
    unknown = CliRunner().invoke(app, ["quality", "--table", "bronze", "--date", DAY.isoformat()])
    assert unknown.exit_code == 2 and "no quality suite for table 'bronze'" in unknown.output
