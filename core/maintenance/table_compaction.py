"""Delta table compaction: bin-pack small files, optionally Z-order, then write a checkpoint.

Micro-batches leave many small files per day (one or more per batch and
table). For each partition with two or more files, delta-rs ``OPTIMIZE``
(``DeltaTable.optimize.compact``) rewrites the small files into files of
about ``target_bytes``; with ``z_order`` it instead rewrites the partition
sorted along a Z-order curve of those columns (``optimize.z_order``), so
filters on metric/server skip more files. Both commit with
``dataChange=false``: rows and versions of the data do not change, and time
travel to earlier versions still works until VACUUM.

One Delta commit per partition keeps each commit small and lets the stream
keep writing: if the stream commits to the same partition meanwhile and the
two conflict, delta-rs raises ``CommitFailedError`` for the loser, which
changed nothing and is retried on the new snapshot
(:func:`metrics_lake.core.tables.commits.retry_on_conflict`; the stream's own merges and appends
retry the same way), so nothing is lost or duplicated. delta-rs 1.6 does not
raise it when both commits remove the same file, though (see
:func:`metrics_lake.core.leases.maintenance_lease`): both rewrites' files
would stay active, the window rows twice, one of them stale. So compaction
always leaves alone the days the speed layer may still rewrite
(:func:`metrics_lake.core.speed.progress.rewritable_from`); bronze and
quarantine, which the speed layer only appends to, are compacted whole.
Finally a checkpoint (``create_checkpoint``) lets readers load the snapshot
from one Parquet file instead of replaying every JSON commit.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable

from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.speed.progress import rewritable_from
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import retry_on_conflict
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import TABLES

log = logging.getLogger(__name__)

DEFAULT_TARGET_BYTES = 128 * 1024 * 1024
#: Columns Z-ordered when asked for and present in the table.
Z_ORDER_COLUMNS = ("metric", "server")


@dataclass(frozen=True)
class TableCompaction:
    """One table's compaction: active files and bytes before/after, partitions rewritten, version, seconds."""

    table: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    partitions_rewritten: int
    version: int
    seconds: float

    @property
    def avg_bytes_before(self) -> float:
        """Average active file size before, in bytes."""
        return self.bytes_before / self.files_before if self.files_before else 0.0

    @property
    def avg_bytes_after(self) -> float:
        """Average active file size after, in bytes."""
        return self.bytes_after / self.files_after if self.files_after else 0.0


def file_counts(table: DeltaTable) -> dict[tuple, tuple[int, int]]:
    """Partition values (tuple of (column, value)) -> (active files, bytes) of ``table``'s snapshot."""
    actions = pa.table(table.get_add_actions(flatten=True))
    columns = [c for c in actions.column_names if c.startswith("partition.")]
    if actions.num_rows == 0:
        return {}
    if not columns:
        return {(): (actions.num_rows, pc.sum(actions.column("size_bytes")).as_py())}
    grouped = actions.group_by(columns).aggregate([("size_bytes", "count"), ("size_bytes", "sum")])
    return {
        tuple((c.removeprefix("partition."), _text(row[c])) for c in columns): (
            row["size_bytes_count"],
            row["size_bytes_sum"],
        )
        for row in grouped.to_pylist()
    }


def _text(value) -> str | None:
    return None if value is None else value.isoformat() if hasattr(value, "isoformat") else str(value)


def compact_table(
    store: Store,
    name: str,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    z_order: bool = False,
    progress: Callable[[str], None] | None = None,
    skip_from: dt.date | None = None,
) -> TableCompaction:
    """Compact table ``name`` partition by partition, then checkpoint it (module docstring).

    Holds the table's maintenance lease throughout
    (:func:`~metrics_lake.core.leases.maintenance_lease`). Day partitions
    the speed layer may still rewrite are always left alone
    (:func:`~metrics_lake.core.speed.progress.rewritable_from`, read under the
    lease: the open day only ever moves later); ``skip_from`` leaves alone
    the days from that one on as well, for another writer that may still
    rewrite them. ``progress`` gets a line per
    partition rewritten. Raises ``deltalake.exceptions.TableNotFoundError``
    if the table does not exist, ``CommitFailedError`` if a partition keeps
    conflicting after every retry.
    """
    started = time.monotonic()
    with maintenance_lease(store, name) as renew:
        open_from = rewritable_from(store, name)
        if open_from is not None:
            skip_from = open_from if skip_from is None else min(skip_from, open_from)
        return _compact(store, name, target_bytes, z_order, progress, skip_from, renew, started)


def _compact(store, name, target_bytes, z_order, progress, skip_from, renew, started) -> TableCompaction:
    table = open_table(store, name)
    before = file_counts(table)
    z_columns = [c for c in Z_ORDER_COLUMNS if c in table.schema().to_arrow().names] if z_order else []
    day_column = TABLES[name].day_column if name in TABLES else None
    rewritten = 0
    for key, (files, size) in sorted(before.items(), key=lambda item: str(item[0])):
        if files < 2 and not (z_columns and files == 1 and size > 0):
            continue
        day = dict(key).get(day_column)
        if skip_from is not None and day is not None and dt.date.fromisoformat(day) >= skip_from:
            continue
        renew()
        filters = [(column, "=", value) for column, value in key] or None

        def optimize(filters=filters) -> dict:
            fresh = open_table(store, name)
            commit = CommitProperties(custom_metadata={"lake.operation": "COMPACTION"})
            if z_columns:
                return fresh.optimize.z_order(
                    z_columns, partition_filters=filters, target_size=target_bytes, commit_properties=commit
                )
            return fresh.optimize.compact(partition_filters=filters, target_size=target_bytes, commit_properties=commit)

        metrics = retry_on_conflict(optimize, f"{name} compaction of {dict(key) or 'the table'}")
        if metrics.get("numFilesAdded", 0) or metrics.get("numFilesRemoved", 0):
            rewritten += 1
            if progress is not None:
                progress(
                    f"{name} {dict(key)}: {metrics['numFilesRemoved']} files -> {metrics['numFilesAdded']}"
                    + (f" (Z-order {', '.join(z_columns)})" if z_columns else "")
                )
    table = open_table(store, name)
    table.create_checkpoint()
    after = file_counts(table)
    return TableCompaction(
        name,
        sum(f for f, _ in before.values()),
        sum(f for f, _ in after.values()),
        sum(b for _, b in before.values()),
        sum(b for _, b in after.values()),
        rewritten,
        table.version(),
        time.monotonic() - started,
    )
