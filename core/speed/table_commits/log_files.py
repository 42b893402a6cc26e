"""The speed layer's commits to ``bronze_events`` and ``quarantine_events``: the files the tasks wrote.

The tasks (:func:`~metrics_lake.core.speed.chunk_processing.process_partition`) write each chunk's valid events
and rejects as Parquet files; the driver adds them to their table in one commit with the table's positions. A
replayed batch's files are never added (the positions are already held) and vacuum removes them as orphans.
"""

from __future__ import annotations

from dataclasses import dataclass

from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.table_commits.batch import ProcessedBatch
from metrics_lake.core.speed.table_commits.positions import commit_with_positions
from metrics_lake.core.tables.commits import commit_changes, offset_transactions

__all__ = [
    "LogFilesCommit",
]


@dataclass(frozen=True)
class LogFilesCommit:
    """Adds the batch's files of ``table`` (``bronze_events`` or ``quarantine_events``) with its positions;
    :meth:`commit` returns the rows those files hold (0 for a replayed batch)."""

    table: str

    def commit(self, batch: ProcessedBatch) -> int:
        """Commit the tasks' files of :attr:`table`; returns their rows (0 if the table held the positions)."""
        files = [f for r in batch.results for f in r.files if f.table == self.table]
        plan = batch.plan
        committed = commit_with_positions(
            batch.store,
            batch.tables,
            plan,
            self.table,
            lambda table, advances: commit_changes(
                table,
                self.table,
                files,
                [],
                transactions=offset_transactions(CONSUMER, plan.topic, advances),
                operation="STREAMING UPDATE",
            ),
        )
        return sum(r.counts.get(self.table, 0) for r in batch.results) if committed else 0
