"""The stream driver's memory does not grow with the number of batches it has run.

The driver's code without Spark (:func:`~metrics_lake.core.speed.micro_batch.run_batch_in_process`, the same
planning, commits and state a ``lake stream`` driver keeps: open windows, the latest table snapshots, the alert
log, stored queries' merged minutes and result rows) runs 2,000 small batches, one per second of event time, with
the stream's idle work between batches (absence alerts every 5 batches, a continuous compaction round every 60)
and the log compacted as the gateway compacts its partitions (every 60 batches). From batch 500 on, once every
cache, table and window in use has been filled, each report (after a full collection) may exceed batch 500's by
at most ``OBJECT_BLOCKS_BOUND`` blocks of CPython's object allocator (``sys.getallocatedblocks``: every live
Python object, however small) and ``NATIVE_BYTES_BOUND`` bytes of native memory (glibc malloc's bytes in use:
numpy arrays, Python objects over 512 bytes; plus pyarrow's pool). A leak of two objects, or of a kilobyte, a batch
fails.

Why these counters and not tracemalloc: started after the warm-up, tracemalloc counts a table that existed before
and is allocated again at the same size (the interpreter's interned strings, 4 MiB, rebuilt once their deleted
entries fill it) as new memory held, which failed this test at random; and it made each batch about 6x slower,
so 2,000 batches would take half an hour. To find what grows, run ``bench/driver_memory.py --tracemalloc``.

Measured (2026-11-29, on /dev/shm): before the partition index left compacted segments' append parts to their
footers, +7.5 blocks a batch (every append's ``[base, time]`` pair, decoded from the index); after, the blocks
swing between -300 and +1,200 of batch 100's with the 5-minute query windows. Native memory still rises by about
0.3 KiB a batch (+444 KiB from batch 500 to 2,000), which tracemalloc does not see over batches 600-900 (its
largest differences are +-9 KiB): not Python's nor numpy's allocations, and not pyarrow's pool (flat), so a
C library's own; not found yet.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.arrow_memory import memory_usage
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.log.segment_compaction import compact_partition
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.spark.jobs.stream_metrics import compact, idle_alerts, prepare_lake

pytestmark = pytest.mark.slow
BATCHES = 2_000
FIRST_REPORT = 500
REPORT_EVERY = 100
OBJECT_BLOCKS_BOUND = 3_000
NATIVE_BYTES_BOUND = 1536 * 1024
#: Merged segments stay listed in the index (``retired``) this long before their objects are deleted: state bounded
#: by time, not by batches. The default (LAKE_SEGMENT_DELETE_DELAY_SECONDS, 300 s) is longer than this test runs,
#: so it would grow the index all along (measured with tracemalloc over batches 300-600: +566 KiB with the default,
#: of which +480 KiB decoded JSON; +286 KiB with this delay).
RETIRED_SEGMENTS_DELAY_MS = 2_000


@pytest.fixture
def scratch(tmp_path):
    """A folder in memory where the machine has one (no fsync cost: the test is about memory, not disks)."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="lake-stream-memory-") as folder:
        yield Path(folder)


def test_the_drivers_memory_stays_flat_over_thousands_of_batches(scratch):
    settings = load_settings(root=str(scratch / "lake"), checkpoint_dir=str(scratch / "checkpoints"))
    store = prepare_lake(settings)
    open_windows, tables, idle_tables = OpenWindows(), LatestTables(), LatestTables()
    start_ms = int(time.time() * 1000) - BATCHES * 1000  # event time ends now: nothing is in the future
    fleet = FleetSimulator(servers=2, metrics=3, seconds=BATCHES, seed=61, start_ms=start_ms)
    held: dict[int, tuple[int, int]] = {}  # batch -> (object blocks, native bytes)
    done = 0
    with producer_for(settings, store, linger_ms=0) as producer:
        for _, events in fleet.second_batches():
            producer.send(events)
            producer.flush()
            outcome = run_batch_in_process(
                store,
                settings.topic,
                end_offsets(SegmentLog(store), settings.topic),
                watermark_seconds=settings.watermark_seconds,
                clock_skew_seconds=settings.quality_clock_skew_seconds,
                open_windows=open_windows,
                tables=tables,
            )
            assert outcome is not None and outcome.rows["bronze_events"] == len(events)
            done += 1
            if done % 5 == 0:
                idle_alerts(settings, idle_tables, store)
            if done % 60 == 0:
                compact(settings, vacuum=done % 600 == 0, tables=idle_tables, store=store)
                for partition in producer.owned:
                    compact_partition(
                        producer.log,
                        settings.topic,
                        partition,
                        delete_delay_ms=RETIRED_SEGMENTS_DELAY_MS,
                        swap_lock=producer.flush_lock(partition),
                    )
            if done >= FIRST_REPORT and done % REPORT_EVERY == 0:
                gc.collect()
                held[done] = (sys.getallocatedblocks(), native_bytes())
    assert done == BATCHES
    first_blocks, first_bytes = held[FIRST_REPORT]
    growth = {batch: (blocks - first_blocks, native - first_bytes) for batch, (blocks, native) in held.items()}
    shown = {batch: f"{blocks:+,} blocks, {native / 1024:+,.0f} KiB" for batch, (blocks, native) in growth.items()}
    assert max(blocks for blocks, _ in growth.values()) <= OBJECT_BLOCKS_BOUND, shown
    assert max(native for _, native in growth.values()) <= NATIVE_BYTES_BOUND, shown


def native_bytes() -> int:
    """Native memory in use: glibc malloc's bytes, plus pyarrow's pool unless that pool is malloc itself."""
    usage = memory_usage()
    assert usage.malloc_in_use is not None, "this test reads glibc's mallinfo2 (glibc 2.33 or later)"
    pool = 0 if pa.default_memory_pool().backend_name == "system" else usage.arrow_allocated
    return usage.malloc_in_use + pool
