"""The exactly-once commit path into Delta tables (delta-rs), in two forms.

- **Log positions** (the speed layer): a table records, for every log
  partition it has consumed, the next offset it holds, as the Delta
  transaction action ``txn(appId="<consumer>/<topic>/<partition>",
  version=<next offset>)`` (:func:`offset_transactions`,
  :func:`committed_offsets`). Data files and the new positions are committed
  in one Delta version (:func:`commit_changes`), so a table never holds a
  row without also holding its position, whatever the process or its
  checkpoint went through. delta-rs fails a commit whose ``txn`` appIds a
  concurrent commit changed, and one that removes a file a concurrent commit
  removed (both verified with delta-rs 1.6), so two writers cannot both
  commit the same positions.
- **Batch ids** (replay): :func:`commit_files` commits files with
  ``txn(appId, version=batchId)`` and skips a batch id already recorded, as
  Delta-Spark's streaming sink does (``DeltaSink.addBatch``; Delta
  PROTOCOL.md "Transaction Identifiers").

A commit that loses to a concurrent writer of another kind (compaction) is
re-planned and retried (:func:`retry_on_conflict`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import ensure_table, table_layout
from metrics_lake.lake_schemas.tables import table_spec

if TYPE_CHECKING:
    from metrics_lake.core.tables.data_files import WrittenFile
    from metrics_lake.core.tables.snapshots import DataFile

__all__ = [
    "COMMIT_ATTEMPTS",
    "batch_commit_properties",
    "commit_changes",
    "commit_files",
    "committed_batch",
    "committed_offsets",
    "offset_app_id",
    "offset_transactions",
    "remove_action",
    "retry_on_conflict",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


#: How often a Delta commit that lost to a concurrent one (CommitFailedError)
#: is re-planned and retried before the error is raised.
COMMIT_ATTEMPTS = 10


def retry_on_conflict(commit: Callable[[], T], what: str, attempts: int = COMMIT_ATTEMPTS) -> T:
    """Run ``commit`` (which re-reads the table), retrying when a concurrent writer wins the Delta commit.

    delta-rs raises ``CommitFailedError`` when a concurrent commit conflicts
    (say compaction removed a file a merge rewrites); the loser changed
    nothing, so re-planning on the new snapshot is safe. Waits 0.1, 0.2, ...
    s (capped at 2 s) between attempts, then re-raises the last error.
    """
    for attempt in range(1, attempts + 1):
        try:
            return commit()
        except CommitFailedError as exc:
            if attempt == attempts:
                raise
            log.info("%s: concurrent commit won (%s); retrying (%d/%d)", what, exc, attempt, attempts - 1)
            time.sleep(min(0.1 * attempt, 2.0))
    raise AssertionError("unreachable")


def committed_batch(table: DeltaTable, app_id: str) -> int:
    """Highest batch id committed by ``app_id`` (``-1`` if none)."""
    version = table.transaction_version(app_id)
    return -1 if version is None else int(version)


def batch_commit_properties(app_id: str, batch_id: int, operation: str) -> CommitProperties:
    """delta-rs commit properties for micro-batch ``batch_id`` of ``app_id``.

    Carries the transaction action ``txn(app_id, batch_id)`` that makes the
    commit idempotent, and ``lake.*`` commit info naming the operation.
    """
    return CommitProperties(
        app_transactions=[Transaction(app_id, batch_id, int(time.time() * 1000))],
        custom_metadata={"lake.operation": operation, "lake.appId": app_id, "lake.batchId": str(batch_id)},
    )


def commit_files(store: Store, name: str, actions: list[AddAction], *, app_id: str, batch_id: int) -> bool:
    """Commit ``actions`` (files already written under the table) for one micro-batch.

    Returns False, committing nothing, if ``app_id`` already committed
    ``batch_id`` or later; True after committing one Delta version. An empty
    ``actions`` list still commits, so the batch id is recorded. A commit
    lost to a concurrent writer is retried (:func:`retry_on_conflict`).
    """

    def commit() -> bool:
        table = ensure_table(store, name)
        if committed_batch(table, app_id) >= batch_id:
            return False
        schema, partition_by = table_layout(store, name)
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema,
            partition_by=partition_by,
            commit_properties=batch_commit_properties(app_id, batch_id, "STREAMING UPDATE"),
        )
        return True

    return retry_on_conflict(commit, f"{name} batch {batch_id}")


def offset_app_id(consumer: str, topic: str, partition: int) -> str:
    """The ``txn`` appId under which a table records ``consumer``'s position in one log partition."""
    return f"{consumer}/{topic}/{partition}"


def committed_offsets(table: DeltaTable, consumer: str, topic: str, partitions) -> dict[int, int | None]:
    """Per log partition, the next offset ``table`` holds for ``consumer`` (``None``: nothing recorded yet)."""
    return {p: table.transaction_version(offset_app_id(consumer, topic, p)) for p in partitions}


def offset_transactions(consumer: str, topic: str, ends: dict[int, int]) -> list[Transaction]:
    """``txn`` actions recording that a table now holds ``consumer``'s records up to ``ends`` (next offsets)."""
    now = int(time.time() * 1000)
    return [Transaction(offset_app_id(consumer, topic, p), end, now) for p, end in sorted(ends.items())]


def remove_action(data_file: DataFile, data_change: bool = True) -> RemoveAction:
    """The Delta ``remove`` action for an active :class:`~metrics_lake.core.tables.snapshots.DataFile`.

    ``data_change=False``: the file's rows stay in the table, rewritten (compaction, clustering).
    """
    return RemoveAction(
        path=data_file.relative,
        data_change=data_change,
        deletion_timestamp=int(time.time() * 1000),
        size=data_file.size,
        partition_values=dict(data_file.partition_values),
    )


def commit_changes(
    table: DeltaTable,
    name: str,
    adds: list[WrittenFile],
    removes: list[RemoveAction],
    *,
    transactions: list[Transaction],
    operation: str,
    data_change: bool = True,
) -> None:
    """Commit ``adds`` and ``removes`` with ``transactions`` as one Delta version on ``table``'s snapshot.

    ``data_change=False`` marks the adds as a rewrite of rows the removes held (compaction, clustering).

    Committing on the snapshot the caller planned from is what makes
    delta-rs detect a concurrent writer (module docstring); it raises
    ``CommitFailedError`` then and nothing is committed, so the caller
    re-plans on a fresh snapshot.
    """
    spec = table_spec(name)
    table.create_write_transaction(
        [f.add_action(data_change) for f in adds] + removes,
        mode="append",
        schema=spec.schema,
        partition_by=list(spec.partition_by),
        commit_properties=CommitProperties(
            app_transactions=transactions, custom_metadata={"lake.operation": operation}
        ),
    )
