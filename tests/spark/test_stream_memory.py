"""The stream driver's Python memory does not grow with the number of batches it has run.

The driver's code without Spark (:func:`~metrics_lake.core.speed.micro_batch.run_batch_in_process`, the same
planning, commits and state a ``lake stream`` driver keeps: open windows, the latest table snapshots, the alert
log, stored queries' merged minutes) runs one small batch per second of event time, with the stream's idle work
between batches (absence alerts every 5 batches, a continuous compaction round every 60) and the log compacted as
the gateway compacts its partitions (every 60 batches; without that the producer's segment index, 2 segments a
batch here, grows as it should). tracemalloc traces the allocations made from batch ``TRACE_FROM`` on, once every
cache, table and window in use has been filled and the interpreter's interned strings have taken their size (a
one-time 4 MiB resize of that table happened between batches 200 and 300 when traced from the start); after a
full collection at each report, what those allocations still hold may grow by ``GROWTH_BOUND_BYTES`` at most from
the first report to any later one, not by what each batch leaves: a leak of 2 KiB a batch would show as 600 KiB.

Measured when this test was written: traced from the start (800 batches, on disk), +3,896 KiB at batch 300 (the
resize), then +80, +72, +142 (a VACUUM round), -35, -5 KiB a hundred batches; as here, +170, +9, +107 KiB from
batch 300 (+170 KiB, +179 KiB, +286 KiB in all). Before the log was compacted in the test too, a steady +207 KiB every hundred batches (the producer's
index): 620 KiB over these 300, which this bound fails.
"""

from __future__ import annotations

import gc
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest

from metrics_lake.agents.simulator import FleetSimulator
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
BATCHES = 600
TRACE_FROM = 250
FIRST_REPORT = 300
REPORT_EVERY = 100
GROWTH_BOUND_BYTES = 512 * 1024
#: Merged segments stay listed in the index (``retired``) this long before their objects are deleted: state bounded
#: by time, not by batches. The default (LAKE_SEGMENT_DELETE_DELAY_SECONDS, 300 s) is longer than this test runs,
#: so it would grow the index all along: measured over batches 300-600, +566 KiB with the default (of which +480 KiB
#: decoded JSON), +286 KiB with this delay.
RETIRED_SEGMENTS_DELAY_MS = 2_000


@pytest.fixture
def scratch(tmp_path):
    """A folder in memory where the machine has one (no fsync cost: the test is about memory, not disks)."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="lake-stream-memory-") as folder:
        yield Path(folder)


def test_the_drivers_retained_python_memory_stays_flat_over_hundreds_of_batches(scratch):
    settings = load_settings(root=str(scratch / "lake"), checkpoint_dir=str(scratch / "checkpoints"))
    store = prepare_lake(settings)
    open_windows, tables, idle_tables = OpenWindows(), LatestTables(), LatestTables()
    start_ms = int(time.time() * 1000) - BATCHES * 1000  # event time ends now: nothing is in the future
    fleet = FleetSimulator(servers=2, metrics=3, seconds=BATCHES, seed=61, start_ms=start_ms)
    retained: dict[int, int] = {}
    done = 0
    try:
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
                if done == TRACE_FROM:
                    tracemalloc.start()
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
                    retained[done] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert done == BATCHES
    growth = {batch: bytes_ - retained[FIRST_REPORT] for batch, bytes_ in retained.items()}
    assert max(growth.values()) <= GROWTH_BOUND_BYTES, {b: f"{g / 1024:+.0f} KiB" for b, g in growth.items()}
