"""The SparkSession every lake job uses: the driver JVM gets the configured options."""

from __future__ import annotations

import os

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
    """The worker daemon sets Arrow's pool before it forks (metrics_lake.core.arrow_memory): every task uses it."""

    def pool_of_worker(_):
        yield pa.default_memory_pool().backend_name

    assert set(spark.sparkContext.parallelize([0, 1], 2).mapPartitions(pool_of_worker).collect()) == {"system"}
