"""The per-partition index: segment -> offset range, event-time range, size.

Stored as ``log/<topic>/<partition>/index.json`` and replaced atomically after
every segment append. It also remembers, per producer id, the last sequence
number appended and the offsets it got, which makes producer retries
idempotent (the same scheme as Kafka's idempotent producer, KIP-98).

The segments are the source of truth: a segment created just before a crash
but missing from the index is added back by :meth:`PartitionIndex.repair`.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from lake.log.segment import SegmentInfo, parse_segment_name, read_segment_info
from lake.storage import LocalStore

INDEX_NAME = "index.json"


def partition_prefix(topic: str, partition: int) -> str:
    """Key prefix of one partition's objects."""
    return f"log/{topic}/{partition}"


@dataclass
class PartitionIndex:
    """Index of one partition's segments, ordered by base offset."""

    segments: list[SegmentInfo] = field(default_factory=list)
    producers: dict[str, dict] = field(default_factory=dict)

    @property
    def start_offset(self) -> int:
        """First offset still in the log (after retention), or the next offset if empty."""
        return self.segments[0].base_offset if self.segments else self.next_offset

    @property
    def next_offset(self) -> int:
        """Offset the next appended record gets (the log end offset)."""
        return self.segments[-1].end_offset if self.segments else 0

    @classmethod
    def load(cls, store: LocalStore, topic: str, partition: int) -> PartitionIndex:
        """Read the index; an empty index if the partition has none yet."""
        key = f"{partition_prefix(topic, partition)}/{INDEX_NAME}"
        try:
            doc = json.loads(store.read(key))
        except FileNotFoundError:
            return cls()
        return cls(
            segments=[SegmentInfo(**entry) for entry in doc["segments"]],
            producers=doc.get("producers", {}),
        )

    def save(self, store: LocalStore, topic: str, partition: int) -> None:
        """Atomically replace the stored index with this one."""
        doc = {
            "format": 1,
            "next_offset": self.next_offset,
            "segments": [info.to_json() for info in self.segments],
            "producers": self.producers,
        }
        store.replace(f"{partition_prefix(topic, partition)}/{INDEX_NAME}", json.dumps(doc).encode())

    def add(self, info: SegmentInfo) -> None:
        """Record a newly appended segment; it must start at :attr:`next_offset`."""
        if info.base_offset != self.next_offset:
            raise ValueError(f"segment base {info.base_offset} != log end offset {self.next_offset}")
        self.segments.append(info)
        if info.producer_id is not None:
            self.producers[info.producer_id] = {
                "seq": info.producer_seq,
                "base_offset": info.base_offset,
                "end_offset": info.end_offset,
            }

    def repair(self, store: LocalStore, topic: str, partition: int) -> bool:
        """Add segments present in storage but missing from the index.

        Returns True if anything was added. Raises ``RuntimeError`` if a
        missing segment does not continue the offsets densely (storage was
        tampered with): appending past a gap would break offset density.
        """
        prefix = partition_prefix(topic, partition)
        changed = False
        for name in store.list(prefix):
            base = parse_segment_name(name)
            if base is None or base < self.next_offset:
                continue
            if base != self.next_offset:
                raise RuntimeError(f"{prefix}/{name}: gap in offsets, index ends at {self.next_offset}")
            key = f"{prefix}/{name}"
            with store.open_arrow(key) as source:
                info = read_segment_info(source, store.size(key))
            self.add(info)
            changed = True
        return changed

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
