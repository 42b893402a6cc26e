"""Retention deletes exactly what is past each resolution's horizon, and VACUUM only what is unreferenced long enough."""

from __future__ import annotations

import datetime as dt
import os
import time

import pyarrow as pa

from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.maintenance.retention import apply_retention, plan_retention
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import TABLES
from tests.core.log.test_log import records

NOW = dt.datetime(2026, 11, 21, 3, 0, tzinfo=dt.UTC)
TODAY = NOW.date()
#: Days back (from TODAY) that get one file of two rows in every table.
AGES = [0, 1, 6, 7, 8, 29, 30, 31, 364, 365, 366, 900]


def land_days(store, table: str, ages: list[int]) -> None:
    """One commit per day: two rows whose day column is TODAY - age (other columns null or minimal)."""
    schema, column = TABLES[table].schema, TABLES[table].day_column
    for batch, age in enumerate(ages):
        day = TODAY - dt.timedelta(days=age)
        data = {name: pa.nulls(2, schema.field(name).type) for name in schema.names}
        data[column] = pa.array([day, day], pa.date32())
        if "metric" in data:
            data["metric"] = pa.array(["m", "m"])
        files = write_data_files(store, table, pa.table(data, schema=schema))
        commit_files(store, table, [f.add_action() for f in files], app_id="load", batch_id=batch)


def kept_ages(store, table: str) -> list[int]:
    column = TABLES[table].day_column
    days = open_table(store, table).to_pyarrow_table(columns=[column]).column(column).to_pylist()
    return sorted({(TODAY - day).days for day in days})


#: The tables kept by day (``servers`` is current state: retention never touches it).
DAY_TABLES = [name for name, spec in TABLES.items() if spec.day_column]


def test_each_table_keeps_exactly_its_horizon(settings, store):
    for table in DAY_TABLES:
        land_days(store, table, AGES)
    plan = plan_retention(settings, store, NOW)
    planned = {t.table: (t.cutoff, t.files, t.rows) for t in plan.tables}
    assert planned["bronze_events"] == (TODAY - dt.timedelta(days=7), 8, 16)  # ages 8 and up
    assert planned["metric_windows_1m"] == (TODAY - dt.timedelta(days=30), 5, 10)
    assert planned["metric_rollup_1h"] == (TODAY - dt.timedelta(days=365), 2, 4)
    assert "metric_rollup_1d" not in planned  # kept forever by default
    assert all(kept_ages(store, t) == AGES for t in DAY_TABLES)  # a plan deletes nothing

    apply_retention(settings, store, NOW)
    assert kept_ages(store, "bronze_events") == [0, 1, 6, 7]
    assert kept_ages(store, "quarantine_events") == [0, 1, 6, 7]
    for table in ("metric_windows_1m", "lambda_reconciliation", "query_results"):
        assert kept_ages(store, table) == [0, 1, 6, 7, 8, 29, 30]
    assert kept_ages(store, "metric_rollup_1h") == [0, 1, 6, 7, 8, 29, 30, 31, 364, 365]
    assert kept_ages(store, "metric_rollup_1d") == AGES
    # Deleted rows stay reachable by time travel until VACUUM's retention period has passed.
    bronze = open_table(store, "bronze_events")
    assert open_table(store, "bronze_events", version=bronze.version() - 1).to_pyarrow_table().num_rows == 24

    again = plan_retention(settings, store, NOW)
    assert all(t.files == 0 for t in again.tables)


def test_vacuum_deletes_only_files_unreferenced_for_longer_than_the_retention(settings, store, tmp_path):
    settings = settings.model_copy(update={"vacuum_retention_hours": 1})
    land_days(store, "bronze_events", [0, 30])
    table_dir = tmp_path / "lake" / "tables" / "bronze_events"
    old_orphan = table_dir / "event_date=2026-11-21" / "part-orphan-old.zstd.parquet"
    new_orphan = table_dir / "event_date=2026-11-21" / "part-orphan-new.zstd.parquet"
    for orphan in (old_orphan, new_orphan):
        orphan.write_bytes(b"a file a failed job wrote and never committed")
    two_hours_ago = time.time() - 7200
    os.utime(old_orphan, (two_hours_ago, two_hours_ago))

    plan = plan_retention(settings, store, NOW)
    (vacuum,) = plan.vacuum
    assert vacuum.files == ["event_date=2026-11-21/part-orphan-old.zstd.parquet"]
    assert old_orphan.exists()  # the plan only lists

    result = apply_retention(settings, store, NOW)
    assert [v.files for v in result.vacuum] == [["event_date=2026-11-21/part-orphan-old.zstd.parquet"]]
    assert not old_orphan.exists() and new_orphan.exists()
    # The expired day's file was tombstoned just now: kept for time travel until the hour has passed.
    assert any((table_dir / "event_date=2026-10-22").iterdir())
    assert kept_ages(store, "bronze_events") == [0]


def test_groups_behind_retention_are_reported(settings, store):
    log = SegmentLog(store)
    log.ensure_topic("metrics", 1)
    writer = log.writer("metrics", 0, "w", ttl_ms=30_000)
    writer.append(records(4))
    writer.append(records(3))
    commit_offsets(store, "speed-bronze", "metrics", {0: 2})
    commit_offsets(store, "speed-windows", "metrics", {0: 7})
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=8)
    plan = plan_retention(settings, store, later)
    assert plan.groups_behind == [("speed-bronze", "metrics", 0, 2, 7)]
    apply_retention(settings, store, later)
    assert (log.index("metrics", 0).start_offset, log.index("metrics", 0).next_offset) == (7, 7)
