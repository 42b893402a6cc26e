"""The lake's tables read by Spark's own Parquet scan (spark/jvm/, spark/snapshot_resolver.py) on a local lake."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from metrics_lake.core import keys
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.catalog import register_lake_tables
from metrics_lake.spark.datasources.delta_reader import SCAN_REPORT_ENV
from tests.spark.test_sql_query import produce_and_stream

pytestmark = pytest.mark.spark


def lake_rows(spark, query: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.sql(query).collect())


def test_native_scan_is_spark_parquet_prunes_files_and_equals_the_python_reader(
    spark, settings, log, capfd, monkeypatch
):
    for seed in (1, 2, 3):  # three versions, each adding files
        produce_and_stream(spark, settings, log, seed, servers=4)
    register_lake_tables(spark, settings)
    plan = spark.sql("SELECT value FROM bronze_events")._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan bronze_events" in plan and "ParquetScan" in plan and "LakeFileIndex" in plan, plan

    python_reader = spark.read.format("lakedelta").option("root", settings.root).option("table", "bronze_events")
    python_reader.load().createOrReplaceTempView("bronze_by_python")
    rows = open_table(spark_store(settings), "bronze_events").to_pyarrow_table(columns=["server", "metric", "ts"])
    servers, metrics = sorted(set(rows.column("server").to_pylist())), sorted(set(rows.column("metric").to_pylist()))
    times = sorted(rows.column("ts").to_pylist())
    chooser = random.Random(7)
    for _ in range(12):  # random conjunctions of what the pruning supports; the answers must not change
        clauses = [f"server = '{chooser.choice(servers)}'", f"metric IN ('{chooser.choice(metrics)}')"]
        clauses.append(f"ts >= TIMESTAMP '{chooser.choice(times):%Y-%m-%d %H:%M:%S.%f}'")
        clauses.append("labels IS NOT NULL")
        where = " AND ".join(chooser.sample(clauses, chooser.randint(1, len(clauses))))
        query = (
            "SELECT server, metric, count(*), round(sum(value), 6), max(ts) FROM {t} WHERE " + where + " GROUP BY 1, 2"
        )
        assert lake_rows(spark, query.format(t="bronze_events")) == lake_rows(spark, query.format(t="bronze_by_python"))

    monkeypatch.setenv(SCAN_REPORT_ENV, "1")
    capfd.readouterr()
    newest = max(times)
    assert lake_rows(spark, f"SELECT count(*) FROM bronze_events WHERE ts > TIMESTAMP '{newest:%Y-%m-%d %H:%M:%S.%f}'")
    snapshot = open_table(spark_store(settings), "bronze_events").get_add_actions().num_rows
    report = re.search(r"scan bronze_events v(\d+): (\d+) of (\d+) files", capfd.readouterr().err)
    assert report, "no scan report"
    assert int(report.group(3)) == snapshot and 1 <= int(report.group(2)) < snapshot  # statistics pruned files
    spark.sql("SELECT count(*) FROM bronze_events WHERE event_date = DATE '1999-01-01'").collect()
    assert re.search(r"scan bronze_events v\d+: 0 of \d+ files", capfd.readouterr().err)  # partition pruning


def test_native_time_travel_needs_no_rewrite_and_tables_refuse_writes(spark, settings, log):
    for seed in (1, 2):
        produce_and_stream(spark, settings, log, seed, servers=3)
    register_lake_tables(spark, settings)
    count = "SELECT count(*) FROM bronze_events"
    assert spark.sql(f"{count} VERSION AS OF 1").collect()[0][0] == 180
    both = spark.sql(f"SELECT ({count} VERSION AS OF 1), ({count}), ({count} VERSION AS OF 1)").collect()[0]
    assert tuple(both) == (180, 360, 180)  # one query, two snapshots of one table
    # The options form: Spark resolves a table once per query whatever its options, so one version per query.
    assert spark.sql(f"{count} WITH ('version' = '1')").collect()[0][0] == 180
    with pytest.raises(Exception, match=r"InputError: bronze_events VERSION AS OF 9 does not exist"):
        spark.sql(f"{count} VERSION AS OF 9").collect()
    folder = Path(settings.root) / keys.table_prefix("bronze_events")
    before = sorted(p for p in folder.rglob("*") if p.is_file())
    for statement in ("INSERT INTO", "INSERT OVERWRITE"):
        with pytest.raises(Exception, match="bronze_events` does not support"):
            spark.sql(f"{statement} bronze_events SELECT * FROM bronze_events LIMIT 1")
    assert sorted(p for p in folder.rglob("*") if p.is_file()) == before


def test_the_jar_is_built_once_per_source_and_spark_version():
    from metrics_lake.spark import lake_jar

    built = lake_jar.build()
    assert built == lake_jar.jar_path() and built.is_file()
    assert lake_jar.build().stat().st_mtime_ns == built.stat().st_mtime_ns  # no second compile


def spark_store(settings):
    from metrics_lake.core.storage import open_store

    return open_store(settings)
