"""The partitioned segment log: topics, partitions and the append path.

Layout under the lake root::

    log/<topic>/topic.json                  partition count, created once
    log/<topic>/<partition>/index.json      the partition index
    log/<topic>/<partition>/<base>.parquet  immutable segments

An append, under the partition's writer lock: load the index, repair it from
storage if a previous writer crashed after creating a segment, drop the call
if its (producer id, sequence) was already appended, create the segment with
an atomic create-if-absent, then replace the index. A segment is visible to
consumers once the index names it, so readers never see a partial segment
and offsets stay dense and monotonic.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pyarrow as pa

from lake.log.index import PartitionIndex, partition_prefix
from lake.log.segment import encode_segment
from lake.storage import LocalStore, ObjectExistsError


class TopicNotFoundError(LookupError):
    """The topic has no ``topic.json``: nothing was ever produced to it."""


@dataclass(frozen=True)
class AppendResult:
    """Offsets ``[base_offset, end_offset)`` of an append; ``duplicate`` if it was a retry."""

    base_offset: int
    end_offset: int
    duplicate: bool = False


class SegmentLog:
    """A partitioned log of segment objects in one :class:`LocalStore`."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store

    def ensure_topic(self, topic: str, partitions: int) -> int:
        """Create ``topic`` with ``partitions`` partitions unless it exists.

        Returns the topic's actual partition count: an existing topic keeps
        its count (re-partitioning would break per-server ordering).
        """
        key = f"log/{topic}/topic.json"
        doc = {"topic": topic, "partitions": partitions, "created_at": int(time.time() * 1000)}
        try:
            self.store.create(key, json.dumps(doc).encode())
        except ObjectExistsError:
            pass
        return self.partitions(topic)

    def partitions(self, topic: str) -> int:
        """Partition count of ``topic``; :class:`TopicNotFoundError` if it does not exist."""
        try:
            return int(json.loads(self.store.read(f"log/{topic}/topic.json"))["partitions"])
        except FileNotFoundError:
            raise TopicNotFoundError(f"topic {topic!r} does not exist under {self.store.root}/log") from None

    def topics(self) -> list[str]:
        """Names of existing topics."""
        return [name for name in self.store.list("log") if self.store.exists(f"log/{name}/topic.json")]

    def index(self, topic: str, partition: int) -> PartitionIndex:
        """The committed index of one partition (what consumers may read)."""
        return PartitionIndex.load(self.store, topic, partition)

    def append(
        self,
        topic: str,
        partition: int,
        records: pa.Table,
        *,
        producer_id: str | None = None,
        producer_seq: int | None = None,
    ) -> AppendResult:
        """Append ``records`` (:data:`lake_schemas.LOG_RECORD`) as one new segment.

        With ``producer_id``/``producer_seq``, a call whose sequence is not
        above the last one appended for that producer is a retry: nothing is
        written and the original offsets are returned with
        ``duplicate=True``. Raises ``ValueError`` for empty or mis-shaped
        records and ``IndexError`` for a partition out of range.
        """
        count = self.partitions(topic)
        if not 0 <= partition < count:
            raise IndexError(f"partition {partition} out of range for topic {topic!r} with {count} partitions")
        prefix = partition_prefix(topic, partition)
        with self.store.lock(f"{prefix}/.writer.lock"):
            index = PartitionIndex.load(self.store, topic, partition)
            repaired = index.repair(self.store, topic, partition)
            if producer_id is not None:
                last = index.producers.get(producer_id)
                if last is not None and producer_seq is not None and producer_seq <= last["seq"]:
                    if repaired:
                        index.save(self.store, topic, partition)
                    return AppendResult(last["base_offset"], last["end_offset"], duplicate=True)
            data, info = encode_segment(
                records,
                base_offset=index.next_offset,
                appended_at=int(time.time() * 1000),
                producer_id=producer_id,
                producer_seq=producer_seq,
            )
            self.store.create(f"{prefix}/{info.name}", data)
            index.add(info)
            index.save(self.store, topic, partition)
            return AppendResult(info.base_offset, info.end_offset)
