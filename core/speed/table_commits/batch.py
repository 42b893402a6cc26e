"""A processed micro-batch as every table's commit sees it, and the shape of one table's commit.

:class:`ProcessedBatch` holds the plan (:class:`~metrics_lake.core.speed.batch_plan.BatchPlan`), the tasks' chunk
results (:class:`~metrics_lake.core.speed.chunk_processing.ChunkResult`) and the options of the stream; what
several tables derive from the results (the new watermark) is computed once here. A :class:`TableCommit` commits
one table from it and says how many rows it committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from metrics_lake.core.kernels.alert_rules import AlertRule
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.core.speed.alerting import AlertOptions
from metrics_lake.core.speed.batch_plan import BatchPlan
from metrics_lake.core.speed.chunk_processing import ChunkResult
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import LatestTables

__all__ = [
    "ProcessedBatch",
    "TableCommit",
]


@dataclass
class ProcessedBatch:
    """A micro-batch after its tasks, before its commits.

    ``store``: the lake; ``tables``: the tables the stream keeps open from one batch to the next; ``plan``: every
    table's positions and the chunks read; ``results``: the tasks' output per chunk; ``watermark_seconds``: how far
    behind the newest event time windows close (seconds); ``queries`` and ``rules``: the stored queries kept live
    and the alert rules evaluated; ``alerting``: the evaluation delay and absence lookback; ``open_windows``: the
    open windows' rows the stream keeps between batches (``None``: read their files). ``stages``: wall seconds per
    step so far, in order; :meth:`lap` adds one.
    """

    store: Store
    tables: LatestTables
    plan: BatchPlan
    results: list[ChunkResult]
    watermark_seconds: int
    queries: list[StoredQuery]
    rules: list[AlertRule]
    alerting: AlertOptions
    open_windows: OpenWindows | None
    stages: dict[str, float] = field(default_factory=dict)
    _lap: float = field(default_factory=time.monotonic, repr=False)

    @cached_property
    def watermark_ms(self) -> int | None:
        """The watermark after this batch (epoch ms; None before any event): the newest event time the results
        hold minus ``watermark_seconds``, never behind the plan's (Spark's ``withWatermark`` semantics; the module
        docstring of :mod:`metrics_lake.core.speed.micro_batch`)."""
        times = [r.event_time_max_ms for r in self.results if r.event_time_max_ms is not None]
        candidates = [max(times) - self.watermark_seconds * 1000] if times else []
        previous = [self.plan.watermark_ms] if self.plan.watermark_ms is not None else []
        return max([*candidates, *previous], default=None)

    def lap(self, stage: str) -> None:
        """Record the wall seconds since the last lap (or since this object was made) as ``stage``."""
        now = time.monotonic()
        self.stages[stage] = now - self._lap
        self._lap = now


class TableCommit(Protocol):
    """One table's commit of a processed batch: ``table`` is the table's name; :meth:`commit` commits the batch's
    rows with the table's new positions and returns the rows committed (0 when the table already held the
    positions: a replayed batch). Raises :class:`~metrics_lake.lake_schemas.errors.ConcurrentWriterError` when
    another stream moved the positions."""

    table: str

    def commit(self, batch: ProcessedBatch) -> int:
        """Commit ``batch`` to :attr:`table`; returns rows committed (see the class docstring)."""
        ...
