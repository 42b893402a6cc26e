"""A read token created with `--servers GLOB` sees, through `lake sql-server`, only its servers' rows of every
table with a `server` column: through Spark Connect and JDBC, in temp views and joins, for random globs against
an independent filter; an admin token and an unscoped read token see every row; other doors refuse the token."""

from __future__ import annotations

import fnmatch
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.delta import open_table
from metrics_lake.core.tokens import Scope, TokenStore
from metrics_lake.lake_schemas.errors import InputError
from tests.helpers import free_port_block
from tests.integration.test_kill_restart import LAKE, lake_env
from tests.integration.test_sql_server_tokens import docs_block, revoked_midway, run_python, wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLES = ("bronze_events", "metric_windows_1m", "query_results", "last_seen")
#: argv: port, then token pairs (name, token); prints one JSON object per token: each table's count, the counts
#: through a temp view and a join, and the servers seen, from one statement per token.
COUNTS = """
import json, sys
from pyspark.sql import SparkSession
port, pairs = sys.argv[1], sys.argv[2:]
tables = TABLES
counted = ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in tables)
for name, token in zip(pairs[::2], pairs[1::2]):
    spark = SparkSession.builder.remote(f"sc://localhost:{port}/;token={token}").create()
    spark.sql("CREATE OR REPLACE TEMP VIEW everything AS SELECT * FROM bronze_events")
    row = spark.sql(
        f"SELECT {counted}, (SELECT count(*) FROM everything) AS view, (SELECT count(*) FROM bronze_events b "
        "JOIN (SELECT DISTINCT server FROM metric_windows_1m) w ON b.server = w.server) AS join, "
        "(SELECT sort_array(collect_set(server)) FROM bronze_events) AS servers"
    ).collect()[0]
    print(json.dumps({"name": name, **row.asDict()}), flush=True)
    spark.stop()
""".replace("tables = TABLES", f"tables = {TABLES!r}")


#: A JDBC session kept open while its token is revoked (argv: port, name, token): runs a statement, prints
#: "ready", waits for a line on stdin, then runs one every 0.2 s until one is refused; prints JSON.
REVOKED_JDBC = """
import json, sys, time
from pyhive import hive
port, name, token = sys.argv[1:]
cursor = hive.connect(host="127.0.0.1", port=int(port), auth="CUSTOM", username=name, password=token).cursor()
cursor.execute("SELECT count(*) FROM bronze_events")
cursor.fetchall()
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
while time.monotonic() - started < 30:
    try:
        cursor.execute("SELECT count(*) FROM bronze_events")
        cursor.fetchall()
    except Exception as error:
        print(json.dumps({"refused_after": time.monotonic() - started, "error": str(error)}), flush=True)
        break
    time.sleep(0.2)
"""


def expected_counts(store, glob: str | None) -> dict:
    """Each table's rows of the servers ``glob`` matches (all for None), computed from the Delta tables directly."""

    def keep(server) -> bool:
        return glob is None or (server is not None and fnmatch.fnmatchcase(server, glob))

    servers = {t: open_table(store, t).to_pyarrow_table(columns=["server"]).column(0).to_pylist() for t in TABLES}
    counts = {t: sum(keep(s) for s in servers[t]) for t in TABLES}
    bronze = [s for s in servers["bronze_events"] if keep(s)]
    windowed = {s for s in servers["metric_windows_1m"] if keep(s)}
    counts["view"] = len(bronze)
    counts["join"] = sum(s in windowed for s in bronze)
    counts["servers"] = sorted(set(bronze))
    return counts


def test_a_scoped_read_token_sees_only_its_servers_rows_in_every_table_and_client(settings, log, store, tmp_path):
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=12, metrics=2, seconds=120, seed=9, start_ms=1_800_000_000_000).generate())
    env = lake_env(settings)
    subprocess.run([LAKE, "stream", "--once"], env=env, check=True, capture_output=True, timeout=300)

    tokens = TokenStore(store)
    rng = random.Random(61)
    pieces = ["sim-", "000", "001", "0", "1", "*", "?", "-", "x"]
    globs = ["sim-000?", "*1", "sim-0010", "nobody-*"]
    globs += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 4))) for _ in range(6)]
    pairs = [("ops", tokens.create("ops", Scope.ADMIN)[0]), ("all", tokens.create("all", Scope.READ)[0])]
    for i, glob in enumerate(globs):
        pairs.append((f"scoped-{i}", tokens.create(f"scoped-{i}", Scope.READ, servers=glob)[0]))
    with pytest.raises(InputError, match=r"takes \* and \? only"):
        tokens.create("classes", Scope.READ, servers="sim-[01]*")
    with pytest.raises(InputError, match="an admin token has all"):
        tokens.create("boss", Scope.ADMIN, servers="sim-*")

    connect_port = free_port_block((0, 1), lowest=25000)
    jdbc_port = connect_port + 1
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
        client_env = {**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
        shown = run_python(COUNTS, client_env, str(connect_port), *[part for pair in pairs for part in pair])
        assert shown.returncode == 0, shown.stderr[-3000:]
        answers = {a.pop("name"): a for a in map(json.loads, shown.stdout.splitlines())}
        whole = expected_counts(store, None)
        assert answers["ops"] == answers["all"] == whole
        for i, glob in enumerate(globs):
            assert answers[f"scoped-{i}"] == expected_counts(store, glob), glob
        assert answers["scoped-0"]["servers"] == [f"sim-000{i}" for i in range(10)]
        assert answers["scoped-3"]["bronze_events"] == 0  # a glob matching no server: no rows, not an error

        # JDBC: the analysts' page's PyHive block with a scoped token, then with the admin token.
        pyhive = docs_block("python", 'auth="CUSTOM"').replace("10000", str(jdbc_port))
        for name, token, glob in (("scoped-2", pairs[4][1], "sim-0010"), ("ops", pairs[0][1], None)):
            counted = run_python(
                pyhive + "\nprint(cursor.fetchall()[0][0])",
                {**client_env, "LAKE_TOKEN_NAME": name, "LAKE_TOKEN": token},
            )
            assert counted.returncode == 0, counted.stderr[-2000:]
            assert counted.stdout.split() == [str(expected_counts(store, glob)["bronze_events"])]

        # A revoked token's open JDBC session: its next statement is refused, within the refreshes (2 s + 2 s).
        outcome = revoked_midway(
            REVOKED_JDBC, [str(jdbc_port), "all", pairs[1][1]], client_env, lambda: tokens.revoke("all")
        )
        assert outcome["refused_after"] < 5.0 and "token 'all' is revoked or expired" in outcome["error"], outcome
    finally:
        children = psutil.Process(server.pid).children(recursive=True)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        psutil.wait_procs(children, timeout=30)
