"""A micro-batch's plan: every speed table's log position, the chunks of the log to read, the watermark.

:func:`plan_batch` runs on the driver before the tasks (the steps:
:mod:`metrics_lake.core.speed.micro_batch`). A table's position is the next offset it holds per partition, read
from its Delta ``txn`` actions (:mod:`metrics_lake.core.speed.progress`); the batch reads each partition from
the lowest position of any table up to ``ends``, so a table a crash left behind catches up in the same read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.inventory import Inventory
from metrics_lake.core.kernels.cardinality import CardinalityLimits
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.alerting import watched_metrics
from metrics_lake.core.speed.enrichment import Pin, pin_inventory
from metrics_lake.core.speed.progress import CONSUMER, POSITION_TABLES, table_positions, watermark_app_id
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.lake_schemas.tables import Table

__all__ = [
    "ALERTS",
    "BRONZE",
    "LAST_SEEN",
    "QUARANTINE",
    "QUERIES",
    "SPEED_TABLES",
    "WINDOWS",
    "BatchPlan",
    "Chunk",
    "configured_limits",
    "plan_batch",
]

log = logging.getLogger(__name__)


BRONZE, QUARANTINE, WINDOWS, QUERIES, LAST_SEEN, ALERTS = (
    Table.BRONZE_EVENTS,
    Table.QUARANTINE_EVENTS,
    Table.METRIC_WINDOWS_1M,
    Table.QUERY_RESULTS,
    Table.LAST_SEEN,
    Table.ALERTS,
)


#: The tables a micro-batch writes with its log positions, in commit order (query results are evaluated from the
#: committed windows); it also folds the inventory into ``servers``.
SPEED_TABLES = POSITION_TABLES


@dataclass(frozen=True)
class Chunk:
    """Offsets ``[start, end)`` of one log partition: one task's input."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class BatchPlan:
    """What one micro-batch does (see the module docstring).

    ``ends``: per partition, the next offset the batch reads up to;
    ``marks``: per table and partition, the next offset the table holds
    (where its records start); ``watermark_ms``: events older than this
    are left out of windows (``None`` before the first batch); ``chunks``:
    the ranges to read; ``watched``: the metrics absence rules watch (their
    per-series last-seen times are kept besides each server's);
    ``read_through_ms``: the append time up to which every partition is read
    once the batch is (the last record it reads of each partition it leaves
    records in; None when it reads every partition to the end): no server
    can look silent before it (:mod:`metrics_lake.core.speed.alerting`);
    ``pins``: which inventory version events are joined with from which
    offsets (:mod:`metrics_lake.core.speed.enrichment`); ``limits``: the
    cardinality limits an hour without a state starts with
    (:mod:`metrics_lake.core.speed.cardinality_gate`); ``unread``: the partitions
    the batch leaves records in (their events bound the threshold rules'
    evaluation steps: :func:`~metrics_lake.core.speed.table_commits.alerts.threshold_clock_us`).
    """

    topic: str
    ends: dict[int, int]
    marks: dict[str, dict[int, int]]
    watermark_ms: int | None
    chunks: tuple[Chunk, ...]
    watched: tuple[str, ...] = ()
    read_through_ms: int | None = None
    pins: tuple[Pin, ...] = ()
    limits: CardinalityLimits = CardinalityLimits()
    unread: tuple[int, ...] = ()

    @property
    def records(self) -> int:
        """Log records the batch reads."""
        return sum(c.end - c.start for c in self.chunks)

    def partition_chunks(self) -> dict[int, list[Chunk]]:
        """The chunks of each partition, in offset order (one task processes them one after the other)."""
        chunks: dict[int, list[Chunk]] = {}
        for chunk in self.chunks:
            chunks.setdefault(chunk.partition, []).append(chunk)
        return chunks

    def advances(self, table: str) -> dict[int, int]:
        """The partitions whose position ``table`` moves forward in this batch, with their new positions."""
        return {p: end for p, end in self.ends.items() if end > self.marks[table][p]}


def configured_limits(settings: LakeSettings, partitions: int) -> CardinalityLimits:
    """The cardinality limits of ``settings`` (``LAKE_LIMIT_*``) as one of ``partitions`` partitions' share."""
    return CardinalityLimits.local(
        series_per_metric=settings.limit_series_per_metric,
        values_per_label=settings.limit_values_per_label,
        labels_per_event=settings.limit_labels_per_event,
        partitions=partitions,
    )


def plan_batch(
    store: Store,
    topic: str,
    ends: dict[int, int],
    *,
    watermark_seconds: int,
    chunk_records: int,
    watched: tuple[str, ...] | None = None,
    limits: CardinalityLimits | None = None,
    tables: LatestTables | None = None,
) -> BatchPlan:
    """Plan a micro-batch reading up to ``ends``: each table's position, the watermark, chunks of ``chunk_records``,
    the metrics absence rules watch (``watched``; default: the config store's rules'), the cardinality limits
    (default: none; :func:`configured_limits` gives the settings'). ``tables``: the tables a stream keeps open
    from one batch to the next (:class:`~metrics_lake.core.tables.delta.LatestTables`; default: opened for this
    call).

    A position below the log's start offset (retention removed records a
    table never got; ``lake consumers`` reports it) starts at the log start.
    """
    tables = tables or LatestTables()
    log_ = SegmentLog(store)
    indexes = {p: log_.index(topic, p) for p in ends}
    first = {p: index.start_offset for p, index in indexes.items()}
    marks: dict[str, dict[int, int]] = {}
    for name in SPEED_TABLES:
        committed = table_positions(store, name, topic, ends, tables)
        marks[name] = {}
        for p in ends:
            mark = committed[p] or 0
            if mark < first[p]:
                if committed[p] is not None:
                    log.warning(
                        "%s: records %d..%d of %s/%d were removed by retention before it read them",
                        name,
                        mark,
                        first[p],
                        topic,
                        p,
                    )
                mark = first[p]
            marks[name][p] = mark
    chunks = []
    for p, end in sorted(ends.items()):
        start = min(marks[name][p] for name in SPEED_TABLES)
        chunks += [Chunk(p, lo, min(lo + chunk_records, end)) for lo in range(start, end, chunk_records)]
    watermark = tables.latest(store, WINDOWS).transaction_version(watermark_app_id(topic))
    if watched is None:
        watched = watched_metrics(ConfigStore(store).current().alert_rules())
    unread_partitions = tuple(p for p, end in sorted(ends.items()) if end < indexes[p].next_offset)
    behind = [indexes[p].appended_at(ends[p] - 1) for p in unread_partitions if ends[p] > 0]
    read_through = min((at for at in behind if at is not None), default=None)
    unread = {p: max(marks[name][p] for name in SPEED_TABLES) for p in ends}
    pins = pin_inventory(store, CONSUMER, topic, unread, Inventory(store).end_offset())
    return BatchPlan(
        topic,
        dict(ends),
        marks,
        watermark,
        tuple(chunks),
        watched,
        read_through,
        pins,
        limits or CardinalityLimits(),
        unread_partitions,
    )
