"""``lake sql-server``: one long-lived Spark application serving the lake to Spark Connect and JDBC/ODBC clients.

- **Spark Connect** (gRPC, default port 15002): Spark's own plugin
  (``org.apache.spark.sql.connect.SparkConnectPlugin``), for notebooks
  with ``SparkSession.builder.remote("sc://host:15002")``.
- **Thrift / HiveServer2** (default port 10000): Spark's Thrift server
  (``HiveThriftServer2.startWithContext``), for beeline, DBeaver,
  Superset or PyHive (``jdbc:hive2://host:10000/default``).

Both jars ship with pyspark. Every client session sees every lake table in
``default`` (:mod:`metrics_lake.spark.catalog`), read at its latest
snapshot when each query is planned; tables created after the start are
added within :data:`REFRESH_SECONDS`. The lake tables are read-only (their
data source has no writer); a client's own tables and views live in its
session. A query reaches Spark without a new application: the first row
costs planning and tasks only.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable

from metrics_lake.core.config import LakeSettings
from metrics_lake.spark.catalog import register_lake_tables
from metrics_lake.spark.session import build_session, stop_session

__all__ = ["REFRESH_SECONDS", "serve_sql"]

log = logging.getLogger(__name__)
#: How often new lake tables are looked for.
REFRESH_SECONDS = 5.0


def listener_config(host: str, connect_port: int, jdbc_port: int) -> dict[str, str]:
    """Spark settings for the Connect plugin and the Thrift server, bound to ``host``."""
    return {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(connect_port),
        "spark.hadoop.hive.server2.thrift.bind.host": host,
        "spark.hadoop.hive.server2.thrift.port": str(jdbc_port),
    }


def serve_sql(
    settings: LakeSettings,
    *,
    host: str,
    connect_port: int,
    jdbc_port: int,
    ready: Callable[[list[str]], None],
    stop: threading.Event | None = None,
) -> None:
    """Serve the lake on ``host``: Spark Connect on ``connect_port``, JDBC on ``jdbc_port``, until SIGINT/SIGTERM.

    ``ready`` gets the table names once both listeners accept connections.
    Stopping stops the Thrift server and the Spark application (its JVM and
    Python workers with it). ``stop``, if given, ends serving when set.
    """
    stop = stop or threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    spark = build_session(settings, "lake-sql-server", extra_config=listener_config(host, connect_port, jdbc_port))
    thrift = None
    try:
        names = register_lake_tables(spark, settings, shared=True)
        # The Thrift server boots an embedded Derby for Hive's execution client; its derby.log would land in the
        # working directory.
        spark._jvm.java.lang.System.setProperty("derby.stream.error.file", os.devnull)
        thrift = spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
            spark._jsparkSession.sqlContext()
        )
        ready(names)
        while not stop.wait(REFRESH_SECONDS):
            try:
                register_lake_tables(spark, settings, shared=True)
            except Exception as exc:  # noqa: BLE001 - the store may be briefly unreachable: keep serving
                log.warning("looking for new lake tables failed: %s", exc)
    finally:
        if thrift is not None:
            thrift.stop()
        stop_session(spark)
