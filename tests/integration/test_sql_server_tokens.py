"""``lake sql-server`` behind the lake's tokens, with the clients analysts use: the analysts' page's beeline, PyHive and
Spark Connect blocks run verbatim (port and token substituted), and a JDBC program on the Hive JDBC driver of
pyspark's jars (what DBeaver loads). Each is tried with no token, a wrong one, a write token, a read token and an
admin token; a revoked token stops a Connect session at its next statement; refusals are logged with the
client's address and never the token; a routable ``--host`` is refused at start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.delta import open_table
from metrics_lake.core.tokens import Scope, TokenStore, parse_token
from tests.helpers import free_port_block
from tests.integration.test_kill_restart import LAKE, lake_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SPARK_JARS = Path(__import__("pyspark").__file__).parent / "jars"
#: A JDBC program as DBeaver runs one: the Hive driver from pyspark's jars, user and password per connection.
#: argv: url, sql, then user/password pairs; prints one JSON line per pair: the count or the error.
JDBC_PROGRAM = """
import java.sql.*;

public class LakeJdbc {
    public static void main(String[] args) throws Exception {
        Class.forName("org.apache.hive.jdbc.HiveDriver");
        for (int i = 2; i + 1 < args.length; i += 2) {
            try (Connection c = DriverManager.getConnection(args[0], args[i], args[i + 1]);
                 Statement s = c.createStatement();
                 ResultSet r = s.executeQuery(args[1])) {
                r.next();
                System.out.println("{\\"count\\": " + r.getLong(1) + "}");
            } catch (SQLException e) {
                System.out.println("{\\"error\\": \\"" + e.getMessage().replace("\\"", "'") + "\\"}");
            }
        }
    }
}
"""
#: A Connect session kept open while its token is revoked (argv: port, token): runs a statement, prints "ready",
#: waits for a line on stdin, then runs one every 0.2 s until one is refused; prints JSON.
REVOKED_SESSION = """
import json, sys, time
from pyspark.sql import SparkSession
port, token = sys.argv[1:]
spark = SparkSession.builder.remote(f"sc://localhost:{port}/;token={token}").getOrCreate()
first = spark.sql("SELECT count(*) AS n FROM bronze_events").collect()[0].n
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
while time.monotonic() - started < 30:
    try:
        spark.sql("SELECT count(*) AS n FROM bronze_events").collect()
    except Exception as error:
        print(json.dumps({"first": first, "refused_after": time.monotonic() - started, "error": str(error)}))
        break
    time.sleep(0.2)
"""


def revoked_midway(script: str, args: list[str], env: dict[str, str], revoke) -> dict:
    """Run a client ``script`` that prints "ready" once its session works, then waits for a line on stdin and
    prints one JSON line when a statement is refused; ``revoke()`` runs in between. Returns that JSON."""
    session = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert session.stdout.readline().strip() == "ready"
    revoke()
    session.stdin.write("go\n")
    session.stdin.flush()
    outcome = json.loads(session.stdout.readline())
    session.wait(60)
    return outcome


def docs_block(language: str, marker: str) -> str:
    """The fenced ``language`` block of docs/analysts.md containing ``marker``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", (REPO / "docs" / "analysts.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def wait_for_text(path: Path, text: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    """Wait until ``path`` (a server's log) holds ``text``; fails if ``process`` exits first or after ``timeout`` s.

    180 s for a ``lake sql-server`` to be ready: it takes about 15 s on an idle 2-core machine, but over 120 s in
    a CI run of the whole suite (four workers on two cores; its query warm-up alone took 59 s there).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            pytest.fail(f"server exited ({process.returncode}): {path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no {text!r} within {timeout} s: {path.read_text(errors='replace')[-3000:]}")


def run_python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (a Connect client cannot share a process with the suite's Spark session)."""
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)


def streamed_lake(settings, log, store, seed: int) -> tuple[dict[str, str], int]:
    """A lake with 10 s of a small fleet streamed into its tables: the ``lake`` environment and bronze's rows."""
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(
            FleetSimulator(servers=3, metrics=2, seconds=10, seed=seed, start_ms=1_800_000_000_000).generate()
        )
    env = lake_env(settings)
    subprocess.run([LAKE, "stream", "--once"], env=env, check=True, capture_output=True, timeout=300)
    return env, open_table(store, "bronze_events").to_pyarrow_table(columns=["offset"]).num_rows


def test_clients_need_a_read_token_and_a_revoked_one_stops_at_the_next_statement(settings, log, store, tmp_path):
    env, expected = streamed_lake(settings, log, store, seed=5)
    tokens = TokenStore(store)
    read, _ = tokens.create("ana", Scope.READ)
    write, _ = tokens.create("agents", Scope.WRITE)
    admin, _ = tokens.create("ops", Scope.ADMIN)
    doomed, _ = tokens.create("leaver", Scope.READ)
    wrong = read[:-4] + ("AAAA" if not read.endswith("AAAA") else "BBBB")

    base = free_port_block((0, 1), lowest=23000)
    connect_port, jdbc_port = base, base + 1
    exposed = subprocess.run(
        [LAKE, "sql-server", "--host", "0.0.0.0", "--connect-port", str(base + 2), "--jdbc-port", str(base + 3)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert exposed.returncode == 2, exposed.stderr
    assert "will not listen on 0.0.0.0 without TLS (--tls-cert/--tls-key): anyone" in exposed.stderr

    server_log = tmp_path / "sql-server.log"
    with open(server_log, "wb") as output:
        server = subprocess.Popen(
            [LAKE, "sql-server", "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=output,
        )
    try:
        wait_for_text(server_log, "JDBC/ODBC", server)
        assert "a read token required" in server_log.read_text()
        client_env = {**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}

        # The analysts' page's beeline command, verbatim but for the port and the token.
        beeline = docs_block("bash", "JDBC/ODBC (HiveServer2)").replace("10000", str(jdbc_port))
        shown, refused = (
            subprocess.run(
                ["bash", "-c", beeline],
                env={**client_env, "LAKE_TOKEN_NAME": name, "LAKE_TOKEN": token},
                capture_output=True,
                text=True,
                timeout=180,
            )
            for name, token in (("ana", read), ("agents", write))
        )
        assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
        assert "bronze_events" in shown.stdout and "query_results" in shown.stdout
        assert refused.returncode != 0 and "Error validating the login" in refused.stdout + refused.stderr

        # A JDBC program on the Hive driver in pyspark's jars: one JVM, one connection per user/password pair.
        (tmp_path / "LakeJdbc.java").write_text(JDBC_PROGRAM)
        pairs = [("ana", read), ("ops", admin), ("", read), ("", ""), ("ana", wrong), ("agents", write), ("bob", read)]
        jdbc = subprocess.run(
            [
                "java",
                "-cp",
                f"{SPARK_JARS}/*",
                str(tmp_path / "LakeJdbc.java"),
                f"jdbc:hive2://127.0.0.1:{jdbc_port}/default",
                "SELECT count(*) FROM bronze_events",
                *[part for pair in pairs for part in pair],
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        answers = [json.loads(line) for line in jdbc.stdout.splitlines() if line.startswith("{")]
        assert [a.get("count") for a in answers] == [expected, expected, None, None, None, None, None], (
            jdbc.stdout + jdbc.stderr[-2000:]
        )
        assert all("Error validating the login" in a["error"] for a in answers[2:])

        # PyHive: the analysts' page's block, and without a password.
        pyhive = docs_block("python", 'auth="CUSTOM"').replace("10000", str(jdbc_port))
        counted = run_python(
            pyhive + "\nprint(cursor.fetchall()[0][0])", {**client_env, "LAKE_TOKEN_NAME": "ana", "LAKE_TOKEN": read}
        )
        assert counted.returncode == 0 and counted.stdout.split() == [str(expected)], counted.stderr[-2000:]
        anonymous = run_python(
            f"from pyhive import hive\nhive.connect(host='127.0.0.1', port={jdbc_port}, username='ana')", client_env
        )
        assert anonymous.returncode != 0 and "Error validating the login" in anonymous.stderr

        # Spark Connect: the analysts' page's block; then no token, a write token and a wrong one.
        connect = docs_block("python", "Spark Connect from a notebook").replace("15002", str(connect_port))
        shown = run_python(
            connect + "\nprint(spark.sql('SELECT count(*) AS n FROM bronze_events').collect()[0].n)",
            {**client_env, "LAKE_TOKEN": read},
        )
        assert shown.returncode == 0 and shown.stdout.split()[-1] == str(expected), shown.stderr[-3000:]
        for token, status, message in [
            ("", "UNAUTHENTICATED", "a token is required"),
            (write, "PERMISSION_DENIED", "token 'agents' has scope write; this needs read"),
            (wrong, "UNAUTHENTICATED", "wrong secret for token 'ana'"),
        ]:
            url = f"sc://localhost:{connect_port}" + (f"/;token={token}" if token else "")
            denied = run_python(
                f"from pyspark.sql import SparkSession\nSparkSession.builder.remote({url!r}).getOrCreate()"
                ".sql('SELECT 1').collect()",
                client_env,
            )
            assert denied.returncode != 0 and status in denied.stderr and message in denied.stderr, denied.stderr[
                -2000:
            ]

        # A revoked token: its open Connect session is refused at its next statement, within the refresh.
        outcome = revoked_midway(
            REVOKED_SESSION, [str(connect_port), doomed], client_env, lambda: tokens.revoke("leaver")
        )
        assert outcome["first"] == expected
        assert outcome["refused_after"] < 5.0 and "token 'leaver' is revoked" in outcome["error"]

        text = server_log.read_text(errors="replace")
        flat = " ".join(re.sub(r"sql_server\.py:\d+", "", text).split())  # the log's lines are wrapped at 80 columns
        # HiveServer2 checks a login before it records the client's address.
        assert "refused a jdbc client from an unknown address: token 'agents' has scope write" in flat, flat[:6000]
        assert "TSaslTransport" not in flat  # no stack trace per refused login
        assert "refused a jdbc client from an unknown address: the user name must be the token's name (ana)" in flat
        assert "refused a connect client from 127.0.0.1: a token is required" in flat, text[-3000:]
        for secret in (read, write, admin, doomed, wrong):
            assert parse_token(secret)[1] not in "".join(text.split())
    finally:
        children = psutil.Process(server.pid).children(recursive=True)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        psutil.wait_procs(children, timeout=30)
    assert os.path.exists(settings.root)
