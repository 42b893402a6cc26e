"""The per-partition index: segment -> offset range, event-time range, size.

Stored as ``log/<topic>/<partition>/index.json``. Only the partition's lease
holder changes it, and every change is a compare-and-swap on the object's
version, so a writer that lost its lease cannot overwrite it (see
:mod:`lake.log.lease`). The index also records the lease ``epoch`` of the
writer that last committed, and, per producer id, the last sequence number
appended with the offsets it got, which makes producer retries idempotent
(the scheme of Kafka's idempotent producer, KIP-98). Producer ids unseen for
:data:`PRODUCER_EXPIRY_MS` are forgotten, as Kafka expires them after
``transactional.id.expiration.ms`` (7 days), so the index stays small.

A segment becomes visible to consumers when the index names it.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from lake.log.segment import SegmentInfo
from lake.storage import Store

INDEX_NAME = "index.json"
PRODUCER_EXPIRY_MS = 7 * 24 * 3600 * 1000


def partition_prefix(topic: str, partition: int) -> str:
    """Key prefix of one partition's objects."""
    return f"log/{topic}/{partition}"


@dataclass
class PartitionIndex:
    """Index of one partition's segments, ordered by base offset.

    ``epoch``: lease epoch of the last committing writer; ``revision``:
    incremented on every save (it also keeps the stored bytes, hence the
    object version, unique); ``version``: the stored object version this
    index was loaded at or saved as (``None`` if never stored).
    """

    segments: list[SegmentInfo] = field(default_factory=list)
    producers: dict[str, dict] = field(default_factory=dict)
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
        return self.segments[-1].end_offset if self.segments else 0

    @classmethod
    def load(cls, store: Store, topic: str, partition: int) -> PartitionIndex:
        """Read the index; an empty index if the partition has none yet."""
        key = f"{partition_prefix(topic, partition)}/{INDEX_NAME}"
        try:
            data, version = store.read_versioned(key)
        except FileNotFoundError:
            return cls()
        doc = json.loads(data)
        return cls(
            segments=[SegmentInfo.from_json(entry) for entry in doc["segments"]],
            producers=doc.get("producers", {}),
            epoch=int(doc.get("epoch", 0)),
            revision=int(doc.get("revision", 0)),
            version=version,
        )

    def save(self, store: Store, topic: str, partition: int) -> None:
        """Store this index if the stored one is still at :attr:`version` (compare-and-swap).

        Raises :class:`lake.storage.VersionConflictError` if another writer
        saved in between; on success :attr:`version` is the new version.
        """
        self.revision += 1
        doc = {
            "format": 2,
            "epoch": self.epoch,
            "revision": self.revision,
            "next_offset": self.next_offset,
            "segments": [info.to_json() for info in self.segments],
            "producers": self.producers,
        }
        key = f"{partition_prefix(topic, partition)}/{INDEX_NAME}"
        self.version = store.replace_if(key, json.dumps(doc).encode(), self.version)

    def add(self, info: SegmentInfo) -> None:
        """Record a newly appended segment; it must start at :attr:`next_offset`.

        Every producer named in the segment gets its sequence and the
        segment's offsets recorded; producers idle for longer than
        :data:`PRODUCER_EXPIRY_MS` are dropped.
        """
        if info.base_offset != self.next_offset:
            raise ValueError(f"segment base {info.base_offset} != log end offset {self.next_offset}")
        self.segments.append(info)
        for producer_id, seq in info.producers.items():
            self.producers[producer_id] = {
                "seq": seq,
                "base_offset": info.base_offset,
                "end_offset": info.end_offset,
                "at": info.appended_at,
            }
        horizon = info.appended_at - PRODUCER_EXPIRY_MS
        self.producers = {k: v for k, v in self.producers.items() if v.get("at", info.appended_at) >= horizon}

    def last_seq(self, producer_id: str) -> int | None:
        """Highest sequence number appended by ``producer_id``, or ``None`` if unknown."""
        entry = self.producers.get(producer_id)
        return None if entry is None else int(entry["seq"])

    def segments_for(self, start: int, end: int) -> list[SegmentInfo]:
        """Segments overlapping offsets ``[start, end)``, in order."""
        bases = [info.base_offset for info in self.segments]
        first = max(bisect.bisect_right(bases, start) - 1, 0)
        return [info for info in self.segments[first:] if info.base_offset < end and info.end_offset > start]

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
