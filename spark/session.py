"""Build the SparkSession every lake job uses, with the lake's data sources registered.

Settings that matter for correctness: the session time zone is UTC (event
time and window boundaries are UTC everywhere), and Python workers run the
same interpreter as the driver so they can import the lake's packages.

Settings for speed: the driver JVM gets ``LAKE_SPARK_DRIVER_JAVA_OPTIONS``,
by default ``-XX:TieredStopAtLevel=1`` (HotSpot compiles with C1 only). The
driver plans queries and moves Arrow batches while Python workers compute,
so C2's optimised code rarely pays back its compile threads, which on two
cores take CPU from the job itself. Measured here (2 cores, Java 17, Spark
4.2, alternating runs): a session starts in 3.5-3.9 s instead of 4.4-5.6 s;
the first recompute of a 13.8 M-event day in it takes 5.0-5.5 s instead of
6.4-7.8 s; ``lake stream --once`` of 12 M events 24.0-24.2 s instead of
26.5-27.6 s with 16 % fewer CPU instructions; a steady 200 k events/s stream
keeps the same windows lag (p99 4.8 vs 5.1 s). Streaming checkpoints are
written by Spark's FileSystem-based writer (:data:`CHECKPOINT_FILE_MANAGER`),
as atomically as by its default and in a third of the time, and Python
workers talk to the JVM over Unix domain sockets (Spark 4.1+), not loopback
TCP: together about 90 ms off every small micro-batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from metrics_lake.core.config import LakeSettings
from metrics_lake.spark import jvm_archive, lake_jar

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
#: Spark's warehouse folder (it stays empty: every catalog table reads the lake).
WAREHOUSE_DIR = Path(tempfile.gettempdir()) / "metrics-lake-spark-warehouse"
#: The session catalog that reads a local lake's tables natively (spark/jvm/, spark/catalog.py).
LAKE_CATALOG = "metricslake.spark.LakeCatalog"
#: Master URLs of a cluster on this machine's loopback (``lake infra spark up``).
LOOPBACK_MASTERS = ("spark://127.0.0.1:", "spark://localhost:")
#: How streaming queries write their checkpoint's offset and commit logs (Spark's
#: ``spark.sql.streaming.checkpointFileManagerClass``). The checkpoint is a local folder
#: (``LAKE_CHECKPOINT_DIR``), where this writer does what Spark's default (FileContext-based) one does, a
#: temporary file and its checksum renamed into place, in a third of the time: measured in ``lake stream``'s
#: progress, 10-11 ms per log file instead of 36-41 ms, about 60 ms of every micro-batch (two files each).
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def build_session(
    settings: LakeSettings,
    app_name: str = "metrics-lake",
    *,
    extra_java_options: str = "",
    extra_config: dict[str, str] | None = None,
    data_sources: bool = True,
):
    """Create (or reuse) a SparkSession for ``settings`` and register the lake data sources.

    Registered formats: ``lakelog`` (the speed layer's streaming source over
    the segment log) and ``lakedelta`` (batch reader over a Delta snapshot).
    ``data_sources=False`` leaves them out, for callers that run only RDD
    jobs (``lake stream --once``): the first registration waits about 1 s
    for Spark's search of installed Python data sources.
    The driver JVM maps this environment's class-data sharing archive when
    there is one (:mod:`metrics_lake.spark.jvm_archive`) and gets
    ``settings.spark_driver_java_options``; ``extra_java_options``, if given,
    replace the archive's options (the archive's own builder passes the one
    that writes it). ``extra_config`` adds Spark settings (``lake sql-server``'s listeners).
    The lake's JVM classes (:mod:`metrics_lake.spark.lake_jar`) are on the
    session's class path and, for a local lake, its session catalog is
    ``metricslake.spark.LakeCatalog`` (:mod:`metrics_lake.spark.catalog`).
    Raises :class:`~metrics_lake.lake_schemas.errors.LakeError` if those
    classes cannot be compiled (no JDK).
    """
    _use_python_launcher()
    if settings.spark_master.startswith("local") or settings.spark_master.startswith(LOOPBACK_MASTERS):
        # A local session, or a driver of a cluster on loopback, has no business on any other interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.sql import SparkSession

    from metrics_lake.spark.datasources.delta_reader import DeltaSnapshotDataSource
    from metrics_lake.spark.datasources.log_source import LogDataSource

    options: dict[str, str] = {}
    if not settings.is_s3:
        # A local lake's tables are read by Spark's own Parquet scan over their Delta snapshots (spark/catalog.py).
        # Not on S3: there the tables are Python data sources, which only Spark's built-in session catalog creates.
        options["spark.sql.catalog.spark_catalog"] = LAKE_CATALOG
    if "LAKE_SPARK_PYTHON" in os.environ:  # a cluster's executors start their Python through the launcher too
        options["spark.executorEnv.LAKE_SPARK_PYTHON"] = os.environ["LAKE_SPARK_PYTHON"]
    options.update(extra_config or {})
    options.update(
        {
            "spark.master": settings.spark_master,
            "spark.app.name": app_name,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.extraJavaOptions": " ".join(
                option
                for option in (
                    f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}",
                    extra_java_options or jvm_archive.java_options(),
                    settings.spark_driver_java_options,
                )
                if option
            ),
            "spark.sql.session.timeZone": "UTC",
            # The catalog's tables are the lake's (spark/catalog.py), stored nowhere: keep Spark's empty warehouse
            # folder out of the user's working directory.
            "spark.sql.warehouse.dir": str(WAREHOUSE_DIR),
            "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.jars": str(lake_jar.build()),
            # And on the driver JVM's own class path: HiveServer2 opens a JDBC client's session on a thread whose
            # context class loader is Hive's, which does not see ``spark.jars``; the Hive JDBC driver (beeline,
            # DBeaver) failed with ClassNotFoundException: metricslake.spark.LakeCatalog where PyHive did not.
            "spark.driver.extraClassPath": str(lake_jar.build()),
            # The lake's Python readers prune files and rows with the filters Spark pushes
            # (spark/datasources/delta_reader.py).
            "spark.sql.python.filterPushdown.enabled": "true",
            "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
            # The JVM and its Python workers (and this process) talk over Unix domain sockets, not TCP on loopback,
            # where a task's small reads waited for delayed ACKs: an empty two-task RDD job took 108 ms, 69 ms with
            # them; a speed-layer batch's tasks stage at 2,000 events/s 119 -> 86 ms (medians, measured here).
            "spark.python.unix.domain.socket.enabled": "true",
            "spark.driver.memory": "2g",
            # A speed-layer task's result (its window states) is megabytes: above 1 MiB (the default) Spark parks it
            # in the block manager and the driver fetches it over its block transfer service, one more copy each way.
            # Sent with the task's status instead (capped at the RPC message size, 128 MiB; larger results still
            # go the other way), the JVM used 1.47-1.48 CPU-s instead of 1.66-2.07 over a 12 M-event import into a
            # running stream (per-thread CPU from /proc: the block transfer threads had used 0.16 s).
            "spark.task.maxDirectResultSize": "128m",
            # Python workers fork from a daemon that has imported pyarrow and the lake already
            # (spark/worker_daemon.py).
            "spark.python.daemon.module": "metrics_lake.spark.worker_daemon",
            # Spark keeps one worker daemon per environment; SQL's Python runners add this variable to theirs, so
            # giving it to every Python worker lets plain RDD jobs (the warm-up below) share the SQL jobs' daemon.
            "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        }
    )
    _launch_driver_jvm(options)
    spark = SparkSession.builder.config(map=options).getOrCreate()
    # The worker daemon starts first: the first registration below waits about 1 s for Spark's one-off search
    # of installed Python data sources (a Python process of its own), and the daemon's start overlaps it.
    warm_up = threading.Thread(target=_warm_up_python_workers, args=(spark,), name="python-worker-warm-up", daemon=True)
    warm_up.start()
    _WARM_UPS[id(spark)] = warm_up
    spark.sparkContext.setLogLevel("ERROR")
    for source in (LogDataSource, DeltaSnapshotDataSource) if data_sources else ():
        spark.dataSource.register(source)
    return spark


def _launch_driver_jvm(options: dict[str, str]) -> None:
    """Start the driver JVM with ``options`` in a session of its own, unless this process has one already.

    pyspark starts it in this process's group, so a signal sent to the
    group (``timeout``, Airflow stopping a task, ``kill -- -PGID``) reached
    the JVM too: it exited at once, and ``lake stream``, which stops between
    micro-batches on SIGTERM, failed mid-batch with a Java stack trace and
    "unexpected ConnectionRefusedError". In its own session the JVM gets
    only what is sent to it, and still exits when this process does:
    pyspark's gateway server ends when its stdin, a pipe from this process,
    closes (``pyspark.java_gateway.launch_gateway``). systemd's default
    ``KillMode=control-group`` signals every process of the unit whatever
    its session; ``lake stream``'s unit should say ``KillMode=mixed``.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    # pyspark keeps one gateway (one JVM) per process for every context it creates, stopped or not.
    if SparkContext._gateway is None:
        gateway = launch_gateway(SparkConf().setAll(options.items()), popen_kwargs={"start_new_session": True})
        SparkContext._ensure_initialized(gateway=gateway)


def driver_jvm_exited(wait: float = 5.0) -> bool:
    """Whether the driver JVM this process started has exited, waiting up to ``wait`` seconds for it to.

    A JVM that got SIGTERM runs its shutdown hooks (Spark stops its
    context) before it exits, while the driver's calls into it fail already.
    False if this process started no JVM (pyspark's gateway keeps the one it
    started as ``proc``; it has none when spark-submit started this process).
    """
    jvm = _driver_jvm()
    if jvm is None:
        return False
    try:
        jvm.wait(wait)
    except subprocess.TimeoutExpired:
        return False
    return True


def kill_driver_jvm() -> None:
    """SIGKILL the driver JVM this process started, if it still runs: before this process exits without stopping Spark.

    Otherwise the JVM outlives the driver for a moment, in which its calls
    back into the driver fail and it prints their Java stack traces to the
    terminal they share. Its Python worker daemons end with it (they exit,
    and end their workers, when the JVM's pipe to them closes). Safe for the
    tables: a micro-batch that does not commit is completed by the next run.
    """
    jvm = _driver_jvm()
    if jvm is not None and jvm.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            jvm.kill()


def _driver_jvm() -> subprocess.Popen | None:
    """The driver JVM process this process started (pyspark's gateway keeps it as ``proc``), or None."""
    context = sys.modules.get("pyspark.context")  # not imported: no JVM, and none to import pyspark for
    return getattr(context.SparkContext._gateway, "proc", None) if context is not None else None


#: The interpreter Spark starts Python processes with: this one, with Spark's planner daemons run as the lake's.
PYTHON_LAUNCHER = Path(__file__).with_name("python_launcher.sh")


def _use_python_launcher() -> None:
    """Have Spark start its Python processes with :data:`PYTHON_LAUNCHER`, unless ``PYSPARK_PYTHON`` names another.

    Spark's Python data-source planners (registering and reading the lake's
    formats) run their workers under ``pyspark.daemon``, whatever
    ``spark.python.daemon.module`` says. A minute after its last plan, Spark
    closes such an idle worker's socket and pyspark's daemon prints a
    ``BrokenPipeError`` traceback for it: three a minute into every ``lake
    stream``, though nothing failed. The launcher runs those daemons as
    :mod:`metrics_lake.spark.worker_daemon`, which ends the worker quietly.
    ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` (the planners use both)
    name the launcher, and ``LAKE_SPARK_PYTHON`` this interpreter, for this
    process and the JVM it starts (set again where they were inherited, the
    launcher's without this interpreter's). An interpreter set by the user (a packed
    virtualenv on a cluster's workers) is left alone, as is a launcher that
    lost its execute bit: Spark then starts this interpreter directly.
    """
    launcher = str(PYTHON_LAUNCHER)
    # A process started by one that built a session inherits PYSPARK_PYTHON, maybe without LAKE_SPARK_PYTHON.
    if os.environ.get("PYSPARK_PYTHON", launcher) == launcher and os.access(PYTHON_LAUNCHER, os.X_OK):
        os.environ["LAKE_SPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_PYTHON"] = launcher
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", launcher)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


#: The warm-up thread of each session this process built, by ``id(spark)``, for :func:`stop_session`.
_WARM_UPS: dict[int, threading.Thread] = {}


def stop_session(spark, timeout: float = 10.0) -> None:
    """Stop ``spark`` once its Python-worker warm-up job has ended (waiting up to ``timeout`` seconds).

    Stopping while the warm-up job runs makes Spark print a Java stack
    trace for the cancelled job, which would precede a failed query's
    one-line error.

    pyspark's accumulator server (the socket Spark's JVM sends accumulator
    updates to) is shut down in the background: its handler polls the JVM's
    connection once a second and ``shutdown()`` waits for that poll, so
    ``spark.stop()`` took 0.9-1.0 s here, of which the JVM's own stop was
    0.06-0.09 s, at the end of every command that used Spark. Call it only
    when nothing else in the process uses the session: without its
    accumulator server, every Python data source Spark plans afterwards
    fails ("EOF reached before Python server acknowledged", or "Python
    worker exited unexpectedly" when the JVM's write hits the closed socket).
    """
    warm_up = _WARM_UPS.pop(id(spark), None)
    if warm_up is not None:
        warm_up.join(timeout)
    context = spark.sparkContext
    accumulators, context._accumulatorServer = context._accumulatorServer, None  # stop() then leaves it alone
    spark.stop()
    if accumulators is not None:
        threading.Thread(target=accumulators.shutdown, name="accumulator-server-shutdown", daemon=True).start()


def _warm_up_python_workers(spark) -> None:
    """Start the Python worker daemon now, in the background.

    Spark starts it lazily, on the critical path of the first job that runs
    Python: the daemon imports pyarrow, pandas and the lake (about 1 s here,
    :mod:`metrics_lake.spark.worker_daemon`) before it can fork a worker.
    A one-task RDD job starts it while the session registers the data
    sources (Spark first searches the installed packages for Python data
    sources, about 1 s) and the caller plans its first job: an RDD job
    skips Spark SQL's planning, which on a fresh JVM took 0.5 s before a
    ``mapInArrow`` warm-up even asked for the daemon. Measured, ``lake
    recompute`` of a 13.8 M-event day, whole command, four alternating
    pairs: 8.1-10.7 s with the warm-up started before the registration,
    9.3-11.8 s after it. The job leaves the other cores to the caller's
    tasks. Failure is harmless (the first real job starts the daemon as
    usual).
    """
    try:
        spark.sparkContext.parallelize([0], 1).foreach(lambda _: None)
    except Exception as exc:  # noqa: BLE001 - an optimisation only
        logging.getLogger(__name__).debug("python worker warm-up failed: %s", exc)
