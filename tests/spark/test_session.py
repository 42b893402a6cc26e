"""The SparkSession every lake job uses: the driver JVM gets the configured options."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pyarrow as pa

from metrics_lake.core.config import LakeSettings


def _vm_option(spark, name: str) -> str:
    """The driver JVM's effective value of the HotSpot option ``name`` (as the JVM reports it)."""
    jvm = spark.sparkContext._jvm
    bean_class = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    return jvm.java.lang.management.ManagementFactory.getPlatformMXBean(bean_class).getVMOption(name).getValue()


def test_driver_jvm_compiles_with_c1_only_by_default(spark):
    assert LakeSettings.model_fields["spark_driver_java_options"].default == "-XX:TieredStopAtLevel=1"
    assert _vm_option(spark, "TieredStopAtLevel") == "1"  # Java's default is 4 (C2)
    arguments = list(
        spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    assert "-XX:TieredStopAtLevel=1" in arguments
    assert any(a.startswith("-Dlog4j2.configurationFile=") for a in arguments)  # the lake's own options are kept


def test_the_driver_jvm_runs_in_a_session_of_its_own_started_with_the_sessions_settings(spark):
    """A signal to the driver's process group (``timeout``, Airflow stopping a task) does not reach the JVM, which
    build_session launches itself: with the settings pyspark would have given it on the command line."""
    from metrics_lake.spark.session import driver_jvm_exited

    (jvm,) = [child for child in psutil.Process().children() if child.name() == "java"]
    assert os.getsid(jvm.pid) == jvm.pid != os.getsid(0)
    assert "-Xmx2g" in jvm.cmdline()  # spark.driver.memory, read by spark-submit when it starts the JVM
    assert not driver_jvm_exited(wait=0)


def test_streaming_checkpoints_are_written_by_a_class_this_spark_has(spark):
    from metrics_lake.spark.session import CHECKPOINT_FILE_MANAGER

    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == CHECKPOINT_FILE_MANAGER
    loaded = spark.sparkContext._jvm.java.lang.Class.forName(CHECKPOINT_FILE_MANAGER)  # another Spark may move it
    assert loaded.getName() == CHECKPOINT_FILE_MANAGER


def test_rdd_and_sql_python_tasks_fork_from_the_one_preloaded_daemon(spark):
    """The warm-up (an RDD job) starts the daemon that SQL's Arrow tasks then use: one daemon, ours."""

    def parent_of_rdd_worker(_):
        yield os.getppid()

    def parent_of_arrow_worker(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"ppid": os.getppid()}])

    rdd = set(spark.sparkContext.parallelize([0, 1], 2).mapPartitions(parent_of_rdd_worker).collect())
    sql = {
        row.ppid
        for row in spark.range(0, 2, 1, numPartitions=2).mapInArrow(parent_of_arrow_worker, "ppid long").collect()
    }
    assert rdd == sql and len(sql) == 1
    daemon = psutil.Process(sql.pop())
    assert "metrics_lake.spark.worker_daemon" in daemon.cmdline()


def test_python_workers_allocate_arrow_buffers_from_the_system_allocator(spark):
    """The worker daemon sets Arrow's pools (Python's and, before importing pyarrow, C++'s) and malloc's reuse of
    large blocks before it forks (metrics_lake.core.arrow_memory): every task has all three; a Parquet write, whose
    buffers come from Arrow's C++ default pool, takes nothing from mimalloc."""

    def memory_of_worker(_):
        import ctypes
        import ctypes.util
        import io

        import pyarrow.parquet as pq

        pq.write_table(pa.table({"x": pa.array(range(100_000))}), io.BytesIO())

        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
        block = libc.malloc(64 << 20)
        placed = "heap" if block < libc.sbrk(0) else "mapped"
        yield pa.default_memory_pool().backend_name, placed, pa.mimalloc_memory_pool().max_memory()
        libc.free(block)

    workers = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(memory_of_worker).collect()
    assert set(workers) == {("system", "heap", 0)}


def test_python_workers_leave_the_daemons_imports_out_of_garbage_collection(spark):
    """The daemon freezes what it imported before it forks (metrics_lake.spark.worker_daemon): a worker's full
    collection does not walk the modules' objects, and collecting leaves them frozen."""

    def frozen_in_worker(_):
        import gc

        gc.collect()
        yield gc.get_freeze_count(), "pyarrow.parquet" in sys.modules

    workers = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(frozen_in_worker).collect()
    assert len(workers) == 2
    assert all(count > 50_000 and preloaded for count, preloaded in workers), workers


#: Two sessions one after the other in a process of its own (the suite's session stays up): each counts with an
#: accumulator, and stop_session leaves the accumulator server's shutdown to a thread that ends on its own.
STOP_TWICE = """
import os, sys, threading, time
from metrics_lake.core.config import load_settings
from metrics_lake.spark.session import build_session, stop_session
settings = load_settings(root=sys.argv[1], spark_master="local[2]")
for n in (3, 4):
    spark = build_session(settings, "stop-test", data_sources=False)
    counted = spark.sparkContext.accumulator(0)
    spark.sparkContext.parallelize(range(n), 2).foreach(lambda x: counted.add(1))
    server = spark.sparkContext._accumulatorServer
    stop_session(spark)
    print(counted.value)
deadline = time.monotonic() + 10
while any(t.name == "accumulator-server-shutdown" for t in threading.enumerate()) and time.monotonic() < deadline:
    time.sleep(0.1)
print(server.socket.fileno() == -1, [t.name for t in threading.enumerate() if t.name == "accumulator-server-shutdown"])
"""


def test_stopping_a_session_leaves_the_accumulator_server_to_a_thread_that_closes_it(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", STOP_TWICE, str(tmp_path / "lake")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:3] == ["3", "4", "True []"]


def test_spark_starts_every_python_daemon_as_the_lake_daemon_module(spark, settings):
    """Spark's data-source planners (lookup at registration, create and plan at a read) run their workers under
    ``pyspark.daemon`` whatever spark.python.daemon.module says; through the launcher every daemon the driver JVM
    started is the lake's module, and only the task workers' one imported the lake (the planners' stay light)."""
    from metrics_lake.spark.jobs.stream_metrics import prepare_lake
    from metrics_lake.spark.session import PYTHON_LAUNCHER

    assert os.environ["PYSPARK_PYTHON"] == str(PYTHON_LAUNCHER) and os.environ["LAKE_SPARK_PYTHON"] == sys.executable
    prepare_lake(settings)
    reader = spark.read.format("lakedelta").option("root", settings.root).option("table", "servers")
    assert reader.load().count() == 0  # creates and plans a read of the Python data source
    jvm = psutil.Process(spark.sparkContext._gateway.proc.pid)
    daemons, arrow = {}, {}  # worker module -> the module the daemon runs as / whether it has pyarrow loaded
    for child in jvm.children():  # daemons are the JVM's children; their forked workers are theirs
        try:
            command = child.cmdline()
            if "-m" in command:
                daemons[command[-1]] = command[command.index("-m") + 1]
                arrow[command[-1]] = any("libarrow" in m.path for m in child.memory_maps())
        except psutil.Error:  # a worker that exited meanwhile (another test's)
            continue
    assert daemons["pyspark.worker"] == "metrics_lake.spark.worker_daemon" and arrow["pyspark.worker"]
    planners = {worker for worker in daemons if worker.startswith("pyspark.sql.worker.")}
    assert {"pyspark.sql.worker.lookup_data_sources", "pyspark.sql.worker.create_data_source"} <= planners
    assert {daemons[worker] for worker in planners} == {"metrics_lake.spark.worker_daemon"}
    assert not any(arrow[worker] for worker in planners)  # the task modules are imported for task workers only


def test_a_module_in_the_working_directory_does_not_shadow_the_standard_librarys_in_sparks_python_processes(tmp_path):
    """Spark starts its Python daemons with ``-m`` in the driver's working directory, which Python puts first on
    sys.path: a ``grp.py`` there (``tarfile``, imported by pandas, imports ``grp``) broke every task worker."""
    from metrics_lake.spark.session import PYTHON_LAUNCHER

    (tmp_path / "grp.py").write_text("raise SystemExit('the grp.py of the working directory was imported')\n")
    plain = subprocess.run([sys.executable, "-c", "import grp"], cwd=tmp_path, capture_output=True, text=True)
    assert "working directory" in plain.stderr  # without the launcher, it is
    env = {**os.environ, "LAKE_SPARK_PYTHON": sys.executable}
    for args in (["-c", "import grp; print(grp.__file__)"], ["-m", "tarfile", "--help"]):  # as Spark runs daemons
        run = subprocess.run([str(PYTHON_LAUNCHER), *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        assert str(tmp_path) not in run.stdout


QUIET_WORKER = """
import os, socket, sys
os.environ["PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE"] = "1"  # as Spark sets it
sys.argv[1:] = ["pyspark.sql.worker.plan_data_source_read"]  # the daemon's argument: a planner's worker
from pyspark import daemon
from metrics_lake.spark import worker_daemon
ours, spark_end = socket.socketpair()
spark_end.close()  # Spark closed an idle pooled worker's socket
run = worker_daemon.worker if os.environ["WHICH"] == "lake" else daemon.worker
print("exit code", run(ours, True))
"""


def test_a_worker_whose_socket_spark_closed_ends_without_a_traceback():
    """pyspark's daemon prints a BrokenPipeError traceback for a worker that finds its socket closed (Spark closes
    idle workers' after a minute); the lake's daemon ends it with exit code 1 and prints nothing."""
    runs = {
        which: subprocess.run(
            [sys.executable, "-c", QUIET_WORKER], env={**os.environ, "WHICH": which}, capture_output=True, text=True
        )
        for which in ("pyspark", "lake")
    }
    assert runs["pyspark"].returncode != 0 and "BrokenPipeError" in runs["pyspark"].stderr  # the noise, reproduced
    assert runs["lake"].returncode == 0, runs["lake"].stderr
    assert runs["lake"].stdout == "exit code 1\n" and runs["lake"].stderr == ""


#: A session whose JVM is killed (as the kernel's OOM killer would): the next call into Spark fails, and the
#: command line's boundary names the cause instead of reporting a bug.
JVM_KILLED = """
import sys
from metrics_lake.app.cli.boundary import explain
from metrics_lake.core.config import load_settings
from metrics_lake.spark import session
spark = session.build_session(load_settings(root=sys.argv[1], spark_master="local[1]"), "killed", data_sources=False)
print(explain(ConnectionRefusedError(111, "Connection refused")))  # the JVM is alive: someone else refused
spark.sparkContext._gateway.proc.kill()
try:
    spark.sparkContext.parallelize([1, 2], 1).count()
except Exception as exc:
    print(explain(exc))
"""


def test_a_call_into_a_jvm_that_was_killed_is_explained_as_such_not_as_a_bug(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", JVM_KILLED, str(tmp_path / "lake")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    alive, killed = run.stdout.splitlines()[-2:]
    assert alive == "None"
    assert killed.startswith("(\"Spark's driver JVM exited unexpectedly") and killed.endswith(", 2)")
