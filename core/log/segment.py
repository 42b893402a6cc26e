"""Segment objects: immutable Parquet files holding a dense run of offsets.

A segment is named by its zero-padded base offset
(``00000000000000001234.parquet``) and holds :data:`metrics_lake.lake_schemas.log_records.LOG_RECORD`
rows; row ``i`` has offset ``base_offset + i``, so offsets are not stored. The
keyed inventory topic's records
(:data:`~metrics_lake.lake_schemas.log_records.INVENTORY_RECORD`) carry their
offset instead, since its log compaction removes superseded records
(:mod:`metrics_lake.core.log.keyed_compaction`).
Its Parquet key-value metadata repeats what the partition index says about it
(base offset, event-time range, writer epoch, producer sequences, append
time), so the index can always be rebuilt from the segments alone. It may
also hold the *request keys* of the requests whose records it holds
(``lake.requests``: append time -> keys), which only a writer taking the
partition over reads (:meth:`metrics_lake.core.log.producer.Producer.send`'s
``request_key``), so the index, rewritten at every append, does not carry them.

Format choice (``bench/segment_format.py``, 49,800 simulator events, one core):
Parquet+zstd with the lake's column layout
(:mod:`metrics_lake.core.parquet_layout`: dictionaries for strings only,
delta-packed times) is 8.2 bytes/event against 12.5 for default
Parquet+zstd, 24.7 for Arrow IPC+zstd and 39.2 for IPC+lz4, and encodes
7.4 M events/s and decodes 15.9 M events/s (Nov 2026). On object storage
bytes are what cost (transfer, storage, request size), so Parquet wins.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metrics_lake.core.parquet_layout import compact_dictionaries, has_dictionary, leaves, write_options
from metrics_lake.lake_schemas.errors import IntegrityError
from metrics_lake.lake_schemas.log_records import CODED_LOG_RECORD, LOG_RECORD, RECORD_SCHEMAS

SEGMENT_SUFFIX = ".parquet"
OFFSET_DIGITS = 20  # enough for any int64 offset, so names sort numerically
_META_KEY = b"lake.segment"
_REQUESTS_KEY = b"lake.requests"
#: The schemas :func:`encode_segment` takes.
_WRITABLE = (*RECORD_SCHEMAS, CODED_LOG_RECORD)


def segment_name(base_offset: int) -> str:
    """File name of the segment starting at ``base_offset``."""
    return f"{base_offset:0{OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def compacted_segment_name(base_offset: int, end_offset: int) -> str:
    """Object name of a compacted segment holding offsets ``[base_offset, end_offset)``."""
    return f"{base_offset:0{OFFSET_DIGITS}d}-{end_offset:0{OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    """Base offset encoded in an appended segment's ``name``; ``None`` for any other name (compacted ones too)."""
    stem = name.removesuffix(SEGMENT_SUFFIX)
    if name.endswith(SEGMENT_SUFFIX) and len(stem) == OFFSET_DIGITS and stem.isdigit():
        return int(stem)
    return None


@dataclass(frozen=True)
class SegmentInfo:
    """What the index records about one segment.

    Offsets are ``[base_offset, end_offset)``; times are epoch milliseconds
    (``min_ts``/``max_ts`` are event time over valid records, ``None`` if the
    segment holds only rejects); ``size_bytes`` is the object size;
    ``epoch`` is the lease epoch of the writer; ``producers`` maps each
    producer id whose records are in the segment to its highest sequence
    number in it (the appending producer's, plus the agents a gateway
    batched together); ``digests`` maps an upstream producer (an agent, an
    import) to the digest of the body it sent with that sequence, so a
    reused sequence with another body can be told from a retry.

    A segment made by compaction (:mod:`metrics_lake.core.log.segment_compaction`) has an
    ``object_name`` of its own (``<base>-<end>.parquet``, so it never collides
    with the segments it replaces) and ``parts``: ``[base_offset,
    appended_at]`` of each merged segment, so every record keeps its original
    append time; its ``appended_at`` is the newest part's. The parts are in
    the segment's footer; the partition index's entry (:meth:`for_index`)
    lists none and keeps their earliest append time, ``oldest_appended_at``:
    a part per append merged (about 4 a second per partition at 40,000
    events/s), a week of them would have made every process holding the
    index hold millions of pairs. Entries written before that still list
    their parts, and are read as before.
    """

    base_offset: int
    end_offset: int
    min_ts: int | None
    max_ts: int | None
    appended_at: int
    size_bytes: int
    epoch: int = 0
    producers: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    object_name: str | None = None
    parts: list[list[int]] = field(default_factory=list)
    oldest_appended_at: int | None = None

    @classmethod
    def from_json(cls, doc: dict) -> SegmentInfo:
        """Inverse of :meth:`to_json`; also reads the first format's single producer id/sequence."""
        doc = dict(doc)
        producer_id, producer_seq = doc.pop("producer_id", None), doc.pop("producer_seq", None)
        if producer_id is not None and producer_seq is not None:
            doc.setdefault("producers", {producer_id: producer_seq})
        return cls(**doc)

    @property
    def name(self) -> str:
        """The segment's object name in its partition."""
        return self.object_name or segment_name(self.base_offset)

    @property
    def parts_in_footer(self) -> bool:
        """Whether this is an index entry of a compacted segment whose parts only its footer lists
        (:func:`read_segment_parts`): its records' append times need them."""
        return not self.parts and self.oldest_appended_at is not None

    @property
    def earliest_appended_at(self) -> int:
        """The earliest append time (epoch ms) of the segment's records, from this info alone."""
        if self.parts:
            return min(at for _, at in self.parts)
        return self.appended_at if self.oldest_appended_at is None else self.oldest_appended_at

    def for_index(self) -> SegmentInfo:
        """This info as the partition index keeps it: a compacted segment's parts left to its footer, their
        earliest append time kept (class docstring)."""
        if not self.parts:
            return self
        return replace(self, parts=[], oldest_appended_at=self.earliest_appended_at)

    def ingested_at(self, start: int, end: int, parts: list[list[int]] | None = None) -> np.ndarray:
        """Append time (epoch ms, int64) of each record with offset in ``[start, end)`` of this segment
        (``parts`` as for :meth:`append_times`)."""
        return self.append_times(np.arange(start, end, dtype=np.int64), parts)

    def appends(self, footer_parts: list[list[int]] | None = None) -> list[list[int]]:
        """``[base_offset, appended_at]`` of each append the segment holds: its own if it was appended, its parts if
        compacted (listed by this info, else ``footer_parts``, the footer's: :func:`read_segment_parts`).

        Raises ``ValueError`` if :attr:`parts_in_footer` and ``footer_parts`` is missing.
        """
        if self.parts:
            return self.parts
        if self.parts_in_footer:
            if not footer_parts:
                raise ValueError(f"{self.name}: its appends are the parts in its footer")  # programming error
            return footer_parts
        return [[self.base_offset, self.appended_at]]

    def append_times(self, offsets: np.ndarray, parts: list[list[int]] | None = None) -> np.ndarray:
        """Append time (epoch ms, int64) of the records at ``offsets`` (int64, within this segment); ``parts`` as
        ``footer_parts`` of :meth:`appends`."""
        parts = self.appends(parts)
        if len(parts) == 1:
            return np.full(len(offsets), parts[0][1], dtype=np.int64)
        bases = np.array([base for base, _ in parts], dtype=np.int64)
        times = np.array([at for _, at in parts], dtype=np.int64)
        return times[np.searchsorted(bases, offsets, side="right") - 1]

    @property
    def record_count(self) -> int:
        """Records in the segment."""
        return self.end_offset - self.base_offset

    def to_json(self) -> dict:
        """JSON-ready dict; ``parts`` and ``oldest_appended_at`` only if set (an appended segment has neither)."""
        doc = asdict(self)
        if not self.parts:
            del doc["parts"]
        if self.oldest_appended_at is None:
            del doc["oldest_appended_at"]
        return doc

    @cached_property
    def json_text(self) -> str:
        """:meth:`to_json` as JSON text, made once: the index writes every segment's at every append."""
        return json.dumps(self.to_json())


def encode_segment(
    records: pa.Table,
    *,
    base_offset: int,
    appended_at: int,
    epoch: int = 0,
    producers: dict[str, int] | None = None,
    digests: dict[str, str] | None = None,
    object_name: str | None = None,
    parts: list[list[int]] | None = None,
    end_offset: int | None = None,
    requests: dict[int, list[str]] | None = None,
) -> tuple[bytes, SegmentInfo]:
    """Serialise ``records`` (rows of one of :data:`RECORD_SCHEMAS`, or of :data:`CODED_LOG_RECORD`) as a segment.

    ``object_name`` and ``parts`` are for compacted segments (see
    :class:`SegmentInfo`); ``end_offset`` for a key-compacted one, whose
    records (carrying their ``offset``) no longer fill its offset range
    (default: ``base_offset`` plus the record count). ``requests``: the
    request keys of the records, by append time (epoch ms), kept in the
    footer for :func:`read_segment_requests`. Returns the bytes and
    the :class:`SegmentInfo` for the index (:meth:`SegmentInfo.for_index`). Raises ``ValueError`` if
    ``records`` is empty or matches none of the schemas.
    """
    if records.num_rows == 0:
        raise ValueError("a segment must hold at least one record")  # programming error
    if not any(records.schema.equals(schema, check_metadata=False) for schema in _WRITABLE):
        raise ValueError(f"records match none of the log's record schemas:\n{records.schema}")  # programming error
    coded = records.schema.equals(CODED_LOG_RECORD, check_metadata=False)
    if coded:  # each column one dictionary: Arrow's Parquet writer writes chunks with differing ones as strings
        for index, field in enumerate(records.schema):
            if has_dictionary(field):
                column = compact_dictionaries(records.column(index).combine_chunks())  # the used values only
                records = records.set_column(index, field, column)
    ts = pc.min_max(records.column("ts").cast(pa.int64()))
    min_ts, max_ts = ts["min"].as_py(), ts["max"].as_py()
    info = SegmentInfo(
        base_offset=base_offset,
        end_offset=base_offset + records.num_rows if end_offset is None else end_offset,
        min_ts=min_ts,
        max_ts=max_ts,
        appended_at=appended_at,
        size_bytes=0,
        epoch=epoch,
        producers=dict(producers or {}),
        digests=dict(digests or {}),
        object_name=object_name,
        parts=[list(part) for part in parts or []],
    )
    sink = io.BytesIO()
    # No column statistics: a segment is always read whole (decode_segment), and computing min/max of every string
    # page was 2 % of an import's CPU; the index and the metadata above carry the time range.
    # Dictionary-encoded records are written without their Arrow schema, so the segment is the same file either
    # way: Parquet stores both as dictionary-encoded strings, and only that schema would tell them apart.
    records = records.replace_schema_metadata(None)  # the footer's metadata is the segment's alone
    options = write_options(records.schema, statistics=False)
    with pq.ParquetWriter(sink, records.schema, store_schema=not coded, **options) as writer:
        writer.write_table(records)
        writer.add_key_value_metadata({_META_KEY: json.dumps(info.to_json()).encode()})
        if requests := {at: keys for at, keys in (requests or {}).items() if keys}:
            writer.add_key_value_metadata({_REQUESTS_KEY: json.dumps(requests).encode()})
    data = sink.getvalue()
    return data, SegmentInfo.from_json({**info.to_json(), "size_bytes": len(data)}).for_index()


def read_segment_info(source, size_bytes: int) -> SegmentInfo:
    """Recover a segment's :class:`SegmentInfo` from its Parquet footer alone.

    Raises :class:`~metrics_lake.lake_schemas.errors.IntegrityError` for a Parquet file the log did not write.
    """
    metadata = pq.read_metadata(source).metadata or {}
    if _META_KEY not in metadata:
        raise IntegrityError("not a lake segment: its Parquet footer lacks the lake.segment metadata")
    fields = json.loads(metadata[_META_KEY])
    return SegmentInfo.from_json({**fields, "size_bytes": size_bytes})


def read_segment_parts(source) -> list[list[int]]:
    """The ``parts`` (``[base_offset, appended_at]`` of each segment merged) a compacted segment's footer lists;
    ``[]`` for an appended segment. ``source``: a file-like object or Arrow file (only the footer is read).

    Raises :class:`~metrics_lake.lake_schemas.errors.IntegrityError` for a Parquet file the log did not write.
    """
    metadata = pq.read_metadata(source).metadata or {}
    if _META_KEY not in metadata:
        raise IntegrityError("not a lake segment: its Parquet footer lacks the lake.segment metadata")
    return [list(part) for part in json.loads(metadata[_META_KEY]).get("parts", [])]


def read_segment_requests(source) -> dict[int, list[str]]:
    """The request keys a segment's footer holds, by append time (epoch ms); ``{}`` if none (module docstring).

    ``source``: a file-like object or Arrow file (only the footer is read). Raises what
    ``pyarrow.parquet.read_metadata`` raises for a file that is not Parquet.
    """
    stored = (pq.read_metadata(source).metadata or {}).get(_REQUESTS_KEY)
    return {int(at): list(keys) for at, keys in json.loads(stored).items()} if stored else {}


def decode_segment(source, schema: pa.Schema = LOG_RECORD) -> pa.Table:
    """Read a segment's records (``schema``: :data:`LOG_RECORD`, without offsets, for an event topic).

    A string column (or a map's keys or values) that ``schema`` gives as a
    dictionary type is read as the segment's dictionary and indices
    (:func:`~metrics_lake.lake_schemas.log_records.with_dictionaries`).
    """
    # read_dictionary keeps the pages' dictionaries; the schema alone would decode the strings, then encode them again.
    dictionaries = [path for column in schema for path, kind in leaves(column) if pa.types.is_dictionary(kind)]
    return pq.read_table(source, schema=schema, read_dictionary=dictionaries or None).replace_schema_metadata(None)
