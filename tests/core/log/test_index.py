"""The partition index in chunks: an append rewrites a bounded tail, and every reader still sees every segment."""

from __future__ import annotations

import json
import random
import time

import pytest

from metrics_lake.core import keys
from metrics_lake.core.log import index as index_module
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.index import PartitionIndex, purge_retired
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment import SegmentInfo, encode_segment
from metrics_lake.core.log.segment_compaction import compact_partition
from metrics_lake.core.log.segment_retention import apply_log_retention
from metrics_lake.core.storage import LocalStore, VersionConflictError
from metrics_lake.lake_schemas.errors import ConflictError, IntegrityError
from tests.core.log.test_log import records
from tests.core.log.test_log_maintenance import append_in_background

CHUNK = 4


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 4 entries, so a few dozen segments make many chunks; and a fresh chunk cache."""
    monkeypatch.setattr(index_module, "CHUNK_SEGMENTS", CHUNK)
    monkeypatch.setattr(index_module, "latest_chunks", index_module.LatestChunks())


def stored(store, partition: int = 0) -> dict:
    return json.loads(store.read(keys.index_key("t", partition)))


def chunk_files(store, partition: int = 0) -> set[str]:
    return set(store.list(keys.index_chunks_prefix("t", partition)))


def reloaded(store) -> PartitionIndex:
    """The index as a process that never read it sees it (no cached chunks)."""
    index_module.latest_chunks = index_module.LatestChunks()
    return PartitionIndex.load(store, "t", 0)


def spans(segments) -> list[tuple[int, int, str]]:
    return [(s.base_offset, s.end_offset, s.name) for s in segments]


def test_an_append_rewrites_only_the_tail_however_many_segments_the_partition_holds(store):
    log = SegmentLog(store)
    log.ensure_topic("t", 1)
    writer = log.writer("t", 0, "w", ttl_ms=60_000)
    for i in range(60):
        writer.append(records(2, start_ms=1_800_000_000_000 + i * 2000), producer_id="w", producer_seq=i)
        doc = stored(store)
        assert len(doc["tail"]) == (i + 1 if i + 1 < 2 * CHUNK else CHUNK + (i + 1) % CHUNK)
        assert [ref["count"] for ref in doc["chunks"]] == [CHUNK] * ((i + 1 - len(doc["tail"])) // CHUNK)
    assert {ref["name"] for ref in stored(store)["chunks"]} == chunk_files(store)
    index = reloaded(store)
    assert spans(index.segments) == spans(writer.index.segments)
    assert [(s.base_offset, s.end_offset) for s in index.segments] == [(2 * i, 2 * i + 2) for i in range(60)]
    assert index.last_seq("w") == 59
    rows = read_range(log, "t", 0, 0, 120)
    assert rows.column("offset").to_pylist() == list(range(120))
    assert rows.column("value").to_pylist() == [0.0, 1.0] * 60


def entry(base: int, end: int, name: str | None = None) -> SegmentInfo:
    return SegmentInfo(base, end, base, end, base, 100 * (end - base), object_name=name)


@pytest.mark.parametrize("seed", range(6))
def test_chunks_follow_every_change_of_compaction_and_retention_and_readers_see_the_same_segments(tmp_path, seed):
    """Random appends, merged runs (anywhere, across chunk boundaries) and dropped heads, each saved, against a
    plain list of the same changes; every save is read back by a process with no cached chunks."""
    rng = random.Random(seed)
    store = LocalStore(tmp_path)
    index, model, next_offset = PartitionIndex(), [], 0
    for step in range(300):
        action = rng.random()
        if action < 0.6 or len(model) < 2:
            for _ in range(rng.randint(1, 12)):
                info = entry(next_offset, next_offset + rng.randint(1, 5))
                index.add(info)
                model.append(info)
                next_offset = info.end_offset
        elif action < 0.85:
            first = rng.randrange(len(model) - 1)
            run = model[first : first + rng.randint(2, min(20, len(model) - first))]
            merged = entry(run[0].base_offset, run[-1].end_offset, f"merged-{step}")
            index.replace_run(run, merged, now_ms=step)
            model[first : first + len(run)] = [merged]
        else:
            count = rng.randint(1, max(1, len(model) // 3))
            index.drop_head(count, now_ms=step)
            model = model[count:]
        index.save(store, "t", 0)
        assert spans(index.segments) == spans(model)
        assert spans(reloaded(store).segments) == spans(model)
        doc = stored(store)
        assert len(doc["tail"]) < 2 * CHUNK
        counts = [ref["count"] for ref in doc["chunks"]]
        if len(model) > 2 * CHUNK:  # neither shrinking nor multiplying as runs are rewritten
            assert all(CHUNK // 2 <= count <= 2 * CHUNK for count in counts), counts
        named = {ref["name"] for ref in doc["chunks"]}
        retired = {e["name"].removeprefix(f"{keys.INDEX_CHUNKS_FOLDER}/") for e in index.retired}
        assert named <= chunk_files(store) and not named & retired
    assert purge_retired(store, "t", 0, delay_ms=0, now_ms=int(time.time() * 1000) + 1)
    assert chunk_files(store) == {ref["name"] for ref in stored(store)["chunks"]}


def test_one_segment_replaced_by_one_inside_a_chunk_is_saved(store):
    """A run of one segment rewritten (a key compaction's single segment) keeps every entry's position: the sealed
    chunk holding it is written again all the same, and a reader sees the new entry."""
    index = PartitionIndex()
    for i in range(3 * CHUNK):
        index.add(entry(i, i + 1))
    index.save(store, "t", 0)
    inside = index.chunks[0].segments[1]
    index.replace_run([inside], entry(inside.base_offset, inside.end_offset, "rewritten"), now_ms=0)
    index.save(store, "t", 0)
    assert spans(reloaded(store).segments) == spans(index.segments)
    assert reloaded(store).segments[1].name == "rewritten"


def test_a_chunk_written_for_a_swap_that_lost_is_retired_then_deleted(store):
    index = PartitionIndex()
    for i in range(2 * CHUNK - 1):
        index.add(entry(i, i + 1))
    index.save(store, "t", 0)
    first, second = PartitionIndex.load(store, "t", 0), PartitionIndex.load(store, "t", 0)
    first.add(entry(2 * CHUNK - 1, 2 * CHUNK))
    first.save(store, "t", 0)  # seals a chunk
    second.add(entry(2 * CHUNK - 1, 2 * CHUNK + 1))
    with pytest.raises(VersionConflictError):
        second.save(store, "t", 0)  # sealed a chunk of its own before its swap lost
    named = {ref["name"] for ref in stored(store)["chunks"]}
    (lost,) = chunk_files(store) - named
    now = int(time.time() * 1000)
    assert purge_retired(store, "t", 0, delay_ms=60_000, now_ms=now) == []  # retired, not yet deleted
    assert {e["name"] for e in stored(store)["retired"]} == {f"{keys.INDEX_CHUNKS_FOLDER}/{lost}"}
    assert purge_retired(store, "t", 0, delay_ms=60_000, now_ms=now + 60_000) == [f"{keys.INDEX_CHUNKS_FOLDER}/{lost}"]
    assert chunk_files(store) == named and stored(store)["retired"] == []
    assert spans(reloaded(store).segments) == spans(first.segments)


def test_a_process_reads_only_the_chunks_it_has_not_read_and_keeps_only_the_current_ones(store, monkeypatch):
    index = PartitionIndex()
    for i in range(4 * CHUNK):
        index.add(entry(i, i + 1))
    index.save(store, "t", 0)  # three chunks and a tail of four
    reads = []
    monkeypatch.setattr(store, "read", lambda key, read=store.read: reads.append(key.rsplit("/", 2)[-2]) or read(key))
    loaded = reloaded(store)
    assert reads == ["0"] + [keys.INDEX_CHUNKS_FOLDER] * 3  # index.json, then each chunk
    reads.clear()
    assert spans(PartitionIndex.load(store, "t", 0).segments) == spans(loaded.segments) and reads == ["0"]
    loaded.replace_run(loaded.segments[:2], entry(0, 2, "merged"), now_ms=0)  # changes the first chunk
    loaded.save(store, "t", 0)
    reads.clear()
    assert spans(PartitionIndex.load(store, "t", 0).segments) == spans(loaded.segments) and reads == ["0"]
    kept = set(index_module.latest_chunks.of(store, "t", 0))
    assert kept == {chunk.name for chunk in loaded.chunks} and index.chunks[0].name not in kept


def test_an_index_that_lists_every_segment_is_read_and_saved_in_chunks(store):
    """An index written before chunks (format 2) reads as it did; its next save moves the older entries out."""
    segments = [entry(i, i + 1) for i in range(20)]
    doc = {"format": 2, "epoch": 3, "revision": 7, "next_offset": 20, "producers": {}, "retired": []}
    doc["truncated_offset"], doc["segments"] = 0, [s.to_json() for s in segments]
    store.replace(keys.index_key("t", 0), json.dumps(doc).encode())
    index = PartitionIndex.load(store, "t", 0)
    assert spans(index.segments) == spans(segments) and (index.epoch, index.revision) == (3, 7)
    index.save(store, "t", 0)
    assert stored(store)["format"] == 3 and len(stored(store)["tail"]) == CHUNK
    assert spans(reloaded(store).segments) == spans(segments)


def test_an_index_a_reader_cannot_trust_fails_with_a_clear_error(store):
    store.replace(keys.index_key("t", 0), json.dumps({"format": 4, "tail": []}).encode())
    with pytest.raises(IntegrityError, match="format 4, newer than this version of metrics-lake reads"):
        PartitionIndex.load(store, "t", 0)
    index = PartitionIndex()
    for i in range(3 * CHUNK):
        index.add(entry(i, i + 1))
    store.delete(keys.index_key("t", 0))
    index.save(store, "t", 0)
    (name, *_) = sorted(chunk_files(store))
    store.delete(keys.index_chunk_key("t", 0, name))
    with pytest.raises(IntegrityError, match=f"{name} is missing but the partition index names it"):
        reloaded(store)


def test_appends_racing_compaction_and_retention_lose_and_duplicate_nothing(any_store):
    """A writer appends while compaction merges runs that straddle chunks and retention drops whole and partial
    chunks; every record appended after the retention horizon is read back exactly once."""
    log = SegmentLog(any_store)
    log.ensure_topic("t", 1)
    writer = log.writer("t", 0, "w", ttl_ms=60_000)
    appends, horizon = 80, {}

    def mark_the_horizon(i: int) -> None:
        if i == appends // 2:
            horizon["ms"], horizon["offset"] = int(time.time() * 1000) + 1, writer.index.next_offset
            time.sleep(0.01)

    thread, errors, done = append_in_background(writer, appends, mark_the_horizon)
    one = encode_segment(records(3), base_offset=0, appended_at=0, producers={"w": 0})[1].size_bytes
    target = 4 * one  # short runs, so merged segments straddle chunks, and merged ones merge again
    rounds = lost = 0
    while not done.is_set():
        try:
            compact_partition(log, "t", 0, target_bytes=target, delete_delay_ms=0)
        except ConflictError:  # the appender, appending without pause, won every one of its swaps: changes nothing
            lost += 1
        if "ms" in horizon:
            apply_log_retention(log, "t", horizon["ms"], delete_delay_ms=0)
        rounds += 1
    thread.join()
    apply_log_retention(log, "t", horizon["ms"], delete_delay_ms=0)
    compact_partition(log, "t", 0, target_bytes=target, delete_delay_ms=0)
    compact_partition(log, "t", 0, target_bytes=target, delete_delay_ms=0)  # deletes what the last one retired
    assert not errors and rounds - lost > 1
    index = reloaded(log.store)
    # Retention dropped every segment appended before the horizon; a merged one straddling it (appended at its
    # newest part's time) stays whole.
    assert index.segments[0].appended_at >= horizon["ms"] and index.segments[0].base_offset <= horizon["offset"]
    assert index.next_offset == appends * 3
    rows = read_range(log, "t", 0, index.start_offset, appends * 3)
    assert rows.column("offset").to_pylist() == list(range(index.start_offset, appends * 3))
    assert rows.column("value").to_pylist() == [float(offset % 3) for offset in range(index.start_offset, appends * 3)]
    assert chunk_files(log.store) == {ref["name"] for ref in stored(log.store)["chunks"]}
