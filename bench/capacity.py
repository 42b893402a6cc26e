"""Capacity model: measured throughput per core, and a projection for the design brief's 20 M events/s.

Measured on this machine, each in the same run:

- **gateway**: one `lake gateway` process driven to saturation with gzip
  NDJSON (as ``bench/gateway_throughput.py``); events/s per process;
- **speed layer**: `lake stream --once` over ``--events`` produced events on
  a `lake infra spark up` cluster of 1 worker (1 core) and of 2 workers (1
  core each): events/s over the batches' own processing time after the
  first (Spark's start, and the executors' Python workers starting in the
  first batch, excluded; the first batch's time is printed), and wall time;
- **recompute**: `lake recompute` of the day on both clusters, after a
  one-minute day before it in the same run (so the measured day runs in a
  warm session, as every day of a fleet-sized recompute does);
- bytes per event in log segments and in bronze Parquet.

Then :func:`projection` turns them into the fleet's numbers (gateway
processes, partitions, executor cores, S3 requests and their monthly cost,
Delta commit rates), printing which inputs are measured and which are
assumptions (list prices, the target, roll sizes). docs/capacity.md quotes
a run of this script.

Run: ``python bench/capacity.py [--servers 500 --metrics 10 --seconds 720]`` (3.6 M events per Spark run).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import LAKE, lake_env  # noqa: E402
from gateway_throughput import drive, encode, free_port, start_gateway  # noqa: E402

from metrics_lake.agents.gateway_client import table_to_payloads
from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.producer import producer_for
from metrics_lake.lake_schemas.tables import Table

START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 60_000  # 2025-11-20 00:53 UTC: one day, whatever the run's date
TARGET_EVENTS_PER_SECOND = 20_000_000  # design brief: 10,000 servers x 2,000 metrics/s
#: S3 Standard list prices, us-east-1 (aws.amazon.com/s3/pricing, as published in 2025), USD.
PUT_PER_1000 = 0.005
GET_PER_1000 = 0.0004
STORAGE_GB_MONTH = 0.023
SECONDS_PER_MONTH = 30 * 86_400
_BATCH = re.compile(r"batch: ([\d,]+) records in ([\d.]+) s")
_RECOMPUTE = re.compile(r"events -> [\d,]+ windows.*?\(([\d.]+) s\)", re.S)


def measure_gateway(work: Path, requests_count: int = 800, batch: int = 2000, clients: int = 32) -> float:
    """Events/s of one gateway process at saturation (gzip NDJSON bodies of ``batch`` events, back to back)."""
    env = lake_env(work / "gateway")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = start_gateway(env, port, work / "gateway.log")
    try:
        lines = table_to_payloads(FleetSimulator(servers=200, metrics=10, seconds=requests_count * batch // 2000,
                                                 seed=2).generate())  # fmt: skip
        bodies = [
            [(encode(lines[k * batch : (k + 1) * batch]), batch) for k in range(c, requests_count, clients)]
            for c in range(clients)
        ]
        drive(url, "warm-up", [bodies[0][:3]], pace_s=None)
        wall, _, events = drive(url, "saturation", bodies, pace_s=None)
        return events / wall
    finally:
        gateway.terminate()
        gateway.wait(60)


def spark_cluster(work: Path, workers: int, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Start a cluster of ``workers`` 1-core workers; (its CLI arguments, env with LAKE_SPARK_MASTER)."""
    port = free_port()
    args = ["--data-dir", str(work / f"spark-{workers}"), "--master-port", str(port), "--ui-port", str(port + 100)]
    up = subprocess.run([LAKE, "infra", "spark", "up", *args, "--workers", str(workers), "--cores", "1",
                         "--memory", "3g"], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    master = up.stdout.strip().split("=", 1)[1]
    return args, env | {"LAKE_SPARK_MASTER": master}


def measure_spark(work: Path, workers: int, servers: int, metrics: int, seconds: int) -> dict:
    """Speed layer and recompute over a fresh lake on a cluster of ``workers`` workers."""
    env = lake_env(work / f"lake-{workers}", LAKE_SHUFFLE_PARTITIONS=str(2 * workers))
    settings = load_settings(root=env["LAKE_ROOT"], checkpoint_dir=env["LAKE_CHECKPOINT_DIR"])
    sim = FleetSimulator(servers=servers, metrics=metrics, seconds=seconds, seed=4, start_ms=START_MS)
    # A minute of the day before, recomputed first: the measured day then runs in a warm session, as every day
    # of a real recompute does (a day of the fleet is 1.7e12 events; Spark's first-job start-up is ~4 s).
    warm_up = FleetSimulator(servers=servers, metrics=metrics, seconds=60, seed=5, start_ms=START_MS - 86_400_000)
    with producer_for(settings) as producer:
        producer.send(warm_up.generate())
        producer.send(sim.generate())
    args, env = spark_cluster(work, workers, env)
    try:
        started = time.monotonic()
        stream = subprocess.run([LAKE, "stream", "--once"], env=env, capture_output=True, text=True, check=True)
        stream_wall = time.monotonic() - started
        batches = [(int(n.replace(",", "")), float(s)) for n, s in _BATCH.findall(stream.stderr)]
        day = time.strftime("%Y-%m-%d", time.gmtime(START_MS / 1000))
        before = time.strftime("%Y-%m-%d", time.gmtime(START_MS / 1000 - 86_400))
        started = time.monotonic()
        recompute = subprocess.run([LAKE, "recompute", "--from", before, "--to", day], env=env, capture_output=True,
                                   text=True, check=True)  # fmt: skip
        recompute_wall = time.monotonic() - started
        cold_s, recompute_s = (float(seconds) for seconds in _RECOMPUTE.findall(recompute.stderr))
    finally:
        subprocess.run([LAKE, "infra", "spark", "down", *args], env=env, capture_output=True, check=False)
    root = Path(env["LAKE_ROOT"])
    bronze = root / keys.table_prefix(Table.BRONZE_EVENTS)
    bronze_bytes = _dir_bytes(bronze) - _dir_bytes(bronze / "_delta_log")
    events, stored = sim.total_events, sim.total_events + warm_up.total_events
    return {
        "events": events,
        # The first batch also starts the executors' Python workers, which a running stream pays once.
        "stream_rate": sum(n for n, _ in batches[1:]) / sum(s for _, s in batches[1:]),
        "first_batch_s": batches[0][1],
        "stream_wall": stream_wall,
        "recompute_rate": events / recompute_s,
        "recompute_warm_up_day_s": cold_s,
        "recompute_wall": recompute_wall,
        "log_bytes_per_event": _dir_bytes(root / "log") / stored,
        "bronze_bytes_per_event": bronze_bytes / stored,
    }


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def projection(gateway_rate: float, one: dict, two: dict, *, partitions_per_gateway: int = 2,
               linger_s: float = 1.0, roll_bytes: int = 4 << 20, trigger_s: float = 5.0,
               retention_days: float = 7.0) -> list[tuple[str, str, str]]:  # fmt: skip
    """(quantity, value, how it was obtained) for the 20 M ev/s fleet from the measured figures."""
    target = TARGET_EVENTS_PER_SECOND
    scaling = two["stream_rate"] / one["stream_rate"]
    per_core = two["stream_rate"] / 2  # the 2-worker figure: it already pays for spreading work over executors
    gateways = math.ceil(target / gateway_rate)
    partitions = gateways * partitions_per_gateway
    cores = math.ceil(target / per_core)
    recompute_cores = math.ceil(target * 86_400 / (two["recompute_rate"] / 2) / (4 * 3600))  # a day in 4 hours
    log_mb_s = target * one["log_bytes_per_event"] / 1e6
    segments_s = max(log_mb_s * 1e6 / roll_bytes, partitions / linger_s)  # size-rolled or linger-flushed
    puts_s = 2 * segments_s  # each append: the segment object, then the partition index swap
    gets_s = segments_s + partitions / trigger_s  # the speed layer reads each segment once, each index per batch
    bronze_tb = target * two["bronze_bytes_per_event"] * 86_400 * 30 / 1e12
    log_tb = log_mb_s * 1e6 * 86_400 * retention_days / 1e12
    cost_requests = (puts_s * PUT_PER_1000 + gets_s * GET_PER_1000) * SECONDS_PER_MONTH / 1000
    return [
        ("target", f"{target / 1e6:.0f} M events/s", "design brief (10,000 servers x 2,000 metrics/s)"),
        ("gateway throughput", f"{gateway_rate:,.0f} ev/s per process", "measured (the process may use both cores)"),
        (
            "speed layer, 1 worker",
            f"{one['stream_rate']:,.0f} ev/s",
            "measured (batch processing time, first batch excluded)",
        ),
        ("speed layer, 2 workers", f"{two['stream_rate']:,.0f} ev/s", "measured"),
        ("scaling 1 -> 2 workers", f"{scaling:.2f}x", "measured (driver shares the 2 cores)"),
        ("recompute, 1 / 2 workers", f"{one['recompute_rate']:,.0f} / {two['recompute_rate']:,.0f} ev/s", "measured"),
        ("log bytes per event", f"{one['log_bytes_per_event']:.1f} B", "measured (segments + index)"),
        ("bronze bytes per event", f"{two['bronze_bytes_per_event']:.1f} B", "measured (Parquet)"),
        ("gateway processes", f"{gateways:,}", "projected: target / measured per process"),
        ("log partitions", f"{partitions:,}", f"projected: {partitions_per_gateway} per gateway (lease rebalancing)"),
        ("speed-layer executor cores", f"{cores:,}", "projected: target / measured per core at 2 workers"),
        ("recompute cores (a day in 4 h)", f"{recompute_cores:,}", "projected"),
        ("log write rate", f"{log_mb_s:,.0f} MB/s", "projected"),
        (
            "S3 PUT rate",
            f"{puts_s:,.0f} /s",
            f"projected: 2 per segment; segments roll at {roll_bytes >> 20} MiB or {linger_s:g} s per partition",
        ),
        (
            "S3 GET rate",
            f"{gets_s:,.0f} /s",
            f"projected: 1 per segment + 1 index per partition per {trigger_s:g} s batch",
        ),
        ("S3 requests per month", f"${cost_requests:,.0f}", f"PUT ${PUT_PER_1000}/1k, GET ${GET_PER_1000}/1k (list)"),
        (
            "storage: log, bronze 30 days",
            f"{log_tb:,.0f} TB, {bronze_tb:,.0f} TB",
            f"projected; log kept {retention_days:g} days",
        ),
        (
            "storage per month",
            f"${(log_tb + bronze_tb) * 1000 * STORAGE_GB_MONTH:,.0f}",
            f"${STORAGE_GB_MONTH}/GB-month (list)",
        ),
        ("Delta commits per table", f"{1 / trigger_s:.1f} /s", f"one per micro-batch ({trigger_s:g} s trigger)"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=720)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lake-capacity-") as tmp:
        work = Path(tmp)
        print(f"machine: {os.cpu_count()} cores; {args.servers * args.metrics * args.seconds:,} events per Spark run")
        gateway_rate = measure_gateway(work)
        print(f"gateway: {gateway_rate:,.0f} ev/s")
        one = measure_spark(work, 1, args.servers, args.metrics, args.seconds)
        print(f"1 worker: {one}")
        two = measure_spark(work, 2, args.servers, args.metrics, args.seconds)
        print(f"2 workers: {two}")
    print()
    print(f"| {'quantity':<32} | {'value':<44} | how |")
    print(f"|{'-' * 34}|{'-' * 46}|-----|")
    for quantity, value, how in projection(gateway_rate, one, two):
        print(f"| {quantity:<32} | {value:<44} | {how} |")


if __name__ == "__main__":
    main()
