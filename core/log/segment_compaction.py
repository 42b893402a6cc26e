"""Log compaction: merge runs of small segments into larger ones without changing any offset.

Object-storage logs flush often to keep acks fast, so they end up with many
small objects (the common pain of WarpStream, KIP-1150 and friends). For each
partition, compaction

1. plans runs of consecutive segments, each smaller than the target, whose
   sizes add up to at most ``target_bytes`` (a run needs two or more);
2. writes each run's records as one new segment object named
   ``<base>-<end>.parquet`` (never colliding with an appended segment),
   keeping every record's offset (its row position) and append time
   (``parts``, see :class:`metrics_lake.core.log.segment.SegmentInfo`);
3. swaps the runs into the index with one compare-and-swap, retiring the old
   objects; on a conflict (a producer appended) it re-reads the index and
   re-applies the same runs, which are unchanged because committed segments
   are immutable;
4. deletes objects retired more than ``delete_delay_ms`` ago, so a consumer
   that read the previous index can still finish reading them.

Concurrent readers therefore see either the old segments or the merged one,
with identical rows and offsets. It needs no lease: it never appends and
never moves the log end offset, and the lease holder re-applies an append
that lost a swap to it (:meth:`metrics_lake.core.log.log.PartitionWriter._recover`).
Run one compactor per topic at a time (the Airflow DAG has
``max_active_runs=1``); two at once waste work but lose nothing, since the
second one's runs are no longer in the index and are skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import pyarrow as pa

from metrics_lake.core import keys
from metrics_lake.core.log.index import PartitionIndex, RunChangedError, purge_retired
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment import (
    SegmentInfo,
    compacted_segment_name,
    decode_segment,
    encode_segment,
    read_segment_info,
    read_segment_parts,
    read_segment_requests,
)
from metrics_lake.core.storage import ObjectExistsError, VersionConflictError
from metrics_lake.lake_schemas.errors import ConflictError, IntegrityError

log = logging.getLogger(__name__)

DEFAULT_TARGET_BYTES = 8 * 1024 * 1024
DEFAULT_DELETE_DELAY_MS = 5 * 60 * 1000


@dataclass(frozen=True)
class PartitionCompaction:
    """What compacting one partition did: segment counts and bytes before/after, objects deleted."""

    topic: str
    partition: int
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    runs: int
    deleted: int


def plan_runs(segments: list[SegmentInfo], target_bytes: int) -> list[list[SegmentInfo]]:
    """Runs of >= 2 consecutive segments, each below ``target_bytes``, totalling at most ``target_bytes``."""
    runs, current, size = [], [], 0
    for info in segments:
        if info.size_bytes >= target_bytes or size + info.size_bytes > target_bytes:
            if len(current) > 1:
                runs.append(current)
            current, size = [], 0
        if info.size_bytes < target_bytes:
            current.append(info)
            size += info.size_bytes
    if len(current) > 1:
        runs.append(current)
    return runs


def _merge(log_: SegmentLog, topic: str, partition: int, run: list[SegmentInfo]) -> SegmentInfo:
    """Write ``run``'s records as one compacted segment object; returns its info.

    Raises :class:`~metrics_lake.lake_schemas.errors.IntegrityError` if the run's segments do not hold
    exactly their offsets' records, :class:`~metrics_lake.lake_schemas.errors.ConflictError` if
    another compaction wrote a different object under the merged name.
    """
    tables, requests, footer_parts = [], {}, {}
    for info in run:
        with log_.store.open_arrow(keys.partition_key(topic, partition, info.name)) as source:
            for at, request_keys in read_segment_requests(source).items():  # a new writer's retry checks read them
                requests.setdefault(at, []).extend(request_keys)
            if info.parts_in_footer:
                footer_parts[info.name] = read_segment_parts(source)
            tables.append(decode_segment(source))
    records = pa.concat_tables(tables)
    base, end = run[0].base_offset, run[-1].end_offset
    if records.num_rows != end - base:
        raise IntegrityError(
            f"{keys.partition_prefix(topic, partition)}: segments [{base}, {end}) hold {records.num_rows} records, "
            f"not {end - base}; nothing was compacted"
        )
    name = compacted_segment_name(base, end)
    return write_run_segment(log_, topic, partition, run, records, name, requests, footer_parts)


def write_run_segment(
    log_: SegmentLog,
    topic: str,
    partition: int,
    run: list[SegmentInfo],
    records: pa.Table,
    name: str,
    requests: dict[int, list[str]] | None = None,
    footer_parts: dict[str, list[list[int]]] | None = None,
) -> SegmentInfo:
    """Write ``records`` as the one segment object ``name`` replacing ``run`` (offsets ``[run's base, run's
    end)``; its producers' sequences, digests and append parts merged, its newest append time and epoch, and
    ``requests``, the run's request keys by append time); returns its info for the index. ``footer_parts``: the
    parts of each compacted segment of ``run`` whose index entry lists none, by name
    (:func:`~metrics_lake.core.log.segment.read_segment_parts`). A leftover object of that name from
    a compaction that crashed before its index swap is reused if it covers the same range and parts, else
    :class:`~metrics_lake.lake_schemas.errors.ConflictError`.
    """
    base, end = run[0].base_offset, run[-1].end_offset
    producers: dict[str, int] = {}
    digests: dict[str, str] = {}
    for info in run:  # in offset order, so the last segment naming a producer has its highest sequence
        producers.update(info.producers)
        digests.update(info.digests)
    footer_parts = footer_parts or {}
    parts = [part for info in run for part in info.appends(footer_parts.get(info.name))]
    data, merged = encode_segment(
        records,
        base_offset=base,
        end_offset=end,
        appended_at=max(info.appended_at for info in run),
        epoch=max(info.epoch for info in run),
        producers=producers,
        digests=digests,
        object_name=name,
        parts=parts,
        requests=requests,
    )
    key = keys.partition_key(topic, partition, name)
    try:
        log_.store.create(key, data)
    except ObjectExistsError:  # left by a compaction that crashed before its index swap: reuse it if it matches
        stored = log_.store.read(key)
        existing = read_segment_info(pa.BufferReader(stored), len(stored))
        if (existing.base_offset, existing.end_offset, existing.parts) != (base, end, parts):
            raise ConflictError(
                f"{key} exists and is not this run's compacted segment "
                "(another compaction of the partition?); run the compaction again"
            ) from None
        return existing.for_index()
    return merged


def compact_partition(
    log_: SegmentLog,
    topic: str,
    partition: int,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    delete_delay_ms: int = DEFAULT_DELETE_DELAY_MS,
    max_attempts: int = 20,
    swap_lock: AbstractContextManager | None = None,
) -> PartitionCompaction:
    """Compact one partition (module docstring).

    ``swap_lock``: held while the merged segments are swapped into the index
    (not while they are written): the partition's writer passes its flush
    lock, so no append of its own races the swap (an append every few
    milliseconds could otherwise win ``max_attempts`` swaps in a row).
    Raises :class:`~metrics_lake.lake_schemas.errors.ConflictError` if the index changed
    ``max_attempts`` times while the merged segments were swapped in (nothing is lost: the
    merged objects are retired by the next run).
    """
    index = log_.index(topic, partition)
    segments_before, bytes_before = len(index.segments), sum(s.size_bytes for s in index.segments)
    runs = plan_runs(index.segments, target_bytes)
    merged = [(run, _merge(log_, topic, partition, run)) for run in runs]
    with swap_lock or nullcontext():
        swap_into_index(log_, topic, partition, index, lambda current: _apply(current, merged), max_attempts)
    deleted = purge_retired(log_.store, topic, partition, delay_ms=delete_delay_ms, now_ms=int(time.time() * 1000))
    after = log_.index(topic, partition)
    return PartitionCompaction(
        topic,
        partition,
        segments_before,
        len(after.segments),
        bytes_before,
        sum(s.size_bytes for s in after.segments),
        len(runs),
        len(deleted),
    )


def swap_into_index(
    log_: SegmentLog,
    topic: str,
    partition: int,
    index: PartitionIndex,
    swap: Callable[[PartitionIndex], bool],
    max_attempts: int,
) -> None:
    """Apply ``swap`` (which edits an index, returning whether it changed it) to ``index`` and save it by
    compare-and-swap; on a conflict (a producer appended) re-read the index and apply ``swap`` again.

    Raises :class:`~metrics_lake.lake_schemas.errors.ConflictError` if the index changed ``max_attempts`` times.
    """
    for _ in range(max_attempts):
        if not swap(index):
            return
        try:
            index.save(log_.store, topic, partition)
            return
        except VersionConflictError:
            index = log_.index(topic, partition)
    raise ConflictError(
        f"{keys.partition_prefix(topic, partition)}: the index changed {max_attempts} times during compaction "
        "(producers appending fast); run the compaction again"
    )


def _apply(index: PartitionIndex, merged: list[tuple[list[SegmentInfo], SegmentInfo]]) -> bool:
    """Swap each still-present run for its merged segment in ``index``; returns whether ``index`` changed.

    A run no longer in the index (retention dropped it, or another compactor
    merged it) is skipped, and its merged object retired unless the index
    names it (the other compactor wrote the same object).
    """
    now = int(time.time() * 1000)
    changed = False
    for run, segment in merged:
        try:
            index.replace_run(run, segment, now)
        except RunChangedError:
            log.info("run [%d, %d) changed since planning; skipped", run[0].base_offset, run[-1].end_offset)
            if segment.name not in {info.name for info in index.segments}:
                index.retired.append({"name": segment.name, "at": now})
        changed = True
    return changed


def compact_topic(
    log_: SegmentLog,
    topic: str,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    delete_delay_ms: int = DEFAULT_DELETE_DELAY_MS,
) -> list[PartitionCompaction]:
    """Compact every partition of ``topic``; raises :class:`metrics_lake.lake_schemas.errors.TopicNotFoundError` if it does not exist."""
    return [
        compact_partition(log_, topic, p, target_bytes=target_bytes, delete_delay_ms=delete_delay_ms)
        for p in range(log_.partitions(topic))
    ]


def compact_log(
    log_: SegmentLog,
    *,
    target_bytes: int,
    delete_delay_ms: int,
    min_lag_ms: int = 7 * 86_400_000,
    tombstone_retention_ms: int = 86_400_000,
) -> list[PartitionCompaction]:
    """Compact every partition of every topic in the log; one result per partition.

    A topic whose cleanup policy is ``compact`` (the inventory) is compacted
    by key instead, with ``min_lag_ms`` and ``tombstone_retention_ms``
    (:mod:`metrics_lake.core.log.keyed_compaction`, which builds on this module).
    """
    from metrics_lake.core.log.keyed_compaction import compact_keyed_partition

    results = []
    for topic in log_.topics():
        if not log_.compacted(topic):
            results += compact_topic(log_, topic, target_bytes=target_bytes, delete_delay_ms=delete_delay_ms)
            continue
        results += [
            compact_keyed_partition(
                log_,
                topic,
                p,
                min_lag_ms=min_lag_ms,
                tombstone_retention_ms=tombstone_retention_ms,
                delete_delay_ms=delete_delay_ms,
            )
            for p in range(log_.partitions(topic))
        ]
    return results
