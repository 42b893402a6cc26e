"""Log compaction by key, for a topic whose cleanup policy is ``compact`` (the server inventory).

A keyed topic is a changelog: each record is the whole new value of its key
(or a *tombstone*, the key's removal). Reading it from offset 0 and keeping
the newest record per key rebuilds the table, so nothing older than the
newest record of a key is needed to know the current state. Compaction
(Kafka's log cleaner, ``cleanup.policy=compact``) therefore rewrites a
partition's segments as one, keeping per key

- its newest record, unless that is a tombstone appended more than
  ``tombstone_retention_ms`` ago (Kafka's ``delete.retention.ms``: a consumer
  that read the key before has had that long to see it deleted);
- older records whose successor was appended less than ``min_lag_ms`` ago
  (Kafka's ``min.compaction.lag.ms``): the speed layer joins each event with
  the inventory *as of* a past position (:mod:`metrics_lake.core.speed.enrichment`),
  so a version must outlive every event still in the log that may need it.
  The default lag is the log's retention.

Records keep their offsets (they carry them: :data:`~metrics_lake.lake_schemas.log_records.INVENTORY_RECORD`)
and their append times (``parts``); the log's start and end offsets do not
move, so a consumer from offset 0 still starts at 0. The swap into the index
is the same compare-and-swap as :mod:`~metrics_lake.core.log.segment_compaction`'s
(a producer's append in between is kept: the run replaced is the segments
read), and replaced objects are deleted after the delete delay.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa

from metrics_lake.core import keys
from metrics_lake.core.log.index import PartitionIndex, RunChangedError, purge_retired
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment import (
    OFFSET_DIGITS,
    SEGMENT_SUFFIX,
    SegmentInfo,
    decode_segment,
    read_segment_parts,
)
from metrics_lake.core.log.segment_compaction import PartitionCompaction, swap_into_index, write_run_segment
from metrics_lake.lake_schemas.log_records import INVENTORY_RECORD

__all__ = ["compact_keyed_partition", "kept_records"]

log = logging.getLogger(__name__)


def kept_records(
    key: np.ndarray,
    offset: np.ndarray,
    deleted: np.ndarray,
    appended: np.ndarray,
    now_ms: int,
    *,
    min_lag_ms: int,
    tombstone_retention_ms: int,
) -> np.ndarray:
    """Which records compaction keeps (module docstring), as a boolean mask over the inputs.

    ``key``: an integer code per record (equal keys, equal codes); ``offset``
    (int64, distinct); ``deleted``: tombstone or not; ``appended``: append
    time, epoch ms. A tombstone is dropped only once it is older than both
    the retention and the lag, so no older version of its key can outlive it
    (and bring the key back).
    """
    n = len(offset)
    order = np.lexsort((offset, key))
    k, appended_sorted = key[order], appended[order]
    has_next = np.zeros(n, bool)
    has_next[:-1] = k[:-1] == k[1:]
    next_appended = np.full(n, np.iinfo(np.int64).max)
    next_appended[:-1] = appended_sorted[1:]
    needed_as_of = has_next & (next_appended > now_ms - min_lag_ms)
    newest = ~has_next
    expired_tombstone = newest & deleted[order] & (appended_sorted <= now_ms - max(tombstone_retention_ms, min_lag_ms))
    keep_sorted = (newest & ~expired_tombstone) | needed_as_of
    keep = np.empty(n, bool)
    keep[order] = keep_sorted
    return keep


def _keyed_name(base: int, end: int, records: int) -> str:
    """Object name of a key-compacted segment: its offset range and record count (a later compaction of the same
    range that drops more records writes another object)."""
    return f"{base:0{OFFSET_DIGITS}d}-{end:0{OFFSET_DIGITS}d}-{records}{SEGMENT_SUFFIX}"


def compact_keyed_partition(
    log_: SegmentLog,
    topic: str,
    partition: int,
    *,
    min_lag_ms: int,
    tombstone_retention_ms: int,
    delete_delay_ms: int,
    now_ms: int | None = None,
    max_attempts: int = 20,
) -> PartitionCompaction:
    """Compact one partition of a keyed topic by key (module docstring); ``runs`` is 1 if it rewrote it.

    Raises :class:`~metrics_lake.lake_schemas.errors.ConflictError` if the
    index changed ``max_attempts`` times during the swap, or another
    compaction left a different object under the compacted segment's name.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    index = log_.index(topic, partition)
    run = list(index.segments)
    before = (len(run), sum(s.size_bytes for s in run))
    merged = _compacted(log_, topic, partition, run, now_ms, min_lag_ms, tombstone_retention_ms)
    if merged is not None:
        swap_into_index(
            log_, topic, partition, index, lambda current: _swap(current, run, merged, now_ms), max_attempts
        )
    deleted = purge_retired(log_.store, topic, partition, delay_ms=delete_delay_ms, now_ms=now_ms)
    after = log_.index(topic, partition)
    return PartitionCompaction(
        topic,
        partition,
        before[0],
        len(after.segments),
        before[1],
        sum(s.size_bytes for s in after.segments),
        int(merged is not None),
        len(deleted),
    )


def _swap(index: PartitionIndex, run: list[SegmentInfo], merged: SegmentInfo | bool, now_ms: int) -> bool:
    """Put ``merged`` in place of ``run`` in ``index`` (``True``: every record was dropped, the run goes); returns
    False, changing nothing, if ``run`` is no longer where it was (another compaction or retention came first)."""
    try:
        if merged is True:
            if [s.name for s in index.segments[: len(run)]] != [s.name for s in run]:
                raise RunChangedError("the compacted run is no longer the head of the index")
            index.drop_head(len(run), now_ms)
        else:
            index.replace_run(run, merged, now_ms)
    except RunChangedError:
        log.info("%s changed since it was read; compaction skipped", run[0].name)
        return False
    return True


def _compacted(
    log_: SegmentLog,
    topic: str,
    partition: int,
    run: list[SegmentInfo],
    now_ms: int,
    min_lag_ms: int,
    tombstone_retention_ms: int,
) -> SegmentInfo | bool | None:
    """The compacted segment replacing ``run`` (written), ``True`` if no record is kept, None if nothing changes."""
    if not run:
        return None
    tables, appended, footer_parts = [], [], {}
    for info in run:
        with log_.store.open_arrow(keys.partition_key(topic, partition, info.name)) as source:
            records = decode_segment(source, INVENTORY_RECORD)
            if info.parts_in_footer:
                footer_parts[info.name] = read_segment_parts(source)
        tables.append(records)
        offsets = records.column("offset").to_numpy(zero_copy_only=False)
        appended.append(info.append_times(offsets, footer_parts.get(info.name)))
    records = pa.concat_tables(tables).combine_chunks()
    codes = records.column("server").dictionary_encode().combine_chunks().indices.to_numpy(zero_copy_only=False)
    keep = kept_records(
        codes.astype(np.int64),
        records.column("offset").to_numpy(zero_copy_only=False),
        records.column("deleted").to_numpy(zero_copy_only=False).astype(bool),
        np.concatenate(appended),
        now_ms,
        min_lag_ms=min_lag_ms,
        tombstone_retention_ms=tombstone_retention_ms,
    )
    if keep.all() and len(run) == 1:
        return None
    if not keep.any():
        return True
    kept = records.filter(pa.array(keep))
    name = _keyed_name(run[0].base_offset, run[-1].end_offset, kept.num_rows)
    return write_run_segment(log_, topic, partition, run, kept, name, footer_parts=footer_parts)
