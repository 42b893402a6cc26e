"""The segment log: dense offsets, immutable segments, index, idempotence, ranges."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.consumer import end_offsets, offsets_for_time, read_range, start_offsets
from metrics_lake.core.log.index import PartitionIndex
from metrics_lake.core.log.log import PartitionWriter, SegmentLog
from metrics_lake.core.log.producer import Producer, assign_partitions, partition_for
from metrics_lake.core.log.segment import decode_segment, encode_segment, parse_segment_name, segment_name
from metrics_lake.core.log.segment_compaction import compact_partition
from metrics_lake.core.storage import LocalStore, ObjectExistsError
from metrics_lake.lake_schemas.errors import TopicNotFoundError
from metrics_lake.lake_schemas.log_records import CODED_LOG_RECORD, DICTIONARY_STRING, LOG_RECORD
from metrics_lake.lake_schemas.ndjson import records_from_lines
from metrics_lake.lake_schemas.types import TAGS


def records(n: int, start_ms: int = 1_800_000_000_000, server: str = "web-01") -> pa.Table:
    """``n`` valid records, one per second from ``start_ms``, values 0..n-1."""
    return pa.table(
        {
            "ts": pa.array([start_ms + i * 1000 for i in range(n)], pa.int64()).cast(LOG_RECORD.field("ts").type),
            "server": [server] * n,
            "metric": ["host.cpu.utilization"] * n,
            "value": [float(i) for i in range(n)],
            "tags": pa.nulls(n, LOG_RECORD.field("tags").type),
            "raw": pa.nulls(n, pa.string()),
            "reason": pa.nulls(n, pa.string()),
        },
        schema=LOG_RECORD,
    )


def test_segment_names_are_zero_padded_base_offsets():
    assert segment_name(1234) == "00000000000000001234.parquet"
    assert parse_segment_name(segment_name(2**62)) == 2**62
    assert parse_segment_name("index.json") is None


def test_appends_get_dense_monotonic_offsets_and_read_back_exactly(log):
    log.ensure_topic("t", 2)
    assert log.append("t", 0, records(3)).base_offset == 0
    assert (log.append("t", 0, records(5)).base_offset, log.index("t", 0).next_offset) == (3, 8)
    assert log.append("t", 1, records(2)).end_offset == 2
    assert end_offsets(log, "t") == {0: 8, 1: 2}
    assert start_offsets(log, "t") == {0: 0, 1: 0}

    # A range crossing the segment boundary: offsets 2..5 = values 2 of seg 1 and 0..2 of seg 2
    rows = read_range(log, "t", 0, 2, 6)
    assert rows.column("offset").to_pylist() == [2, 3, 4, 5]
    assert rows.column("value").to_pylist() == [2.0, 0.0, 1.0, 2.0]
    assert set(rows.column("partition").to_pylist()) == {0}
    assert read_range(log, "t", 0, 4, 4).num_rows == 0


def test_a_range_read_with_dictionaries_holds_the_same_records(log):
    """``dictionaries``: topic, server, metric and the tags' names and values as each segment's dictionaries and
    indices, every value as read plainly, across segments with different dictionaries and in an empty range."""
    log.ensure_topic("t", 1)
    tagged = records(2, server="db-02").set_column(4, "tags", pa.array([[("az", "b")], None], TAGS))
    log.append("t", 0, records(3, server="web-01"))
    log.append("t", 0, pa.concat_tables([tagged, records(2, server="web-01")]))
    plain = read_range(log, "t", 0, 1, 7)
    coded = read_range(log, "t", 0, 1, 7, dictionaries=True)
    for name in ("topic", "server", "metric"):
        assert coded.schema.field(name).type == DICTIONARY_STRING
    assert [chunk.dictionary.to_pylist() for chunk in coded.column("topic").chunks] == [["t"], ["t"]]
    assert coded.schema.field("tags").type == pa.map_(DICTIONARY_STRING, DICTIONARY_STRING)
    assert [len(chunk.dictionary) for chunk in coded.column("server").chunks] == [1, 2]
    assert coded.cast(plain.schema).equals(plain)
    assert coded.column("server").to_pylist() == ["web-01", "web-01", "db-02", "db-02", "web-01", "web-01"]
    assert coded.column("tags").to_pylist() == [None, None, [("az", "b")], None, None, None]
    empty = read_range(log, "t", 0, 4, 4, dictionaries=True)
    assert empty.num_rows == 0 and empty.schema.equals(coded.schema)


def coded_lines() -> tuple[pa.Table, pa.Table]:
    """The same records plain and as the importer makes them (:data:`CODED_LOG_RECORD`, two chunks with differing
    dictionaries): tags, a string time, rejects (they have no server), and a row with neither server nor raw."""
    lines = [
        b'{"ts": 1800000000000, "server": "web-01", "metric": "m.a", "value": 1, "tags": {"az": "b", "dc": "eu"}}',
        b'{"ts": "2027-01-15T08:00:00Z", "server": "db-02", "metric": "m.b", "value": 2}',
        b'{"ts": 1800000000001, "server": "web-01", "metric": "m.a", "value": "NaN"}',
        b"not json",
        b'{"ts": 1800000000002, "server": "web-03", "metric": "m.c", "value": 3, "tags": {"dc": "us"}}',
    ]
    halves = [b"\n".join(lines[:3]), b"\n".join(lines[3:])]
    coded = [records_from_lines(half, few_lines=0, dictionaries=True).records for half in halves]
    plain = pa.concat_tables([records_from_lines(half, few_lines=0).records for half in halves])
    reject = plain.slice(0, 1).set_column(5, "raw", pa.nulls(1, pa.string())).set_column(6, "reason", pa.array(["x"]))
    reject = reject.set_column(1, "server", pa.nulls(1, pa.string()))
    return pa.concat_tables([plain, reject]), pa.concat_tables([*coded, reject.cast(CODED_LOG_RECORD)])


def test_records_with_dictionaries_make_the_same_segment_and_partitions_as_plain_ones(log):
    """The importer's dictionary-encoded records: the same partition per row (a row without a server goes by its
    raw payload, or ""), split without being decoded, and a segment holding the same records, its strings in Parquet
    dictionaries, without the Arrow schema that would be the only difference from the plain records' segment."""
    plain, coded = coded_lines()
    assert coded.column("server").num_chunks > 2 and coded.column("server").null_count == 3
    assert assign_partitions(coded, 4).tolist() == assign_partitions(plain, 4).tolist()
    assert assign_partitions(coded, 4)[-1] == partition_for("", 4)
    producer = Producer(log, "t", partitions=4)
    coded_parts, plain_parts = producer.split(coded), producer.split(plain)
    assert coded_parts.keys() == plain_parts.keys() and len(coded_parts) > 1
    for p, part in coded_parts.items():
        assert part.schema == CODED_LOG_RECORD and part.cast(LOG_RECORD).equals(plain_parts[p])
        # A partition's segment holds the servers of that partition in its dictionary, not all of its chunk's.
        stored = decode_segment(
            pa.BufferReader(encode_segment(part, base_offset=0, appended_at=1)[0]), CODED_LOG_RECORD
        )
        servers = {s for s in plain_parts[p].column("server").to_pylist() if s is not None}
        assert sorted(stored.column("server").chunk(0).dictionary.to_pylist()) == sorted(servers)
        assert stored.cast(LOG_RECORD).equals(plain_parts[p])
    producer.close()
    plain_bytes, plain_info = encode_segment(plain, base_offset=7, appended_at=1)
    coded_bytes, coded_info = encode_segment(coded, base_offset=7, appended_at=1)
    assert coded_info.to_json() | {"size_bytes": 0} == plain_info.to_json() | {"size_bytes": 0}
    assert decode_segment(pa.BufferReader(coded_bytes)).equals(plain)
    assert decode_segment(pa.BufferReader(plain_bytes)).equals(plain)
    read_plainly = pq.read_table(pa.BufferReader(coded_bytes)).replace_schema_metadata(None)
    assert read_plainly.schema.equals(LOG_RECORD) and read_plainly.equals(plain)
    footer = pq.ParquetFile(pa.BufferReader(coded_bytes)).metadata
    assert (
        b"ARROW:schema" not in footer.metadata
        and b"ARROW:schema" in pq.read_metadata(pa.BufferReader(plain_bytes)).metadata
    )
    columns = {footer.schema.column(i).path: footer.row_group(0).column(i) for i in range(footer.num_columns)}
    for path in ("server", "metric", "tags.key_value.key", "tags.key_value.value"):
        assert "RLE_DICTIONARY" in columns[path].encodings, path


def test_reading_outside_the_log_is_an_error_not_a_short_read(log):
    log.ensure_topic("t", 1)
    log.append("t", 0, records(3))
    with pytest.raises(ValueError, match="outside"):
        read_range(log, "t", 0, 0, 4)


def test_segments_are_immutable(store, log):
    log.ensure_topic("t", 1)
    log.append("t", 0, records(3))
    with pytest.raises(ObjectExistsError):
        store.create(f"log/t/0/{segment_name(0)}", b"overwrite attempt")
    assert read_range(log, "t", 0, 0, 3).column("value").to_pylist() == [0.0, 1.0, 2.0]


def test_unknown_topic_and_partition_are_clear_errors(log):
    with pytest.raises(TopicNotFoundError, match="nope"):
        log.partitions("nope")
    log.ensure_topic("t", 2)
    with pytest.raises(IndexError, match="partition 2 out of range"):
        log.append("t", 2, records(1))


def test_existing_topic_keeps_its_partition_count(log):
    assert log.ensure_topic("t", 3) == 3
    assert log.ensure_topic("t", 8) == 3


def test_a_fenced_writers_uncommitted_segment_never_becomes_visible(store, log):
    log.ensure_topic("t", 1)
    log.append("t", 0, records(4))
    # A writer of epoch 1 crashed after creating segment 4 but before committing the index.
    data, _ = encode_segment(records(2), base_offset=4, appended_at=0, epoch=1, producers={"p": 7})
    store.create(f"log/t/0/{segment_name(4)}", data)
    assert log.index("t", 0).next_offset == 4  # not visible to consumers
    result = log.append("t", 0, records(1))  # the next writer (a higher epoch) drops the zombie
    assert (result.base_offset, result.end_offset) == (4, 5)
    assert read_range(log, "t", 0, 0, 5).column("value").to_pylist() == [0.0, 1.0, 2.0, 3.0, 0.0]
    # The crashed producer's retry of sequence 7 was never acknowledged, so it is appended once.
    retry = log.append("t", 0, records(2), producer_id="p", producer_seq=7)
    assert not retry.duplicate and (retry.base_offset, retry.end_offset) == (5, 7)
    assert log.append("t", 0, records(2), producer_id="p", producer_seq=7).duplicate


def test_a_writers_own_half_done_append_is_adopted_on_retry(store, log, monkeypatch):
    log.ensure_topic("t", 1)
    writer = log.writer("t", 0, "w")
    real_save = PartitionIndex.save
    calls = {"n": 0}

    def save_that_fails_once(self, *args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("connection reset after the segment was written")
        return real_save(self, *args)

    monkeypatch.setattr(PartitionIndex, "save", save_that_fails_once)
    with pytest.raises(OSError):
        writer.append(records(3), producer_id="p", producer_seq=1)
    assert log.index("t", 0).next_offset == 0  # segment created, not committed
    again = writer.append(records(3), producer_id="p", producer_seq=1)
    assert again.duplicate and (again.base_offset, again.end_offset) == (0, 3)
    assert log.index("t", 0).next_offset == 3


def test_producer_retry_with_same_sequence_is_idempotent(log):
    log.ensure_topic("t", 1)
    first = log.append("t", 0, records(3), producer_id="p1", producer_seq=1)
    again = log.append("t", 0, records(3), producer_id="p1", producer_seq=1)
    assert not first.duplicate and again.duplicate
    assert (again.base_offset, again.end_offset) == (0, 3)
    assert log.append("t", 0, records(3), producer_id="p1", producer_seq=2).base_offset == 3
    assert log.append("t", 0, records(1), producer_id="p2", producer_seq=1).base_offset == 6
    assert log.index("t", 0).next_offset == 7


def test_index_records_time_range_and_size_and_finds_offsets_by_time(log):
    log.ensure_topic("t", 1)
    base = 1_800_000_000_000
    log.append("t", 0, records(10, start_ms=base))  # ts base .. base+9s
    log.append("t", 0, records(10, start_ms=base + 60_000))  # base+60s .. base+69s
    index = log.index("t", 0)
    first = index.segments[0]
    assert (first.min_ts, first.max_ts, first.record_count) == (base, base + 9000, 10)
    assert first.size_bytes == log.store.size(f"log/t/0/{first.name}") > 0
    assert offsets_for_time(log, "t", base) == {0: 0}
    assert offsets_for_time(log, "t", base + 30_000) == {0: 10}
    assert offsets_for_time(log, "t", base + 120_000) == {0: 20}


def test_partitioning_is_stable_and_keeps_each_server_in_one_partition():
    assert partition_for("web-01", 4) == partition_for("web-01", 4)
    table = FleetSimulator(servers=40, metrics=2, seconds=5, seed=1).generate()
    assignment = assign_partitions(table, 4)
    by_server: dict[str, set[int]] = {}
    for server, p in zip(table.column("server").to_pylist(), assignment, strict=True):
        by_server.setdefault(server, set()).add(int(p))
    assert all(len(parts) == 1 for parts in by_server.values())
    assert {p for parts in by_server.values() for p in parts} == {0, 1, 2, 3}


def test_producer_preserves_per_server_order_and_loses_nothing(log):
    table = FleetSimulator(servers=12, metrics=3, seconds=30, seed=3).generate()
    with Producer(log, "m", partitions=3, roll_bytes=20_000, linger_ms=10_000) as producer:
        for start in range(0, table.num_rows, 100):
            producer.send(table.slice(start, 100))
    ends = end_offsets(log, "m")
    assert sum(ends.values()) == table.num_rows
    assert producer.stats.segments > 3  # flushed by size, several times
    for p, end in ends.items():
        rows = read_range(log, "m", p, 0, end)
        for server in set(rows.column("server").to_pylist()):
            mine = rows.filter(pa.compute.equal(rows.column("server"), server))
            expected = table.filter(pa.compute.equal(table.column("server"), server))
            assert mine.column("ts").to_pylist() == expected.column("ts").to_pylist()


def test_a_batch_split_by_partition_beforehand_is_appended_as_the_whole_batch_would_be(log):
    table = FleetSimulator(servers=12, metrics=3, seconds=30, seed=5).generate()
    with (
        Producer(log, "whole", partitions=3, linger_ms=10_000) as whole,
        Producer(log, "split", partitions=3, linger_ms=10_000) as split,
    ):
        for start in range(0, table.num_rows, 250):
            batch = table.slice(start, 250)
            parts = split.split(batch)
            assert sum(part.num_rows for part in parts.values()) == batch.num_rows
            assert all(set(split.route(part)) == {p} for p, part in parts.items())
            routes = split.route(batch)  # each partition's rows in the batch's order
            assert all(part.equals(batch.filter(pa.array(routes == p))) for p, part in parts.items())
            shuffle = np.random.default_rng(start).permutation(batch.num_rows)  # rows out of order, with their order
            assert {p: t.to_pylist() for p, t in split.split(batch.take(shuffle), order=shuffle).items()} == {
                p: t.to_pylist() for p, t in parts.items()
            }
            whole.send(batch)
            split.send(parts)
    assert end_offsets(log, "whole") == end_offsets(log, "split")
    for p, end in end_offsets(log, "whole").items():
        assert (
            read_range(log, "split", p, 0, end)
            .drop_columns(["topic", "ingested_at"])
            .equals(read_range(log, "whole", p, 0, end).drop_columns(["topic", "ingested_at"]))
        )


def test_producer_flushes_by_age_without_explicit_flush(log):
    producer = Producer(log, "m", partitions=1, roll_bytes=10**9, linger_ms=50)
    try:
        producer.send(records(5))
        deadline = time.monotonic() + 5
        while log.index("m", 0).next_offset < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert log.index("m", 0).next_offset == 5
    finally:
        producer.close()


def test_the_adaptive_group_commit_flushes_once_no_request_is_incoming_and_waits_while_one_is(log):
    producer = Producer(log, "m", partitions=1, roll_bytes=10**9, linger_ms=60_000, flush_when_idle=True)
    try:
        started = time.monotonic()
        producer.send(records(5))  # nothing incoming: flushed at once, not after the minute's linger
        producer.send(records(3)).futures[0].result(timeout=5)
        assert log.index("m", 0).next_offset == 8 and time.monotonic() - started < 5
        with producer.incoming():  # another request on its way: the batch waits for it
            waiting = producer.send(records(2)).futures[0]
            time.sleep(0.3)
            assert not waiting.done() and log.index("m", 0).next_offset == 8
        waiting.result(timeout=5)  # the request arrived (or failed): flushed without waiting out the linger
        assert log.index("m", 0).next_offset == 10
    finally:
        producer.close()


@pytest.mark.parametrize(
    ("holds_the_gil", "request_on_its_way", "side_by_side"),
    [(True, False, 4), (True, True, 1), (False, True, 4)],
    ids=["local-idle", "local-decoding", "object-store-decoding"],
)
def test_appends_run_side_by_side_unless_they_would_take_turns_at_the_gil_with_requests_being_decoded(
    log, monkeypatch, holds_the_gil, request_on_its_way, side_by_side
):
    """Up to Store.parallel_appends partitions append at once; on a store whose appends hold the GIL (a local disk)
    one at a time while a request is on its way to the buffer (being decoded), since side by side they only take
    turns at the GIL; on an object store, whose appends wait on round trips, side by side regardless. All land."""
    monkeypatch.setattr(type(log.store), "parallel_appends", 4)
    monkeypatch.setattr(type(log.store), "appends_hold_the_gil", holds_the_gil)
    under_way = peak = 0
    lock = threading.Lock()
    append = PartitionWriter.append

    def slow_append(self, *args, **kwargs):
        nonlocal under_way, peak
        with lock:
            under_way += 1
            peak = max(peak, under_way)
        try:
            time.sleep(0.2)
            return append(self, *args, **kwargs)
        finally:
            with lock:
                under_way -= 1

    monkeypatch.setattr(PartitionWriter, "append", slow_append)
    producer = Producer(log, "p", partitions=4, linger_ms=10, flush_when_idle=True)
    try:
        body = pa.concat_tables([records(2, server=f"web-{i:02d}") for i in range(16)])  # rows in every partition
        with producer.incoming() if request_on_its_way else contextlib.nullcontext():
            sent = producer.send(body)
            for future in sent.futures:  # flushed after the linger while the request is on its way
                future.result(timeout=10)
    finally:
        producer.close()
    assert len(sent.futures) == 4 and peak == side_by_side
    assert sum(end_offsets(log, "p").values()) == 32


def test_a_request_key_is_appended_once_per_partition_across_producers_and_compaction(log):
    """A request retried whole (same key): not buffered again while its first copy is buffered, nor once appended
    within the window; a producer taking the partitions over reads the keys back from the segments' footers, also
    after log compaction merged them; past the window (or with none) the body is appended again."""
    body = pa.concat_tables([records(3, server=f"web-{i:02d}") for i in range(8)])  # rows in both partitions
    lone = records(2, server="web-00")

    def producer(window_ms: int) -> Producer:
        made = Producer(log, "rw", partitions=2, linger_ms=60_000, request_window_ms=window_ms)
        made.acquire()
        return made

    first = producer(60_000)
    sent = first.send(body, request_key="k1")
    retry = first.send(body, request_key="k1")  # still buffered: waits for the same flush
    assert (sent.records, retry.records, retry.duplicates) == (24, 0, 24) and retry.futures == sent.futures
    first.flush()
    assert first.send(body, request_key="k1").duplicates == 24  # appended: remembered
    first.send(lone, request_key="k2")
    first.close()
    assert sum(end_offsets(log, "rw").values()) == 26
    merged = [compact_partition(log, "rw", p, delete_delay_ms=0) for p in range(2)]
    assert sum(m.segments_before - m.segments_after for m in merged) >= 1  # k1's and k2's segments are one now

    second = producer(60_000)  # as a gateway restarted after its predecessor was killed
    assert second.send(body, request_key="k1").duplicates == 24
    assert second.send(lone, request_key="k2").duplicates == 2
    assert second.send(lone, request_key="k3").records == 2  # a new request
    second.close()
    assert sum(end_offsets(log, "rw").values()) == 28

    time.sleep(0.01)
    for window_ms in (1, 0):  # older than the window, or no window: appended again
        again = producer(window_ms)
        assert again.send(lone, request_key="k3").records == 2
        again.close()
    assert sum(end_offsets(log, "rw").values()) == 32
    rows = [read_range(log, "rw", p, 0, end) for p, end in end_offsets(log, "rw").items()]
    assert sum(table.num_rows for table in rows) == 32


def test_without_the_adaptive_group_commit_incoming_requests_change_nothing(log):
    producer = Producer(log, "m", partitions=1, roll_bytes=10**9, linger_ms=60_000)
    try:
        with producer.incoming():
            pass
        buffered = producer.send(records(5)).futures[0]
        time.sleep(0.3)
        assert not buffered.done()  # it waits for its linger, as before
    finally:
        producer.close()
    assert log.index("m", 0).next_offset == 5  # closing flushed it


def _produce_in_child(root: str, seed: int) -> None:
    log = SegmentLog(LocalStore(root))
    table = FleetSimulator(servers=8, metrics=2, seconds=20, seed=seed).generate()
    with Producer(log, "m", partitions=2, roll_bytes=4_000, linger_ms=10_000) as producer:
        for start in range(0, table.num_rows, 37):
            producer.send(table.slice(start, 37))


def test_concurrent_producer_processes_keep_offsets_dense(log, store):
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=_produce_in_child, args=(str(store.root), seed)) for seed in (1, 2, 3)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    expected = 3 * 8 * 2 * 20
    ends = end_offsets(log, "m")
    assert sum(ends.values()) == expected
    for p, end in ends.items():
        index = PartitionIndex.load(store, "m", p)
        bases = [s.base_offset for s in index.segments]
        ends_ = [s.end_offset for s in index.segments]
        assert bases[0] == 0 and bases[1:] == ends_[:-1]  # dense, no gap, no overlap
        assert read_range(log, "m", p, 0, end).column("offset").to_pylist() == list(range(end))


def test_a_failed_flush_is_retried_with_its_sequence_and_nothing_newer_is_left_behind(log, monkeypatch):
    producer = Producer(log, "m", partitions=1, roll_bytes=10**9, linger_ms=60_000, retries=0)
    real_append = PartitionWriter.append
    calls = {"n": 0}

    def append_that_writes_then_fails(self, *args, **kwargs):
        calls["n"] += 1
        result = real_append(self, *args, **kwargs)
        if calls["n"] == 1:
            raise OSError("timeout after the segment was written")  # the caller cannot know it landed
        return result

    monkeypatch.setattr(PartitionWriter, "append", append_that_writes_then_fails)
    producer.send(records(3))
    with pytest.raises(OSError):
        producer.flush()  # batch 1 stays pending with its sequence number
    producer.send(records(4, start_ms=1_900_000_000_000))
    producer.close()  # retries batch 1 (a duplicate, skipped), then appends batch 2
    assert log.index("m", 0).next_offset == 7
    assert read_range(log, "m", 0, 0, 7).column("value").to_pylist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0]


def test_two_producers_needing_each_others_partitions_take_leases_in_order_and_both_finish(log):
    server = {partition_for(f"web-{i}", 2): f"web-{i}" for i in range(20)}  # a server routed to each partition
    first = Producer(log, "m", partitions=2, linger_ms=60_000, lease_wait_s=5)
    second = Producer(log, "m", partitions=2, linger_ms=60_000, lease_wait_s=30)
    first.send(records(3, server=server[1]))
    first.flush()  # needs partition 1: takes the leases of 0 and 1, in order
    failures: list[Exception] = []

    def other() -> None:
        try:
            second.send(records(3, server=server[0]))
            second.flush()  # waits for partition 0 until the first producer is done
            second.send(records(3, server=server[1]))
            second.close()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.5)
    first.send(records(3, server=server[0]))  # lazily leased partitions would deadlock here until lease_wait_s
    first.close()
    thread.join(60)
    assert not failures and not thread.is_alive()
    assert end_offsets(log, "m") == {0: 6, 1: 6}
