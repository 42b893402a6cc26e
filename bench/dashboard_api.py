"""Benchmark: the dashboard API on a 24-hour panel over ``--servers`` series, cold and warm, beside DuckDB.

Builds a lake with one metric from ``--servers`` servers, one sample per
server per minute for 24 hours, streamed by the speed layer's batch
function (so ``query_results`` is kept live as in production) with two
stored queries: ``per_server`` (15-minute windows PER SERVER: one series per
server, the API returning the top 5 and the fleet) and ``fleet_hopping``
(5-minute windows every minute, fleet-wide: 1,440 points). Then it times
``GET /api/queries/{name}/series`` for the 24 hours through HTTP on a fresh
reader (cold: nothing cached, first table load) and repeated (warm, p50/p95
of ``--repeat`` requests), with the clock an hour after the data so every
block is closed and cacheable. The **peer** is DuckDB reading the same
``query_results`` Parquet files for the same rows (no cache, no HTTP).

Run: ``python bench/dashboard_api.py [--servers 1000] [--repeat 20]``.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import numpy as np
import requests
from common import scratch_dir

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.dashboard import DashboardReader, serve
from metrics_lake.core import keys
from metrics_lake.core.config import load_settings
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.tables import Table

DAY_MS = 86_400_000
START_MS = 1_750_000_000_000 - 1_750_000_000_000 % DAY_MS  # a past UTC midnight


def main() -> None:
    """Build the lake, time the API cold and warm and the DuckDB peer; print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    work = scratch_dir("bench-dashboard-")
    settings = load_settings(root=str(work / "lake"), partitions=4)
    store = open_store(settings)
    queries = [
        parse_query("per_server", "FROM * SELECT host.cpu.utilization WINDOW 15m COMPUTE avg, max PER SERVER"),
        parse_query(
            "fleet_hopping", "FROM * SELECT host.cpu.utilization WINDOW 5m EVERY 1m COMPUTE avg, percentile(99)"
        ),
    ]
    started = time.monotonic()
    simulator = FleetSimulator(servers=args.servers, metrics=1, seconds=86_400, rate=1 / 60, seed=1, start_ms=START_MS)
    with producer_for(settings, store) as producer:  # metrics=1: the catalog's first, host.cpu.utilization
        producer.send(simulator.generate())
    events = sum(end_offsets(SegmentLog(store), settings.topic).values())
    produced = time.monotonic() - started
    outcome = run_batch_in_process(
        store,
        settings.topic,
        end_offsets(SegmentLog(store), settings.topic),
        watermark_seconds=120,
        clock_skew_seconds=10**9,
        queries=queries,
    )
    print(
        f"lake: {events:,} events ({args.servers:,} servers x 1,440 minutes) produced in {produced:.1f} s, "
        f"streamed in {outcome.seconds:.1f} s; {Table.QUERY_RESULTS} rows {outcome.rows[Table.QUERY_RESULTS]:,}\n"
    )
    now = (START_MS + DAY_MS) / 1000 + 3600
    params = {"from": START_MS, "to": START_MS + DAY_MS}
    for query in queries:
        reader = DashboardReader(settings, queries, clock=lambda: now)
        stop, address = threading.Event(), []
        server = threading.Thread(
            target=serve, args=(reader, "127.0.0.1", 0, stop), kwargs={"ready": address.append}, daemon=True
        )
        server.start()
        while not address:
            time.sleep(0.05)
        url = f"http://{address[0][0]}:{address[0][1]}/api/queries/{query.name}/series"
        session = requests.Session()
        began = time.perf_counter()
        answer = session.get(url, params=params, timeout=300)
        cold = time.perf_counter() - began
        answer.raise_for_status()
        warm = []
        for _ in range(args.repeat):
            began = time.perf_counter()
            session.get(url, params=params, timeout=300).raise_for_status()
            warm.append(time.perf_counter() - began)
        body = answer.json()
        points = max(len(s["points"]) for s in body["series"])
        p50, p95 = np.percentile(np.array(warm) * 1000, [50, 95])
        print(
            f"{query.name:<14} {len(body['series']):>3} series x {points:>5} points  cold {cold * 1000:7.0f} ms   "
            f"warm p50 {p50:6.1f} ms  p95 {p95:6.1f} ms"
        )
        stop.set()
        server.join(30)
        peer(work, query.name)


def peer(work: Path, name: str) -> None:
    """DuckDB reading the same query_results rows from the table's Parquet files (all versions' files skipped by
    reading the active ones through delta-rs's file list)."""
    import duckdb
    from deltalake import DeltaTable

    files = DeltaTable(str(work / "lake" / keys.table_prefix(Table.QUERY_RESULTS))).file_uris()
    began = time.perf_counter()
    rows = duckdb.sql(
        f"SELECT server, window_start, aggregate, value FROM read_parquet({files!r}) WHERE query = '{name}' "
        f"ORDER BY window_start"
    ).fetchall()
    print(f"{'  peer duckdb':<14} {len(rows):>9,} rows read in {(time.perf_counter() - began) * 1000:7.0f} ms")


if __name__ == "__main__":
    main()
