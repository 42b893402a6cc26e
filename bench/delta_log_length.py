"""Benchmark: a micro-batch's time against the length of the speed tables' Delta logs, on a local lake.

Every table ``lake stream`` writes gets a log entry per batch and keeps its
entries for ``LAKE_DELTA_LOG_RETENTION_HOURS``: at a 1 s trigger about 3,600
an hour (plus a checkpoint every 10). On a local lake each delta-rs open,
refresh (``update_incremental``) and commit lists the whole ``_delta_log``
folder, and a batch does about 30 of those across its tables (counted with
``strace -e openat``), so the log's length is a cost of every batch. This run
gives each speed table a log of N entries before the first batch (commits
holding only their ``commitInfo``, then a checkpoint at the last, as a log
the stream wrote for N seconds and cleaned up to a checkpoint looks to a
listing), then times ``--batches`` in-process micro-batches of ``--servers``
x 10 events (:func:`metrics_lake.core.speed.micro_batch.run_batch_in_process`,
the driver's code without Spark), the first five left out. The peer is the
first length, a log 10 minutes long. S3 lists from a key, so a lake on S3 does
not pay this. Run:
``python bench/delta_log_length.py [--entries 700 4000 24000] [--servers 500] [--batches 45]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from common import print_table, run_batch_of_the_log, scratch_dir
from deltalake import DeltaTable

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.arrow_memory import use_system_allocator
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.maintenance.continuous_compaction import VACUUMED_TABLES
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.tables.delta import LatestTables, table_uri
from metrics_lake.spark.jobs.stream_metrics import prepare_lake

METRICS = 10
WARM_UP = 5  # batches left out: the first ones open the tables and fill the driver's caches


def lengthen_logs(uri: str, entries: int, timestamp_ms: int) -> None:
    """Give the local table at ``uri`` versions up to ``entries - 1`` (commits of a ``commitInfo`` only) and a
    checkpoint at the last one."""
    log = Path(uri) / "_delta_log"
    line = json.dumps({"commitInfo": {"timestamp": timestamp_ms, "operation": "WRITE"}}) + "\n"
    for version in range(DeltaTable(uri).version() + 1, entries):
        (log / f"{version:020d}.json").write_text(line)
    DeltaTable(uri).create_checkpoint()


def run(entries: int, servers: int, batches: int) -> list[float]:
    """Seconds of each batch after the warm-up, on a fresh lake whose speed tables' logs hold ``entries`` entries
    (in a process of its own, so the runs share no cache)."""
    use_system_allocator()  # as the lake's processes allocate (metrics_lake.core.arrow_memory)
    workdir = scratch_dir("lake-log-length-")
    settings = load_settings(root=str(workdir / "lake"), checkpoint_dir=str(workdir / "checkpoints"))
    store = prepare_lake(settings)
    now_ms = int(time.time() * 1000)
    for name in VACUUMED_TABLES:
        lengthen_logs(table_uri(store, name), entries, now_ms)
    open_windows, tables, seconds = OpenWindows(), LatestTables(), []
    fleet = FleetSimulator(servers=servers, metrics=METRICS, seconds=batches, seed=7, start_ms=now_ms - batches * 1000)
    with producer_for(settings, store, linger_ms=0) as producer:
        for _, events in fleet.second_batches():
            producer.send(events)
            producer.flush()
            started = time.perf_counter()
            run_batch_of_the_log(settings, store, open_windows, tables)
            seconds.append(time.perf_counter() - started)
    return seconds[WARM_UP:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--entries", type=int, nargs="+", default=[700, 4000, 24000], help="log entries per speed table, one run each"
    )
    parser.add_argument("--servers", type=int, default=500, help=f"servers, {METRICS} metrics each, 1 event/s")
    parser.add_argument("--batches", type=int, default=45, help=f"micro-batches per run ({WARM_UP} of warm-up)")
    args = parser.parse_args()
    rows, baseline = [], None
    for entries in args.entries:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as fresh:
            seconds = sorted(fresh.submit(run, entries, args.servers, args.batches).result())
        median, p90 = seconds[len(seconds) // 2], seconds[int(len(seconds) * 0.9)]
        baseline = baseline or median
        rows.append(
            (
                f"{entries:,}",
                f"{entries / 1.1 / 3600:.1f} h",  # a commit a second and a checkpoint every 10
                f"{median * 1000:,.0f}",
                f"{p90 * 1000:,.0f}",
                f"{median / baseline:.2f}x",
            )
        )
        print(f"  {entries:,} entries: median {median * 1000:,.0f} ms", flush=True)
    print_table(("log entries per table", "at a 1 s trigger", "batch median ms", "batch p90 ms", "vs the first"), rows)


if __name__ == "__main__":
    main()
