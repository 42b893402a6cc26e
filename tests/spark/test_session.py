"""The SparkSession every lake job uses: the driver JVM gets the configured options."""

from __future__ import annotations

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
