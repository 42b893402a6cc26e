"""What ``lake sql-server`` does before it serves: its JVM options, the warm-up of the query path, Connect's TLS server."""

from __future__ import annotations

import socket
import ssl
import tempfile
from pathlib import Path

import pytest

from metrics_lake.core.config import load_settings
from metrics_lake.infra.tls import write_ca, write_certificate
from metrics_lake.lake_schemas.errors import ServiceError
from metrics_lake.spark.catalog import register_lake_tables
from metrics_lake.spark.jobs.sql_server import server_settings, warm_up
from metrics_lake.spark.sql_server_tls import handshake_with, start_connect_tls, warm_up_tls, write_keystore
from tests.spark.test_sql_query import produce_and_stream


def test_the_server_runs_javas_default_jit_unless_the_user_chose_options(monkeypatch, tmp_path):
    monkeypatch.delenv("LAKE_SPARK_DRIVER_JAVA_OPTIONS", raising=False)
    default = load_settings(root=str(tmp_path))
    assert default.spark_driver_java_options == "-XX:TieredStopAtLevel=1"  # short jobs keep C1 only
    assert server_settings(default).spark_driver_java_options == ""
    assert server_settings(default).root == default.root
    monkeypatch.setenv("LAKE_SPARK_DRIVER_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -Xss4m")
    chosen = load_settings(root=str(tmp_path))
    assert server_settings(chosen).spark_driver_java_options == "-XX:TieredStopAtLevel=1 -Xss4m"


@pytest.mark.spark
def test_warm_up_runs_in_a_session_of_its_own_and_leaves_nothing(spark, settings, log):
    produce_and_stream(spark, settings, log, 1, servers=4)
    names = register_lake_tables(spark, settings)
    before = spark.conf.get("spark.sql.sources.useV1SourceList")
    leftovers = set(Path(tempfile.gettempdir()).glob("lake-sql-warm-up-*"))

    assert 0 < warm_up(spark, names, rounds=1) < 120

    assert "warm_up" not in {row.tableName for row in spark.sql("SHOW TABLES").collect()}
    assert spark.conf.get("spark.sql.sources.useV1SourceList") == before  # the V2 switch stayed in its session
    assert set(Path(tempfile.gettempdir()).glob("lake-sql-warm-up-*")) == leftovers  # its scratch file is gone
    assert spark.sql("SELECT count(*) FROM bronze_events").collect()[0][0] > 0  # the lake tables still answer


@pytest.mark.spark
def test_connects_tls_server_offers_h2_with_the_key_stores_certificate_and_a_taken_port_is_one_clear_error(
    spark, tmp_path
):
    ca = write_ca(tmp_path / "ca", "test CA")
    cert, key = write_certificate(ca, tmp_path, "server", ["127.0.0.1"])
    keystore = write_keystore(cert, key, tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_connect_tls(spark._jvm, "127.0.0.1", port, keystore)
    try:
        context = ssl.create_default_context(cafile=ca[0])
        context.set_alpn_protocols(["h2"])  # what gRPC clients offer, and require back
        with (
            socket.create_connection(("127.0.0.1", port), timeout=15) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.selected_alpn_protocol() == "h2"
            assert tls.getpeercert()["subject"] == ((("commonName", "127.0.0.1"),),)
        with pytest.raises(ServiceError, match=rf"TLS listener on 127\.0\.0\.1:{port} cannot start: .*in use"):
            start_connect_tls(spark._jvm, "127.0.0.1", port, keystore)
    finally:
        server.shutdownNow()


@pytest.mark.spark
def test_the_tls_warm_up_completes_handshakes_with_the_key_store_and_refuses_a_wrong_password(spark, tmp_path):
    from py4j.protocol import Py4JJavaError

    ca = write_ca(tmp_path / "ca", "test CA")
    cert, key = write_certificate(ca, tmp_path, "server", ["127.0.0.1"])
    path, password = write_keystore(cert, key, tmp_path)
    handshakes = warm_up_tls(spark._jvm, (path, password), rounds=5)
    assert len(handshakes) == 5 and all(ms > 0 for ms in handshakes)
    with pytest.raises(Py4JJavaError, match="password"):
        warm_up_tls(spark._jvm, (path, password + "x"), rounds=1)


def test_a_handshake_with_a_listener_completes_and_a_listener_that_never_comes_is_an_os_error(tmp_path):
    import threading

    ca = write_ca(tmp_path / "ca", "test CA")
    cert, key = write_certificate(ca, tmp_path, "server", ["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handshakes = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve_one() -> None:
            connection, _ = listener.accept()
            with context.wrap_socket(connection, server_side=True) as tls:
                handshakes.append(tls.version())

        server = threading.Thread(target=serve_one)
        server.start()
        assert handshake_with("0.0.0.0", listener.getsockname()[1]) > 0  # a wildcard address: the loopback's
        server.join(10)
    assert handshakes and handshakes[0].startswith("TLS")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        handshake_with("127.0.0.1", closed, wait_s=0.5)
