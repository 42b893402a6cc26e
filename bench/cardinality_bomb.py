"""A cardinality bomb beside the same run without it: one agent sending a fresh tag value per event.

A fleet (``--servers`` × ``--metrics`` at 1 event/s) is appended to the log
in ``--batches`` rounds of ``--batch-seconds`` each, the way a running
stream meets it; the bombed run appends, in the first minute's rounds as
well, ``--bomb`` events of one server each carrying a ``request_id`` never
seen before. Both runs then go through the speed layer's library path
(plan, process, commit of ``metrics_lake.core.speed.micro_batch``, no Spark)
one round per micro-batch, with the default cardinality limits (``LakeSettings``)
on. Printed: per run, each batch's seconds (a stream that keeps up lags by
about its trigger plus this), their p99, and the rows bronze, quarantine and
the windows hold, so the growth a bomb causes can be read against the limit.

Usage: ``python bench/cardinality_bomb.py [--servers 2000 --metrics 10 --bomb 1000000]``. Prints figures;
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa
from common import scratch_dir

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.kernels.cardinality import CardinalityLimits
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed import cardinality_gate
from metrics_lake.core.speed.batch_plan import configured_limits
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.log_records import LOG_RECORD
from metrics_lake.lake_schemas.tables import Table

TOPIC = "metrics"
PARTITIONS = 4


def bomb_events(count: int, first_id: int, start_ms: int, seconds: float) -> pa.Table:
    """``count`` events of server ``bomb-0001``, metric ``app.requests``, with request ids ``first_id``,
    ``first_id + 1``, … (each new), spread over ``seconds`` from ``start_ms``."""
    ts = start_ms + (np.arange(count) * (seconds * 1000 / max(count, 1))).astype(np.int64)
    tags = pa.MapArray.from_arrays(
        pa.array(np.arange(count + 1, dtype=np.int32)),
        pa.array(["request_id"] * count),
        pa.array([f"req-{first_id + i:08d}" for i in range(count)]),
    )
    return pa.table(
        {
            "ts": pa.array(ts).cast(pa.timestamp("ms", "UTC")),
            "server": pa.array(["bomb-0001"] * count),
            "metric": pa.array(["app.requests"] * count),
            "value": pa.array(np.ones(count)),
            "tags": tags,
            "raw": pa.nulls(count, pa.string()),
            "reason": pa.nulls(count, pa.string()),
        }
    ).cast(LOG_RECORD)


def run(work, args, with_bomb: bool, limited: bool = True) -> dict:
    """Append the rounds and process one micro-batch per round (cardinality limits on unless not ``limited``);
    returns batch seconds and table rows."""
    store = LocalStore(work / f"{'bomb' if with_bomb else 'steady'}-{'limits' if limited else 'no-limits'}")
    limits = configured_limits(LakeSettings(root=str(store.root)), PARTITIONS) if limited else CardinalityLimits()
    cardinality_gate._CACHE.clear()
    log = SegmentLog(store)
    start_ms = int(time.time() * 1000) // 60_000 * 60_000 - 600_000
    seconds, refused, sent = [], {}, 0
    bomb_rounds = max(1, round(60 / args.batch_seconds))  # the bomb lands within one minute
    with Producer(log, TOPIC, partitions=PARTITIONS) as producer:
        for i in range(args.batches):
            round_start = start_ms + int(i * args.batch_seconds * 1000)
            producer.send(
                FleetSimulator(
                    servers=args.servers,
                    metrics=args.metrics,
                    seconds=args.batch_seconds,
                    rate=1.0,
                    seed=i,
                    start_ms=round_start,
                ).generate()
            )
            if with_bomb and i < bomb_rounds:
                share = args.bomb // bomb_rounds + (args.bomb % bomb_rounds if i == bomb_rounds - 1 else 0)
                producer.send(bomb_events(share, sent, round_start, args.batch_seconds))
                sent += share
            producer.flush()
            started = time.perf_counter()
            outcome = run_batch_in_process(
                store,
                TOPIC,
                end_offsets(log, TOPIC),
                watermark_seconds=120,
                clock_skew_seconds=300,
                queries=[],
                rules=[],
                limits=limits,
            )
            seconds.append(time.perf_counter() - started)
            for name, count in outcome.limited.items():
                refused[name] = refused.get(name, 0) + count
    rows = {
        name: pa.table(open_table(store, name).get_add_actions(flatten=True)).column("num_records").to_numpy().sum()
        for name in (Table.BRONZE_EVENTS, Table.QUARANTINE_EVENTS, Table.METRIC_WINDOWS_1M)
    }
    return {"seconds": seconds, "rows": rows, "refused": refused, "limits": limits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2_000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--batch-seconds", type=float, default=5.0)
    parser.add_argument("--bomb", type=int, default=1_000_000)
    args = parser.parse_args()
    work = scratch_dir("bench-bomb-")
    unlimited = run(work, args, with_bomb=False, limited=False)
    steady = run(work, args, with_bomb=False)
    bombed = run(work, args, with_bomb=True)
    limits = steady["limits"]
    print(
        f"fleet {args.servers:,} servers × {args.metrics} metrics at 1 event/s, {args.batches} batches of "
        f"{args.batch_seconds:g} s ({args.servers * args.metrics * args.batch_seconds:,.0f} events each); bomb "
        f"{args.bomb:,} events with distinct request_id in the first minute; limits per partition of {PARTITIONS}: "
        f"{limits.series_per_metric:,} series/metric, {limits.values_per_label:,} values/label"
    )
    runs = (("no limits, no bomb", unlimited), ("without bomb", steady), ("with bomb", bombed))
    for name, result in runs:
        s = np.array(result["seconds"])
        print(
            f"  {name:>17}: batch seconds p50 {np.percentile(s, 50):.2f}  p99 {np.percentile(s, 99):.2f}  "
            f"max {s.max():.2f};  rows: "
            + ", ".join(f"{t} {n:,}" for t, n in result["rows"].items())
            + (f";  refused {result['refused']}" if result["refused"] else "")
        )
    p99 = {n: float(np.percentile(r["seconds"], 99)) for n, r in (("steady", steady), ("bomb", bombed))}
    total = {n: sum(r["seconds"]) for n, r in (("unlimited", unlimited), ("steady", steady))}
    print(f"  the limits themselves cost {100 * (total['steady'] / total['unlimited'] - 1):+.1f} % of the batch time")
    growth = {t: bombed["rows"][t] - steady["rows"][t] for t in steady["rows"]}
    print(
        f"  the bomb adds {p99['bomb'] - p99['steady']:+.2f} s to the batch p99; grows "
        + ", ".join(f"{t} by {n:,}" for t, n in growth.items())
    )


if __name__ == "__main__":
    main()
