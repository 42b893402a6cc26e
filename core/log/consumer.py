"""The read side of the log: offset ranges as Arrow, and offset lookups.

Consumers never lock: they read the partition index (replaced atomically by
writers) and the immutable segments it names.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core import keys
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment import decode_segment, read_segment_parts
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.log_records import INVENTORY_RECORD, LOG_RECORD, LOG_ROW, with_dictionaries

#: What :func:`read_keyed` yields: a keyed record (it carries its offset) and its append time.
KEYED_ROW = pa.schema([*INVENTORY_RECORD, pa.field("ingested_at", LOG_ROW.field("ingested_at").type, nullable=False)])


def read_range(
    log: SegmentLog, topic: str, partition: int, start: int, end: int, *, dictionaries: bool = False
) -> pa.Table:
    """Records with offsets in ``[start, end)`` as a :data:`LOG_ROW` table, in offset order.

    ``dictionaries``: ``server``, ``metric`` and the ``tags``' names and
    values as the segments' dictionaries and indices
    (:func:`~metrics_lake.lake_schemas.log_records.with_dictionaries`; a
    chunk per segment, each with its own dictionaries), which a reader that
    groups by them decodes faster and hashes no more.

    Raises ``ValueError`` if part of the range is below the partition's
    start offset (removed by retention) or beyond its end offset: a silent
    short read would break exactly-once accounting downstream. If a segment
    named by the index is gone (compaction or retention replaced it after the
    index was read and its delete delay passed), the index is read again once.
    """
    row, record = LOG_ROW, LOG_RECORD
    if dictionaries:
        row, record = with_dictionaries(LOG_ROW), with_dictionaries(LOG_RECORD)
    if end <= start:
        return row.empty_table()
    try:
        return _read_segments(log, topic, partition, start, end, row, record)
    except FileNotFoundError:
        return _read_segments(log, topic, partition, start, end, row, record)


def _read_segments(
    log: SegmentLog, topic: str, partition: int, start: int, end: int, row: pa.Schema, record: pa.Schema
) -> pa.Table:
    index = log.index(topic, partition)
    if start < index.start_offset or end > index.next_offset:
        raise InputError(
            f"{topic}/{partition}: range [{start}, {end}) outside the log's [{index.start_offset}, {index.next_offset})"
        )
    pieces = []
    for info in index.segments_for(start, end):
        with log.store.open_arrow(keys.partition_key(topic, partition, info.name)) as source:
            records = decode_segment(source, record)
            parts = read_segment_parts(source) if info.parts_in_footer else None
        lo = max(start, info.base_offset)
        hi = min(end, info.end_offset)
        records = records.slice(lo - info.base_offset, hi - lo)
        n = records.num_rows
        pieces.append(
            pa.table(
                [
                    _topic_column(topic, n, row.field("topic").type),
                    pa.array(np.full(n, partition, dtype=np.int32)),
                    pa.array(np.arange(lo, hi, dtype=np.int64)),
                    *records.columns,
                    pa.array(info.ingested_at(lo, hi, parts)).cast(row.field("ingested_at").type),
                ],
                schema=row,
            )
        )
    return pa.concat_tables(pieces) if pieces else row.empty_table()


def _topic_column(topic: str, n: int, kind: pa.DataType) -> pa.Array:
    """``n`` times ``topic``, as a column of type ``kind`` (a string, or a dictionary of strings): never n Python
    strings."""
    if pa.types.is_dictionary(kind):
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([topic], pa.string()))
    return pa.repeat(pa.scalar(topic, pa.string()), n)


def read_keyed(log: SegmentLog, topic: str, partition: int, start: int = 0) -> pa.Table:
    """Every record of a keyed topic's partition with offset ``>= start``: :data:`INVENTORY_RECORD` columns plus
    ``ingested_at`` (its append time), in offset order.

    A keyed topic's records carry their offsets, and log compaction removes
    superseded ones (:mod:`metrics_lake.core.log.keyed_compaction`), so the
    offsets read need not be dense. As :func:`read_range`, the index is read
    again once if a segment it named was deleted meanwhile.
    """
    try:
        return _read_keyed(log, topic, partition, start)
    except FileNotFoundError:
        return _read_keyed(log, topic, partition, start)


def _read_keyed(log: SegmentLog, topic: str, partition: int, start: int) -> pa.Table:
    index = log.index(topic, partition)
    pieces = []
    for info in index.segments_for(start, index.next_offset):
        with log.store.open_arrow(keys.partition_key(topic, partition, info.name)) as source:
            records = decode_segment(source, INVENTORY_RECORD)
            parts = read_segment_parts(source) if info.parts_in_footer else None
        if info.base_offset < start:
            records = records.filter(pc.greater_equal(records.column("offset"), start))
        offsets = records.column("offset").to_numpy(zero_copy_only=False)
        appended = pa.array(info.append_times(offsets, parts)).cast(KEYED_ROW.field("ingested_at").type)
        pieces.append(records.append_column("ingested_at", appended).cast(KEYED_ROW))
    return pa.concat_tables(pieces) if pieces else KEYED_ROW.empty_table()


def end_offsets(log: SegmentLog, topic: str) -> dict[int, int]:
    """Next offset (log end) of every partition of ``topic``."""
    return {p: log.index(topic, p).next_offset for p in range(log.partitions(topic))}


def start_offsets(log: SegmentLog, topic: str) -> dict[int, int]:
    """First retained offset of every partition of ``topic``."""
    return {p: log.index(topic, p).start_offset for p in range(log.partitions(topic))}


def offsets_for_time(log: SegmentLog, topic: str, ts_ms: int) -> dict[int, int]:
    """Per partition, the offset to replay from to see every event with ``ts >= ts_ms`` (epoch ms)."""
    return {p: log.index(topic, p).offset_for_time(ts_ms) for p in range(log.partitions(topic))}
