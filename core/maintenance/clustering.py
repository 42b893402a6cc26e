"""Clustering: rewrite a table's files sorted by (metric, server, time), so that a query on a series reads little.

The speed layer writes files in log order: every file of a day holds every
metric and server, and min/max statistics skip nothing. Clustering sorts a
partition's not-yet-clustered files by :data:`CLUSTER_COLUMNS` and writes
them as files of at most ``rows_per_file`` rows, with Parquet row groups of
``row_group_rows``: each file (and each row group) then covers a narrow
range of metric and server, so the readers' file skipping and row-group
skipping (:mod:`metrics_lake.core.tables.pruning`) read about one file per
clustering run for a series, about one in ten for a metric of ten. This is
Delta-Spark's ``OPTIMIZE ... ZORDER BY`` idea with a linear sort, which
suits the lake's queries (they name a metric, often a server) better than a
Z-curve, which spreads one metric's rows over most files.

Clustered files are named ``part-clustered-*`` and are not rewritten again:
each run sorts only the files written since the last one (incremental, as
Delta's liquid clustering), at most ``max_rows_in_memory`` rows at a time.
The commit removes exactly the files read and adds their rows sorted, with
``dataChange=false``, under the table's maintenance lease
(:func:`~metrics_lake.core.leases.maintenance_lease`), and leaves alone the
days the speed layer may still rewrite
(:func:`~metrics_lake.core.speed.progress.rewritable_from`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.speed.progress import rewritable_from
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, remove_action, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table, table_layout
from metrics_lake.core.tables.snapshots import DataFile, read_data_files, snapshot_files
from metrics_lake.lake_schemas.tables import TABLES

__all__ = ["CLUSTER_COLUMNS", "CLUSTERED_PREFIX", "TableClustering", "cluster_table"]

#: Sort keys, the first of each group a table has: metric and server, then its time column.
CLUSTER_COLUMNS = (("metric",), ("server",), ("ts", "window_start", "hour_start", "day_start"))
CLUSTERED_PREFIX = "part-clustered-"
DEFAULT_ROWS_PER_FILE = 1 << 20
DEFAULT_ROW_GROUP_ROWS = 1 << 16
DEFAULT_MAX_ROWS_IN_MEMORY = 8 << 20


@dataclass(frozen=True)
class TableClustering:
    """One table's clustering: files read and written, rows rewritten, partitions committed, version, seconds."""

    table: str
    files_read: int
    files_written: int
    rows: int
    partitions: int
    version: int
    seconds: float


def sort_keys(schema: pa.Schema) -> list[str]:
    """The columns of :data:`CLUSTER_COLUMNS` a table of ``schema`` has, in sort order (empty: not clusterable)."""
    keys = []
    for choices in CLUSTER_COLUMNS:
        keys += [c for c in choices if c in schema.names][:1]
    return keys if "metric" in keys else []


def _is_clustered(data_file: DataFile) -> bool:
    return data_file.relative.rsplit("/", 1)[-1].startswith(CLUSTERED_PREFIX)


def _batches(files: list[DataFile], max_rows: int) -> list[list[DataFile]]:
    """Consecutive runs of ``files`` of at most ``max_rows`` rows each (a file without a row count counts as 1)."""
    runs: list[list[DataFile]] = []
    rows = 0
    for data_file in files:
        count = data_file.records or 1
        if not runs or rows + count > max_rows:
            runs.append([])
            rows = 0
        runs[-1].append(data_file)
        rows += count
    return runs


def cluster_table(
    store: Store,
    name: str,
    *,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    max_rows_in_memory: int = DEFAULT_MAX_ROWS_IN_MEMORY,
    progress: Callable[[str], None] | None = None,
) -> TableClustering:
    """Cluster the unclustered files of table ``name``, partition by partition (module docstring).

    Returns what was rewritten (nothing for a table without a ``metric``
    column). Raises ``deltalake.exceptions.TableNotFoundError`` if the table
    does not exist, :class:`~metrics_lake.lake_schemas.errors.LeaseHeldError`
    if another maintenance job keeps its lease, ``CommitFailedError`` if a
    commit keeps conflicting after every retry.
    """
    started = time.monotonic()
    schema, partition_by = table_layout(store, name)
    keys = sort_keys(schema)
    files_read = files_written = rows = partitions = 0
    with maintenance_lease(store, name) as renew:
        skip_from = rewritable_from(store, name)
        day_column = TABLES[name].day_column if name in TABLES else None
        table = open_table(store, name)
        pending: dict[tuple, list[DataFile]] = {}
        for data_file in snapshot_files(store, name, table) if keys else []:
            if not _is_clustered(data_file):
                pending.setdefault(data_file.partition_values, []).append(data_file)
        for values, files in sorted(pending.items(), key=lambda item: str(item[0])):
            day = dict(values).get(day_column)
            if skip_from is not None and day is not None and day >= skip_from.isoformat():
                continue
            for run in _batches(files, max_rows_in_memory):
                renew()
                data = read_data_files(store, run, schema)
                data = data.take(pc.sort_indices(data, [(k, "ascending") for k in keys]))
                written = []
                for start in range(0, data.num_rows, rows_per_file):
                    written += write_data_files(
                        store,
                        name,
                        data.slice(start, rows_per_file),
                        prefix=CLUSTERED_PREFIX,
                        row_group_rows=row_group_rows,
                    )

                def commit(run=run, written=written) -> None:
                    commit_changes(
                        open_table(store, name),
                        name,
                        written,
                        [remove_action(f, data_change=False) for f in run],
                        transactions=[],
                        operation="CLUSTER",
                        data_change=False,
                    )

                retry_on_conflict(commit, f"{name} clustering of {dict(values) or 'the table'}")
                files_read += len(run)
                files_written += len(written)
                rows += data.num_rows
                partitions += 1
                if progress is not None:
                    progress(f"{name} {dict(values)}: {len(run)} files -> {len(written)} sorted by {', '.join(keys)}")
        version = open_table(store, name).version()
    return TableClustering(name, files_read, files_written, rows, partitions, version, time.monotonic() - started)
