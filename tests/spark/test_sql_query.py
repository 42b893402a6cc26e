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


def test_sql_reads_current_snapshot_and_time_travels(spark, settings, log):
    def produce(seed: int) -> None:
        with Producer(log, settings.topic, partitions=settings.partitions) as producer:
            producer.send(
                FleetSimulator(
                    servers=2, metrics=2, seconds=30, seed=seed, start_ms=1_800_000_000_000 + seed * 60_000
                ).generate()
            )
        run_stream(spark, settings, once=True)

    produce(1)
    produce(2)
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
    # The CLI stops its session; give it its own instead of the shared one.
    monkeypatch.setattr("pyspark.sql.SparkSession.stop", lambda self: None)
    runner = CliRunner()
    result = runner.invoke(app, ["sql", "SELECT reason, raw FROM quarantine_events", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert rows == [{"reason": "missing_field: ts", "raw": '{"bad": true}'}]
    result = runner.invoke(app, ["tables"])
    assert result.exit_code == 0 and "quarantine_events" in result.stdout
    result = runner.invoke(app, ["sql", "SELECT nope FROM quarantine_events"])
    assert result.exit_code == 2 and "error" in result.output
