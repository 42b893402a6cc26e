"""Shared fixtures: a lake in a temp directory, and one Spark session per test run.

Following PySpark's and Delta's own test suites: one session-scoped
SparkSession (2 local cores, 2 shuffle partitions, UI off); each test gets its
own lake root and checkpoint directory, so tests never share state. The S3
server is also session-scoped; each test gets its own key prefix (delta-rs's
conftest pattern).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrics_lake.core.config import LakeSettings, load_settings
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import LocalStore
from metrics_lake.infra.seaweedfs import S3Server, store_as
from tests.helpers import LAKE, free_port_pair

# pytest-xdist runs tests in worker processes whose __main__ is execnet's bootstrap code, with neither __spec__ nor
# __file__. pyspark.sql.connect takes such a process for a doctest run and calls sys.exit(0) when imported without
# its optional dependencies, which Great Expectations does. A spec named __main__ makes it raise its ImportError as
# anywhere else, and multiprocessing's spawned children then leave their own __main__ alone (spawn.py skips that name).
_main = sys.modules["__main__"]
if getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
    _main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)


def pytest_collection_modifyitems(config, items) -> None:
    """Slow tests first: in a parallel run they start together instead of one of them ending the run alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: the order is otherwise kept


@pytest.fixture
def settings(tmp_path) -> LakeSettings:
    """Settings for a fresh lake under ``tmp_path``."""
    return load_settings(
        root=str(tmp_path / "lake"),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        spark_master="local[2]",
        shuffle_partitions=2,
    )


@pytest.fixture
def store(settings) -> LocalStore:
    """The fresh lake's store."""
    return LocalStore(settings.root)


@pytest.fixture
def log(store) -> SegmentLog:
    """The fresh lake's segment log."""
    return SegmentLog(store)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local SparkSession for the whole run, with the lake data sources registered."""
    from metrics_lake.spark.session import build_session

    base = tmp_path_factory.mktemp("spark-session")
    session = build_session(
        load_settings(
            root=str(base / "lake"), checkpoint_dir=str(base / "ck"), spark_master="local[2]", shuffle_partitions=2
        ),
        "lake-tests",
        extra_config={"spark.python.worker.faulthandler.enabled": "true"},
    )
    yield session
    session.stop()


@contextlib.contextmanager
def running_s3_server(data_dir: Path) -> Iterator[S3Server]:
    """A SeaweedFS S3 server in ``data_dir``, started through `lake infra up` on free loopback ports."""
    s3_port, master_port = free_port_pair()
    args = ["--data-dir", str(data_dir), "--s3-port", str(s3_port), "--master-port", str(master_port)]
    try:
        up = subprocess.run([LAKE, "infra", "up", *args], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr
        (data_dir / "exports.sh").write_text(up.stdout)
        yield S3Server(data_dir, s3_port=s3_port, master_port=master_port)
    finally:
        # Test data need no graceful shutdown; SeaweedFS can take 20 s to exit on SIGTERM.
        subprocess.run([LAKE, "infra", "down", *args, "--timeout", "2"], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """One S3 server for the whole run; tests share it through their own key prefixes."""
    with running_s3_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def own_s3_server(tmp_path) -> Iterator[S3Server]:
    """An S3 server for one test, whose lake is the bucket root (where the identities' policies apply)."""
    with running_s3_server(tmp_path / "seaweedfs") as server:
        yield server


@pytest.fixture(params=["local", pytest.param("s3", marks=[pytest.mark.integration, pytest.mark.s3])])
def any_store(request, tmp_path):
    """Each backend in turn: a local directory, and a fresh key prefix on the S3 server (admin identity)."""
    if request.param == "local":
        return LocalStore(tmp_path / "lake")
    server = request.getfixturevalue("s3_server")
    return store_as(server, "admin", f"tests/{uuid.uuid4().hex}")
