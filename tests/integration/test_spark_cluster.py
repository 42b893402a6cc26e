"""The pipeline on a real Spark standalone cluster (`lake infra spark up`, two workers on loopback).

- the known-events test (exact bronze, quarantine and windows) through
  `lake stream --once` on the cluster, on a local lake and on S3, and for the
  local lake every other Spark command after it, unchanged;
- faults: a worker SIGKILLed with its executor mid-stream (Spark retries its
  tasks on the other worker and the stream goes on), then the driver
  SIGKILLed; a restart finishes exactly once;
- `lake infra spark down` leaves no process behind (checked after each test).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import open_table
from metrics_lake.infra.seaweedfs import settings_env
from tests.helpers import LAKE, free_port_block
from tests.spark.test_stream_metrics import INVALID, START_MS, check_windows, produced_rows, table_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORKERS = 2


class Cluster:
    """A `lake infra spark up` cluster in a test's directory, and the environment of lake commands on it."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        first = free_port_block(tuple(range(2 + WORKERS)), lowest=20000)
        self.directory = directory
        self.args = ["--data-dir", str(directory), "--master-port", str(first), "--ui-port", str(first + 1)]
        self.ui = f"http://127.0.0.1:{first + 1}"
        up = subprocess.run(
            [LAKE, "infra", "spark", "up", *self.args, "--workers", str(WORKERS), "--cores", "1", "--memory", "1g"],
            env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr[-3000:]
        (export,) = [line for line in up.stdout.splitlines() if line.startswith("export LAKE_SPARK_MASTER=")]
        self.env = env | {"LAKE_SPARK_MASTER": export.split("=", 1)[1]}

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=10) as answer:
            return json.loads(answer.read())

    def lake(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        done = subprocess.run([LAKE, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"lake {' '.join(args)}:\n{done.stderr[-3000:]}"
        return done

    def worker_pid(self, index: int) -> int:
        return int((self.directory / "run" / f"worker-{index}.pid").read_text())

    def processes(self) -> list[psutil.Process]:
        """Processes of this cluster: its daemons and executors (their command line or directory is under it)."""
        mine = []
        for process in psutil.process_iter(["cmdline", "cwd"]):
            cmdline, cwd = " ".join(process.info["cmdline"] or []), process.info["cwd"] or ""
            if str(self.directory) in cmdline or cwd.startswith(str(self.directory)):
                mine.append(process)
        return mine

    def down(self) -> None:
        done = subprocess.run([LAKE, "infra", "spark", "down", *self.args], env=self.env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        left = self.processes()
        assert not left, f"left behind: {[p.info['cmdline'][:3] for p in left]}"


@pytest.fixture
def cluster_on(tmp_path):
    """Start a cluster for a given lake environment; every started cluster is taken down and checked empty."""
    started: list[Cluster] = []

    def start(env: dict[str, str]) -> Cluster:
        started.append(Cluster(tmp_path / "spark", env))
        return started[-1]

    yield start
    for cluster in started:
        cluster.down()


def lake_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "LAKE_ROOT": str(tmp_path / "lake"),
        "LAKE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "LAKE_SHUFFLE_PARTITIONS": "2",
        **extra,
    }


def produce_known_events(store, settings) -> FleetSimulator:
    sim = FleetSimulator(servers=6, metrics=4, seconds=180, rate=5.0, seed=11, start_ms=START_MS)
    with Producer(SegmentLog(store), settings.topic, partitions=settings.partitions) as producer:
        producer.send(sim.generate())
        producer.send_payloads(list(INVALID))
    return sim


def check_known_events(store, sim: FleetSimulator) -> None:
    """Bronze holds every valid event once, quarantine every invalid one with its reason, windows are exact."""
    produced = produced_rows(SegmentLog(store))
    valid = produced.filter(produced.column("reason").is_null())
    bronze = Counter((r["topic"], r["partition"], r["offset"]) for r in table_rows(store, "bronze_events"))
    assert max(bronze.values()) == 1 and len(bronze) == valid.num_rows == sim.total_events
    assert {r["raw"]: r["reason"].split(":")[0] for r in table_rows(store, "quarantine_events")} == INVALID
    assert check_windows(store, produced) == 6 * 4 * 3


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_known_events_are_exact_through_stream_once_on_a_two_worker_cluster(backend, tmp_path, cluster_on, request):
    env = lake_env(tmp_path)
    if backend == "s3":  # the executors read these from their own environment: the workers' (started with it)
        env |= settings_env(request.getfixturevalue("s3_server"), "admin", f"tests/{uuid.uuid4().hex}")
    names = ("root", "checkpoint_dir", "s3_endpoint", "s3_region", "s3_access_key", "s3_secret_key")
    settings = load_settings(**{name: env[f"LAKE_{name.upper()}"] for name in names if f"LAKE_{name.upper()}" in env})
    store = open_store(settings)
    cluster = cluster_on(env)
    sim = produce_known_events(store, settings)

    cluster.lake("stream", "--once")

    check_known_events(store, sim)
    apps = cluster.state()["completedapps"]
    assert apps and all(app["cores"] == WORKERS for app in apps), apps  # it ran on both workers, not locally
    if backend == "s3":
        return
    # Every other Spark command runs on the cluster unchanged.
    day = "2025-11-20"
    assert f"{sim.total_events:,} events -> 72 windows" in cluster.lake("recompute", "--date", day).stderr
    assert table_rows(store, "metric_windows_1m") and check_windows(store, produced_rows(SegmentLog(store))) == 72
    assert "metric_rollup_1d: 24 rows" in cluster.lake("rollup", "--date", day).stderr
    cluster.lake("queries", "--date", day)
    assert open_table(store, "query_results").to_pyarrow_table().num_rows > 0
    cluster.lake("quality", "--date", day, "--table", "metric_windows_1m")
    version = open_table(store, "bronze_events").version()
    cluster.lake("replay", "--from-offset", "0")
    assert open_table(store, "bronze_events").version() == version  # an ingested range commits nothing
    cluster.lake("replay", "--from-offset", "0", "--into", "bronze_copy")
    assert open_table(store, "bronze_copy").to_pyarrow_table().num_rows == sim.total_events
    counted = cluster.lake("sql", "SELECT count(*) AS n FROM bronze_events").stdout
    assert str(sim.total_events) in counted.replace(",", "")
    ran = {app["name"] for app in cluster.state()["completedapps"]}  # replay is Arrow only: no Spark application
    assert ran == {"lake-stream", "lake-recompute", "lake-rollup", "lake-queries", "lake-quality", "lake-sql"}


def bronze_version(store) -> int:
    return open_table(store, "bronze_events").version() if store.exists("tables/bronze_events/_delta_log") else -1


def wait_for_commit(store, after: int, process: subprocess.Popen, log: Path, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while (version := bronze_version(store)) <= after:
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no bronze commit after version {after} within {timeout} s"
        time.sleep(0.2)
    return version


def test_a_worker_and_then_the_driver_killed_mid_stream_leave_the_tables_exact(tmp_path, cluster_on):
    env = lake_env(tmp_path, LAKE_TRIGGER_SECONDS="1", LAKE_MAX_RECORDS_PER_BATCH="4000", LAKE_WATERMARK_SECONDS="3600")
    settings = load_settings(root=env["LAKE_ROOT"], checkpoint_dir=env["LAKE_CHECKPOINT_DIR"])
    store = open_store(settings)
    cluster = cluster_on(env)
    sim = FleetSimulator(servers=10, metrics=5, seconds=300, rate=4.0, seed=5, start_ms=START_MS)
    with Producer(SegmentLog(store), settings.topic, partitions=settings.partitions, roll_bytes=64_000) as producer:
        producer.send(sim.generate())  # 60,000 events: 15 batches of 4,000

    log = tmp_path / "stream.log"
    with open(log, "wb") as output:
        stream = subprocess.Popen([LAKE, "stream"], env=cluster.env, stdout=output, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
        first = wait_for_commit(store, -1, stream, log)
        os.killpg(cluster.worker_pid(1), signal.SIGKILL)  # the worker and the executor it launched
        after_worker = wait_for_commit(store, first, stream, log)  # the stream goes on with one worker
        os.killpg(stream.pid, signal.SIGKILL)  # now the driver, with its JVM and Python workers
        stream.wait(30)
    alive = [w for w in cluster.state()["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 1, cluster.state()["workers"]
    assert after_worker > first

    cluster.lake("stream", "--once")  # the restart, on what is left of the cluster

    produced = produced_rows(SegmentLog(store))
    assert produced.num_rows == sim.total_events == 60_000
    bronze = Counter((r["topic"], r["partition"], r["offset"]) for r in table_rows(store, "bronze_events"))
    assert max(bronze.values()) == 1, "duplicated positions"
    assert len(bronze) == produced.num_rows
    assert check_windows(store, produced) == 10 * 5 * 5
