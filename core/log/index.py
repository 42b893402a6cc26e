"""The per-partition index: segment -> offset range, event-time range, size.

Stored as ``log/<topic>/<partition>/index.json`` (:func:`metrics_lake.core.keys.index_key`). Only the partition's lease
holder changes it, and every change is a compare-and-swap on the object's
version, so a writer that lost its lease cannot overwrite it (see
:mod:`metrics_lake.core.leases`). The index also records the lease ``epoch`` of the
writer that last committed, and, per producer id, the last sequence number
appended with the offsets it got, which makes producer retries idempotent
(the scheme of Kafka's idempotent producer, KIP-98). Producer ids unseen for
:data:`PRODUCER_EXPIRY_MS` are forgotten, as Kafka expires them after
``transactional.id.expiration.ms`` (7 days), so the index stays small.

A segment becomes visible to consumers when the index names it. Compaction
and retention (:mod:`metrics_lake.core.log.segment_compaction`, :mod:`metrics_lake.core.log.segment_retention`) change
the index too, by compare-and-swap, without the lease: they only replace or
drop committed segments, never move the log end offset or the epoch, and
the lease holder re-applies its append on top when its swap loses to theirs.
Segments they take out of the index are *retired*, not deleted at once: a
consumer that read the old index may still be reading them, so their objects
are deleted only after a delay (Kafka's ``file.delete.delay.ms``).

The index is written again at every append, so it must not grow with the
partition's history: a week's retention of compacted segments is thousands
of entries, and rewriting (and, on a local lake, reading back and hashing)
all of them made an append 6x slower (``bench/partition_index_length.py``).
Older entries therefore move into *index chunks*: immutable objects
``index-chunks/<base>-<end>-<random>.json`` of about
:data:`CHUNK_SEGMENTS` consecutive segments each, which ``index.json`` names
in order before its own *tail* of the newest entries (between
:data:`CHUNK_SEGMENTS` and twice that). An append rewrites only the tail,
and seals its oldest :data:`CHUNK_SEGMENTS` entries into a new chunk once it
is twice that long; compaction and retention, which change older entries,
write the chunks they change as new objects and retire the old ones like
segments. A chunk is written before the index that names it, so a
committed index never names a missing chunk; a chunk whose index swap lost
is named by no index and :func:`purge_retired` retires it. Chunks are
immutable, so each process keeps those of the index it last loaded of each
partition (:class:`LatestChunks`), and loading an index again mostly reads
only ``index.json``. Delta's
checkpoints and Iceberg's manifest lists follow the same idea: an immutable
prefix read once, and a small mutable head.
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
import threading
import time
import uuid
from dataclasses import dataclass, field

from metrics_lake.core import keys
from metrics_lake.core.log.segment import SegmentInfo
from metrics_lake.core.storage import Store, VersionConflictError
from metrics_lake.lake_schemas.errors import IntegrityError

PRODUCER_EXPIRY_MS = 7 * 24 * 3600 * 1000
#: Index format written: 3 keeps older entries in chunks (module docstring); 1 and 2 listed every segment.
INDEX_FORMAT = 3
#: Segments per index chunk. An append writes at most twice this many entries: at about 300 bytes each, 77 KiB.
CHUNK_SEGMENTS = 128


class RunChangedError(ValueError):
    """The segments a compaction planned to replace are no longer a consecutive run of the index.

    Retention dropped some of them or another compactor merged them: control
    flow of :mod:`metrics_lake.core.log.segment_compaction`, which skips the run.
    """


@dataclass(frozen=True)
class IndexChunk:
    """An immutable run of consecutive index entries, stored as ``index-chunks/<name>`` in its partition.

    ``name``: the file name (``<base>-<end>-<random>.json``, so a rewritten
    run never reuses an object); ``segments``: the entries, ordered by base
    offset, covering ``[segments[0].base_offset, segments[-1].end_offset)``.
    """

    name: str
    segments: tuple[SegmentInfo, ...]

    @classmethod
    def seal(cls, segments: list[SegmentInfo]) -> IndexChunk:
        """A new chunk of ``segments`` (non-empty), with a name no other chunk has."""
        base, end = segments[0].base_offset, segments[-1].end_offset
        return cls(f"{base:020d}-{end:020d}-{uuid.uuid4().hex[:16]}.json", tuple(segments))

    def ref(self) -> dict:
        """What ``index.json`` records of the chunk: its name, offsets ``[base_offset, end_offset)`` and entry count."""
        return {
            "name": self.name,
            "base_offset": self.segments[0].base_offset,
            "end_offset": self.segments[-1].end_offset,
            "count": len(self.segments),
        }

    def encode(self) -> bytes:
        """The chunk object's bytes (JSON: ``{"segments": [entry, ...]}``)."""
        return f'{{"segments": [{", ".join(info.json_text for info in self.segments)}]}}'.encode()

    @classmethod
    def read(cls, store: Store, topic: str, partition: int, ref: dict) -> IndexChunk:
        """Read the chunk ``ref`` (an entry of ``index.json``'s ``chunks``) names from storage.

        Raises :class:`~metrics_lake.lake_schemas.errors.IntegrityError` if the object
        is missing or does not hold the entries ``ref`` describes.
        """
        key = keys.index_chunk_key(topic, partition, ref["name"])
        try:
            doc = json.loads(store.read(key))
        except FileNotFoundError:
            raise IntegrityError(
                f"{key} is missing but the partition index names it: the partition's index is damaged "
                "(an object deleted by hand?); restore the object from a backup of the lake"
            ) from None
        segments = tuple(SegmentInfo.from_json(entry) for entry in doc["segments"])
        found = (segments[0].base_offset, segments[-1].end_offset, len(segments)) if segments else None
        if found != (ref["base_offset"], ref["end_offset"], ref["count"]):
            raise IntegrityError(f"{key} does not hold the entries the partition index names: {found} != {ref}")
        return cls(ref["name"], segments)


class LatestChunks:
    """The chunks of the index each partition had when this process last loaded or saved it.

    Loading an index reuses those of its chunks it still names (chunks are
    immutable and never reuse a name, so they are never stale) and reads
    only the others, mostly none. Memory follows the current indexes, one
    per partition read, not the history of the log: a chunk that compaction
    or retention replaced is forgotten at the next load. Thread-safe: a
    gateway's flush threads load indexes side by side.
    """

    def __init__(self) -> None:
        self._chunks: dict[tuple[str, str], dict[str, IndexChunk]] = {}
        self._lock = threading.Lock()

    def of(self, store: Store, topic: str, partition: int) -> dict[str, IndexChunk]:
        """The chunks of the partition's index as last loaded or saved here, by name (empty if never)."""
        with self._lock:
            return self._chunks.get((store.root, keys.partition_prefix(topic, partition)), {})

    def remember(self, store: Store, topic: str, partition: int, chunks: list[IndexChunk]) -> None:
        """Keep ``chunks`` (the partition index's, just loaded or saved) in place of those kept before."""
        with self._lock:
            self._chunks[store.root, keys.partition_prefix(topic, partition)] = {chunk.name: chunk for chunk in chunks}


#: This process's latest chunks of every partition index it read.
latest_chunks = LatestChunks()


@dataclass
class PartitionIndex:
    """Index of one partition's segments, ordered by base offset.

    ``retired``: ``{"name", "at"}`` of segment objects taken out of the
    index at epoch ms ``at``, awaiting deletion; ``truncated_offset``: end
    offset of the last segment retention dropped, so the log end offset
    survives when retention drops every segment;
    ``epoch``: lease epoch of the last committing writer; ``revision``:
    incremented on every save (it also keeps the stored bytes, hence the
    object version, unique); ``version``: the stored object version this
    index was loaded at or saved as (``None`` if never stored).

    ``segments`` lists every segment, however the stored index splits them
    into chunks and tail (module docstring). Change it with :meth:`add`,
    :meth:`replace_run` and :meth:`drop_head`; appending to it directly is
    also fine (it is what :meth:`add` does to it).
    """

    segments: list[SegmentInfo] = field(default_factory=list)
    producers: dict[str, dict] = field(default_factory=dict)
    retired: list[dict] = field(default_factory=list)
    truncated_offset: int = 0
    epoch: int = 0
    revision: int = 0
    version: str | None = None
    #: The chunks as stored at :attr:`version`: ``segments`` starts with their entries, the same objects, in order.
    chunks: list[IndexChunk] = field(default_factory=list, repr=False)
    #: Whether :meth:`replace_run` or :meth:`drop_head` changed entries the stored chunks hold. The check of the
    #: chunks' first and last entries in :meth:`_kept_chunks` sees most such changes by itself, but not one segment
    #: replaced by one inside a chunk (the entries keep their positions).
    _chunks_changed: bool = field(default=False, init=False, repr=False)

    @property
    def start_offset(self) -> int:
        """First offset still in the log (after retention), or the next offset if empty."""
        return self.segments[0].base_offset if self.segments else self.next_offset

    @property
    def next_offset(self) -> int:
        """Offset the next appended record gets (the log end offset)."""
        return self.segments[-1].end_offset if self.segments else self.truncated_offset

    @classmethod
    def load(cls, store: Store, topic: str, partition: int) -> PartitionIndex:
        """Read the index; an empty index if the partition has none yet.

        Raises :class:`~metrics_lake.lake_schemas.errors.IntegrityError` if the
        index was written in a format newer than :data:`INDEX_FORMAT` or names
        a chunk that is missing or damaged.
        """
        key = keys.index_key(topic, partition)
        try:
            data, version = store.read_versioned(key)
        except FileNotFoundError:
            return cls()
        doc = json.loads(data)
        if int(doc.get("format", 1)) > INDEX_FORMAT:
            raise IntegrityError(
                f"{key} has format {doc['format']}, newer than this version of metrics-lake reads "
                f"({INDEX_FORMAT}); upgrade it to read this lake"
            )
        known = latest_chunks.of(store, topic, partition)
        chunks = [
            known.get(ref["name"]) or IndexChunk.read(store, topic, partition, ref) for ref in doc.get("chunks", [])
        ]
        latest_chunks.remember(store, topic, partition, chunks)
        segments = [info for chunk in chunks for info in chunk.segments]
        segments += [SegmentInfo.from_json(entry) for entry in doc["tail" if "tail" in doc else "segments"]]
        return cls(
            segments=segments,
            producers=doc.get("producers", {}),
            retired=doc.get("retired", []),
            truncated_offset=int(doc.get("truncated_offset", 0)),
            epoch=int(doc.get("epoch", 0)),
            revision=int(doc.get("revision", 0)),
            version=version,
            chunks=chunks,
        )

    def save(self, store: Store, topic: str, partition: int) -> None:
        """Store this index if the stored one is still at :attr:`version` (compare-and-swap).

        New chunks are written first (each a create of a new object), then
        ``index.json`` naming them; chunks the new layout no longer uses are
        retired. Raises :class:`metrics_lake.core.storage.VersionConflictError`
        if another writer saved in between (the chunks written for this save
        are then named by no index, and :func:`purge_retired` retires them);
        on success :attr:`version` is the new version.
        """
        self.revision += 1
        chunks, tail = self._layout()
        stored = {chunk.name for chunk in self.chunks}
        new = [chunk for chunk in chunks if chunk.name not in stored]
        for chunk in new:
            store.create(keys.index_chunk_key(topic, partition, chunk.name), chunk.encode())
        used, now_ms = {chunk.name for chunk in chunks}, int(time.time() * 1000)
        retired = self.retired + [
            {"name": f"{keys.INDEX_CHUNKS_FOLDER}/{chunk.name}", "at": now_ms}
            for chunk in self.chunks
            if chunk.name not in used
        ]
        doc = {
            "format": INDEX_FORMAT,
            "epoch": self.epoch,
            "revision": self.revision,
            "next_offset": self.next_offset,
            "producers": self.producers,
            "retired": retired,
            "truncated_offset": self.truncated_offset,
            "chunks": [chunk.ref() for chunk in chunks],
        }
        # The tail is most of the index: splice in each segment's JSON made once (SegmentInfo.json_text).
        entries = ", ".join(info.json_text for info in tail)
        text = f'{json.dumps(doc)[:-1]}, "tail": [{entries}]}}'
        key = keys.index_key(topic, partition)
        self.version = store.replace_if(key, text.encode(), self.version)
        self.chunks, self.retired, self._chunks_changed = chunks, retired, False
        latest_chunks.remember(store, topic, partition, chunks)

    def _layout(self) -> tuple[list[IndexChunk], list[SegmentInfo]]:
        """How to store :attr:`segments`: the chunks (stored ones kept where unchanged, new ones sealed) and the tail.

        The tail keeps between :data:`CHUNK_SEGMENTS` and twice that entries;
        past that its oldest are sealed in chunks of :data:`CHUNK_SEGMENTS`.
        """
        chunks, tail = self._kept_chunks()
        sealed = (
            (len(tail) - CHUNK_SEGMENTS) // CHUNK_SEGMENTS * CHUNK_SEGMENTS if len(tail) >= 2 * CHUNK_SEGMENTS else 0
        )
        chunks += [IndexChunk.seal(tail[i : i + CHUNK_SEGMENTS]) for i in range(0, sealed, CHUNK_SEGMENTS)]
        return chunks, tail[sealed:]

    def _kept_chunks(self) -> tuple[list[IndexChunk], list[SegmentInfo]]:
        """The chunks :attr:`segments` starts with (stored ones where unchanged) and the entries after them."""
        chunked = sum(len(chunk.segments) for chunk in self.chunks)
        segments = self.segments
        if not self.chunks:
            return [], segments
        if (  # only appends since the chunks were stored: the common case, checked without walking the entries
            not self._chunks_changed
            and len(segments) >= chunked
            and segments[0] is self.chunks[0].segments[0]
            and segments[chunked - 1] is self.chunks[-1].segments[-1]
        ):
            return list(self.chunks), segments[chunked:]
        return self._rechunked()

    def _rechunked(self) -> tuple[list[IndexChunk], list[SegmentInfo]]:
        """After compaction or retention changed chunked entries: keep each stored chunk whose entries are all
        still there, in order, and hold at least half :data:`CHUNK_SEGMENTS`; seal the entries between them
        into new chunks of about :data:`CHUNK_SEGMENTS` (a run too short for one takes in the chunk before it,
        or after it), so chunks neither shrink nor multiply as runs are rewritten. Entries after the last kept
        chunk are the tail."""
        segments = self.segments
        position = {id(info): i for i, info in enumerate(segments)}
        pieces: list[IndexChunk | list[SegmentInfo]] = []
        done = 0
        for chunk in self.chunks:
            start = position.get(id(chunk.segments[0]), -1)
            end = start + len(chunk.segments)
            if (
                start < done
                or end > len(segments)
                or len(chunk.segments) < CHUNK_SEGMENTS // 2
                or not all(map(operator.is_, segments[start:end], chunk.segments))
            ):
                continue
            if start > done:
                pieces.append(segments[done:start])
            pieces.append(chunk)
            done = end
        merged: list[IndexChunk | list[SegmentInfo]] = []
        for piece in pieces:
            previous = merged[-1] if merged else None
            if isinstance(piece, list) and len(piece) < CHUNK_SEGMENTS // 2 and isinstance(previous, IndexChunk):
                merged.pop()
                piece = [*previous.segments, *piece]
            elif isinstance(piece, IndexChunk) and isinstance(previous, list) and len(previous) < CHUNK_SEGMENTS // 2:
                merged.pop()
                piece = [*previous, *piece.segments]
            if isinstance(piece, list) and merged and isinstance(merged[-1], list):
                piece = merged.pop() + piece
            merged.append(piece)
        chunks = []
        for piece in merged:
            chunks += [piece] if isinstance(piece, IndexChunk) else _sealed_evenly(piece)
        return chunks, segments[done:]

    def add(self, info: SegmentInfo) -> None:
        """Record a newly appended segment; it must start at :attr:`next_offset`.

        Every producer named in the segment gets its sequence, the
        segment's offsets and the digest of its batch (if any) recorded; producers idle for longer than
        :data:`PRODUCER_EXPIRY_MS` are dropped.
        """
        if info.base_offset != self.next_offset:
            raise ValueError(  # programming error
                f"segment base {info.base_offset} != log end offset {self.next_offset}"
            )
        self.segments.append(info)
        for producer_id, seq in info.producers.items():
            entry = {"seq": seq, "base_offset": info.base_offset, "end_offset": info.end_offset}
            if producer_id in info.digests:
                entry["digest"] = info.digests[producer_id]
            self.producers[producer_id] = entry | {"at": info.appended_at}
        horizon = info.appended_at - PRODUCER_EXPIRY_MS
        self.producers = {k: v for k, v in self.producers.items() if v.get("at", info.appended_at) >= horizon}

    def replace_run(self, run: list[SegmentInfo], merged: SegmentInfo, now_ms: int) -> None:
        """Replace the consecutive segments ``run`` by ``merged`` (same offsets) and retire their objects.

        Raises :class:`RunChangedError` if ``run`` is not a consecutive run of
        this index's segments, ``ValueError`` if ``merged`` does not cover
        exactly its offsets.
        """
        names = [info.name for info in self.segments]
        first = names.index(run[0].name) if run and run[0].name in names else -1
        if first < 0 or names[first : first + len(run)] != [info.name for info in run]:
            raise RunChangedError("segments to replace are not a consecutive run of the index")
        if (merged.base_offset, merged.end_offset) != (run[0].base_offset, run[-1].end_offset):
            raise ValueError(  # programming error
                f"merged segment covers [{merged.base_offset}, {merged.end_offset}), not the run's offsets"
            )
        self.segments[first : first + len(run)] = [merged]
        self._chunks_changed = True
        self.retired.extend({"name": info.name, "at": now_ms} for info in run)

    def drop_head(self, count: int, now_ms: int) -> list[SegmentInfo]:
        """Take the first ``count`` segments out of the index (retention), retire them, and return them."""
        dropped, self.segments = self.segments[:count], self.segments[count:]
        self._chunks_changed = self._chunks_changed or bool(dropped)
        if dropped:
            self.truncated_offset = dropped[-1].end_offset
        self.retired.extend({"name": info.name, "at": now_ms} for info in dropped)
        return dropped

    def due_for_deletion(self, now_ms: int, delay_ms: int) -> list[str]:
        """Names of retired objects retired at least ``delay_ms`` before ``now_ms``."""
        return [entry["name"] for entry in self.retired if entry["at"] + delay_ms <= now_ms]

    def last_seq(self, producer_id: str) -> int | None:
        """Highest sequence number appended by ``producer_id``, or ``None`` if unknown."""
        entry = self.producers.get(producer_id)
        return None if entry is None else int(entry["seq"])

    def last_batch(self, producer_id: str) -> tuple[int, str | None] | None:
        """(highest sequence, digest of that batch's body or ``None``) appended by ``producer_id``, if known."""
        entry = self.producers.get(producer_id)
        return None if entry is None else (int(entry["seq"]), entry.get("digest"))

    def segments_for(self, start: int, end: int) -> list[SegmentInfo]:
        """Segments overlapping offsets ``[start, end)``, in order."""
        bases = [info.base_offset for info in self.segments]
        first = max(bisect.bisect_right(bases, start) - 1, 0)
        return [info for info in self.segments[first:] if info.base_offset < end and info.end_offset > start]

    def appended_at(self, offset: int) -> int | None:
        """Append time (epoch ms) of the record at ``offset``, or a lower bound of it: the earliest append time of
        its segment when that is a compacted one whose parts only its footer lists (the index alone cannot tell
        them; :class:`~metrics_lake.core.log.segment.SegmentInfo`). None if the index holds no such record."""
        found = self.segments_for(offset, offset + 1)
        if not found:
            return None
        if found[0].parts_in_footer:
            return found[0].earliest_appended_at
        return int(found[0].ingested_at(offset, offset + 1)[0])

    def first_appended_at_or_after(self, ms: int) -> int:
        """First offset whose record was appended at or after ``ms`` (epoch ms); :attr:`next_offset` if none.

        Append times come from the writers' clocks, so they need not grow
        with offsets: every record appended at or after ``ms`` is at this
        offset or later, but not every record after it was. Within a
        compacted segment whose parts only its footer lists, the offset is
        its first (its ``appended_at`` is its newest part's).
        """
        for info in self.segments:
            for base, at in info.parts or [[info.base_offset, info.appended_at]]:
                if at >= ms:
                    return max(base, info.base_offset)
        return self.next_offset

    def offset_for_time(self, ts_ms: int) -> int:
        """First offset of the earliest segment that may hold an event at or after ``ts_ms``.

        Event time is not ordered within a partition (late events), so this
        is the conservative start for a replay: reading from it misses no
        event with ``ts >= ts_ms``. Returns :attr:`next_offset` if none can.
        """
        for info in self.segments:
            if info.max_ts is not None and info.max_ts >= ts_ms:
                return info.base_offset
        return self.next_offset


def _sealed_evenly(segments: list[SegmentInfo]) -> list[IndexChunk]:
    """``segments`` sealed in consecutive chunks of as even sizes as can be, about :data:`CHUNK_SEGMENTS` each."""
    count = max(1, round(len(segments) / CHUNK_SEGMENTS))
    bounds = [len(segments) * i // count for i in range(count + 1)]
    return [IndexChunk.seal(segments[start:end]) for start, end in itertools.pairwise(bounds) if end > start]


def _unnamed_chunks(store: Store, topic: str, partition: int, index: PartitionIndex) -> list[str]:
    """Retired-entry names (``index-chunks/<name>``) of chunk objects ``index`` neither names nor retired.

    Such a chunk was written for an index swap that lost (:meth:`PartitionIndex.save`); its writer re-reads the
    index and seals new chunks, so nothing will name it. Listed after ``index`` was loaded: a chunk written
    since for a swap that then wins makes the caller's own swap of ``index`` fail, and it looks again.
    """
    known = {chunk.name for chunk in index.chunks}
    retired = {entry["name"] for entry in index.retired}
    folder = keys.INDEX_CHUNKS_FOLDER
    return [
        f"{folder}/{name}"
        for name in store.list(keys.index_chunks_prefix(topic, partition))
        if name not in known and f"{folder}/{name}" not in retired
    ]


def purge_retired(store: Store, topic: str, partition: int, *, delay_ms: int, now_ms: int) -> list[str]:
    """Delete the partition's retired objects (segments, index chunks) whose delete delay has passed; returns
    their names (``index-chunks/<name>`` for a chunk).

    Objects are deleted first, then the index forgets them (compare-and-swap,
    re-read on conflict), so a crash in between only leaves names that the
    next purge deletes again (deleting a missing object is a no-op). Index
    chunks no index names (left by a lost swap) are retired here, to be
    deleted by a purge after the delay.
    """
    while True:
        index = PartitionIndex.load(store, topic, partition)
        unnamed = _unnamed_chunks(store, topic, partition, index)
        due = index.due_for_deletion(now_ms, delay_ms)
        if not due and not unnamed:
            return []
        for name in due:
            store.delete(keys.partition_key(topic, partition, name))
        gone = set(due)
        index.retired = [entry for entry in index.retired if entry["name"] not in gone]
        index.retired += [{"name": name, "at": now_ms} for name in unnamed]
        try:
            index.save(store, topic, partition)
            return due
        except VersionConflictError:
            continue  # a writer appended meanwhile; the objects are gone, forget them on the fresh index
