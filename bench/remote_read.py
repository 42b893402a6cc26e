"""Prometheus remote-read of one series over 24 h, cold, beside DuckDB reading the same Delta snapshot.

Builds a lake of ``--servers x --metrics x --seconds`` events at 1 Hz
(12 M by default, the size of ``bench/same_file.py``'s day) through the
speed layer's library path, then times ``RemoteReader.answer`` (decode,
read bronze pruned by day and metric, group, encode, snappy) for
``{__name__="app_rpc_latency_ms", server="sim-0042"}`` over the last 24 h
with a new reader each time (cold: no table or snapshot cached), and DuckDB
selecting the same rows from the snapshot's files (``DeltaTable.file_uris``).

Usage: ``python bench/remote_read.py [--servers 2500 --metrics 10 --seconds 480 --repeat 3]``. Prints figures;
asserts only that both return the same samples.
"""

from __future__ import annotations

import argparse
import time

import cramjam
import duckdb
from common import scratch_dir
from deltalake import DeltaTable

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.dashboard import DashboardReader
from metrics_lake.app.dashboard.remote_read import RemoteReader
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import LabelMatcher, ReadRequest, ReadResponse
from metrics_lake.core import keys
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.tables import Table

SERVER, METRIC = "sim-0042", "app.rpc.latency_ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2500)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=480)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = scratch_dir("remote-read")
    settings = load_settings(root=str(work / "lake"), partitions=4)
    store = open_store(settings)
    now_ms = int(time.time() * 1000)
    simulator = FleetSimulator(args.servers, args.metrics, args.seconds, 1.0, 3, now_ms - (args.seconds + 600) * 1000)
    started = time.perf_counter()
    with producer_for(settings, store) as producer:
        producer.send(simulator.generate())
    log = SegmentLog(store)
    run_batch_in_process(
        store, settings.topic, end_offsets(log, settings.topic), watermark_seconds=120, clock_skew_seconds=300
    )
    events = args.servers * args.metrics * args.seconds
    print(f"lake: {events:,} events built in {time.perf_counter() - started:.1f} s")

    request = ReadRequest()
    query = request.queries.add(start_timestamp_ms=now_ms - 86_400_000, end_timestamp_ms=now_ms)
    query.matchers.add(type=LabelMatcher.EQ, name="__name__", value=METRIC.replace(".", "_"))
    query.matchers.add(type=LabelMatcher.EQ, name="server", value=SERVER)
    body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
    lake_s, samples = [], 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        answer = RemoteReader(DashboardReader(settings, [])).answer(body)
        lake_s.append(time.perf_counter() - t0)
    (result,) = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(answer))).results
    samples = sum(len(ts.samples) for ts in result.timeseries)

    files = DeltaTable(str(work / "lake" / keys.table_prefix(Table.BRONZE_EVENTS))).file_uris()
    duck_s, rows = [], 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        connection = duckdb.connect()
        connection.execute("SET threads TO 2")
        rows = connection.sql(
            "SELECT ts, value FROM read_parquet($files) WHERE metric = $metric AND server = $server ORDER BY ts",
            params={"files": files, "metric": METRIC, "server": SERVER},
        ).to_arrow_table()
        duck_s.append(time.perf_counter() - t0)
        connection.close()
    assert rows.num_rows == samples, (rows.num_rows, samples)
    print(
        f"one series over 24 h ({samples:,} samples of {events:,} events, {len(files)} bronze files), "
        f"cold, best of {args.repeat}:\n"
        f"  lake remote-read (decode, read, group, encode, snappy)  {min(lake_s):.3f} s  (first {lake_s[0]:.3f} s)\n"
        f"  DuckDB over the same snapshot's files                  {min(duck_s):.3f} s  (first {duck_s[0]:.3f} s)"
    )


if __name__ == "__main__":
    main()
