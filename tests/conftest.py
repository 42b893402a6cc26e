"""Shared fixtures: a lake in a temp directory, and one Spark session per test run.

Following PySpark's and Delta's own test suites: one session-scoped
SparkSession (2 local cores, 2 shuffle partitions, UI off); each test gets its
own lake root and checkpoint directory, so tests never share state.
"""

from __future__ import annotations

import pytest

from lake.config import LakeSettings, load_settings
from lake.log.log import SegmentLog
from lake.storage import LocalStore


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
    from spark.session import build_session

    base = tmp_path_factory.mktemp("spark-session")
    session = build_session(
        load_settings(
            root=str(base / "lake"), checkpoint_dir=str(base / "ck"), spark_master="local[2]", shuffle_partitions=2
        ),
        "lake-tests",
    )
    yield session
    session.stop()
