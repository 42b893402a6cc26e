"""`sql_audit`: every statement through `lake sql-server` (Spark Connect and JDBC) and `lake sql`, recorded once
with who ran it, what, how long, rows, files and the outcome; the endpoint does not serve the table."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

from metrics_lake.core.tables.delta import open_table
from metrics_lake.core.tokens import Scope, TokenStore
from tests.helpers import free_port_block
from tests.integration.test_kill_restart import LAKE
from tests.integration.test_sql_server_tokens import docs_block, run_python, streamed_lake, wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT = "SELECT count(*) AS n FROM bronze_events"
#: A Connect client reading a result row by row that exits after its first row, mid-result.
HALF_READ = """
import os, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(f"sc://localhost:{sys.argv[1]}/;token={sys.argv[2]}").getOrCreate()
rows = spark.sql("SELECT * FROM bronze_events ORDER BY offset").toLocalIterator()
next(rows)
os._exit(0)
"""


def test_each_statement_is_recorded_once_with_its_caller_and_only_admins_read_the_audit(settings, log, store, tmp_path):
    env, expected = streamed_lake(settings, log, store, seed=5)
    tokens = TokenStore(store)
    read, _ = tokens.create("ana", Scope.READ)
    admin, _ = tokens.create("ops", Scope.ADMIN)

    connect_port = free_port_block((0, 1), lowest=24000)
    jdbc_port = connect_port + 1
    server_log = tmp_path / "sql-server.log"
    with open(server_log, "wb") as output:
        server = subprocess.Popen(
            [LAKE, "--verbose", "sql-server", "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=output,
        )
    try:
        wait_for_text(server_log, "JDBC/ODBC", server)
        assert "sql_audit" not in server_log.read_text().split("serving", 1)[1].split("\n")[0]
        client_env = {**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
        connect = docs_block("python", "Spark Connect from a notebook").replace("15002", str(connect_port))
        counted = run_python(
            connect
            + f"\nprint(spark.sql({COUNT!r}).collect()[0].n)"
            + "\ntry:\n    spark.sql('SELECT * FROM no_such_table').collect()\nexcept Exception:\n    print('refused')"
            + "\ntry:\n    spark.sql('SELECT count(*) FROM sql_audit').collect()\nexcept Exception as e:\n"
            + "    print('admin-only' if \"sql_audit (who ran which statement) is an admin token's only\" in str(e) "
            + "and \"token 'ana' has scope read\" in str(e) else str(e))",
            {**client_env, "LAKE_TOKEN": read},
        )
        assert counted.returncode == 0, counted.stderr[-3000:]
        assert counted.stdout.split()[-3:] == [str(expected), "refused", "admin-only"], counted.stdout[-2000:]
        pyhive = docs_block("python", 'auth="CUSTOM"').replace("10000", str(jdbc_port))
        counted = run_python(
            pyhive
            + "\nprint(cursor.fetchall()[0][0])"
            + "\nimport time; time.sleep(6)"  # the audit's first rows are written and its table registered
            + "\ncursor.execute(\"SELECT count(*) FROM sql_audit WHERE caller = 'ana'\")\nprint(cursor.fetchall()[0][0])",
            {**client_env, "LAKE_TOKEN_NAME": "ops", "LAKE_TOKEN": admin},
        )
        assert counted.returncode == 0, counted.stderr[-2000:]
        assert counted.stdout.split()[0] == str(expected) and int(counted.stdout.split()[1]) >= 4  # an admin reads it
        half = run_python(HALF_READ, client_env, str(connect_port), read)
        assert half.returncode == 0, half.stderr[-2000:]
    finally:
        children = psutil.Process(server.pid).children(recursive=True)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        psutil.wait_procs(children, timeout=30)
    assert server.returncode == 0, server_log.read_text()[-3000:]

    audit = open_table(store, "sql_audit").to_pyarrow_table().to_pylist()
    ids = Counter(r["statement_id"] for r in audit)
    assert audit and max(ids.values()) == 1, ids.most_common(3)  # each statement once
    (jdbc,) = [r for r in audit if r["client"] == "jdbc" and r["statement"] == "SELECT count(*) FROM bronze_events"]
    assert (jdbc["caller"], jdbc["kind"], jdbc["outcome"], jdbc["rows"]) == ("ops", "statement", "ok", None)
    assert jdbc["files"] >= 1
    # spark.sql sends the SQL as a command (analysed only), then runs the query it returns.
    (command, query) = sorted((r for r in audit if r["statement"] == COUNT), key=lambda r: r["started_at"])
    assert (command["kind"], command["caller"], command["outcome"], command["files"]) == ("command", "ana", "ok", 0)
    assert (query["kind"], query["caller"], query["outcome"], query["rows"]) == ("query", "ana", "ok", 1)
    assert query["files"] >= 1
    (missing,) = [r for r in audit if r["statement"] == "SELECT * FROM no_such_table"]
    assert missing["outcome"] == "error" and "no_such_table" in missing["error"] and missing["caller"] == "ana"
    (hidden,) = [r for r in audit if r["statement"] == "SELECT count(*) FROM sql_audit"]
    assert hidden["outcome"] == "error" and "an admin token's only" in hidden["error"]
    # The client that left after its first row: its query is recorded once, as the server saw it end.
    half = [r for r in audit if "ORDER BY offset" in r["statement"]]
    assert sorted(r["kind"] for r in half) == ["command", "query"] and {r["caller"] for r in half} == {"ana"}
    assert all(r["duration_ms"] >= 0 and r["started_date"] == r["started_at"].date() for r in audit)
    flat = " ".join(server_log.read_text(errors="replace").split())
    assert "ana connect query ok" in flat and "ops jdbc statement ok" in flat, flat[-3000:]

    # lake sql records its statement too, with the OS user (or LAKE_AUTHOR) as the caller.
    shown = subprocess.run(
        [LAKE, "sql", COUNT], env={**env, "LAKE_AUTHOR": "alice"}, capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    local = [r for r in open_table(store, "sql_audit").to_pyarrow_table().to_pylist() if r["client"] == "lake sql"]
    assert [(r["caller"], r["statement"], r["rows"], r["outcome"]) for r in local] == [("alice", COUNT, 1, "ok")]
