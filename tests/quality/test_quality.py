"""Great Expectations suites: each expectation fails on a crafted bad partition and passes on good data."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M
from metrics_lake.quality.checkpoint import gx_context, outcome, run_quality, validate
from metrics_lake.quality.suites import build_suite, prepare
from metrics_lake.spark.jobs.recompute import recompute
from metrics_lake.spark.jobs.rollups import rollup
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


@pytest.mark.slow
def test_good_day_passes_and_publishes_docs_and_trend(spark, settings, store):
    land(store, "bronze_events", good_bronze())
    recompute(spark, settings, [DAY])
    rollup(spark, settings, [DAY])
    report = run_quality(spark, settings, DAY, now=NOW)
    assert report.rows == {
        "bronze_events": 3 * 4 * 300,
        "metric_windows_1m": 3 * 4 * 5,
        "metric_rollup_1h": 3 * 4,
        "metric_rollup_1d": 3 * 4,
        "lambda_reconciliation": 4,
    }
    assert report.critical_failures() == []
    for table in ("bronze_events", "metric_windows_1m", "metric_rollup_1h", "metric_rollup_1d"):
        assert failed(report, table) == {}
    # No speed layer ran, so reconciliation warns that speed and batch differ by 100 %.
    (recon,) = failed(report, "lambda_reconciliation").values()
    assert (recon.column, recon.critical, recon.unexpected_count) == ("count_diff_ratio", False, 4)

    results = open_table(store, "dq_results").to_pyarrow_table().to_pylist()
    assert len(results) == len(report.outcomes) and {r["run_id"] for r in results} == {report.run_id}
    counts = {
        r["table"]: r["observed_value"] for r in results if r["expectation"] == "expect_table_row_count_to_be_between"
    }
    assert counts == {table: str(rows) for table, rows in report.rows.items()}

    index = report.docs_index.read_text()
    assert report.docs_index.is_relative_to(settings.quality_path)
    assert all(table in index for table in report.rows)  # every suite has its page
    assert (settings.quality_path / "trend.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "count_diff_ratio" in (settings.quality_path / "trend.html").read_text()  # the latest failures


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
        {**base, "server": "avg-below-min", "window_start": start, "min": 11.0, "p50": 11.0},
        {**base, "server": "p50-below-min", "window_start": start, "p50": 0.5},
        {**base, "server": "p99-below-p95", "window_start": start, "p99": 14.0},
        {**base, "server": "p99-above-max", "window_start": start, "p99": 21.0},
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
    for row, column in enumerate(("topic", "partition", "offset", "ts", "metric", "value"), start=20):
        values_ = bad.column(column).to_pylist()
        values_[row] = None
        index = bad.schema.get_field_index(column)
        bad = bad.set_column(index, column, pa.array(values_, bad.schema.field(column).type))
    bad = pa.concat_tables([bad, bad.slice(10, 1)])  # a duplicated (topic, partition, offset)
    land(store, "bronze_events", bad)
    land(store, "metric_windows_1m", bad_windows())

    report = run_quality(spark, settings, DAY, ["bronze_events", "metric_windows_1m"], now=NOW)
    bronze_failed = failed(report, "bronze_events")
    assert set(bronze_failed) == {
        ("expect_column_values_to_be_in_set", "value_is_finite"),
        *(
            ("expect_column_values_to_not_be_null", c)
            for c in ("topic", "partition", "offset", "ts", "server", "metric", "value")
        ),
        ("expect_column_values_to_match_regex", "metric"),
        ("expect_column_values_to_be_between", "ts_epoch_s"),
        ("expect_compound_columns_to_be_unique", "topic, partition, offset"),
    }
    assert {key: o.unexpected_count for key, o in bronze_failed.items()} == dict.fromkeys(bronze_failed, 1) | {
        ("expect_compound_columns_to_be_unique", "topic, partition, offset"): 2,  # both copies
    }
    assert "Bad-Metric" in bronze_failed[("expect_column_values_to_match_regex", "metric")].sample
    windows_failed = failed(report, "metric_windows_1m")
    assert set(windows_failed) == {
        ("expect_column_values_to_be_between", "count"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "max >= avg"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "avg >= min"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "p50 >= min"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "p95 >= p50"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "p99 >= p95"),
        ("expect_column_pair_values_a_to_be_greater_than_b", "max >= p99"),
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

    from metrics_lake.app.cli import app

    land(store, "metric_windows_1m", bad_windows())
    monkeypatch.setenv("LAKE_ROOT", settings.root)
    monkeypatch.setenv("LAKE_CHECKPOINT_DIR", settings.checkpoint_dir)
    result = CliRunner().invoke(app, ["quality", "--table", "metric_windows_1m", "--date", DAY.isoformat()])
    assert result.exit_code == 1, result.output
    assert "metric_windows_1m" in result.output and "CRITICAL" in result.output
    assert "critical expectations failed" in result.output and "dq_results WHERE run_id" in result.output
    assert len(result.output.splitlines()) < 40  # no GX logging or progress bars around the summary
    unknown = CliRunner().invoke(app, ["quality", "--table", "bronze", "--date", DAY.isoformat()])
    assert unknown.exit_code == 2 and "--table bronze: no quality suite" in unknown.output


def test_schema_freshness_and_reconciliation_expectations_fail_when_broken(spark, settings):
    from pyspark.sql import functions as F

    context = gx_context(settings)
    day = NOW.date()
    bronze = prepare(spark.createDataFrame(good_bronze().slice(0, 5).to_pandas()), "bronze_events")
    suite = build_suite("bronze_events", settings, day, NOW, [])
    drifted = [
        outcome("bronze_events", r)
        for r in validate(context, "bronze_events", bronze.withColumn("oops", F.lit(1)), suite)
    ]
    (schema,) = [o for o in drifted if not o.success]
    assert (schema.expectation, schema.critical) == ("expect_table_columns_to_match_set", True)

    stale = bad_windows().slice(0, 1).to_pylist()[0]
    old_end = dt.datetime.combine(day, dt.time(0, 10), dt.UTC)  # 50 minutes before NOW: older than the 15-minute lag
    frame = spark.createDataFrame(
        pa.Table.from_pylist(
            [{**stale, "window_start": old_end - dt.timedelta(minutes=1), "window_end": old_end, "event_date": day}],
            schema=METRIC_WINDOWS_1M,
        ).to_pandas()
    )
    suite = build_suite("metric_windows_1m", settings, day, NOW, [])
    results = [
        outcome("metric_windows_1m", r)
        for r in validate(context, "metric_windows_1m", prepare(frame, "metric_windows_1m"), suite)
    ]
    (fresh,) = [o for o in results if not o.success]
    assert (fresh.expectation, fresh.column, fresh.critical) == (
        "expect_column_max_to_be_between",
        "window_end_epoch_s",
        False,
    )
    assert fresh.observed_value == str(int(old_end.timestamp()))

    recon = spark.createDataFrame(
        [(day, "m", 90, 900.0, 100, 1000.0, 10), (day, "n", 100, 1.0, 100, 1.0, 0)],
        "event_date date, metric string, speed_count long, speed_sum double, batch_count long, batch_sum double, late_events long",
    )
    suite = build_suite("lambda_reconciliation", settings, day, NOW, [])
    results = [
        outcome("lambda_reconciliation", r)
        for r in validate(context, "lambda_reconciliation", prepare(recon, "lambda_reconciliation"), suite)
    ]
    (diff,) = [o for o in results if not o.success]
    assert (diff.column, diff.unexpected_count, diff.sample) == ("count_diff_ratio", 1, "[0.1]")
