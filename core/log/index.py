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
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from metrics_lake.core import keys
from metrics_lake.core.log.segment import SegmentInfo
from metrics_lake.core.storage import Store, VersionConflictError

PRODUCER_EXPIRY_MS = 7 * 24 * 3600 * 1000


class RunChangedError(ValueError):
    """The segments a compaction planned to replace are no longer a consecutive run of the index.

    Retention dropped some of them or another compactor merged them: control
    flow of :mod:`metrics_lake.core.log.segment_compaction`, which skips the run.
    """


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
    """

    segments: list[SegmentInfo] = field(default_factory=list)
    producers: dict[str, dict] = field(default_factory=dict)
    retired: list[dict] = field(default_factory=list)
    truncated_offset: int = 0
    epoch: int = 0
    revision: int = 0
    version: str | None = None

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
        """Read the index; an empty index if the partition has none yet."""
        key = keys.index_key(topic, partition)
        try:
            data, version = store.read_versioned(key)
        except FileNotFoundError:
            return cls()
        doc = json.loads(data)
        return cls(
            segments=[SegmentInfo.from_json(entry) for entry in doc["segments"]],
            producers=doc.get("producers", {}),
            retired=doc.get("retired", []),
            truncated_offset=int(doc.get("truncated_offset", 0)),
            epoch=int(doc.get("epoch", 0)),
            revision=int(doc.get("revision", 0)),
            version=version,
        )

    def save(self, store: Store, topic: str, partition: int) -> None:
        """Store this index if the stored one is still at :attr:`version` (compare-and-swap).

        Raises :class:`metrics_lake.core.storage.VersionConflictError` if another writer
        saved in between; on success :attr:`version` is the new version.
        """
        self.revision += 1
        doc = {
            "format": 2,
            "epoch": self.epoch,
            "revision": self.revision,
            "next_offset": self.next_offset,
            "producers": self.producers,
            "retired": self.retired,
            "truncated_offset": self.truncated_offset,
        }
        # The segment list is most of the index: splice in each segment's JSON made once (SegmentInfo.json_text).
        segments = ", ".join(info.json_text for info in self.segments)
        text = f'{json.dumps(doc)[:-1]}, "segments": [{segments}]}}'
        key = keys.index_key(topic, partition)
        self.version = store.replace_if(key, text.encode(), self.version)

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
        self.retired.extend({"name": info.name, "at": now_ms} for info in run)

    def drop_head(self, count: int, now_ms: int) -> list[SegmentInfo]:
        """Take the first ``count`` segments out of the index (retention), retire them, and return them."""
        dropped, self.segments = self.segments[:count], self.segments[count:]
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
        """Append time (epoch ms) of the record at ``offset``; None if the index holds no such record."""
        found = self.segments_for(offset, offset + 1)
        return int(found[0].ingested_at(offset, offset + 1)[0]) if found else None

    def first_appended_at_or_after(self, ms: int) -> int:
        """First offset whose record was appended at or after ``ms`` (epoch ms); :attr:`next_offset` if none.

        Append times come from the writers' clocks, so they need not grow
        with offsets: every record appended at or after ``ms`` is at this
        offset or later, but not every record after it was.
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


def purge_retired(store: Store, topic: str, partition: int, *, delay_ms: int, now_ms: int) -> list[str]:
    """Delete the partition's retired segment objects whose delete delay has passed; returns their names.

    Objects are deleted first, then the index forgets them (compare-and-swap,
    re-read on conflict), so a crash in between only leaves names that the
    next purge deletes again (deleting a missing object is a no-op).
    """
    while True:
        index = PartitionIndex.load(store, topic, partition)
        due = index.due_for_deletion(now_ms, delay_ms)
        if not due:
            return []
        for name in due:
            store.delete(keys.partition_key(topic, partition, name))
        gone = set(due)
        index.retired = [entry for entry in index.retired if entry["name"] not in gone]
        try:
            index.save(store, topic, partition)
            return due
        except VersionConflictError:
            continue  # a writer appended meanwhile; the objects are gone, forget them on the fresh index
