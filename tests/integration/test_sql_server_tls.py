"""``lake sql-server --tls-cert/--tls-key`` with the certificates of ``lake infra tls``: the analysts' page's TLS
blocks (Spark Connect, beeline, PyHive) run verbatim but for ports, paths and the token; a client trusting another CA,
or speaking plain text, fails its handshake and only its connection ends; a refused Connect client behind the TLS
listener is logged with its own address."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from metrics_lake.core.tokens import Scope, TokenStore, parse_token
from tests.helpers import free_port_block
from tests.integration.test_kill_restart import LAKE
from tests.integration.test_sql_server_tokens import docs_block, run_python, streamed_lake, wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def mint(directory: Path, env: dict[str, str]) -> dict[str, str]:
    """``lake infra tls --data-dir directory``: its ``export`` lines as a dict, plus the Java trust store's path."""
    minted = subprocess.run(
        [LAKE, "infra", "tls", "--data-dir", str(directory)], env=env, capture_output=True, text=True, timeout=60
    )
    assert minted.returncode == 0, minted.stderr
    exports = dict(re.findall(r"^export (\w+)=(\S+)$", minted.stdout, flags=re.M))
    assert "ca-truststore.p12, password changeit" in " ".join(minted.stderr.split())
    return {**exports, "LAKE_TRUSTSTORE": str(directory / "ca-truststore.p12")}


def test_both_listeners_serve_tls_to_the_documented_clients_and_a_wrong_ca_fails_only_its_connection(
    settings, log, store, tmp_path
):
    env, expected = streamed_lake(settings, log, store, seed=8)
    read, _ = TokenStore(store).create("ana", Scope.READ)
    tls = mint(tmp_path / "tls", env)
    other = mint(tmp_path / "other-ca", env)  # a CA the server's certificate does not chain to

    connect_port, jdbc_port = (base := free_port_block((0, 1), lowest=24000)), base + 1
    server_log = tmp_path / "sql-server.log"
    key_stores = set(Path(tempfile.gettempdir()).glob("lake-sql-server-tls-*"))
    with open(server_log, "wb") as output:
        server = subprocess.Popen(
            [LAKE, "sql-server", "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port)],
            env={**env, "LAKE_TLS_CERT": tls["LAKE_TLS_CERT"], "LAKE_TLS_KEY": tls["LAKE_TLS_KEY"]},
            stdout=subprocess.DEVNULL,
            stderr=output,
        )
    try:
        wait_for_text(server_log, "JDBC/ODBC (TLS)", server)
        flat = " ".join(server_log.read_text().split())
        assert f"sc://127.0.0.1:{connect_port}/;use_ssl=true" in flat
        assert f"jdbc:hive2://127.0.0.1:{jdbc_port}/default;ssl=true" in flat
        client_env = {
            **env,
            "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
            "LAKE_TOKEN_NAME": "ana",
            "LAKE_TOKEN": read,
        }

        def beeline(trust: dict[str, str], block: str = docs_block("bash", "over TLS: beeline")):
            command = block.replace("10000", str(jdbc_port))
            return subprocess.run(
                ["bash", "-c", command],
                env={**client_env, "LAKE_TRUSTSTORE": trust["LAKE_TRUSTSTORE"]},
                capture_output=True,
                text=True,
                timeout=180,
            )

        # beeline: the block with the right trust store, the wrong CA's, plain text; then the right one again.
        shown = beeline(tls)
        assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
        assert "bronze_events" in shown.stdout and "query_results" in shown.stdout
        untrusted = beeline(other)
        assert untrusted.returncode != 0
        assert "SSLHandshakeException" in untrusted.stderr and "PKIX path" in untrusted.stderr, untrusted.stderr[-2000:]
        plain = beeline(tls, docs_block("bash", "JDBC/ODBC (HiveServer2)"))
        assert plain.returncode != 0 and "Could not open client transport" in plain.stdout + plain.stderr
        assert beeline(tls).returncode == 0  # the failed handshakes ended only their own connections

        # PyHive over TLS: the block, then the same with the other CA.
        pyhive = docs_block("python", "PyHive over TLS").replace("10000", str(jdbc_port))
        counted = run_python(pyhive + "\nprint(cursor.fetchall()[0][0])", {**client_env, **tls})
        assert counted.returncode == 0 and counted.stdout.split() == [str(expected)], counted.stderr[-2000:]
        refused = run_python(pyhive, {**client_env, **other})
        # Thrift's socket reports no more than that it could not connect; the handshake's error is in its cause.
        assert refused.returncode != 0 and "Could not connect" in refused.stderr, refused.stderr[-2000:]

        # Spark Connect over TLS: the block; a wrong token is refused and logged with the client's address.
        connect = docs_block("python", "Spark Connect over TLS").replace("15002", str(connect_port))
        shown = run_python(
            connect + "\nprint(spark.sql('SELECT count(*) AS n FROM bronze_events').collect()[0].n)",
            {**client_env, **tls},
        )
        assert shown.returncode == 0 and shown.stdout.split()[-1] == str(expected), shown.stderr[-3000:]

        # A plain-text gRPC client (its HTTP/2 preface) on the TLS listener: the handshake fails, the connection
        # is closed, and the server serves the next client. (Spark's Connect client would retry for minutes.)
        with socket.create_connection(("127.0.0.1", connect_port), timeout=15) as plain:
            plain.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(64))
            assert plain.recv(4096) == b""
        denied = run_python(connect, {**client_env, **tls, "LAKE_TOKEN": read[:-4] + "AAAA"})
        assert denied.returncode != 0 and "UNAUTHENTICATED" in denied.stderr, denied.stderr[-2000:]
        text = " ".join(re.sub(r"sql_server\.py:\d+", "", server_log.read_text(errors="replace")).split())
        assert "refused a connect client from 127.0.0.1: wrong secret for token 'ana'" in text, text[-3000:]
        assert parse_token(read)[1] not in text.replace(" ", "")
    finally:
        children = psutil.Process(server.pid).children(recursive=True)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        psutil.wait_procs(children, timeout=30)
    assert set(Path(tempfile.gettempdir()).glob("lake-sql-server-tls-*")) <= key_stores  # its key store is gone
