"""Rebuild one UTC day of a table from another on Spark: the batch layer's shared two-stage pattern.

The batch jobs (recompute, rollups, stored queries) work a day at a time on
tables partitioned by ``event_date``:

1. :func:`states_from_files`: one Spark task per ~128 MiB of the source
   day's files (and at least one per core, equal in size) reads them with
   pyarrow and turns them into *partial* window states
   (:data:`metrics_lake.core.windows.WINDOW_STATE`), in Arrow;
2. :func:`finalize_on_executors`: Spark shuffles the states by ``(metric,
   server)``, so each series' partials meet in one task, which merges them
   (:func:`~metrics_lake.core.windows.merge_states`), finalizes the rows and
   writes them as the target table's data files (invisible until committed),
   returning the files and per-metric totals;
3. :func:`replace_day` commits the files as one Delta version that removes
   the day's old files, so readers see the old day or the new day, never a
   mix (Delta commits are atomic; PROTOCOL.md "Atomic commits").

Only states cross the shuffle (one row per window and task, not one per
event), and the merge is exact whatever split Spark chose (see
:mod:`metrics_lake.core.windows`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict

import pyarrow as pa

from metrics_lake.core.config import load_settings
from metrics_lake.core.snapshots import read_data_files
from metrics_lake.core.storage import Store, open_store
from metrics_lake.core.tables import WrittenFile, ensure_table, maintenance_lease, retry_on_conflict, write_data_files
from metrics_lake.core.windows import WINDOW_STATE, merge_states
from metrics_lake.schemas import TABLES, spark_schema
from metrics_lake.spark.readers.delta_reader import group_files, table_files

__all__ = ["finalize_on_executors", "read_days", "replace_day", "rows_written", "states_from_files"]

_RESULT = "files string, totals string"


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


def states_from_files(
    spark,
    root: str,
    table: str,
    days: Iterable[dt.date],
    columns: list[str],
    to_states: Callable[[pa.Table], pa.Table],
    dictionary: tuple[str, ...] = (),
):
    """DataFrame of partial window states: ``to_states`` applied to each task's share of ``table``'s days.

    ``columns`` are the source columns ``to_states`` needs (only those are
    read); the string columns in ``dictionary`` reach it dictionary-encoded
    (:func:`~metrics_lake.core.snapshots.read_data_file`), which the window
    code groups without hashing strings. Runs one task per ~128 MiB of
    files, at least one per core (:func:`group_files`); an empty day gives
    an empty DataFrame.
    """
    files = table_files(root, table, None, ("event_date", tuple(sorted(d.isoformat() for d in days))))
    groups = group_files(files, min_groups=spark.sparkContext.defaultParallelism)
    schema = TABLES[table].schema

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        store = open_store(load_settings(root=root))
        for batch in batches:
            for index in batch.column("id").to_pylist():
                states = to_states(read_data_files(store, list(groups[index].files), schema, columns, dictionary))
                yield from states.to_batches(max_chunksize=65_536)

    count = max(len(groups), 1)
    return spark.range(0, len(groups), 1, numPartitions=count).mapInArrow(task, spark_schema(WINDOW_STATE))


def finalize_on_executors(
    states, root: str, table: str, finalize: Callable[[pa.Table], pa.Table], partitions: int
) -> tuple[list[WrittenFile], dict[str, tuple[int, float]]]:
    """Merge ``states`` per series on executors, ``finalize`` them into ``table``'s rows and write its files.

    Returns the files written (not committed) and, per metric, the total
    count and sum of the rows written (for reconciliation). ``partitions``
    is the number of shuffle partitions (tasks) for the merge.
    """

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [pa.Table.from_batches([batch]) for batch in batches]
        merged = merge_states(pa.concat_tables(parts)) if parts else WINDOW_STATE.empty_table()
        rows = finalize(merged)
        written = write_data_files(open_store(load_settings(root=root)), table, rows) if rows.num_rows else []
        totals: dict[str, list] = {}
        if rows.num_rows and "count" in rows.column_names:
            grouped = rows.group_by("metric").aggregate([("count", "sum"), ("sum", "sum")])
            totals = {g["metric"]: [g["count_sum"], g["sum_sum"]] for g in grouped.to_pylist()}
        yield pa.RecordBatch.from_pylist(
            [{"files": json.dumps([asdict(f) for f in written]), "totals": json.dumps(totals)}]
        )

    rows = states.repartition(partitions, "metric", "server").mapInArrow(task, _RESULT).toArrow().to_pylist()
    files = [WrittenFile(**f) for row in rows for f in json.loads(row["files"])]
    totals: dict[str, tuple[int, float]] = {}
    for row in rows:
        for metric, (count, total) in json.loads(row["totals"]).items():
            before = totals.get(metric, (0, 0.0))
            totals[metric] = (before[0] + count, before[1] + total)
    return files, totals


def replace_day(store: Store, table: str, day: dt.date, files: list[WrittenFile], operation: str) -> None:
    """Replace ``table``'s ``event_date = day`` partition by ``files`` in one Delta commit.

    ``operation`` is recorded as ``lake.operation`` in the commit info, so
    ``DESCRIBE HISTORY``-style readers can tell recomputes from streaming
    writes. Holds the table's maintenance lease, so a compaction never
    rewrites the day meanwhile
    (:func:`~metrics_lake.core.tables.maintenance_lease`); a commit lost to
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
