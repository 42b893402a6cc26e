"""The table registry: each table's facts are consistent, and everything derived from it covers the same tables."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from metrics_lake.core.config import LakeSettings, load_settings
from metrics_lake.core.maintenance.retention import TABLE_RETENTION
from metrics_lake.lake_schemas.tables import TABLES, rollup_chain, table_spec


@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_spec_names_columns_its_schema_has(name):
    spec = TABLES[name]
    assert spec.name == name
    columns = set(spec.schema.names)
    assert set(spec.partition_by) <= columns and set(spec.key) <= columns
    if spec.partition_by:  # retention and quality work by UTC day; a table of current state has no days
        assert spec.schema.field(spec.day_column).type == pa.date32()
    else:
        assert spec.day_column is None and not spec.retention_setting and not spec.quality_suite
    assert spec.asset_uri == f"lake://tables/{name}"


def test_retention_covers_exactly_the_tables_with_a_retention_setting():
    with_setting = {name for name, spec in TABLES.items() if spec.retention_setting}
    assert set(TABLE_RETENTION) == with_setting
    for name, (column, setting) in TABLE_RETENTION.items():
        assert setting in LakeSettings.model_fields, f"{name}: no setting {setting}"
        assert column == TABLES[name].day_column


def test_window_tables_nest_and_roll_up_in_order():
    windows = {name: spec.window_seconds for name, spec in TABLES.items() if spec.window_seconds}
    assert windows == {"metric_windows_1m": 60, "metric_rollup_1h": 3600, "metric_rollup_1d": 86_400}
    assert all(86_400 % seconds == 0 for seconds in windows.values())  # a window never spans two days
    chain = rollup_chain()
    assert [spec.name for spec in chain] == ["metric_rollup_1h", "metric_rollup_1d"]
    for spec in chain:
        source = table_spec(spec.rollup_of)
        assert spec.window_seconds % source.window_seconds == 0 and spec.schema.equals(source.schema)


def test_quality_suites_cover_the_tables_the_registry_marks(tmp_path):
    from metrics_lake.quality.checkpoint import gx_context
    from metrics_lake.quality.suites import SUITE_TABLES, build_suite

    assert set(SUITE_TABLES) == {name for name, spec in TABLES.items() if spec.quality_suite}
    settings = load_settings(root=str(tmp_path))
    gx_context(settings)  # GX builds suites only inside an active context
    now = dt.datetime(2026, 11, 21, 12, tzinfo=dt.UTC)
    for name in SUITE_TABLES:
        suite = build_suite(name, settings, now.date(), now, [])
        assert suite.name == name and suite.expectations


def test_unknown_table_names_the_declared_ones():
    with pytest.raises(KeyError, match="declared: bronze_events"):
        table_spec("bronze")


def test_vacuum_keeps_the_configured_hours_but_for_a_table_rewritten_whole_every_batch():
    from metrics_lake.core.maintenance.retention import vacuum_hours

    settings = load_settings(vacuum_retention_hours=168)
    assert {name: vacuum_hours(settings, name) for name in TABLES if vacuum_hours(settings, name) != 168} == {
        "last_seen": 1,
        "servers": 24,
    }
    assert vacuum_hours(load_settings(vacuum_retention_hours=1), "last_seen") == 1
