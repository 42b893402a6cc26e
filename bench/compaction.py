"""Benchmark: what compaction does to a lake the speed layer filled in many small micro-batches.

Builds a lake the way production does (not timed): ``--rounds`` rounds, each
one a producer session of the demo's fleet (``--servers`` x ``--metrics`` at
1 sample/s for ``--seconds``) followed by ``lake stream --once`` with
``--batch-records`` records per micro-batch, so every round adds a few small
log segments and a few small Delta files per table; a last event the next
day closes the rounds' day (compaction leaves alone the days the speed layer
may still rewrite). Then it runs log
compaction and table compaction (bin-pack, then a checkpoint) and prints, per
table and for the log, object counts and average sizes before and after, the
compaction's wall time, and, as the peer that shows why it matters, a full
read of each (delta-rs ``to_pyarrow_table``; the log's ``read_range``)
before vs after in the same process.

Run: ``python bench/compaction.py [--rounds 20 --servers 20 --metrics 8 --seconds 60]``.
"""

from __future__ import annotations

import argparse
import time

from common import scratch_dir

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.log.segment_compaction import compact_topic
from metrics_lake.core.maintenance.table_compaction import compact_table
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import list_tables, open_table
from metrics_lake.spark.jobs.stream_metrics import run_stream
from metrics_lake.spark.session import build_session

#: 2025-11-20T08:00Z: a past day (event times past append time + clock skew would not move the watermark).
START_MS = 1_763_625_600_000
#: A last, tiny round the next day at 02:00 moves the watermark (1 h) past midnight: compaction leaves the days
#: the speed layer may still rewrite alone, so the rounds' day must be closed for its windows to be compacted.
CLOSING_MS = START_MS + 18 * 3_600_000


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def read_log(log: SegmentLog, topic: str) -> int:
    return sum(read_range(log, topic, p, 0, end).num_rows for p, end in end_offsets(log, topic).items())


def main() -> None:
    """Fill a lake in small micro-batches, compact it, print before/after counts, sizes and read times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--batch-records", type=int, default=5000)
    args = parser.parse_args()

    base = scratch_dir("bench-compaction-")
    settings = load_settings(
        root=str(base / "lake"),
        checkpoint_dir=str(base / "ck"),
        spark_master="local[2]",
        shuffle_partitions=2,
        max_records_per_batch=args.batch_records,
        watermark_seconds=3600,
    )
    store, log = open_store(settings), SegmentLog(open_store(settings))
    spark = build_session(settings, "bench-compaction")
    for round_ in range(args.rounds):
        sim = FleetSimulator(
            servers=args.servers,
            metrics=args.metrics,
            seconds=args.seconds,
            seed=round_,
            start_ms=START_MS + round_ * args.seconds * 1000,
        )
        with Producer(log, settings.topic, partitions=settings.partitions) as producer:
            producer.send(sim.generate())
        run_stream(spark, settings, once=True)
        print(f"round {round_ + 1}/{args.rounds}: {sim.total_events:,} events streamed", flush=True)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=1, metrics=1, seconds=1, seed=0, start_ms=CLOSING_MS).generate())
    run_stream(spark, settings, once=True)
    print("closing round: 1 event the next day, which closes the rounds' day", flush=True)

    tables = list_tables(store)
    read_before = {name: timed(lambda n=name: open_table(store, n).to_pyarrow_table()) for name in tables}
    log_read_before = timed(lambda: read_log(log, settings.topic))

    started = time.perf_counter()
    segments = compact_topic(log, settings.topic, target_bytes=settings.log_compaction_target_bytes, delete_delay_ms=0)
    log_seconds = time.perf_counter() - started
    results = [compact_table(store, name, target_bytes=settings.table_compaction_target_bytes) for name in tables]

    read_after = {name: timed(lambda n=name: open_table(store, n).to_pyarrow_table()) for name in tables}
    log_read_after = timed(lambda: read_log(log, settings.topic))

    seg_before, seg_after = sum(r.segments_before for r in segments), sum(r.segments_after for r in segments)
    bytes_before, bytes_after = sum(r.bytes_before for r in segments), sum(r.bytes_after for r in segments)
    print(
        f"\n{'object':<24}{'files':>8}{'after':>8}{'avg KiB':>10}{'after':>10}{'secs':>7}{'read s':>9}{'after':>8}{'speed-up':>9}"
    )
    print(
        f"{'log segments':<24}{seg_before:>8,}{seg_after:>8,}{bytes_before / seg_before / 1024:>10.1f}"
        f"{bytes_after / seg_after / 1024:>10.1f}{log_seconds:>7.2f}{log_read_before:>9.3f}{log_read_after:>8.3f}"
        f"{log_read_before / log_read_after:>8.1f}x"
    )
    for r in results:
        if r.files_before:
            print(
                f"{r.table:<24}{r.files_before:>8,}{r.files_after:>8,}{r.avg_bytes_before / 1024:>10.1f}"
                f"{r.avg_bytes_after / 1024:>10.1f}{r.seconds:>7.2f}{read_before[r.table]:>9.3f}"
                f"{read_after[r.table]:>8.3f}{read_before[r.table] / read_after[r.table]:>8.1f}x"
            )
    spark.stop()


if __name__ == "__main__":
    main()
