"""Log retention: drop segments appended before a horizon, from the head of each partition.

A segment is past retention when its ``appended_at`` (for a compacted one,
its newest part's) is older than the horizon. Only a prefix of each
partition is dropped, so offsets stay dense and the log start offset just
moves forward. Append time, not event time, decides: an agent with a wrong
clock must neither pin segments forever nor get its fresh data deleted
before the speed layer read it (Kafka's ``log.message.timestamp.type``
trade-off, decided for the broker's clock).

Dropped segments are retired in the index (one compare-and-swap, re-read on
a conflict) and their objects deleted after the delete delay, like
compaction's (:func:`metrics_lake.core.log.index.purge_retired`).

A consumer group whose committed offset is below the new start offset would
lose records it never read; :func:`plan_log_retention` reports such groups
(``behind``) so the caller can say so loudly. Retention does not wait for
slow consumers: a retention period is a promise about storage, as in Kafka.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from metrics_lake.core import keys
from metrics_lake.core.log.consumer_groups import committed_offsets, consumer_groups
from metrics_lake.core.log.index import PartitionIndex, purge_retired
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import VersionConflictError


@dataclass(frozen=True)
class PartitionRetention:
    """Segments of one partition past the horizon: how many, records, bytes, the new start offset.

    ``behind`` maps each consumer group whose committed offset is below
    ``new_start`` to that offset: the records ``[committed, new_start)`` it
    never read are (or would be) deleted.
    """

    topic: str
    partition: int
    segments: int
    records: int
    size_bytes: int
    old_start: int
    new_start: int
    behind: dict[str, int] = field(default_factory=dict)


def _expired_prefix(index: PartitionIndex, horizon_ms: int) -> int:
    count = 0
    for info in index.segments:
        if info.appended_at >= horizon_ms:
            break
        count += 1
    return count


def plan_log_retention(log: SegmentLog, topic: str, horizon_ms: int) -> list[PartitionRetention]:
    """What retention at ``horizon_ms`` (epoch ms) would drop, per partition of ``topic``; changes nothing."""
    groups = [group for group, group_topic in consumer_groups(log.store) if group_topic == topic]
    committed = {group: committed_offsets(log.store, group, topic) for group in groups}
    plans = []
    for partition in range(log.partitions(topic)):
        index = log.index(topic, partition)
        dropped = index.segments[: _expired_prefix(index, horizon_ms)]
        new_start = dropped[-1].end_offset if dropped else index.start_offset
        behind = {
            group: offsets[partition]
            for group, offsets in committed.items()
            if partition in offsets and offsets[partition] < new_start
        }
        plans.append(
            PartitionRetention(
                topic,
                partition,
                len(dropped),
                sum(s.record_count for s in dropped),
                sum(s.size_bytes for s in dropped),
                index.start_offset,
                new_start,
                behind,
            )
        )
    return plans


def apply_log_retention(log: SegmentLog, topic: str, horizon_ms: int, *, delete_delay_ms: int) -> list[str]:
    """Drop every partition's segments past ``horizon_ms`` from the index; delete retired objects past the delay.

    Returns the keys of objects deleted now (segments dropped now are
    deleted by a later run, once ``delete_delay_ms`` has passed).
    """
    deleted = []
    for partition in range(log.partitions(topic)):
        while True:
            index = log.index(topic, partition)
            count = _expired_prefix(index, horizon_ms)
            if count == 0:
                break
            index.drop_head(count, int(time.time() * 1000))
            try:
                index.save(log.store, topic, partition)
                break
            except VersionConflictError:
                continue  # a producer appended; the head is unchanged, so drop it again on the fresh index
        now = int(time.time() * 1000)
        names = purge_retired(log.store, topic, partition, delay_ms=delete_delay_ms, now_ms=now)
        deleted += [keys.partition_key(topic, partition, name) for name in names]
    return deleted
