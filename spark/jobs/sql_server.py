"""``lake sql-server``: one long-lived Spark application serving the lake to Spark Connect and JDBC/ODBC clients.

- **Spark Connect** (gRPC, default port 15002): Spark's own plugin
  (``org.apache.spark.sql.connect.SparkConnectPlugin``), for notebooks
  with ``SparkSession.builder.remote("sc://host:15002")``.
- **Thrift / HiveServer2** (default port 10000): Spark's Thrift server
  (``HiveThriftServer2.startWithContext``), for beeline, DBeaver,
  Superset or PyHive (``jdbc:hive2://host:10000/default``).

Both jars ship with pyspark. Both listeners check the lake's tokens
(:class:`CredentialChecker`): Connect every call (``authorization: Bearer
<token>``, what ``sc://host:15002/;token=...`` sends), HiveServer2 every
session it opens (``CUSTOM`` authentication: user the token's name,
password the token). Every client session sees every lake table in
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
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.errors import TokenError
from metrics_lake.spark.catalog import register_lake_tables
from metrics_lake.spark.session import build_session, stop_session
from metrics_lake.spark.sql_audit import AuditWriter
from metrics_lake.spark.sql_server_tls import handshake_with, start_connect_tls, warm_up_tls, write_keystore

__all__ = ["REFRESH_SECONDS", "CredentialChecker", "serve_sql", "server_settings", "warm_up"]

log = logging.getLogger(__name__)
#: How often new lake tables are looked for.
REFRESH_SECONDS = 5.0
#: Follows both servers' statements into ``sql_audit`` (:mod:`metrics_lake.spark.sql_audit`).
AUDIT_LISTENER = "metricslake.spark.LakeAudit"
#: Limits a read token created with ``--servers`` to its servers' rows (``LakeRowScope.java``).
ROW_SCOPE_EXTENSIONS = "metricslake.spark.LakeExtensions"
#: HiveServer2's ``CUSTOM`` authentication: the lake's tokens as passwords.
PASSWORD_PROVIDER = "metricslake.spark.LakePasswdAuthenticationProvider"
#: TLS handshakes made with HiveServer2's own listener at start, after the JVM's TLS warm-up
#: (:func:`~metrics_lake.spark.sql_server_tls.handshake_with`): measured, they took 26-41, 5-9 and 10-14 ms, and
#: a client's first then 7-10 ms (20-25 ms after one).
LISTENER_HANDSHAKES = 3
#: The query shapes :func:`warm_up` runs: analysts' usual filtered aggregate, per-window series and top N.
WARM_UP_QUERIES = (
    "SELECT count(*), avg(value), max(value) FROM warm_up WHERE metric = 'm1' AND server = 's-7'",
    "SELECT window_start, max(value) FROM warm_up WHERE metric = 'm1' GROUP BY window_start ORDER BY window_start",
    "SELECT server, max(value) AS peak FROM warm_up WHERE metric = 'm2' GROUP BY server "
    "ORDER BY peak DESC, server LIMIT 10",
)


def listener_config(
    host: str, connect_port: int, jdbc_port: int, keystore: tuple[Path, str] | None = None
) -> dict[str, str]:
    """Spark settings for the Connect plugin and the Thrift server, bound to ``host``, both checking tokens through
    the lake's JVM classes (``spark/jvm/metricslake/spark/LakeAuth.java``).

    ``keystore`` (path, password): HiveServer2 serves TLS from it, and the Connect plugin's plain-text gRPC server
    listens on ``127.0.0.1:connect_port`` only (the public port is the TLS server of
    :func:`~metrics_lake.spark.sql_server_tls.start_connect_tls`)."""
    config = {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": host if keystore is None else "127.0.0.1",
        "spark.connect.grpc.binding.port": str(connect_port),
        "spark.connect.grpc.interceptor.classes": "metricslake.spark.LakeConnectAuthInterceptor",
        "spark.hadoop.hive.server2.thrift.bind.host": host,
        "spark.hadoop.hive.server2.thrift.port": str(jdbc_port),
        "spark.hadoop.hive.server2.authentication": "CUSTOM",
        "spark.extraListeners": AUDIT_LISTENER,
        "spark.sql.extensions": ROW_SCOPE_EXTENSIONS,
    }
    if keystore is not None:
        config |= {
            "spark.hadoop.hive.server2.use.SSL": "true",
            "spark.hadoop.hive.server2.keystore.path": str(keystore[0]),
            "spark.hadoop.hive.server2.keystore.password": keystore[1],
        }
    return config


class CredentialChecker:
    """Answers ``metricslake.spark.LakeAuth.Checker.check`` for both listeners, through py4j's callback server.

    ``scope_of(caller)``: what a caller may read (:meth:`scopeOf`: the
    row scope and the admin-only tables). ``authenticate(credential, address)`` returns the caller's name if
    ``credential`` (a token, or None) may read the lake, and raises
    :class:`~metrics_lake.lake_schemas.errors.TokenError` (401, 403, 429)
    otherwise; ``address`` is the client's host, what failures are counted
    against, or None where it is not known: HiveServer2 checks a login
    before it records the client's address, so JDBC failures are logged and
    counted but throttle no address. Every refusal is logged with the
    client's kind and address (when known), never the token.
    """

    class Java:
        implements = ["metricslake.spark.LakeAuth$Checker"]

    def __init__(
        self,
        authenticate: Callable[[str | None, str | None], str],
        scope_of: Callable[[str], str | None] = lambda caller: "admin",
    ) -> None:
        self.authenticate = authenticate
        self.scope_of = scope_of

    def scopeOf(self, caller: str) -> str | None:  # noqa: N802 - the Java interface's name
        """``admin``, ``read`` or ``read:<glob>`` for ``caller``; None when it has no active token (the Java
        contract: its statements are refused; a failed lookup is None too, logged)."""
        try:
            return self.scope_of(caller)
        except Exception:  # a bug or the store: the statement is refused rather than run with every row
            log.exception("looking up what token %r may read failed", caller)
            return None

    def check(self, credential: str | None, user: str | None, source: str, client: str) -> str:
        """``ok:<caller>`` or ``<status>:<message>`` (the Java interface's contract); never raises.

        ``user``: a JDBC login's user name, which must be the token's name (the JDBC session's statements are
        audited under it: :mod:`metrics_lake.spark.sql_audit`); None for Spark Connect."""
        address = source.rsplit(":", 1)[0] if client == "connect" else source  # Connect's source is host:port
        known = None if address == "unknown" else address
        try:
            caller = self.authenticate(credential, known)
            if user is not None and user != caller and caller != "anonymous":  # the audit names the login
                raise TokenError(401, f"the user name must be the token's name ({caller})")
            return f"ok:{caller}"
        except TokenError as error:
            log.warning("refused a %s client from %s: %s", client, address if known else "an unknown address", error)
            return f"{error.status}:{error}"
        except Exception as error:  # a bug or the store: still an answer, or the client would wait on a dead callback
            log.exception("checking a %s client's token from %s failed", client, address)
            return f"503:the token check failed on the server ({type(error).__name__}); its log says why"


def _install_checker(spark, checker: CredentialChecker) -> None:
    """Let ``spark``'s listeners check credentials with ``checker`` (through py4j's callback server)."""
    from pyspark.java_gateway import ensure_callback_server_started

    ensure_callback_server_started(spark.sparkContext._gateway)
    spark._jvm.metricslake.spark.LakeAuth.install(checker)


def server_settings(settings: LakeSettings) -> LakeSettings:
    """``settings`` as the server runs them: the driver JVM with Java's default JIT unless the user chose options.

    The lake's default driver options stop HotSpot at C1, which suits
    short jobs (spark/session.py). A server answers the same query shapes
    for hours, and C2's optimised code pays back there: on a 60 M-event
    lake the top-10-servers query took 0.32 s warm with C2, 0.57 s with C1
    only; the small queries were within noise (0.15-0.19 s either way).
    ``LAKE_SPARK_DRIVER_JAVA_OPTIONS``, when set, is kept as it is.
    """
    if "spark_driver_java_options" in settings.model_fields_set:
        return settings
    return settings.model_copy(update={"spark_driver_java_options": ""})


def warm_up(spark, tables: list[str], rounds: int = 3) -> float:
    """Run :data:`WARM_UP_QUERIES` ``rounds`` times on a scratch Parquet file; returns the seconds it took.

    A fresh JVM answers its first query in 1.2-1.5 s more than a warm one
    (class loading, code generation, the JIT), so without this the first
    client of a new server waited that long (measured on a 60 M-event lake:
    first Connect query 1.40-1.53 s without it, 0.60-0.99 s with it; the
    next client's first 0.22 s). The file
    (100 k rows, 2 MiB at most) is read by Spark's DataSource V2 Parquet
    scan, the reader of the lake's native tables, in a session of its own
    that is dropped afterwards; clients never see it.
    """
    started = time.perf_counter()
    rows = 100_000
    scratch = pa.table(
        {
            "server": pa.array([f"s-{i % 100}" for i in range(rows)]),
            "metric": pa.array([f"m{i % 10}" for i in range(rows)]),
            "window_start": pa.array([i // 1000 * 60_000_000 for i in range(rows)], pa.timestamp("us", "UTC")),
            "value": pa.array([float(i % 997) for i in range(rows)]),
        }
    )
    with tempfile.TemporaryDirectory(prefix="lake-sql-warm-up-") as folder:
        pq.write_table(scratch, f"{folder}/part-0.parquet")
        session = spark.newSession()
        # Parquet through DataSource V2, as the lake tables' LakeTable reads it (V1 is Spark's default for files).
        session.conf.set("spark.sql.sources.useV1SourceList", "")
        session.read.parquet(folder).createOrReplaceTempView("warm_up")
        for _ in range(rounds):
            for query in WARM_UP_QUERIES:
                session.sql(query).toArrow()  # Arrow batches, as Spark Connect answers
        for name in tables:
            # Planning only: the lake catalog's table, its snapshot and its file listing (no file is read).
            session.sql(f"SELECT count(*) FROM `{name}`")._jdf.queryExecution().executedPlan()
    return time.perf_counter() - started


def serve_sql(
    settings: LakeSettings,
    *,
    host: str,
    connect_port: int,
    jdbc_port: int,
    ready: Callable[[list[str]], None],
    authenticate: Callable[[str | None, str | None], str],
    stop: threading.Event | None = None,
    tls: tuple[Path, Path] | None = None,
    verbose: bool = False,
    scope_of: Callable[[str], str | None] = lambda caller: "admin",
) -> None:
    """Serve the lake on ``host``: Spark Connect on ``connect_port``, JDBC on ``jdbc_port``, until SIGINT/SIGTERM.

    ``ready`` gets the table names once both listeners accept connections.
    ``authenticate`` checks every client's token (:class:`CredentialChecker`);
    until it is installed, right after Spark starts, clients are refused.
    ``scope_of(caller)`` says what a token reads (``admin``; ``read``;
    ``read:<glob>``: its servers' rows of every lake table with a ``server``
    column; None: no active token, its statements are refused), enforced in
    its statements' plans (``LakeRowScope.java``); ``sql_audit`` is an
    admin token's only.
    ``tls`` (PEM certificate chain, key): both listeners serve TLS only
    (:mod:`metrics_lake.spark.sql_server_tls`). Every statement is recorded
    in ``sql_audit`` (:class:`~metrics_lake.spark.sql_audit.AuditWriter`;
    ``verbose``: also logged, one line each). Stopping writes the audit's last statements, then stops the Thrift
    server and the Spark application (its JVM and Python workers with it).
    ``stop``, if given, ends serving when set.
    """
    stop = stop or threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    settings = server_settings(settings)
    keystore = secrets_dir = None
    grpc_port = connect_port
    if tls is not None:  # the key store's folder: 0700, removed when serving ends (or at exit, if Spark fails)
        secrets_dir = tempfile.TemporaryDirectory(prefix="lake-sql-server-tls-")
        keystore = write_keystore(tls[0], tls[1], Path(secrets_dir.name))
        grpc_port = free_loopback_port()
    config = listener_config(host, grpc_port, jdbc_port, keystore)
    spark = build_session(settings, "lake-sql-server", extra_config=config)
    thrift = connect_tls = None
    checker = CredentialChecker(authenticate, scope_of)  # referenced here while the JVM holds it through py4j
    audit = AuditWriter(open_store(settings), spark._jvm, verbose=verbose)
    try:
        _install_checker(spark, checker)
        audit.start()
        names = register_lake_tables(spark, settings, shared=True)
        try:
            log.info("warmed up the query path in %.1f s", warm_up(spark, names))
        except Exception as exc:  # noqa: BLE001 - only the first query's speed depends on it: serve anyway
            log.warning("warming up the query path failed (the first query will be slower): %s", exc)
        # The Thrift server boots an embedded Derby for Hive's execution client; its derby.log would land in the
        # working directory.
        spark._jvm.java.lang.System.setProperty("derby.stream.error.file", os.devnull)
        # Hive makes its password provider from a new HiveConf (system properties over hive-site.xml), not the
        # server's configuration.
        spark._jvm.java.lang.System.setProperty("hive.server2.custom.authentication.class", PASSWORD_PROVIDER)
        thrift = spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
            spark._jsparkSession.sqlContext()
        )
        if keystore is not None:
            connect_tls = start_connect_tls(spark._jvm, host, connect_port, keystore)
            try:
                handshakes = warm_up_tls(spark._jvm, keystore)
                jdbc_ms = [handshake_with(host, jdbc_port) for _ in range(LISTENER_HANDSHAKES)]
                log.info(
                    "warmed up TLS: %d handshakes in %.1f s, then %d with the JDBC listener (%s ms)",
                    len(handshakes),
                    sum(handshakes) / 1000,
                    len(jdbc_ms),
                    ", ".join(f"{ms:.0f}" for ms in jdbc_ms),
                )
            except Exception as exc:  # noqa: BLE001 - only the first TLS connection's speed depends on it
                log.warning("warming up TLS failed (the first TLS connection will be slower): %s", exc)
        ready(names)
        while not stop.wait(REFRESH_SECONDS):
            try:
                register_lake_tables(spark, settings, shared=True)
            except Exception as exc:  # noqa: BLE001 - the store may be briefly unreachable: keep serving
                log.warning("looking for new lake tables failed: %s", exc)
    finally:
        try:
            if connect_tls is not None:
                connect_tls.shutdownNow()
            if thrift is not None:
                thrift.stop()
            try:
                audit.stop()
            except Exception as exc:  # noqa: BLE001 - stopping goes on; the log names what was not written
                log.error("writing the SQL audit's last statements failed: %s", exc)
            stop_session(spark)
        finally:
            if secrets_dir is not None:
                secrets_dir.cleanup()


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (the operating system's choice), for a listener only this host reaches."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
