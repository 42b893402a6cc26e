"""A speed table's commit together with its log positions: the exactly-once step every table of a micro-batch takes.

Each table records the next offset it holds per partition as a Delta ``txn`` action in the same version as its
data (:func:`metrics_lake.core.tables.commits.offset_transactions`), so a replayed batch finds its positions
committed and commits nothing (the module docstring of :mod:`metrics_lake.core.speed.micro_batch`).
"""

from __future__ import annotations

from metrics_lake.core.speed.batch_plan import BatchPlan
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import committed_offsets, retry_on_conflict
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.lake_schemas.errors import ConcurrentWriterError

__all__ = [
    "commit_with_positions",
]


def commit_with_positions(store: Store, tables: LatestTables, plan: BatchPlan, name: str, commit) -> bool:
    """Run ``commit(table, advances)`` for ``name`` on its latest snapshot, from ``tables``, if its positions are
    still the plan's. ``commit`` must not ask ``tables`` for ``name`` again: that would move the snapshot it plans
    on, and delta-rs would no longer see a concurrent commit as a conflict.

    Returns False (committing nothing) if the table already holds the
    batch's positions: an earlier attempt of this very batch committed.
    Raises :class:`ConcurrentWriterError` if another writer moved them.
    Retries when a concurrent commit of another kind (compaction) wins.
    """
    advances = plan.advances(name)
    if not advances:
        return False

    def attempt() -> bool:
        table = tables.latest(store, name)
        current = committed_offsets(table, CONSUMER, plan.topic, advances)
        if all((current[p] or 0) >= end for p, end in advances.items()):
            return False
        expected = {p: plan.marks[name][p] for p in advances}
        moved = {p: current[p] for p in advances if (current[p] or 0) > expected[p]}
        if moved:
            raise ConcurrentWriterError(
                f"{name}: another speed layer committed positions {moved} of topic {plan.topic!r} while this one "
                f"planned from {expected}; run one `lake stream` per topic"
            )
        commit(table, advances)
        return True

    return retry_on_conflict(attempt, name)
