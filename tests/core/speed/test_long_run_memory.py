"""A stream that runs for months holds what it needs now, not the history of its batches.

Thousands of small micro-batches in one process, as `lake stream` runs them (the tables and open windows kept from
one batch to the next, a compaction round every 20 batches, the producer appending in the same process), with
tracemalloc on: the Python memory still held after batch 2,000 is within a small bound of what it was after batch
500. Without continuous compaction the log's index alone grows by a segment per partition and batch.
"""

from __future__ import annotations

import gc
import time
import tracemalloc

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.log.segment_compaction import compact_topic
from metrics_lake.core.maintenance.continuous_compaction import CompactionPolicy, compact_speed_tables
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import watermark_app_id
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.lake_schemas.tables import Table

pytestmark = pytest.mark.slow
TOPIC = "metrics"
BATCHES = 2000
#: Python memory a long run may gain between batch 500 and batch 2,000 (bytes): caches that fill up and level off.
BOUND = 512 * 1024


def test_python_memory_after_2000_batches_stays_within_a_small_bound_of_batch_500(store):
    log = SegmentLog(store)
    sim = FleetSimulator(servers=4, metrics=2, seconds=1, seed=5, start_ms=0).generate()
    zero = pc.subtract(sim.column("ts").cast(pa.int64()), sim.column("ts").cast(pa.int64()))
    start_ms = int(time.time() * 1000) // 60_000 * 60_000 - BATCHES * 1000 - 60_000
    open_windows, tables, maintenance = OpenWindows(), LatestTables(), LatestTables()
    policy = CompactionPolicy(target_bytes=8 * 1024 * 1024, min_files=4, vacuum_hours=0)
    held: dict[int, int] = {}
    tracemalloc.start(1)
    try:
        with Producer(log, TOPIC, partitions=2, linger_ms=0) as producer:
            for i in range(1, BATCHES + 1):
                ts = pc.add(zero, start_ms + i * 1000).cast(sim.schema.field("ts").type)
                producer.send(sim.set_column(0, "ts", ts))
                producer.flush()
                run_batch_in_process(
                    store,
                    TOPIC,
                    end_offsets(log, TOPIC),
                    watermark_seconds=5,
                    clock_skew_seconds=300,
                    queries=[],
                    rules=[],
                    open_windows=open_windows,
                    tables=tables,
                )
                if i % 20 == 0:  # the stream's round: tables, then the log's segments
                    watermark = maintenance.latest(store, Table.METRIC_WINDOWS_1M).transaction_version(
                        watermark_app_id(TOPIC)
                    )
                    compact_speed_tables(store, policy, sealed_before_us=watermark * 1000, tables=maintenance)
                    compact_topic(log, TOPIC, target_bytes=1024 * 1024, delete_delay_ms=0)
                if i in (500, BATCHES):
                    gc.collect()
                    held[i] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    grown = held[BATCHES] - held[500]
    assert grown < BOUND, f"{grown / 1024:.0f} KiB more held after batch {BATCHES} than after batch 500"
