"""Log compaction and retention: offsets, rows and append times never change; readers never notice."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from metrics_lake.core import keys
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment import SegmentInfo, read_segment_parts
from metrics_lake.core.log.segment_compaction import compact_partition, compact_topic, plan_runs
from metrics_lake.core.log.segment_retention import apply_log_retention, plan_log_retention
from tests.core.log.test_log import records


def fill(log: SegmentLog, sizes: list[int], partition: int = 0, producer: str = "p") -> None:
    writer = log.writer("t", partition, "test-writer", ttl_ms=30_000)
    for i, n in enumerate(sizes):
        writer.append(records(n, start_ms=1_800_000_000_000 + i * 60_000), producer_id=producer, producer_seq=i)
    writer.release()


def append_in_background(writer, appends: int, before=None) -> tuple[threading.Thread, list, threading.Event]:
    """A started thread appending ``appends`` batches of 3 records with ``writer`` (producer ``w``, sequence ``i``),
    calling ``before(i)`` first if given; (the thread, the errors it raised, set when it is done)."""
    errors, done = [], threading.Event()

    def produce() -> None:
        try:
            for i in range(appends):
                if before is not None:
                    before(i)
                writer.append(records(3, start_ms=1_800_000_000_000 + i * 3000), producer_id="w", producer_seq=i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    return thread, errors, done


def test_plan_runs_merges_small_neighbours_up_to_the_target():
    def seg(base, size):
        return SegmentInfo(base, base + 1, None, None, 0, size)

    segments = [seg(0, 10), seg(1, 10), seg(2, 50), seg(3, 10), seg(4, 100), seg(5, 10), seg(6, 10), seg(7, 10)]
    runs = plan_runs(segments, target_bytes=60)
    assert [[s.base_offset for s in run] for run in runs] == [[0, 1], [2, 3], [5, 6, 7]]


def test_compaction_keeps_offsets_rows_and_append_times(any_store):
    log = SegmentLog(any_store)
    log.ensure_topic("t", 1)
    fill(log, [3, 5, 1, 7, 2, 4])
    before = read_range(log, "t", 0, 0, 22)
    appended = log.index("t", 0).segments
    old_names = [s.name for s in appended]

    (result,) = compact_topic(log, "t", target_bytes=1 << 20, delete_delay_ms=60_000)
    assert (result.segments_before, result.segments_after, result.runs, result.deleted) == (6, 1, 1, 0)
    index = log.index("t", 0)
    assert [(s.base_offset, s.end_offset) for s in index.segments] == [(0, 22)]
    assert read_range(log, "t", 0, 0, 22).equals(before)  # ingested_at per record too
    assert read_range(log, "t", 0, 4, 9).equals(before.slice(4, 5))
    assert index.last_seq("p") == 5
    # The index lists no append of the merged segment (its footer does), only the earliest append time.
    (merged,) = index.segments
    assert merged.parts == [] and merged.oldest_appended_at == min(s.appended_at for s in appended)
    assert b'"parts"' not in any_store.read(keys.index_key("t", 0))
    with any_store.open_arrow(keys.partition_key("t", 0, merged.name)) as source:
        assert read_segment_parts(source) == [[s.base_offset, s.appended_at] for s in appended]
    assert index.appended_at(21) == merged.oldest_appended_at  # a lower bound, from the index alone
    assert index.first_appended_at_or_after(merged.appended_at) == 0
    # Old objects stay for readers holding the previous index until the delete delay passes.
    assert set(old_names) <= set(any_store.list("log/t/0"))
    assert compact_partition(log, "t", 0, target_bytes=1 << 20, delete_delay_ms=0).deleted == 6
    assert not set(old_names) & set(any_store.list("log/t/0"))

    # The writer appends on top, and a second compaction merges the merged segment with the new ones.
    fill(log, [2, 2], producer="q")
    grown = read_range(log, "t", 0, 0, 26)
    compact_partition(log, "t", 0, target_bytes=1 << 20, delete_delay_ms=0)
    assert [(s.base_offset, s.end_offset) for s in log.index("t", 0).segments] == [(0, 26)]
    assert read_range(log, "t", 0, 0, 26).equals(grown)  # the first merge's parts came from its footer
    assert read_range(log, "t", 0, 0, 22).equals(before)


def test_an_index_entry_listing_its_parts_still_gives_each_records_append_time():
    """Entries of compacted segments written before the parts moved to the footer list them: they are read as
    before, and their index form (what a rewrite keeps) gives the same times with the footer's parts."""
    listed = SegmentInfo(0, 10, 1, 2, 300, 99, object_name="x", parts=[[0, 100], [4, 300], [7, 200]])
    offsets = np.arange(10, dtype=np.int64)
    times = [100] * 4 + [300] * 3 + [200] * 3
    assert listed.append_times(offsets).tolist() == times
    entry = listed.for_index()
    assert (entry.parts, entry.oldest_appended_at, entry.parts_in_footer) == ([], 100, True)
    assert entry.append_times(offsets, listed.parts).tolist() == times
    assert SegmentInfo.from_json(json.loads(entry.json_text)) == entry
    with pytest.raises(ValueError, match="footer"):
        entry.append_times(offsets)


def test_a_reader_with_a_stale_index_reads_the_compacted_segment(store):
    log = SegmentLog(store)
    log.ensure_topic("t", 1)
    fill(log, [4, 4, 4])
    before = read_range(log, "t", 0, 0, 12)
    real_index, calls = log.index, []

    def stale_then_fresh(topic, partition):
        calls.append(1)
        if len(calls) == 1:  # the reader got the index, then compaction + purge ran before it read a segment
            index = real_index(topic, partition)
            compact_partition(log, "t", 0, target_bytes=1 << 20, delete_delay_ms=0)
            compact_partition(log, "t", 0, target_bytes=1 << 20, delete_delay_ms=0)  # purges the old objects
            return index
        return real_index(topic, partition)

    log.index = stale_then_fresh
    assert read_range(log, "t", 0, 0, 12).equals(before)
    assert store.list("log/t/0") == [
        "00000000000000000000-00000000000000000012.parquet",  # the stale index's segments are gone
        "index.json",
        "lease.json",
    ]


@pytest.mark.slow
def test_compaction_while_a_writer_appends_loses_and_duplicates_nothing(any_store):
    log = SegmentLog(any_store)
    log.ensure_topic("t", 1)
    writer = log.writer("t", 0, "w", ttl_ms=60_000)
    appends = 60
    thread, errors, done = append_in_background(writer, appends)
    compactions = 0
    while not done.is_set():
        compact_partition(log, "t", 0, target_bytes=1 << 20, delete_delay_ms=0)
        compactions += 1
    thread.join()
    compact_partition(log, "t", 0, target_bytes=1 << 20, delete_delay_ms=0)
    assert not errors
    index = log.index("t", 0)
    assert index.next_offset == appends * 3 and compactions > 1
    rows = read_range(log, "t", 0, 0, appends * 3)
    assert rows.column("offset").to_pylist() == list(range(appends * 3))
    assert rows.column("value").to_pylist() == [0.0, 1.0, 2.0] * appends
    assert len(index.segments) == 1


def test_retention_drops_the_expired_head_and_reports_groups_behind(any_store):
    log = SegmentLog(any_store)
    log.ensure_topic("t", 2)
    fill(log, [3, 4], partition=0)
    fill(log, [5], partition=1)
    time.sleep(0.01)
    horizon = int(time.time() * 1000)
    time.sleep(0.01)
    fill(log, [6], partition=0, producer="q")
    commit_offsets(any_store, "slow", "t", {0: 2, 1: 5})
    commit_offsets(any_store, "fast", "t", {0: 13, 1: 5})

    plan = {p.partition: p for p in plan_log_retention(log, "t", horizon)}
    assert (plan[0].segments, plan[0].records, plan[0].old_start, plan[0].new_start) == (2, 7, 0, 7)
    assert plan[0].behind == {"slow": 2}  # records 2..6 were never read by "slow"
    assert (plan[1].segments, plan[1].new_start, plan[1].behind) == (1, 5, {})
    assert log.index("t", 0).start_offset == 0  # planning changed nothing

    assert apply_log_retention(log, "t", horizon, delete_delay_ms=60_000) == []
    assert (log.index("t", 0).start_offset, log.index("t", 0).next_offset) == (7, 13)
    with pytest.raises(ValueError, match=r"outside the log's \[7, 13\)"):
        read_range(log, "t", 0, 0, 13)
    assert read_range(log, "t", 0, 7, 13).column("offset").to_pylist() == list(range(7, 13))
    # Every segment of partition 1 expired: the log end offset survives, and appends continue from it.
    assert (log.index("t", 1).start_offset, log.index("t", 1).next_offset) == (5, 5)
    fill(log, [2], partition=1, producer="q")
    assert read_range(log, "t", 1, 5, 7).column("offset").to_pylist() == [5, 6]
    deleted = apply_log_retention(log, "t", horizon, delete_delay_ms=0)
    assert sorted(deleted) == [
        "log/t/0/00000000000000000000.parquet",
        "log/t/0/00000000000000000003.parquet",
        "log/t/1/00000000000000000000.parquet",
    ]
    assert not any(any_store.exists(key) for key in deleted)
