"""Analysts' warm queries: the lake's Spark SQL beside Polars and DuckDB on the same Delta snapshot.

Builds a lake with the CLI (``lake produce`` of the fleet simulator, ``lake
stream --once``, then ``lake compact --cluster`` unless ``--no-cluster``),
then times three queries, best of ``--repeat``, each in a warm session:

- the lake: one Spark session with the lake's tables in its catalog
  (:func:`metrics_lake.spark.catalog.register_lake_tables`), its JVM options
  and warm-up those of ``lake sql-server``, ``spark.sql(query).collect()``;
- Polars ``scan_delta`` of the table (delta-rs resolves the snapshot);
- DuckDB over the snapshot's active Parquet files.

Then, unless ``--no-endpoint``, it starts ``lake sql-server`` on the same
lake and times each query through it as a client sees it: the first
answer and the best of ``--repeat`` from a Spark Connect client (a
notebook's session, in a process of its own) and from PyHive over
HiveServer2 (JDBC's protocol), each from sending the query to its first
row on an open connection, and each client's connection set-up (Connect:
the session and a ``SELECT 1``; JDBC: ``hive.connect``), first (the server
checks the token against its record) and again (it remembers the token
verified). It does so three
times: on the open lake, with a read token (created for the run, revoked
after it), each call's token check included, and with the token over TLS
(the certificates of ``lake infra tls``; Connect with ``;use_ssl=true``,
PyHive over a TLS socket, as the analysts' page shows). Every statement is
recorded in ``sql_audit`` in all three (the server always audits).

Every engine must give the same answer (checked). For the lake, "files
read" is what the reader's pruning keeps
(:func:`metrics_lake.core.tables.pruning.keep_files`, the function the
reader calls) of the files in the snapshot.

With ``--first-connections N``, each client's first connection is timed on
N fresh servers per access and client (one connection per server's life: a
single one varies by about ±80 ms run to run), and their mean is compared
with the open lake's.

Usage: ``python bench/analyst_queries.py [--size 2500x10x240] [--repeat 3] [--no-cluster] [--no-endpoint]
[--workdir DIR] [--first-connections N]``; with ``--workdir`` the lake is built there once and reused by later runs (a 60 M-event
lake takes minutes to build).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean

import duckdb
import polars as pl
import pyarrow as pa
from common import LAKE, free_port, lake_env, print_table, run_measured, scratch_dir
from deltalake import DeltaTable

from metrics_lake.core import keys
from metrics_lake.core.tables.pruning import Predicate, keep_files
from metrics_lake.lake_schemas.tables import TABLES, Table

METRIC = "app.rpc.latency_ms"
#: The read token the endpoint is timed with (created for the run, revoked after it).
TOKEN_NAME = "bench-analyst"
SERVER = "sim-0042"

QUERIES = {
    "one series: count, avg, max from bronze": (
        Table.BRONZE_EVENTS,
        f"SELECT count(*) AS n, avg(value) AS mean, max(value) AS peak FROM {{t}} "
        f"WHERE metric = '{METRIC}' AND server = '{SERVER}'",
        [Predicate("metric", "=", METRIC), Predicate("server", "=", SERVER)],
    ),
    "one metric's p99 per minute from windows": (
        Table.METRIC_WINDOWS_1M,
        f"SELECT window_start, max(p99) AS p99 FROM {{t}} WHERE metric = '{METRIC}' "
        "GROUP BY window_start ORDER BY window_start",
        [Predicate("metric", "=", METRIC)],
    ),
    "top 10 servers by max of a metric from bronze": (
        Table.BRONZE_EVENTS,
        f"SELECT server, max(value) AS peak FROM {{t}} WHERE metric = '{METRIC}' "
        "GROUP BY server ORDER BY peak DESC, server LIMIT 10",
        [Predicate("metric", "=", METRIC)],
    ),
}


def best_of(repeat: int, run) -> tuple[float, list[tuple]]:
    """Best wall seconds of ``repeat`` calls of ``run`` and its last result (rows as tuples)."""
    best, rows = math.inf, []
    for _ in range(repeat):
        started = time.perf_counter()
        rows = run()
        best = min(best, time.perf_counter() - started)
    return best, rows


def normalized(rows: list[tuple]) -> list[tuple]:
    """Rows with floats rounded to 9 significant digits and times without zone, comparable across engines."""
    out = []
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, float):
                cell = float(f"{cell:.9g}")
            elif hasattr(cell, "tzinfo") and getattr(cell, "tzinfo", None) is not None:
                cell = cell.replace(tzinfo=None)
            cells.append(cell)
        out.append(tuple(cells))
    return out


#: The notebook's side, a process of its own (a Connect client cannot share one with a classic session).
#: argv: URL, repeat, JSON {label: sql}; prints JSON {label: [first s, best s, rows], "set-up": s, "set-up again": s}.
CONNECT_CLIENT = """
import json, sys, time
from pyspark.sql import SparkSession
url, repeat, queries = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
started = time.perf_counter()
spark = SparkSession.builder.remote(url).getOrCreate()
spark.sql("SELECT 1").collect()
answers = {"set-up": time.perf_counter() - started}
for label, sql in queries.items():
    seconds = []
    for _ in range(1 + repeat):
        started = time.perf_counter()
        rows = [tuple(r) for r in spark.sql(sql).collect()]
        seconds.append(time.perf_counter() - started)
    answers[label] = [seconds[0], min(seconds[1:]), rows]
started = time.perf_counter()  # a second session: the server has verified the token once already
again = SparkSession.builder.remote(url).create()
again.sql("SELECT 1").collect()
answers["set-up again"] = time.perf_counter() - started
again.stop()
spark.stop()
print(json.dumps(answers, default=str))
"""


def comparable(rows: list) -> list[tuple]:
    """Rows as :func:`normalized` tuples after a JSON round trip (times as text), comparable across clients."""
    return normalized([tuple(json.loads(json.dumps(list(row), default=str))) for row in rows])


def mint_tls(work: Path, env: dict[str, str]) -> dict[str, str]:
    """``lake infra tls`` certificates under ``work/tls``: its ``export`` lines (LAKE_TLS_CERT, _KEY, _CA)."""
    minted = subprocess.run(
        [LAKE, "infra", "tls", "--data-dir", str(work / "tls")], env=env, capture_output=True, text=True, check=True
    )
    return dict(re.findall(r"^export (\w+)=(\S+)$", minted.stdout, flags=re.M))


@contextlib.contextmanager
def sql_server(env: dict[str, str], work: Path):
    """``lake sql-server`` on this lake, started fresh; yields its (Connect port, JDBC port) once it is ready."""
    connect_port, jdbc_port = free_port(), free_port()
    server = subprocess.Popen(
        [LAKE, "sql-server", "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port)],
        env=env,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = time.perf_counter()
        banner = []
        while not any("JDBC/ODBC" in line for line in banner):
            line = server.stderr.readline()
            if not line:
                raise RuntimeError(f"lake sql-server exited ({server.wait()}): {''.join(banner)[-3000:]}")
            banner.append(line)
        print(f"sql-server: ready in {time.perf_counter() - started:.1f} s", flush=True)
        yield connect_port, jdbc_port
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)


def through_connect(
    port: int, repeat: int, queries: dict[str, str], token: str | None, ca: str | None = None
) -> dict[str, list]:
    """``{label: [first s, best s, rows], "set-up": s}`` of ``queries`` from a Spark Connect client in a process of
    its own, sending ``token`` if given (to ``localhost``: the client sends a token in the clear nowhere else), over
    TLS trusting ``ca`` (a PEM file) if given."""
    url = f"sc://localhost:{port}/;token={token}" if token else f"sc://127.0.0.1:{port}"
    env = dict(os.environ)
    if ca is not None:
        url = f"sc://localhost:{port}/;use_ssl=true;token={token}"
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = ca
    client = subprocess.run(
        [sys.executable, "-c", CONNECT_CLIENT, url, str(repeat), json.dumps(queries)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if client.returncode != 0:
        raise RuntimeError(f"the Connect client failed: {client.stderr[-3000:]}")
    return json.loads(client.stdout.strip().splitlines()[-1])


def jdbc_connect(port: int, token: str | None, ca: str | None):
    """A PyHive connection to HiveServer2 on ``port``: with ``token`` (user = :data:`TOKEN_NAME`) if given, over
    TLS trusting ``ca`` (a PEM file) if given, as the analysts' page shows."""
    import ssl

    import thrift_sasl
    from pyhive import hive
    from pyhive.hive import get_installed_sasl
    from thrift.transport.TSSLSocket import TSSLSocket

    if ca is not None:  # the analysts' page's "PyHive over TLS"
        socket = TSSLSocket("localhost", port, ssl_context=ssl.create_default_context(cafile=ca))
        transport = thrift_sasl.TSaslClientTransport(
            lambda: get_installed_sasl(host="localhost", sasl_auth="PLAIN", username=TOKEN_NAME, password=token),
            "PLAIN",
            socket,
        )
        return hive.connect(thrift_transport=transport)
    if token:
        return hive.connect(host="127.0.0.1", port=port, auth="CUSTOM", username=TOKEN_NAME, password=token)
    return hive.connect(host="127.0.0.1", port=port, username="analyst")


def through_jdbc(
    port: int, repeat: int, queries: dict[str, str], token: str | None, ca: str | None = None
) -> dict[str, list]:
    """``{label: [first s, best s, rows], "set-up": s}`` of ``queries`` from PyHive over HiveServer2, logging in with
    ``token`` if given, over TLS trusting ``ca`` (a PEM file) if given; times end at ``fetchone``."""
    started = time.perf_counter()
    connection = jdbc_connect(port, token, ca)
    answers = {"set-up": time.perf_counter() - started}
    started = time.perf_counter()  # a second connection: the server has verified the token once already
    again = jdbc_connect(port, token, ca)
    answers["set-up again"] = time.perf_counter() - started
    again.close()  # not timed: Spark's Thrift server takes about 3 s to close its first session, whichever
    cursor = connection.cursor()
    for label, sql in queries.items():
        seconds, rows = [], []
        for _ in range(1 + repeat):
            started = time.perf_counter()
            cursor.execute(sql)
            rows = [cursor.fetchone()]
            seconds.append(time.perf_counter() - started)
            rows += cursor.fetchall()
        answers[label] = [seconds[0], min(seconds[1:]), rows]
    connection.close()
    return answers


def first_setups(
    env: dict[str, str], work: Path, token: str | None, ca: str | None, servers: int
) -> dict[str, list[float]]:
    """``{"Connect": [s, ...], "JDBC": [s, ...]}``: seconds of the first connection set-up of each client (as
    :func:`through_connect` and :func:`through_jdbc` time it), each on ``servers`` fresh ``lake sql-server``s of its
    own: a server's first connection happens once per server, so its mean needs several servers."""
    seconds: dict[str, list[float]] = {"Connect": [], "JDBC": []}
    for _ in range(servers):
        with sql_server(env, work) as (connect_port, _):
            seconds["Connect"].append(through_connect(connect_port, 0, {}, token, ca)["set-up"])
        with sql_server(env, work) as (_, jdbc_port):
            seconds["JDBC"].append(through_jdbc(jdbc_port, 0, {}, token, ca)["set-up"])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2500x10x240", help="servers x metrics x seconds of the simulated fleet")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cluster", action="store_true", help="query the files as the stream wrote them")
    parser.add_argument("--no-endpoint", action="store_true", help="leave out the queries through lake sql-server")
    parser.add_argument("--workdir", type=Path, help="build the lake here once, and reuse it when it exists")
    parser.add_argument(
        "--first-connections",
        type=int,
        default=1,
        help="fresh servers per access and client whose first connection is timed (the query run's is the first)",
    )
    args = parser.parse_args()
    servers, metrics, seconds = (int(x) for x in args.size.split("x"))
    work = args.workdir or scratch_dir("lake-analyst-")
    work.mkdir(parents=True, exist_ok=True)
    env = lake_env(work)
    steps = [
        [LAKE, "produce", "--servers", str(servers), "--metrics", str(metrics), "--seconds", str(seconds)],
        [LAKE, "stream", "--once"],
    ]
    if not args.no_cluster:
        steps.append([LAKE, "compact", "--cluster", "--tables-only", "--tables", Table.BRONZE_EVENTS])
    root = Path(env["LAKE_ROOT"])
    if (root / keys.table_prefix(Table.BRONZE_EVENTS)).exists():
        print(f"reusing the lake in {work} (its size and layout are what built it)", flush=True)
    else:
        for step in steps:
            print(f"{' '.join(step[1:])}: {run_measured(step, env, cwd=work).seconds:.1f} s", flush=True)

    os.environ.update(env)
    from metrics_lake.core.config import load_settings
    from metrics_lake.spark.catalog import register_lake_tables
    from metrics_lake.spark.jobs.sql_server import server_settings, warm_up
    from metrics_lake.spark.session import build_session

    settings = server_settings(load_settings())  # the JVM options lake sql-server runs with
    spark = build_session(settings, "bench-analyst")
    warm_up(spark, register_lake_tables(spark, settings))  # as lake sql-server starts
    duck = duckdb.connect()
    duck.execute("SET threads = 2")
    rows, answers = [], {}
    for label, (table, sql, predicates) in QUERIES.items():
        uri = str(root / keys.table_prefix(table))
        delta = DeltaTable(uri)
        actions = pa.table(delta.get_add_actions(flatten=True))
        kept = keep_files(actions, predicates, TABLES[table].schema, list(TABLES[table].partition_by))
        files = [f"{uri}/{p}" for p in actions.column("path").to_pylist()]
        duck.execute(f"CREATE OR REPLACE VIEW snapshot AS SELECT * FROM read_parquet({files!r})")
        lake_s, lake_rows = best_of(
            args.repeat, lambda sql=sql, table=table: [tuple(r) for r in spark.sql(sql.format(t=table)).collect()]
        )
        polars_s, polars_rows = best_of(
            args.repeat,
            lambda sql=sql, uri=uri: pl.SQLContext(t=pl.scan_delta(uri)).execute(sql.format(t="t")).collect().rows(),
        )
        duck_s, duck_rows = best_of(args.repeat, lambda sql=sql: duck.execute(sql.format(t="snapshot")).fetchall())
        assert normalized(lake_rows) == normalized(polars_rows) == normalized(duck_rows), (
            label,
            lake_rows[:3],
            polars_rows[:3],
            duck_rows[:3],
        )
        answers[label] = lake_rows
        peer = min(polars_s, duck_s)
        rows.append(
            (
                label,
                f"{lake_s:.3f}",
                f"{polars_s:.3f}",
                f"{duck_s:.3f}",
                f"{lake_s / peer:.0f}x",
                f"{int(kept.sum())} / {actions.num_rows}",
            )
        )
    spark.stop()
    endpoint_rows, setup_rows, firsts = [], [], {}
    if not args.no_endpoint:
        from metrics_lake.core.storage import open_store
        from metrics_lake.core.tokens import Scope, TokenStore

        queries = {label: sql.format(t=table) for label, (table, sql, _) in QUERIES.items()}
        tokens = TokenStore(open_store(settings))
        tls = mint_tls(work, env)
        for access in ("open", "read token", "read token + TLS"):
            token = tokens.create(TOKEN_NAME, Scope.READ)[0] if access != "open" else None
            served = (
                {**env, "LAKE_TLS_CERT": tls["LAKE_TLS_CERT"], "LAKE_TLS_KEY": tls["LAKE_TLS_KEY"]}
                if (access.endswith("TLS"))
                else env
            )
            ca = tls["LAKE_TLS_CA"] if access.endswith("TLS") else None
            try:
                # A server per client kind, so that each client's first query is the first its server answers.
                with sql_server(served, work) as (connect_port, _):
                    connect = through_connect(connect_port, args.repeat, queries, token, ca)
                with sql_server(served, work) as (_, jdbc_port):
                    jdbc = through_jdbc(jdbc_port, args.repeat, queries, token, ca)
                more = first_setups(served, work, token, ca, args.first_connections - 1)
                firsts[access] = {
                    "Connect": [connect["set-up"], *more["Connect"]],
                    "JDBC": [jdbc["set-up"], *more["JDBC"]],
                }
            finally:
                if token:
                    tokens.revoke(TOKEN_NAME)
            setup_rows.append((access, *(f"{a[k]:.3f}" for a in (connect, jdbc) for k in ("set-up", "set-up again"))))
            for label in queries:
                expected = comparable(answers[label])
                for client, (_, _, client_rows) in (("Connect", connect[label]), ("JDBC", jdbc[label])):
                    assert comparable(client_rows) == expected, (label, client, client_rows[:3], expected[:3])
                endpoint_rows.append(
                    (label, access, *(f"{seconds:.3f}" for seconds in (*connect[label][:2], *jdbc[label][:2])))
                )
    events = servers * metrics * seconds
    print(f"\n{events:,} events; {'clustered' if not args.no_cluster else 'as streamed'}; best of {args.repeat}")
    print_table(
        ("warm query", "lake Spark SQL s", "Polars s", "DuckDB s", "lake / faster peer", "files read / in snapshot"),
        rows,
    )
    if endpoint_rows:
        print("\nthrough lake sql-server (a fresh server per client), query sent to first row on an open connection:")
        print_table(
            ("query", "access", "Connect first s", "Connect best s", "JDBC first s", "JDBC best s"),
            sorted(endpoint_rows),
        )
        print("\nconnection set-up (Connect: session and SELECT 1; JDBC: hive.connect); first: the token verified")
        print_table(("access", "Connect first s", "Connect again s", "JDBC first s", "JDBC again s"), setup_rows)
        if args.first_connections > 1:
            print(f"\nfirst connection set-up, {args.first_connections} fresh servers per access and client:")
            print_table(
                ("client", "access", "mean s", "min s", "max s", "mean - open's, ms"),
                [
                    (
                        client,
                        access,
                        *(f"{f(by_client[client]):.3f}" for f in (fmean, min, max)),
                        f"{(fmean(by_client[client]) - fmean(firsts['open'][client])) * 1000:+.0f}",
                    )
                    for client in ("Connect", "JDBC")
                    for access, by_client in firsts.items()
                ],
            )


if __name__ == "__main__":
    main()
