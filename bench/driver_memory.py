"""Benchmark: the speed layer driver's memory over many micro-batches in process, with continuous compaction and without.

What grows in a long-running ``lake stream`` that is not Spark's: this
process appends ``--servers`` x 10 metrics events per second of event time to
a fresh local lake and runs one micro-batch after each second
(:func:`metrics_lake.core.speed.micro_batch.run_batch_in_process`, the
stream's driver code without Spark), with the stream's idle work between
batches: absence alerts every 5 batches and a continuous compaction round
every 60 (with VACUUM every 600), as ``lake stream --trigger 1`` does with the
default ``LAKE_COMPACTION_INTERVAL_SECONDS``. Every 100 batches it prints the
process's RSS and the bytes Arrow has allocated; the peer is the same run
without compaction, so the difference is what compaction holds.
``--tracemalloc`` also prints the Python allocations that grew most between
batch 300 and the end. Run:
``python bench/driver_memory.py [--batches 800] [--servers 2000] [--tracemalloc]``.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor

import psutil
import pyarrow as pa
from common import mib, print_table, run_batch_of_the_log, scratch_dir

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.arrow_memory import use_system_allocator
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.spark.jobs.stream_metrics import compact, idle_alerts, prepare_lake

METRICS = 10
REPORT_EVERY = 100


def run(batches: int, servers: int, compaction: bool, trace: bool) -> list[tuple[int, int, int]]:
    """(batch, RSS bytes, Arrow bytes) every :data:`REPORT_EVERY` batches of one run (in a process of its own: RSS
    keeps a process's high-water mark, so the runs must not share one)."""
    use_system_allocator()  # as the lake's processes allocate (metrics_lake.core.arrow_memory)
    if trace:
        tracemalloc.start()
    workdir = scratch_dir("lake-driver-memory-")
    settings = load_settings(root=str(workdir / "lake"), checkpoint_dir=str(workdir / "checkpoints"))
    store = prepare_lake(settings)
    open_windows, tables, idle_tables = OpenWindows(), LatestTables(), LatestTables()
    start_ms = int(time.time() * 1000) - batches * 1000  # event time ends now: nothing is in the future
    process, samples, before = psutil.Process(), [], None
    with producer_for(settings, linger_ms=0) as producer:
        done = 0
        for first in range(0, batches, 100):  # the simulator's events 100 s at a time: bounded memory
            fleet = FleetSimulator(
                servers=servers, metrics=METRICS, seconds=100, seed=first, start_ms=start_ms + first * 1000
            )
            for _, events in fleet.second_batches():
                producer.send(events)
                producer.flush()
                run_batch_of_the_log(settings, store, open_windows, tables)
                done += 1
                if done % 5 == 0:
                    idle_alerts(settings, idle_tables, store)
                if compaction and done % 60 == 0:
                    compact(settings, vacuum=done % 600 == 0, tables=idle_tables, store=store)
                if done % REPORT_EVERY == 0:
                    gc.collect()
                    samples.append((done, process.memory_info().rss, pa.total_allocated_bytes()))
                    print(
                        f"  {'with' if compaction else 'without'} compaction: batch {done:>5} "
                        f"RSS {mib(samples[-1][1])} MiB",
                        flush=True,
                    )
                    if trace and done == 300:
                        before = tracemalloc.take_snapshot()
                if done >= batches:
                    break
    if trace and before is not None:
        for stat in tracemalloc.take_snapshot().compare_to(before, "lineno")[:10]:
            print(f"    {stat}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=800, help="micro-batches, one per second of event time")
    parser.add_argument("--servers", type=int, default=2000, help=f"servers, {METRICS} metrics each, 1 event/s")
    parser.add_argument("--tracemalloc", action="store_true", help="also trace Python allocations (slower)")
    args = parser.parse_args()
    results = {}
    for compaction in (True, False):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
            results[compaction] = fresh.submit(run, args.batches, args.servers, compaction, args.tracemalloc).result()
    print_table(
        ("batch", "RSS MiB, compaction", "RSS MiB, none", "Arrow MiB, compaction", "Arrow MiB, none"),
        [
            (f"{a[0]:,}", mib(a[1]), mib(b[1]), mib(a[2]), mib(b[2]))
            for a, b in zip(results[True], results[False], strict=True)
        ],
    )


if __name__ == "__main__":
    main()
