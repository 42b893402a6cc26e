"""``lake sql-server`` with real clients: the pyspark Spark Connect client and PyHive over HiveServer2 (JDBC's
protocol), each listing the lake's tables, querying, joining with its own data and time-travelling; then the
server stops without leaving a process, and a taken port is refused naming it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import psutil
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.delta import list_tables, open_table
from tests.helpers import free_port_block
from tests.integration.test_kill_restart import LAKE, lake_env
from tests.integration.test_sql_server_tokens import wait_for_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: A notebook's side: the pyspark Connect client against the server (argv: port, metric, server); prints JSON.
CONNECT_CLIENT = """
import json, sys, time
from pyspark.sql import SparkSession
port, metric, server = sys.argv[1:]
spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
series = f"SELECT count(*) AS n FROM bronze_events WHERE metric = '{metric}' AND server = '{server}'"
answers = {"tables": [r.tableName for r in spark.sql("SHOW TABLES").collect()]}
counts = [spark.sql(series).collect()[0].n]
started = time.perf_counter()
counts.append(spark.sql(series).collect()[0].n)
answers["second_seconds"] = time.perf_counter() - started
answers["series"] = counts
spark.createDataFrame([(server, "team-a")], "server string, team string").createOrReplaceTempView("mine")
answers["joined"] = [
    [r.team, r.n]
    for r in spark.sql(
        f"SELECT m.team, count(*) AS n FROM bronze_events b JOIN mine m USING (server) "
        f"WHERE b.metric = '{metric}' GROUP BY m.team"
    ).collect()
]
answers["version_0"] = spark.sql("SELECT count(*) AS n FROM bronze_events WITH ('version' = '0')").collect()[0].n
spark.stop()
print(json.dumps(answers))
"""


def test_connect_and_hiveserver2_clients_query_the_lake(settings, log, store, tmp_path):
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=4, metrics=3, seconds=20, seed=3, start_ms=1_800_000_000_000).generate())
    env = lake_env(settings)
    subprocess.run([LAKE, "stream", "--once"], env=env, check=True, capture_output=True, timeout=300)
    bronze = open_table(store, "bronze_events").to_pyarrow_table(columns=["metric", "server", "value"])
    metric, server = bronze.column("metric")[0].as_py(), bronze.column("server")[0].as_py()
    expected = sum(1 for r in bronze.to_pylist() if r["metric"] == metric and r["server"] == server)
    base = free_port_block((0, 1), lowest=21000)
    connect_port, jdbc_port = base, base + 1
    # Its log in a file, as in the other server tests: a pipe nobody reads after the banner could fill and stall it.
    server_log = tmp_path / "sql-server.log"
    with open(server_log, "wb") as output:
        server_process = subprocess.Popen(
            [LAKE, "sql-server", "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port)],
            env=env,
            stderr=output,
            stdout=subprocess.DEVNULL,
        )
    try:
        wait_for_text(server_log, "JDBC/ODBC", server_process)
        banner = server_log.read_text()
        assert f"sc://127.0.0.1:{connect_port}" in banner
        # A long-lived server compiles with C2 too (spark/jobs/sql_server.py), unlike the lake's short jobs.
        (java,) = [p for p in psutil.Process(server_process.pid).children(recursive=True) if p.name() == "java"]
        assert "-XX:TieredStopAtLevel=1" not in java.cmdline()

        # A taken port is refused, naming it, before any JVM starts.
        taken = subprocess.run(
            [LAKE, "sql-server", "--connect-port", str(connect_port), "--jdbc-port", str(base + 5)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode == 2 and f"--connect-port {connect_port} on 127.0.0.1 is not free" in taken.stderr

        # A Connect client cannot share a process with a classic session (the suite's Spark fixture): its own.
        client = subprocess.run(
            [sys.executable, "-c", CONNECT_CLIENT, str(connect_port), metric, server],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert client.returncode == 0, client.stderr[-3000:]
        answers = json.loads(client.stdout.strip().splitlines()[-1])
        # sql_audit appears once the audit's first write is registered (the server looks every 5 s).
        assert set(list_tables(store)) - {"sql_audit"} <= set(answers["tables"]) <= set(list_tables(store))
        assert answers["series"] == [expected, expected]
        assert answers["second_seconds"] < 10  # no Spark application started per query
        assert answers["joined"] == [["team-a", expected]]
        assert answers["version_0"] == 0
        series = f"SELECT count(*) AS n FROM bronze_events WHERE metric = '{metric}' AND server = '{server}'"

        from pyhive import hive

        connection = hive.connect(host="127.0.0.1", port=jdbc_port, username="analyst")
        cursor = connection.cursor()
        cursor.execute("SHOW TABLES")
        assert (
            set(list_tables(store)) - {"sql_audit"} <= {row[1] for row in cursor.fetchall()} <= set(list_tables(store))
        )
        cursor.execute(series)
        assert cursor.fetchall() == [(expected,)]
        with pytest.raises(Exception, match="bronze_events` does not support append"):
            cursor.execute("INSERT INTO bronze_events SELECT * FROM bronze_events LIMIT 1")
        connection.close()
    finally:
        children = psutil.Process(server_process.pid).children(recursive=True)
        server_process.send_signal(signal.SIGTERM)
        server_process.wait(timeout=60)
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [p.cmdline()[:3] for p in alive]
    for port in (connect_port, jdbc_port):
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert os.path.exists(settings.root)
