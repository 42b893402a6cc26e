"""Benchmark: decoding the gateway's protocols into checked log records, against its JSON path in the same run.

The same simulated events (:class:`~metrics_lake.agents.simulator.FleetSimulator`)
are encoded once per protocol in request-sized bodies of ``--batch`` points
(Prometheus's default ``max_samples_per_send`` is 2,000), the way each
client sends them:

- **json** (the peer): NDJSON events, :func:`~metrics_lake.app.gateway.body.records_from_body`;
- **otlp**: an ``ExportMetricsServiceRequest`` as protobuf, a resource per
  server, a gauge per metric holding its points; **otlp_json**: the same in
  OTLP's JSON encoding;
- **remote_write**: a snappy-compressed ``WriteRequest``, a series per
  (server, metric) with ``__name__``, ``instance`` and ``job`` labels;
- **influx**: line protocol, one line per point (``<metric>,host=<server> value=<v> <ns>``).

Bodies are decoded from bytes to LOG_RECORD rows by the gateway's own
functions, timed two ways: on one thread (one gateway process: its decode
threads share the GIL, except the JSON path's Arrow parsing), and split
over ``--processes`` processes (default: one per core), which is how a
machine's cores are used for ingest: one gateway per core, each owning
its own partitions (``lake gateway --partitions``). Printed: points/s per
protocol and the ratio to the JSON path measured the same way. The issue's
target is 200 k points/s for OTLP protobuf and remote-write on this
machine's cores.

Run: ``python bench/protocol_decode.py [--servers 100 --metrics 20 --seconds 100 --batch 2000]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections import defaultdict

import cramjam
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from metrics_lake.agents.gateway_client import table_to_payloads
from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.gateway.body import records_from_body
from metrics_lake.app.gateway.protocols import influx, otlp, remote_write
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest
from metrics_lake.app.gateway.protocols.series_catalog import RecentSeries
from metrics_lake.app.gateway.protocols.temporality import SeriesMemory

TARGET = 200_000


def batches(rows: list[dict], size: int) -> list[list[dict]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def grouped(batch: list[dict]) -> dict[str, dict[str, list[dict]]]:
    by_server: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in batch:
        by_server[row["server"]][row["metric"]].append(row)
    return by_server


def otlp_message(batch: list[dict]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for server, metrics in grouped(batch).items():
        rm = request.resource_metrics.add()
        rm.resource.attributes.add(key="host.name").value.string_value = server
        scope = rm.scope_metrics.add()
        for name, rows in metrics.items():
            gauge = scope.metrics.add(name=name).gauge
            for row in rows:
                gauge.data_points.add(time_unix_nano=row["ms"] * 1_000_000, as_double=row["value"])
    return request


def remote_write_body(batch: list[dict]) -> bytes:
    request = WriteRequest()
    for server, metrics in grouped(batch).items():
        for name, rows in metrics.items():
            series = request.timeseries.add()
            for label, value in (("__name__", name), ("instance", server), ("job", "bench")):
                series.labels.append(Label(name=label, value=value).SerializeToString())
            for row in rows:
                series.samples.add(value=row["value"], timestamp=row["ms"])
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def influx_body(batch: list[dict]) -> bytes:
    return "\n".join(
        f"{r['metric']},host={r['server']} value={r['value']!r} {r['ms'] * 1_000_000}" for r in batch
    ).encode()


def prepare(servers: int, metrics: int, seconds: int, batch: int) -> tuple[int, dict]:
    """(points, {protocol: (bodies, decode)}): the same simulated events encoded per protocol (deterministic)."""
    events = FleetSimulator(servers=servers, metrics=metrics, seconds=seconds, seed=3).generate()
    ms = [int(t.timestamp() * 1000) for t in events.column("ts").to_pylist()]
    rows = [
        {"ms": m, "server": s, "metric": k, "value": v}
        for m, s, k, v in zip(
            ms,
            events.column("server").to_pylist(),
            events.column("metric").to_pylist(),
            events.column("value").to_pylist(),
            strict=True,
        )
    ]
    json_bodies = ["\n".join(p).encode() for p in batches(table_to_payloads(events), batch)]
    parts = batches(rows, batch)
    otlp_messages = [otlp_message(b) for b in parts]
    limit = 64 << 20
    memory, recent, influx_recent = SeriesMemory(), RecentSeries(), RecentSeries()  # as the gateway's endpoints
    writer = remote_write.Decoder()
    cases = {
        "json": (json_bodies, lambda body: records_from_body(body, "application/x-ndjson")),
        "otlp": (
            [m.SerializeToString() for m in otlp_messages],
            lambda body: otlp.decode(body, otlp.PROTOBUF_TYPE, memory, recent).records,
        ),
        "otlp_json": (
            [json_format.MessageToJson(m, indent=None).encode() for m in otlp_messages],
            lambda body: otlp.decode(body, otlp.JSON_TYPE, memory, recent).records,
        ),
        "remote_write": ([remote_write_body(b) for b in parts], lambda body: writer.decode(body, limit).records),
        "influx": ([influx_body(b) for b in parts], lambda body: influx.decode(body, recent=influx_recent).records),
    }
    return len(rows), cases


def decode_all(name: str, bodies: list[bytes], decode) -> tuple[float, float, int]:
    """(start, end) on the monotonic clock (system-wide on Linux) and the points decoded, all accepted."""
    decode(bodies[0])  # warm caches (names, series) as a running gateway has them
    started = time.perf_counter()
    decoded = 0
    for body in bodies:
        table = decode(body)
        decoded += table.num_rows
        assert table.column("reason").null_count == table.num_rows, f"{name}: rejected points"
    return started, time.perf_counter(), decoded


#: The encoded bodies and decoders, set before the process pool forks so its workers inherit them.
_CASES: dict = {}


def worker(name: str, share: int, shares: int, barrier) -> tuple[float, float, int]:
    """One process's share of a protocol's bodies, decoded after every process is ready."""
    bodies, decode = _CASES[name]
    mine = bodies[share::shares]
    barrier.wait()
    return decode_all(name, mine, decode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2000, help="points per request body")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1, help="for the all-cores column")
    args = parser.parse_args()
    points, cases = prepare(args.servers, args.metrics, args.seconds, args.batch)
    _CASES.update(cases)
    print(
        f"{points:,} points ({args.servers} servers x {args.metrics} metrics x {args.seconds} s) in bodies of "
        f"{args.batch:,}; one thread, and {args.processes} processes (one gateway per core on disjoint partitions)"
    )
    print(f"{'protocol':<14}{'body MiB':>10}{'1 thread/s':>12}{'vs json':>9}{'all cores/s':>13}{'vs json':>9}  check")
    peers: list[float] = []
    context = multiprocessing.get_context("fork")
    for name, (bodies, decode) in cases.items():
        started, ended, decoded = decode_all(name, bodies, decode)
        assert decoded == points, f"{name}: {decoded} points decoded of {points}"
        single = points / (ended - started)
        with context.Pool(args.processes) as pool:
            barrier = context.Manager().Barrier(args.processes)
            spans = pool.starmap(worker, [(name, i, args.processes, barrier) for i in range(args.processes)])
        assert sum(n for _, _, n in spans) == points
        parallel = points / (max(e for _, e, _ in spans) - min(s for s, _, _ in spans))
        peers = peers or [single, parallel]
        size = sum(len(b) for b in bodies) / 2**20
        best = max(single, parallel)
        check = (
            f"target {TARGET / 1000:.0f} k: {'met' if best >= TARGET else 'MISSED'}"
            if name in ("otlp", "remote_write")
            else ""
        )
        print(
            f"{name:<14}{size:>10.1f}{single:>12,.0f}{single / peers[0]:>8.2f}x"
            f"{parallel:>13,.0f}{parallel / peers[1]:>8.2f}x  {check}"
        )


if __name__ == "__main__":
    main()
