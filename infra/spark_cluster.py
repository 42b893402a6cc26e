"""A Spark standalone cluster on 127.0.0.1 from the installed pyspark: one master and N workers as processes.

``start`` runs ``bin/spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker`` from the pyspark package (its directory is
``SPARK_HOME``), each in its own session (so ``stop`` can signal a worker
together with the executors it launched), with logs, PID files and the
workers' work directories under ``data_dir`` (never inside the
virtualenv), and waits until the master's web UI reports every worker
alive. ``stop`` and ``status`` use the PID files.

**Environment.** Executors are launched by the workers and inherit their
environment: the ``LAKE_S3_*`` credentials the lake's Python tasks read
(``load_settings`` in each task) must be exported where ``start`` runs
(``eval "$(lake infra up)"`` first), exactly as for the driver. Python
workers run the driver's interpreter (PySpark sends ``PYSPARK_PYTHON``, set
to this virtualenv's by :mod:`metrics_lake.spark.session` through its
launcher script, with ``spark.executorEnv.LAKE_SPARK_PYTHON``), so on this
machine they import the same installed code. On other machines the same
environment must exist there, or be shipped: ``spark.archives`` with a
packed virtualenv (``venv-pack``) and ``PYSPARK_PYTHON=./environment/bin/python``
(docs/operations/cluster.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from metrics_lake.infra.processes import pid_from_file, stop_process_group
from metrics_lake.lake_schemas.errors import SparkClusterError

__all__ = ["SparkCluster", "SparkClusterError", "cluster_state", "running_pids", "spark_home", "start", "stop"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class SparkCluster:
    """Where a local standalone cluster lives: its directory, ports (127.0.0.1) and worker sizes.

    ``memory``: per worker, in Spark's notation (``2g``, ``512m``). Worker
    ``i`` (from 0) serves its web UI on ``ui_port + 1 + i``.
    """

    data_dir: Path
    master_port: int = 7077
    ui_port: int = 8080
    workers: int = 2
    cores: int = 1
    memory: str = "2g"

    @property
    def url(self) -> str:
        """The master URL for ``LAKE_SPARK_MASTER``."""
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def ui_url(self) -> str:
        """The master's web UI."""
        return f"http://127.0.0.1:{self.ui_port}"

    def worker_ui_port(self, index: int) -> int:
        """Web UI port of worker ``index``."""
        return self.ui_port + 1 + index

    def pid_file(self, name: str) -> Path:
        """PID file of ``master`` or ``worker-<i>``."""
        return self.data_dir / "run" / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        """Log of ``master`` or ``worker-<i>``."""
        return self.data_dir / "logs" / f"{name}.log"

    def names(self) -> list[str]:
        """``master`` and the workers' names."""
        return ["master", *(f"worker-{i}" for i in range(self.workers))]


def spark_home() -> Path:
    """The installed pyspark's directory, which holds ``bin/spark-class`` and the jars (located, not imported)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkClusterError("pyspark is not installed in this environment; run `python3 run.py` to install it")
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-class").exists():
        raise SparkClusterError(f"no bin/spark-class in {home}; reinstall pyspark")
    return home


def running_pids(cluster: SparkCluster) -> dict[str, int]:
    """``name -> pid`` of the cluster's processes that run, whatever ``workers`` says (stale PID files ignored)."""
    names = sorted(p.stem for p in (cluster.data_dir / "run").glob("*.pid"))
    return {name: pid for name in names if (pid := pid_from_file(cluster.pid_file(name))) is not None}


def cluster_state(cluster: SparkCluster, timeout: float = 2.0) -> dict | None:
    """The master's JSON state (``/json/``: workers, cores, applications), or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"{cluster.ui_url}/json/", timeout=timeout) as answer:
            return json.loads(answer.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None


def _alive_workers(state: dict | None) -> int:
    return sum(w.get("state") == "ALIVE" for w in (state or {}).get("workers", []))


def _launch(cluster: SparkCluster, name: str, arguments: list[str]) -> int:
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(cluster.data_dir / "logs"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }
    with open(cluster.log_file(name), "ab") as output:
        process = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *arguments],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() signals it with the executors it started
            env=env,
            cwd=cluster.data_dir,
        )
    cluster.pid_file(name).write_text(str(process.pid))
    return process.pid


def start(cluster: SparkCluster, *, timeout: float = 90.0, log=print) -> None:
    """Start the master and the workers that are not running, and wait until all workers are alive.

    Raises :class:`SparkClusterError` with the logs' tails if the cluster
    is not up within ``timeout`` seconds, or if a port is held by another
    cluster.
    """
    for folder in ("run", "logs", "work"):
        (cluster.data_dir / folder).mkdir(parents=True, exist_ok=True)
    running = running_pids(cluster)
    if "master" not in running:
        if cluster_state(cluster) is not None:
            raise SparkClusterError(
                f"port {cluster.ui_port} already serves a Spark master not started from {cluster.data_dir}"
            )
        pid = _launch(
            cluster,
            "master",
            [
                MASTER_CLASS,
                "--host",
                "127.0.0.1",
                "--port",
                str(cluster.master_port),
                "--webui-port",
                str(cluster.ui_port),
            ],
        )
        log(f"started the Spark master (pid {pid}) at {cluster.url}, web UI {cluster.ui_url}")
    for index in range(cluster.workers):
        name = f"worker-{index}"
        if name in running:
            continue
        work = cluster.data_dir / "work" / name
        work.mkdir(parents=True, exist_ok=True)
        pid = _launch(
            cluster,
            name,
            [
                WORKER_CLASS,
                "--host", "127.0.0.1",
                "--cores", str(cluster.cores),
                "--memory", cluster.memory,
                "--webui-port", str(cluster.worker_ui_port(index)),
                "--work-dir", str(work),
                cluster.url,
            ],
        )  # fmt: skip
        log(
            f"started {name} (pid {pid}): {cluster.cores} cores, {cluster.memory}, "
            f"web UI http://127.0.0.1:{cluster.worker_ui_port(index)}"
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _alive_workers(cluster_state(cluster)) >= cluster.workers:
            log(f"{cluster.workers} workers alive at {cluster.url}")
            return
        if "master" not in running_pids(cluster):
            break
        time.sleep(0.5)
    tails = "\n".join(
        f"--- {name}:\n{cluster.log_file(name).read_text(errors='replace')[-1500:]}"
        for name in cluster.names()
        if cluster.log_file(name).exists()
    )
    raise SparkClusterError(f"the Spark cluster at {cluster.url} is not up within {timeout:.0f} s; logs:\n{tails}")


def stop(cluster: SparkCluster, *, timeout: float = 20.0, log=print) -> bool:
    """Stop the workers (with their executors), then the master: SIGTERM, SIGKILL after ``timeout``.

    Returns False if nothing was running.
    """
    running = running_pids(cluster)
    for name in sorted(running, key=lambda n: n == "master"):  # the workers first
        stop_process_group(running[name], timeout)
        log(f"stopped {name} (pid {running[name]})")
    for stale in (cluster.data_dir / "run").glob("*.pid"):
        stale.unlink()
    return bool(running)
