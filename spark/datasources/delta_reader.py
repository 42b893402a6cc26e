"""Spark batch reader over a Delta snapshot (format ``lakedelta``).

The driver asks delta-rs for the snapshot's active files (optionally at an
older ``version``: time travel); executors read those Parquet files with
pyarrow (``pyarrow.fs``: the local file system or S3) and add the partition columns from the ``add`` actions' partition
values (Delta convention: partition columns are not stored in data files).

Options: ``root`` (lake root), ``table`` (a name in
:data:`metrics_lake.lake_schemas.tables.TABLES`), ``version`` (optional int),
``partitionFilter`` (optional ``column=value[,value...]``: read only the
files of those partitions, e.g. ``event_date=2026-11-20,2026-11-21``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import open_table, table_layout
from metrics_lake.core.tables.snapshots import DataFile, read_data_file, snapshot_files
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.types import spark_schema

FILES_PER_TASK_BYTES = 128 * 1024 * 1024


@dataclass(frozen=True)
class FileGroup(InputPartition):
    """The files one Spark task reads."""

    files: tuple[DataFile, ...]


def table_files(
    root: str, table: str, version: int | None = None, partition: tuple[str, str | tuple[str, ...]] | None = None
) -> list[DataFile]:
    """Active files of lake table ``table`` under ``root`` at ``version`` (latest if None), of ``partition`` if given.

    See :func:`metrics_lake.core.tables.snapshots.snapshot_files`.
    """
    store = open_store(load_settings(root=root))
    return snapshot_files(store, table, open_table(store, table, version), partition)


def group_files(
    files: list[DataFile], target_bytes: int = FILES_PER_TASK_BYTES, min_groups: int = 1
) -> list[FileGroup]:
    """Pack files, in file order, into about equal tasks: about ``target_bytes`` each at most, ``min_groups`` at least.

    ``min_groups`` is the cores the job may use (Spark's default
    parallelism): a day of 185 MB on two cores is two tasks of ~92 MB, not
    one of 128 MB and a straggler of 57 MB. Files are never split, so a
    large file makes its task larger, and there are never more groups than
    files.
    """
    if not files:
        return []
    total = sum(f.size for f in files)
    count = min(len(files), max(-(-total // target_bytes), min_groups))
    groups: list[list[DataFile]] = [[] for _ in range(count)]
    done = 0
    for data_file in files:  # each file goes to the group its byte midpoint falls in
        groups[min(int((done + data_file.size / 2) * count // max(total, 1)), count - 1)].append(data_file)
        done += data_file.size
    return [FileGroup(tuple(group)) for group in groups if group]


class DeltaSnapshotReader(DataSourceReader):
    """Reads the active files of one Delta snapshot."""

    def __init__(self, options, schema: pa.Schema) -> None:
        self.root = options["root"]
        self.table = options["table"]
        self.version = int(options["version"]) if options.get("version") not in (None, "") else None
        self.partition = None
        if options.get("partitionFilter"):
            column, sep, values = options["partitionFilter"].partition("=")
            if not sep or not column:
                raise InputError(f"partitionFilter {options['partitionFilter']!r}: expected column=value[,value...]")
            self.partition = (column, tuple(values.split(",")))
        self.arrow_schema = schema

    def partitions(self) -> list[FileGroup]:
        """One task per ~128 MiB of files (one empty task for an empty snapshot).

        Spark replaces an empty partition list with a bare ``InputPartition``,
        so an empty snapshot is made an explicit task with no files.
        """
        return group_files(table_files(self.root, self.table, self.version, self.partition)) or [FileGroup(())]

    def read(self, partition: FileGroup) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the task's files (runs on executors)."""
        filesystem, _ = open_store(load_settings(root=self.root)).arrow_fs()
        for data_file in partition.files:
            yield from read_data_file(data_file, self.arrow_schema, filesystem).to_batches(max_chunksize=65_536)


class DeltaSnapshotDataSource(DataSource):
    """``spark.read.format("lakedelta").option("table", ...)``: a lake table as a DataFrame."""

    @classmethod
    def name(cls) -> str:
        """Format name: ``lakedelta``."""
        return "lakedelta"

    def _arrow_schema(self) -> pa.Schema:
        for required in ("root", "table"):
            if required not in self.options:
                raise InputError(f"lakedelta reader needs option {required!r}")
        return table_layout(open_store(load_settings(root=self.options["root"])), self.options["table"])[0]

    def schema(self):
        """The table's schema (declared in :data:`metrics_lake.lake_schemas.tables.TABLES`, else its Delta schema) for Spark."""
        return spark_schema(self._arrow_schema())

    def reader(self, schema) -> DeltaSnapshotReader:
        """A reader of the snapshot named by the options."""
        return DeltaSnapshotReader(self.options, self._arrow_schema())
