"""DAG integrity: every DAG imports cleanly, reads no config or secret at parse time, and follows our conventions."""

from __future__ import annotations

import ast
import datetime as dt
import os
import subprocess
import sys

import pytest

from tests.dags.conftest import DAGS

EXPECTED = {"lake_speed_layer", "lake_nightly", "lake_compaction", "lake_retention", "lake_backfill"}
#: What a DAG file may import at module level: Airflow's SDK and our Airflow glue; everything else inside tasks.
ALLOWED_TOP_LEVEL = ("__future__", "datetime", "airflow.sdk", "metrics_lake.app.orchestration")


def test_every_dag_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == EXPECTED


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_conventions(dagbag, dag_id):
    dag = dagbag.get_dag(dag_id)
    assert "metrics-lake" in dag.tags
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert dag.start_date.utcoffset() == dt.timedelta(0)
    assert dag.doc_md
    for task in dag.tasks:
        assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"
        assert task.owner == "metrics-lake"


@pytest.mark.parametrize("path", sorted(DAGS.glob("*.py")), ids=lambda p: p.name)
def test_heavy_imports_stay_inside_tasks(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            assert module.startswith(ALLOWED_TOP_LEVEL), f"{path.name} imports {module} at parse time"


def test_parsing_reads_no_lake_config_and_no_secret(tmp_path):
    """Parse the DAGs in a fresh interpreter with a broken LAKE_ROOT and a secret set: no error, no secret anywhere."""
    secret = "s3cr3t-should-never-appear"
    script = f"""
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={str(DAGS)!r})
assert not bag.import_errors, bag.import_errors
blob = repr([(d.dag_id, d.params.dump(), d.default_args, [t.__dict__ for t in d.tasks]) for d in bag.dags.values()])
assert {secret!r} not in blob
print(len(bag.dags))
"""
    env = {
        **os.environ,
        "LAKE_ROOT": "ftp://not-a-valid-root",
        "LAKE_S3_SECRET_KEY": secret,
    }
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(len(EXPECTED))
    assert secret not in result.stdout + result.stderr


def test_every_table_of_the_registry_is_an_asset(dagbag):
    from metrics_lake.app.orchestration import TABLE_ASSETS
    from metrics_lake.lake_schemas.tables import TABLES

    assert set(TABLE_ASSETS) == set(TABLES)
    assert {name: asset.uri for name, asset in TABLE_ASSETS.items()} == {n: s.asset_uri for n, s in TABLES.items()}
    used = {asset.name for dag in dagbag.dags.values() for task in dag.tasks for asset in task.outlets}
    assert used <= set(TABLES)  # DAGs publish only registry tables


def test_each_task_s_outlets_are_the_tables_its_operation_writes(dagbag):
    """Outlets come from lake_schemas/table_access.py: a task updates exactly the Assets of what its step commits."""
    from metrics_lake.lake_schemas.table_access import ALERTS, QUALITY, QUERIES, RECOMPUTE, REPLAY, ROLLUP, STREAM

    expected = {
        ("lake_speed_layer", "micro_batches"): STREAM,
        ("lake_speed_layer", "query_backfills"): QUERIES,
        ("lake_nightly", "recompute"): RECOMPUTE,
        ("lake_nightly", "quality_gate"): QUALITY,
        ("lake_nightly", "rollups"): ROLLUP,
        ("lake_nightly", "rollup_quality_gate"): QUALITY,
        ("lake_nightly", "stored_queries"): QUERIES,
        ("lake_nightly", "alert_rules"): ALERTS,
        ("lake_backfill", "replay"): REPLAY,
        ("lake_backfill", "recompute"): RECOMPUTE,
        ("lake_backfill", "rollups"): ROLLUP,
        ("lake_backfill", "queries"): QUERIES,
    }
    for (dag_id, task_id), operation in expected.items():
        outlets = [asset.name for asset in dagbag.get_dag(dag_id).get_task(task_id).outlets]
        assert outlets == list(operation.writes), (dag_id, task_id)
    # Compaction follows the nightly (rollups and query results both landed), not every speed-layer batch.
    assert "metric_rollup_1d" in str(dagbag.get_dag("lake_compaction").timetable.asset_condition)
