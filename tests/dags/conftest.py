"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME with a SQLite metadata DB, and the DagBag of dags/.

Airflow reads its configuration when first imported, so the environment is
set here, at collection time, before any test module imports it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="lake-airflow-"))
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)  # one per test process, each run
os.environ.update(
    AIRFLOW_HOME=str(AIRFLOW_HOME),
    AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
)


@pytest.fixture(scope="session")
def dagbag():
    """Every DAG under dags/, parsed once, after the metadata DB is migrated."""
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, timeout=300)
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@pytest.fixture
def lake_env(settings, monkeypatch):
    """Point the DAG tasks (which read ``LAKE_*`` like the CLI) at the test's lake."""
    monkeypatch.setenv("LAKE_ROOT", settings.root)
    monkeypatch.setenv("LAKE_CHECKPOINT_DIR", settings.checkpoint_dir)
    monkeypatch.setenv("LAKE_SPARK_MASTER", "local[2]")
    monkeypatch.setenv("LAKE_SHUFFLE_PARTITIONS", "2")
    return settings


def task_states(run) -> dict[str, str]:
    """task_id -> final state of a finished ``dag.test()`` run."""
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def returned(run, task_id: str):
    """The XCom return value of ``task_id`` in ``run``."""
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == task_id]
    return ti.xcom_pull(task_ids=task_id)
