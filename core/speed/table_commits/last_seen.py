"""The speed layer's commit to ``last_seen``: when each watched series was last heard from.

``last_seen`` is small (one row per server and watched metric) and rewritten whole each batch: the newest times
the tasks saw merged into the rows it holds, plus the first rows of a metric an absence rule starts to watch,
taken from the windows (:func:`~metrics_lake.core.speed.alerting.initial_last_seen`). Absence rules read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from deltalake import Transaction

from metrics_lake.core.speed.alerting import (
    SEEN,
    append_clock_us,
    initial_last_seen,
    read_last_seen,
    updated_last_seen,
    watched_app_id,
    watched_metrics,
)
from metrics_lake.core.speed.batch_plan import LAST_SEEN
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.table_commits.batch import ProcessedBatch
from metrics_lake.core.speed.table_commits.positions import commit_with_positions
from metrics_lake.core.tables.commits import commit_changes, offset_transactions, remove_action
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.snapshots import snapshot_files

__all__ = [
    "LastSeenCommit",
]


@dataclass(frozen=True)
class LastSeenCommit:
    """Rewrites ``last_seen`` with the batch's newest times merged in (and a newly watched metric's first rows
    from the windows), with its positions; :meth:`commit` returns the rows the table now holds."""

    table: str = LAST_SEEN

    def commit(self, batch: ProcessedBatch) -> int:
        """Commit the merged ``last_seen``; returns its rows (0 if the table held the positions)."""
        store, plan = batch.store, batch.plan
        seen = pa.concat_tables([r.seen for r in batch.results]) if batch.results else SEEN.empty_table()
        watched = watched_metrics(batch.rules)
        lookback_s = batch.alerting.absence_lookback_s
        written = 0

        def commit(table, advances: dict[int, int]) -> None:
            nonlocal written
            old_files = snapshot_files(store, LAST_SEEN, table)
            existing = read_last_seen(store, table, old_files)
            new_metrics = [m for m in watched if table.transaction_version(watched_app_id(m)) is None]
            clock = append_clock_us(pa.concat_tables([existing.cast(SEEN), seen.cast(SEEN)]))
            initial = SEEN.empty_table()
            if new_metrics and clock is not None:
                initial = initial_last_seen(store, new_metrics, clock, lookback_s)
            rows = updated_last_seen(existing, seen, initial, watched, lookback_s)
            commit_changes(
                table,
                LAST_SEEN,
                write_data_files(store, LAST_SEEN, rows),
                [remove_action(f) for f in old_files],
                transactions=offset_transactions(CONSUMER, plan.topic, advances)
                + [Transaction(watched_app_id(m), 1) for m in new_metrics],
                operation="STREAMING LAST SEEN",
            )
            written = rows.num_rows

        return written if commit_with_positions(store, batch.tables, plan, LAST_SEEN, commit) else 0
