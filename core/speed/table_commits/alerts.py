"""The speed layer's commit to ``alerts``: every alert rule evaluated on the tables the batch committed.

Threshold rules step through evaluation steps up to the event clock :func:`threshold_clock_us` allows; absence
rules and ``LakeNoData`` read ``last_seen`` (:func:`~metrics_lake.core.speed.alerting.evaluate_alerts`). The
transitions are appended with the table's positions and the rules' clocks in one commit, so a replayed batch
records none twice.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from metrics_lake.core.kernels.alert_evaluation import transitions_table
from metrics_lake.core.speed.alerting import evaluate_alerts, event_clock_us, read_last_seen, shared_alert_log
from metrics_lake.core.speed.batch_plan import ALERTS, LAST_SEEN, QUERIES, BatchPlan
from metrics_lake.core.speed.chunk_processing import ChunkResult
from metrics_lake.core.speed.enrichment import expected_servers
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.table_commits.batch import ProcessedBatch
from metrics_lake.core.speed.table_commits.positions import commit_with_positions
from metrics_lake.core.tables.commits import commit_changes, offset_transactions
from metrics_lake.core.tables.data_files import write_data_files

__all__ = [
    "AlertsCommit",
    "threshold_clock_us",
]

log = logging.getLogger(__name__)


def threshold_clock_us(
    plan: BatchPlan, results: list[ChunkResult], watermark_ms: int | None, watermark_seconds: int, delay_s: float
) -> int | None:
    """How far threshold rules may step after this batch (epoch µs; None: no step this batch).

    The event clock minus the delay (:func:`~metrics_lake.core.speed.alerting.event_clock_us`) when the batch
    reads every partition to its end. Else no later than the oldest of the newest event times it read in the
    partitions it leaves records in: a window is final only once every partition's events before its end are
    read, and a batch catching up unevenly must not evaluate a window another partition still adds to. None when
    it read nothing of one of those (a later batch reads on).
    """
    clock = event_clock_us(watermark_ms, watermark_seconds, delay_s)
    if clock is None or not plan.unread:
        return clock
    newest: dict[int, int] = {}
    for r in results:
        if r.partition is not None and r.event_time_max_ms is not None:
            newest[r.partition] = max(newest.get(r.partition, r.event_time_max_ms), r.event_time_max_ms)
    if any(p not in newest for p in plan.unread):
        return None
    return min(clock, int((min(newest[p] for p in plan.unread) - delay_s * 1000) * 1000))


@dataclass(frozen=True)
class AlertsCommit:
    """Evaluates every alert rule on the committed tables (threshold rules at each evaluation step up to
    :func:`threshold_clock_us`) and appends the transitions to ``alerts`` with the batch's positions and the
    rules' clocks; :meth:`commit` returns the transitions recorded."""

    table: str = ALERTS

    def commit(self, batch: ProcessedBatch) -> int:
        """Commit the batch's alert transitions; returns how many (0 if the table held the positions)."""
        store, tables, plan, options = batch.store, batch.tables, batch.plan, batch.alerting
        event_clock = threshold_clock_us(
            plan, batch.results, batch.watermark_ms, batch.watermark_seconds, options.evaluation_delay_s
        )
        alert_log = shared_alert_log(store)
        recorded = 0

        def commit(table, advances: dict[int, int]) -> None:
            nonlocal recorded
            active = alert_log.refresh(table)  # what the committed transitions leave active: the state to go on from
            evaluation = evaluate_alerts(
                store,
                table,
                tables.latest(store, QUERIES),
                read_last_seen(store, tables.latest(store, LAST_SEEN)),
                batch.rules,
                batch.queries,
                active,
                topic=plan.topic,
                options=options,
                event_clock=event_clock,
                read_through_ms=plan.read_through_ms,
                expected=expected_servers(store),
            )
            rows = transitions_table(evaluation.transitions, dt.datetime.now(dt.UTC))
            commit_changes(
                table,
                ALERTS,
                write_data_files(store, ALERTS, rows),
                [],
                transactions=offset_transactions(CONSUMER, plan.topic, advances) + evaluation.clocks,
                operation="STREAMING ALERTS",
            )
            recorded = rows.num_rows
            if recorded:
                log.info("alerts: %s", "; ".join(f"{t.state} {t.summary}" for t in evaluation.transitions[:20]))

        return recorded if commit_with_positions(store, tables, plan, ALERTS, commit) else 0
