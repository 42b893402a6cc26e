"""Named consumer groups: committed offsets per topic partition, and lag.

A group's offsets for one topic live in
``log/_consumers/<group>/<topic>.json`` (:func:`metrics_lake.core.keys.consumer_offsets_key`)::

    {"group": "bronze", "topic": "metrics", "offsets": {"0": 1200, "1": 980},
     "committed_at_ms": 1795291000000}

An offset is the *next* offset the group will read (Kafka's convention), so
lag = log end offset - committed offset. The speed layer's queries commit
after each micro-batch is committed to its table (the data source's
``commit``), so committed offsets never run ahead of the data. Only the
pipeline identity may write ``log/_consumers/`` on S3.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from metrics_lake.core import keys
from metrics_lake.core.log.consumer import end_offsets, start_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import Store


def commit_offsets(store: Store, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Record ``offsets`` (partition -> next offset to read) as ``group``'s position in ``topic``.

    Partitions not in ``offsets`` keep their previously committed offset.
    """
    doc = {"group": group, "topic": topic, "offsets": {}}
    try:
        doc["offsets"] = json.loads(store.read(keys.consumer_offsets_key(group, topic)))["offsets"]
    except FileNotFoundError:
        pass
    doc["offsets"].update({str(p): int(o) for p, o in offsets.items()})
    doc["committed_at_ms"] = int(time.time() * 1000)
    store.replace(keys.consumer_offsets_key(group, topic), json.dumps(doc, sort_keys=True).encode())


def committed_offsets(store: Store, group: str, topic: str) -> dict[int, int]:
    """``group``'s committed offsets in ``topic`` (empty if it never committed)."""
    try:
        doc = json.loads(store.read(keys.consumer_offsets_key(group, topic)))
    except FileNotFoundError:
        return {}
    return {int(p): int(o) for p, o in doc["offsets"].items()}


def consumer_groups(store: Store) -> list[tuple[str, str]]:
    """Every (group, topic) with committed offsets, sorted."""
    pairs = []
    for group in store.list(keys.CONSUMERS_PREFIX):
        if keys.is_group(group):
            names = store.list(keys.consumer_group_prefix(group))
            pairs += [(group, name.removesuffix(".json")) for name in names if name.endswith(".json")]
    return sorted(pairs)


@dataclass(frozen=True)
class PartitionLag:
    """One partition's position for a group: ``committed`` (next offset to read), log ``start``/``end``, ``lag``.

    ``behind_retention`` is True when ``committed`` < ``start``: records the
    group never read were already deleted by retention.
    """

    group: str
    topic: str
    partition: int
    committed: int | None
    start: int
    end: int

    @property
    def lag(self) -> int:
        """Records in the log the group has not read (all retained ones if it never committed)."""
        return self.end - max(self.committed if self.committed is not None else self.start, self.start)

    @property
    def behind_retention(self) -> bool:
        """Whether retention removed records this group had not read yet."""
        return self.committed is not None and self.committed < self.start


def lag_report(log: SegmentLog, group: str | None = None) -> list[PartitionLag]:
    """Lag per partition of every (group, topic), or of ``group`` only."""
    report = []
    for name, topic in consumer_groups(log.store):
        if group is not None and name != group:
            continue
        committed = committed_offsets(log.store, name, topic)
        starts, ends = start_offsets(log, topic), end_offsets(log, topic)
        for p in sorted(ends):
            report.append(PartitionLag(name, topic, p, committed.get(p), starts[p], ends[p]))
    return report
