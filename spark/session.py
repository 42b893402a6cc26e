"""Build the SparkSession every lake job uses, with the lake's data sources registered.

Settings that matter for correctness: the session time zone is UTC (event
time and window boundaries are UTC everywhere), and Python workers run the
same interpreter as the driver so they can import the lake's packages.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from metrics_lake.core.config import LakeSettings

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")


def build_session(settings: LakeSettings, app_name: str = "metrics-lake"):
    """Create (or reuse) a SparkSession for ``settings`` and register the lake data sources.

    Registered formats: ``lakelog`` (streaming reader over the segment log),
    ``lakedelta`` (batch reader over a Delta snapshot) and
    ``lakebronze`` (streaming Delta sink for bronze and quarantine).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if settings.spark_master.startswith("local"):
        # A local session has no business on any interface but loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.sql import SparkSession

    from metrics_lake.spark.readers.delta_reader import DeltaSnapshotDataSource
    from metrics_lake.spark.sinks.delta_sink import BronzeDeltaDataSource
    from metrics_lake.spark.sources.log_source import LogDataSource

    spark = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    for source in (LogDataSource, DeltaSnapshotDataSource, BronzeDeltaDataSource):
        spark.dataSource.register(source)
    return spark
