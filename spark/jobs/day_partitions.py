"""Rebuild one UTC day of a table from another on Spark: the batch layer's shared two-stage pattern.

The batch jobs (recompute, rollups, stored queries) work a day at a time on
tables partitioned by ``event_date``:

1. :func:`compute_day_files`, map stage: one Spark task per ~128 MiB of
   the source day's files (and at least one per core, equal in size) reads
   them with pyarrow and turns them into *partial* window states
   (:data:`metrics_lake.core.kernels.windows.WINDOW_STATE`), in Arrow;
2. :func:`compute_day_files`, reduce stage: Spark shuffles the states by
   ``(metric, server)``, so each series' partials meet in one task, which
   merges them (:func:`~metrics_lake.core.kernels.windows.merge_states`), finalizes
   the rows and writes them as the target table's data files (invisible
   until committed), returning the files and per-metric totals;
3. :func:`replace_day` commits the files as one Delta version that removes
   the day's old files, so readers see the old day or the new day, never a
   mix (Delta commits are atomic; PROTOCOL.md "Atomic commits").

Only states cross the shuffle (one row per window and task, not one per
event), and the merge is exact whatever split Spark chose (see
:mod:`metrics_lake.core.kernels.windows`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from metrics_lake.core.config import load_settings
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states, series_shards
from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.log.producer import group_by_partition
from metrics_lake.core.storage import Store, open_store
from metrics_lake.core.tables.commits import retry_on_conflict
from metrics_lake.core.tables.data_files import WrittenFile, write_data_files
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.core.tables.snapshots import read_data_files
from metrics_lake.lake_schemas.tables import TABLES
from metrics_lake.spark.datasources.delta_reader import group_files, table_files

__all__ = ["compute_day_files", "read_days", "replace_day", "rows_written"]


def read_days(spark, root: str, table: str, days: Iterable[dt.date]):
    """DataFrame of ``table``'s rows with ``event_date`` in ``days`` (only those partitions' files are listed)."""
    values = ",".join(sorted(day.isoformat() for day in days))
    return (
        spark.read.format("lakedelta")
        .option("root", root)
        .option("table", table)
        .option("partitionFilter", f"event_date={values}")
        .load()
    )


def compute_day_files(
    spark,
    root: str,
    source: str,
    days: Iterable[dt.date],
    columns: list[str],
    to_states: Callable[[pa.Table], pa.Table],
    target: str,
    finalize: Callable[[pa.Table], pa.Table],
    partitions: int,
    dictionary: tuple[str, ...] = (),
) -> tuple[list[WrittenFile], dict[str, tuple[int, float]]]:
    """Compute ``target``'s rows from ``source``'s ``days`` on Spark and write them as ``target``'s data files.

    Map stage: one task per ~128 MiB of ``source``'s files, at least one
    per core (:func:`group_files`), reads ``columns`` of its files with
    pyarrow (the string columns in ``dictionary`` dictionary-encoded, which
    the window code groups without hashing strings) and applies
    ``to_states``, which returns :data:`~metrics_lake.core.kernels.windows.WINDOW_STATE`
    rows. Spark shuffles the states by ``(metric, server)`` into
    ``partitions`` reduce tasks, each of which merges its series' states
    (:func:`~metrics_lake.core.kernels.windows.merge_states`), applies ``finalize``
    (states -> ``target``'s rows) and writes the rows as ``target``'s data
    files, invisible until committed (:func:`replace_day`).

    The stages are RDD stages whose records are Arrow IPC streams: states
    cross the shuffle as opaque bytes, where a DataFrame (``mapInArrow``)
    would convert them into the JVM's rows and back, and the job needs no
    SQL planning. Measured on a 13.8 M-event day, 2 cores, alternating
    runs: 1.9-2.0 s instead of 2.5-3.0 s in a warm session, 4.5-4.6 s
    instead of 5.4-5.6 s in a fresh one. Returns the files written and,
    per metric, the total count and sum of the rows written (for
    reconciliation); an empty day writes no files.
    """
    files = table_files(root, source, None, ("event_date", tuple(sorted(d.isoformat() for d in days))))
    groups = group_files(files, min_groups=spark.sparkContext.defaultParallelism)
    schema = TABLES[source].schema

    def map_task(index: int) -> Iterator[tuple[int, bytes]]:
        store = open_store(load_settings(root=root))
        states = to_states(read_data_files(store, groups[index], schema, columns, dictionary))
        for partition, part in group_by_partition(
            states, series_shards(states.column("metric"), states.column("server"), partitions)
        ).items():
            yield partition, _to_ipc(part)

    def reduce_task(records: Iterator[tuple[int, bytes]]) -> Iterator[tuple[list[WrittenFile], dict]]:
        parts = [pa.ipc.open_stream(payload).read_all() for _, payload in records]
        merged = merge_states(pa.concat_tables(parts)) if parts else WINDOW_STATE.empty_table()
        rows = finalize(merged)
        written = write_data_files(open_store(load_settings(root=root)), target, rows) if rows.num_rows else []
        totals: dict[str, tuple[int, float]] = {}
        if rows.num_rows and "count" in rows.column_names:
            grouped = rows.group_by("metric").aggregate([("count", "sum"), ("sum", "sum")])
            totals = {g["metric"]: (g["count_sum"], g["sum_sum"]) for g in grouped.to_pylist()}
        yield written, totals  # pickled back to the driver

    results = (
        spark.sparkContext.parallelize(range(len(groups)), max(len(groups), 1))
        .flatMap(map_task)
        .partitionBy(partitions, _identity)
        .mapPartitions(reduce_task)
        .collect()
    )
    written = [f for files, _ in results for f in files]
    totals: dict[str, tuple[int, float]] = {}
    for _, task_totals in results:
        for metric, (count, total) in task_totals.items():
            before = totals.get(metric, (0, 0.0))
            totals[metric] = (before[0] + count, before[1] + total)
    return written, totals


def _identity(partition: int) -> int:
    return partition


def _to_ipc(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream (uncompressed: Spark compresses shuffle files itself)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def replace_day(store: Store, table: str, day: dt.date, files: list[WrittenFile], operation: str) -> None:
    """Replace ``table``'s ``event_date = day`` partition by ``files`` in one Delta commit.

    ``operation`` is recorded as ``lake.operation`` in the commit info, so
    ``DESCRIBE HISTORY``-style readers can tell recomputes from streaming
    writes. Holds the table's maintenance lease, so a compaction never
    rewrites the day meanwhile
    (:func:`~metrics_lake.core.leases.maintenance_lease`); a commit lost to
    another concurrent writer (the speed layer) is re-planned and retried.
    """
    from deltalake import CommitProperties

    spec = TABLES[table]
    with maintenance_lease(store, table):  # never interleaved with a compaction of the same table
        retry_on_conflict(
            lambda: ensure_table(store, table).create_write_transaction(
                [f.add_action() for f in files],
                mode="overwrite",
                schema=spec.schema,
                partition_by=list(spec.partition_by),
                partition_filters=[(spec.day_column, "=", day.isoformat())],
                commit_properties=CommitProperties(custom_metadata={"lake.operation": operation, "lake.day": str(day)}),
            ),
            f"{table} {operation.lower()} of {day}",
        )


def rows_written(files: list[WrittenFile]) -> int:
    """Rows in ``files``, from their Delta statistics."""
    return sum(json.loads(f.stats)["numRecords"] for f in files)
