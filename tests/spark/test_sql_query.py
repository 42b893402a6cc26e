"""Spark SQL over the lake: views over Delta snapshots, time travel, CLI output."""

from __future__ import annotations

import json

import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.spark.jobs.sql_query import parse_versions, referenced_tables, run_sql
from metrics_lake.spark.jobs.stream_metrics import run_stream

pytestmark = pytest.mark.spark


def test_referenced_tables_and_version_specs():
    tables = ["bronze_events", "metric_windows_1m"]
    assert referenced_tables("select * from BRONZE_EVENTS b", tables) == ["bronze_events"]
    assert referenced_tables("select * from bronze_events_old", tables) == []
    assert parse_versions(["3", "metric_windows_1m=1"]) == {None: 3, "metric_windows_1m": 1}
    with pytest.raises(ValueError, match="--version 'x=y'"):
        parse_versions(["x=y"])


def produce_and_stream(spark, settings, log, seed: int, servers: int) -> None:
    """A minute of ``servers`` x 2 metrics x 30 s (seeded, a minute apart per seed) into bronze: one new version."""
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(
            FleetSimulator(
                servers=servers, metrics=2, seconds=30, seed=seed, start_ms=1_800_000_000_000 + seed * 60_000
            ).generate()
        )
    run_stream(spark, settings, once=True)


def test_sql_reads_current_snapshot_and_time_travels(spark, settings, log):
    produce_and_stream(spark, settings, log, 1, servers=2)
    produce_and_stream(spark, settings, log, 2, servers=2)
    count = "SELECT count(*) AS n FROM bronze_events"
    assert run_sql(spark, settings, count).collect()[0].n == 240
    assert run_sql(spark, settings, count, {"bronze_events": 1}).collect()[0].n == 120
    assert run_sql(spark, settings, count, {None: 0}).collect()[0].n == 0
    joined = run_sql(
        spark,
        settings,
        "SELECT count(DISTINCT w.server) AS n FROM metric_windows_1m w JOIN bronze_events b ON w.server = b.server",
    )
    assert joined.collect()[0].n == 2
    with pytest.raises(ValueError, match="unknown table"):
        run_sql(spark, settings, count, {"nope": 1})


def test_cli_sql_and_tables_print_results(spark, settings, log, monkeypatch, capsys):
    from typer.testing import CliRunner

    from metrics_lake.app.cli import app

    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send_payloads(['{"bad": true}'])
    run_stream(spark, settings, once=True)
    for key, value in {
        "ROOT": settings.root,
        "CHECKPOINT_DIR": settings.checkpoint_dir,
        "SPARK_MASTER": "local[2]",
    }.items():
        monkeypatch.setenv(f"LAKE_{key}", value)
    # The CLI stops its session, which is the shared one here (getOrCreate): leave it running. Patching only
    # SparkSession.stop once left stop_session shutting down the shared session's accumulator server, and every
    # later Python data source planned in this process failed ("Python worker exited unexpectedly").
    monkeypatch.setattr("metrics_lake.spark.session.stop_session", lambda spark: None)
    runner = CliRunner()
    result = runner.invoke(app, ["sql", "SELECT reason, raw FROM quarantine_events", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert rows == [{"reason": "missing_field: ts", "raw": '{"bad": true}'}]
    result = runner.invoke(app, ["tables"])
    assert result.exit_code == 0 and "quarantine_events" in result.stdout
    result = runner.invoke(app, ["sql", "SELECT nope FROM quarantine_events"])
    assert result.exit_code == 2 and "error" in result.output
    # The shared session still plans Python data sources (its planner sends accumulator updates to the driver).
    assert spark.readStream.format("lakelog").load().columns


def test_time_travel_in_sql_equals_version_flag_and_a_vacuumed_version_is_a_clear_error(spark, settings, log, store):
    import datetime as dt

    from metrics_lake.core.maintenance.clustering import cluster_table
    from metrics_lake.core.tables.delta import open_table
    from metrics_lake.spark.catalog import rewrite_time_travel

    for seed in (1, 2):
        produce_and_stream(spark, settings, log, seed, servers=3)
    count = "SELECT count(*) AS n FROM bronze_events"
    flagged = run_sql(spark, settings, count, {"bronze_events": 1}).collect()[0].n
    assert flagged == 180
    assert run_sql(spark, settings, f"{count} VERSION AS OF 1").collect()[0].n == flagged
    assert run_sql(spark, settings, f"{count} FOR SYSTEM_VERSION AS OF 1 AS b").collect()[0].n == flagged
    committed = dt.datetime.fromtimestamp(
        next(h["timestamp"] for h in open_table(store, "bronze_events").history() if h["version"] == 1) / 1000, dt.UTC
    )
    at = (committed + dt.timedelta(milliseconds=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    assert run_sql(spark, settings, f"{count} TIMESTAMP AS OF '{at}'").collect()[0].n == flagged
    assert run_sql(spark, settings, count).collect()[0].n == 360
    # Pushed filters give what a row-by-row count of the table gives.
    rows = open_table(store, "bronze_events").to_pyarrow_table(columns=["metric", "server"]).to_pylist()
    metric, server = rows[0]["metric"], rows[0]["server"]
    series = f"{count} WHERE metric = '{metric}' AND server = '{server}'"
    assert run_sql(spark, settings, series).collect()[0].n == sum(
        1 for r in rows if r["metric"] == metric and r["server"] == server
    )
    # Clustering rewrites every file; VACUUM with no retention deletes the old ones: version 1 is gone.
    cluster_table(store, "bronze_events")
    open_table(store, "bronze_events").vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(Exception, match=r"bronze_events version 1 is no longer readable: VACUUM deleted"):
        run_sql(spark, settings, f"{count} VERSION AS OF 1").collect()
    with pytest.raises(Exception, match=r"VERSION AS OF 9 does not exist: bronze_events has versions 0 \("):
        run_sql(spark, settings, f"{count} VERSION AS OF 9").collect()
    assert run_sql(spark, settings, count).collect()[0].n == 360
    assert rewrite_time_travel(
        "SELECT * FROM metric_windows_1m TIMESTAMP AS OF TIMESTAMP '2026-11-20'", ["metric_windows_1m"]
    ) == ("SELECT * FROM metric_windows_1m WITH ('timestamp' = '2026-11-20')")
    with pytest.raises(ValueError, match="TIMESTAMP AS OF 'noon'"):
        rewrite_time_travel("SELECT * FROM bronze_events TIMESTAMP AS OF 'noon'", ["bronze_events"])
