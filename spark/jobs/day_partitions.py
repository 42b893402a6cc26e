"""Read and atomically replace one day of a lake table from Spark.

The batch jobs (recompute, rollups, stored queries) all work a UTC day at a
time on tables partitioned by ``event_date``:

- :func:`read_days` reads only those days' files (``lakedelta`` with
  ``partitionFilter``);
- :func:`write_on_executors` has the executors write a DataFrame as the
  table's Parquet data files (invisible until committed) and returns them;
- :func:`replace_day` commits them as one Delta version that removes the
  day's old files, so readers see the old day or the new day, never a mix
  (Delta commits are atomic; PROTOCOL.md "Atomic commits").
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict

import pyarrow as pa

from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import Store, open_store
from metrics_lake.core.tables import WrittenFile, ensure_table, retry_on_conflict, write_data_files
from metrics_lake.schemas import TABLES

_FILE_ROWS = pa.schema([("file", pa.string())])


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


def write_on_executors(frame, root: str, table: str) -> list[WrittenFile]:
    """Write ``frame`` (``table``'s columns) as data files of ``table`` from the executors; returns the files.

    Nothing is visible until the files are committed (:func:`replace_day`);
    a failed job leaves only uncommitted files, which VACUUM removes.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        written = []
        if batches:
            written = write_data_files(open_store(load_settings(root=root)), table, pa.Table.from_batches(batches))
        yield pa.RecordBatch.from_pylist([{"file": json.dumps(asdict(f))} for f in written], schema=_FILE_ROWS)

    return [WrittenFile(**json.loads(row.file)) for row in frame.mapInArrow(write, "file string").collect()]


def replace_day(store: Store, table: str, day: dt.date, files: list[WrittenFile], operation: str) -> None:
    """Replace ``table``'s ``event_date = day`` partition by ``files`` in one Delta commit.

    ``operation`` is recorded as ``lake.operation`` in the commit info, so
    ``DESCRIBE HISTORY``-style readers can tell recomputes from streaming
    writes. A commit lost to a concurrent writer (compaction) is retried.
    """
    from deltalake import CommitProperties

    spec = TABLES[table]
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
