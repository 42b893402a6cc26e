"""Benchmark: ingest gateway throughput, POST-to-durable-ack latency and segment sizes.

Runs `lake gateway` as its own process over a fresh lake (a local directory,
or with ``--backend s3`` a SeaweedFS server started for the run, signed as
the agent identity), then drives it from this process:

- **demo load**: two agents at the demo's rate (one request per agent per
  second, 176 events/s in total: 20 servers x 8 metrics x 1.1/s) for
  ``--demo-seconds``;
- **saturation**: ``--clients`` agents, each sending pre-encoded gzip NDJSON
  batches of ``--batch`` events back to back until ``--requests`` requests
  are acknowledged.

Both run twice: over plain HTTP on a lake without tokens, then over TLS
(a CA minted for the run, as ``lake infra tls`` does) with a write token
checked on every request (its SHA-256 once, then the remembered digest), and the
cost of the second is printed as a ratio. Then the token is revoked and the
time until the gateway refuses it is measured (the revocation target).

For each it prints events/s, p50/p99 of the time from POST to the 200
(durable) answer as the client sees it, and the average segment object size
from the gateway's own ``/metrics``. The **peer** is the same events appended
by a library :class:`metrics_lake.core.log.producer.Producer` in this process (no HTTP,
no JSON), on the same backend, and **peer+parse** the gateway's own gunzip,
NDJSON parsing and validation followed by that producer (everything but
HTTP); the ratios gateway/peer are printed.

Run: ``python bench/gateway_throughput.py [--backend s3]``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests
from common import free_port, scratch_dir
from prometheus_client.parser import text_string_to_metric_families

from metrics_lake.agents.gateway_client import table_to_payloads
from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.gateway.body import records_from_body
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.producer import producer_for

LAKE = str(Path(sys.executable).with_name("lake"))


def start_gateway(env: dict[str, str], url: str, verify, log: Path, *args: str) -> subprocess.Popen:
    """`lake gateway --port PORT *args` as a process, once it answers /healthz; ``SystemExit`` if it exits first."""
    port = url.rsplit(":", 1)[1]
    gateway = subprocess.Popen([LAKE, "gateway", "--port", port, *args], env=env, stderr=open(log, "wb"))
    while gateway.poll() is None:
        try:
            if requests.get(f"{url}/healthz", timeout=1, verify=verify).ok:
                return gateway
        except requests.ConnectionError:
            time.sleep(0.2)
    raise SystemExit(f"gateway exited; see {log}")


def encode(lines: list[str]) -> bytes:
    return gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1)


def segment_stats(url: str, auth: dict | None = None) -> tuple[float, float]:
    """(segments written, their total bytes) from the gateway's /metrics; ``auth["metrics"]``: headers and verify."""
    auth = (auth or {}).get("metrics", {"headers": {}, "verify": True})
    answer = requests.get(f"{url}/metrics", timeout=10, **auth)
    values = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values["lake_gateway_segment_bytes_count"], values["lake_gateway_segment_bytes_sum"]


def drive(
    url: str, name: str, bodies: list[list[tuple[bytes, int]]], pace_s: float | None, auth: dict | None = None
) -> tuple[float, list[float], int]:
    """One thread per client (producer id ``<name>-<i>``); returns (wall seconds, ack latencies in s, events acked).

    ``auth``: ``{"headers": {...}, "verify": ...}`` for a gateway with tokens and TLS.

    Raises ``SystemExit`` if any request is not answered 200.
    """
    latencies: list[float] = []
    events = [0]
    failures: list[str] = []
    lock = threading.Lock()

    def client(index: int, batches: list[tuple[bytes, int]]) -> None:
        try:
            send(index, batches)
        except Exception as exc:  # noqa: BLE001 - reported after the threads end
            failures.append(f"{name}-{index}: {exc}")

    def send(index: int, batches: list[tuple[bytes, int]]) -> None:
        session = requests.Session()
        headers = {
            "Content-Type": "application/x-ndjson",
            "Content-Encoding": "gzip",
            "X-Producer-Id": f"{name}-{index}",
            **(auth or {}).get("headers", {}),
        }
        verify = (auth or {}).get("verify", True)
        start = time.monotonic()
        for seq, (body, count) in enumerate(batches, 1):
            if pace_s is not None:
                time.sleep(max(0.0, start + seq * pace_s - time.monotonic()))
            sent = time.monotonic()
            answer = session.post(
                f"{url}/v1/events", data=body, headers=headers | {"X-Producer-Seq": str(seq)}, verify=verify
            )
            if answer.status_code != 200:
                raise RuntimeError(f"gateway answered {answer.status_code}: {answer.text}")
            with lock:
                latencies.append(time.monotonic() - sent)
                events[0] += count

    threads = [threading.Thread(target=client, args=(i, b)) for i, b in enumerate(bodies)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit("benchmark failed: " + "; ".join(failures))
    return time.monotonic() - started, latencies, events[0]


def report(
    name: str,
    url: str,
    before: tuple[float, float],
    wall: float,
    latencies: list[float],
    events: int,
    auth: dict | None = None,
) -> tuple[float, float]:
    """Print one scenario's line; returns (events/s, ack p99 ms)."""
    count, total = (a - b for a, b in zip(segment_stats(url, auth), before, strict=True))
    p50, p99, top = np.percentile(np.array(latencies) * 1000, [50, 99, 100])
    print(
        f"{name:<22} {events:>9,} events {events / wall:>10,.0f} ev/s   "
        f"ack p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  max {top:6.1f} ms   "
        f"{count:>5.0f} segments, avg {total / max(count, 1) / 1024:8.1f} KiB"
    )
    return events / wall, p99


def main() -> None:
    """Parse the options, run the scenarios and the peers, print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["local", "s3"], default="local")
    parser.add_argument("--clients", type=int, default=32, help="agents sending back to back in the saturation run")
    parser.add_argument("--batch", type=int, default=2000, help="events per request in the saturation run")
    parser.add_argument("--requests", type=int, default=400, help="requests in the saturation run")
    parser.add_argument("--demo-seconds", type=int, default=20)
    parser.add_argument("--linger-ms", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--profile", type=Path, help="write py-spy's collapsed stacks of the gateway during saturation to this file"
    )
    args = parser.parse_args()

    work = scratch_dir("bench-gateway-")
    env = {"LAKE_ROOT": str(work / "lake"), "LAKE_PARTITIONS": str(args.partitions), "LAKE_LEASE_TTL_SECONDS": "5"}
    infra_args = []
    if args.backend == "s3":
        infra_args = ["--data-dir", str(work / "s3"), "--s3-port", "28433", "--master-port", "29433"]
        subprocess.run([LAKE, "infra", "up", *infra_args], check=True, capture_output=True)
        from metrics_lake.infra.seaweedfs import S3Server, settings_env

        server = S3Server(work / "s3", s3_port=28433, master_port=29433)
        env |= settings_env(server, "agent")  # the bucket root: where the agent identity may write log/
    try:
        run(args, work, env)
    finally:
        if infra_args:
            subprocess.run([LAKE, "infra", "down", *infra_args, "--timeout", "2"], capture_output=True)


def run(args, work: Path, env: dict) -> None:
    """Drive both scenarios over plain HTTP, then over TLS with a token; revoke it; then time the peers."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    print(f"backend {args.backend}, {args.partitions} partitions, linger {args.linger_ms} ms, 2 cores\n")
    # Saturation bodies: pre-encoded, the same for both runs.
    sim = FleetSimulator(servers=200, metrics=10, seconds=max(1, args.requests * args.batch // 2000), seed=2)
    table = sim.generate()
    lines = table_to_payloads(table)
    bodies = [
        [
            (encode(lines[(k * args.batch) % len(lines) : (k * args.batch) % len(lines) + args.batch]), args.batch)
            for k in range(c, args.requests, args.clients)
        ]
        for c in range(args.clients)
    ]
    plain = scenarios(args, work, clean | env, f"http://127.0.0.1:{free_port()}", None, bodies, "plain HTTP")
    # The same over TLS with a token: a CA and a certificate minted for the run, a write token.
    from metrics_lake.core.storage import open_store
    from metrics_lake.core.tokens import Scope, TokenStore
    from metrics_lake.infra.tls import write_ca, write_certificate

    ca = write_ca(work / "tls", "bench CA")
    cert, key = write_certificate(ca, work / "tls", "server", ["127.0.0.1"])
    lake_env = {k.removeprefix("LAKE_").lower(): v for k, v in env.items() if k.startswith("LAKE_")}
    tokens = TokenStore(open_store(load_settings(**lake_env)))
    token, _ = tokens.create("bench-agents", Scope.WRITE)
    reader, _ = tokens.create("bench-metrics", Scope.READ)  # /metrics needs a read token once the lake has tokens
    auth = {
        "headers": {"Authorization": f"Bearer {token}"},
        "verify": str(ca[0]),
        "metrics": {"headers": {"Authorization": f"Bearer {reader}"}, "verify": str(ca[0])},
    }
    secure_env = clean | env | {"LAKE_TLS_CERT": str(cert), "LAKE_TLS_KEY": str(key)}
    secure = scenarios(
        args, work, secure_env, f"https://127.0.0.1:{free_port()}", auth, bodies, "TLS + token", tokens=tokens
    )
    print(
        f"\nTLS + token / plain: saturation {secure[0] / plain[0]:.2f}x the events/s "
        f"({100 * (1 - secure[0] / plain[0]):+.1f} % cost), ack p99 {secure[1] - plain[1]:+.1f} ms"
    )
    events = args.requests * args.batch
    peers(args, env, table, bodies, events, plain)


def scenarios(args, work: Path, env: dict, url: str, auth, bodies, label: str, tokens=None) -> tuple[float, float]:
    """Start a gateway at ``url``, run the demo load and the saturation run; returns saturation (events/s, p99 ms).

    With ``tokens``, the token is revoked afterwards and the seconds until the gateway refuses it are printed.
    """
    verify = auth["verify"] if auth else True
    log = work / f"gateway-{label.split()[0].lower()}.log"
    gateway = start_gateway(env, url, verify, log, "--linger-ms", str(args.linger_ms))
    try:
        # Demo load: 2 agents, one request per second each (the demo's ~176 events/s).
        demo = FleetSimulator(servers=20, metrics=8, seconds=args.demo_seconds, rate=1.1, seed=1)
        per_agent = [[], []]
        for _, batch in demo.second_batches():
            half = batch.num_rows // 2
            for agent, part in enumerate((batch.slice(0, half), batch.slice(half))):
                per_agent[agent].append((encode(table_to_payloads(part)), part.num_rows))
        # Warm-up, not measured: the first requests pay for imports and Arrow kernels initialised on first use.
        warm = FleetSimulator(servers=20, metrics=8, seconds=5, rate=1.1, seed=3).generate()
        drive(url, f"warm-up-{label}", [[(encode(table_to_payloads(warm)), warm.num_rows)] * 3], None, auth)
        before = segment_stats(url, auth)
        report(f"demo load, {label}", url, before, *drive(url, f"demo-{label}", per_agent, 1.0, auth), auth)
        before = segment_stats(url, auth)
        spy = None
        if args.profile:  # where the gateway's time goes (py-spy samples it from outside; needs ptrace rights)
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(gateway.pid), "--threads",
                 "--format", "raw", "--rate", "200", "--output", f"{args.profile}.{label.split()[0].lower()}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1)
        wall, latencies, events = drive(url, f"saturation-{label}", bodies, None, auth)
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        result = report(f"saturation, {label}", url, before, wall, latencies, events, auth)
        if tokens is not None:
            tokens.revoke("bench-agents")
            revoked = time.monotonic()
            body = encode(table_to_payloads(warm.slice(0, 1)))
            while requests.post(f"{url}/v1/events", data=body, verify=verify, **{"headers": auth["headers"]}).ok:
                time.sleep(0.05)
            print(f"{'revocation':<22} refused {time.monotonic() - revoked:.2f} s after `lake tokens revoke`")
        return result
    finally:
        gateway.terminate()
        gateway.wait(60)


def peers(args, env: dict, table, bodies, events: int, plain: tuple[float, float]) -> None:
    """The same events through a library producer (no HTTP or JSON), then with the gateway's parsing (no HTTP)."""
    # Peer: the same number of events appended by a library producer, no HTTP or JSON.
    # Same lake and backend, another topic.
    lake_env = {k.removeprefix("LAKE_").lower(): v for k, v in env.items() if k.startswith("LAKE_")}
    settings = load_settings(**(lake_env | {"topic": "peer"}))
    peer_events = table.slice(0, events) if events <= table.num_rows else table
    started = time.monotonic()
    with producer_for(settings, linger_ms=args.linger_ms) as producer:
        for start in range(0, peer_events.num_rows, args.batch):
            producer.send(peer_events.slice(start, args.batch))
    peer_rate = peer_events.num_rows / (time.monotonic() - started)
    print(f"{'peer':<22} {peer_events.num_rows:>9,} events {peer_rate:>10,.0f} ev/s   (library Producer, Arrow in)")
    # Second peer: the gateway's own decompression, parsing and validation of the same bodies, then the
    # producer; no HTTP.
    compressed = [body for client in bodies for body, _ in client]
    started = time.monotonic()
    with producer_for(settings, linger_ms=args.linger_ms) as producer:
        for body in compressed:
            producer.send(records_from_body(gzip.decompress(body), "application/x-ndjson"))
    parse_rate = events / (time.monotonic() - started)
    print(
        f"{'peer+parse':<22} {events:>9,} events {parse_rate:>10,.0f} ev/s   (gunzip + NDJSON parse + validate + Producer)"
    )
    print(
        f"\ngateway (plain) / peer: {plain[0] / peer_rate:.2f};  gateway (plain) / peer+parse: {plain[0] / parse_rate:.2f}"
    )


if __name__ == "__main__":
    main()
