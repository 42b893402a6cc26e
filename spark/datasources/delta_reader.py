"""Spark batch reader over a Delta snapshot (format ``lakedelta``, and ``lake_<table>`` per table).

The driver asks delta-rs for the snapshot's active files (optionally at an
older ``version`` or ``timestamp``: time travel); executors read those
Parquet files with pyarrow (``pyarrow.fs``: the local file system or S3)
and add the partition columns from the ``add`` actions' partition values
(Delta convention: partition columns are not stored in data files).

Filters Spark pushes (``pushFilters``, Spark >= 4.1, with
``spark.sql.python.filterPushdown.enabled``) prune partitions, skip files
by their Delta statistics and filter rows inside the reader
(:mod:`metrics_lake.core.tables.pruning`); those it cannot apply exactly are
returned to Spark, which evaluates them after the scan.

Options: ``root`` (lake root), ``table`` (a name in
:data:`metrics_lake.lake_schemas.tables.TABLES`), ``version`` (optional
int) or ``timestamp`` (optional ISO time, UTC), ``partitionFilter``
(optional ``column=value[,value...]``: read only the files of those
partitions, e.g. ``event_date=2026-11-20,2026-11-21``). With the
environment variable ``LAKE_SCAN_REPORT=1`` each scan prints one line on
stderr: files read of files in the snapshot, and the filters it applied.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)

from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import table_layout
from metrics_lake.core.tables.pruning import Predicate, row_filter, supported
from metrics_lake.core.tables.snapshots import DataFile, read_data_file, snapshot_files
from metrics_lake.core.tables.time_travel import check_files_present, open_as_of
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.types import spark_schema

FILES_PER_TASK_BYTES = 128 * 1024 * 1024
#: Tasks a scan is split into at least, files and row groups allowing: the cores of this machine, where a
#: local session runs its tasks (a cluster's executors have more; a scan of more files uses them all).
MIN_TASKS = os.cpu_count() or 2
#: Environment variable that makes every scan print its files read / files in snapshot on stderr.
SCAN_REPORT_ENV = "LAKE_SCAN_REPORT"
#: Spark filter classes and the predicate operator each becomes.
_OPERATORS = {
    EqualTo: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
    In: "in",
    IsNull: "is_null",
    IsNotNull: "is_not_null",
}


@dataclass(frozen=True)
class FileGroup(InputPartition):
    """The files one Spark task reads, and the predicates its rows must satisfy."""

    files: tuple[DataFile, ...]
    predicates: tuple[Predicate, ...] = ()
    #: (i, n): read only the i-th of n shares of each file's row groups (a few large files on many cores).
    part: tuple[int, int] = (0, 1)


def table_files(
    root: str, table: str, version: int | None = None, partition: tuple[str, str | tuple[str, ...]] | None = None
) -> list[DataFile]:
    """Active files of lake table ``table`` under ``root`` at ``version`` (latest if None), of ``partition`` if given.

    See :func:`metrics_lake.core.tables.snapshots.snapshot_files`.
    """
    store = open_store(load_settings(root=root))
    return snapshot_files(store, table, open_as_of(store, table, version), partition)


def group_files(
    files: list[DataFile], target_bytes: int = FILES_PER_TASK_BYTES, min_groups: int = 1
) -> list[list[DataFile]]:
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
    return [group for group in groups if group]


def report_scan(
    table: str, version: int, files: list[DataFile], kept: list[DataFile], predicates: list[Predicate]
) -> None:
    """Print the ``LAKE_SCAN_REPORT`` line on stderr: files read of ``files`` in snapshot ``version``, and ``predicates``."""
    applied = " AND ".join(str(p) for p in predicates) or "none"
    print(
        f"scan {table} v{version}: {len(kept):,} of {len(files):,} files "
        f"({sum(f.size for f in kept) / 2**20:,.1f} of {sum(f.size for f in files) / 2**20:,.1f} MiB); "
        f"filters applied in the reader: {applied}",
        file=sys.stderr,
        flush=True,
    )


def as_predicate(spark_filter: Filter, schema: pa.Schema) -> Predicate | None:
    """A pushed Spark filter as a :class:`~metrics_lake.core.tables.pruning.Predicate`, or None if it cannot be
    applied exactly (a nested column, an operator or type the pruning does not support)."""
    op = _OPERATORS.get(type(spark_filter))
    if op is None or len(spark_filter.attribute) != 1:
        return None
    value = getattr(spark_filter, "value", None)
    if op == "in":
        value = tuple(value)
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return None  # TIMESTAMP_NTZ: no time zone to compare with the lake's UTC timestamps
    predicate = Predicate(spark_filter.attribute[0], op, value)
    return predicate if supported(schema, predicate) else None


class DeltaSnapshotReader(DataSourceReader):
    """Reads the active files of one Delta snapshot that may hold rows matching the pushed filters."""

    def __init__(self, options, schema: pa.Schema, partition_by: list[str]) -> None:
        self.root = options["root"]
        self.table = options["table"]
        version = options.get("version")
        if version not in (None, "") and not str(version).isdigit():
            raise InputError(f"{self.table}: version {version!r} is not a version number (0, 1, 2, ...)")
        self.version = int(version) if version not in (None, "") else None
        self.timestamp = options.get("timestamp") or None
        if self.version is not None and self.timestamp is not None:
            raise InputError(f"{self.table}: give a version or a timestamp to travel to, not both")
        self.partition = None
        if options.get("partitionFilter"):
            column, sep, values = options["partitionFilter"].partition("=")
            if not sep or not column:
                raise InputError(f"partitionFilter {options['partitionFilter']!r}: expected column=value[,value...]")
            self.partition = (column, tuple(values.split(",")))
        self.arrow_schema = schema
        self.partition_by = partition_by
        self.predicates: list[Predicate] = []

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep the filters the reader applies exactly (partitions, statistics, rows); return the rest to Spark."""
        for spark_filter in filters:
            predicate = as_predicate(spark_filter, self.arrow_schema)
            if predicate is None:
                yield spark_filter
            else:
                self.predicates.append(predicate)

    def partitions(self) -> list[FileGroup]:
        """One task per ~128 MiB of the files that may match (one empty task if none may).

        Spark replaces an empty partition list with a bare ``InputPartition``,
        so an empty snapshot is made an explicit task with no files. Raises
        :class:`~metrics_lake.lake_schemas.errors.InputError` for a
        time-travel target that does not exist or was vacuumed.
        """
        store = open_store(load_settings(root=self.root))
        table = open_as_of(store, self.table, self.version, self.timestamp)
        kept = snapshot_files(store, self.table, table, self.partition, self.predicates)
        if self.version is not None or self.timestamp is not None:
            check_files_present(store, self.table, table, [f.relative for f in kept])
        if os.environ.get(SCAN_REPORT_ENV) == "1":
            report_scan(
                self.table,
                table.version(),
                snapshot_files(store, self.table, table, self.partition),
                kept,
                self.predicates,
            )
        row_predicates = tuple(p for p in self.predicates if p.column not in self.partition_by)
        groups = group_files(kept, min_groups=MIN_TASKS)
        if kept and len(groups) < MIN_TASKS:  # fewer files than cores: share each file's row groups among tasks
            shares = -(-MIN_TASKS // len(groups))
            return [FileGroup(tuple(g), row_predicates, (i, shares)) for g in groups for i in range(shares)]
        return [FileGroup(tuple(group), row_predicates) for group in groups] or [FileGroup(())]

    def read(self, partition: FileGroup) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the task's files, only rows matching its predicates (runs on executors)."""
        filesystem, _ = open_store(load_settings(root=self.root)).arrow_fs()
        rows = row_filter(list(partition.predicates), self.arrow_schema)
        for data_file in partition.files:
            yield from read_data_file(
                data_file, self.arrow_schema, filesystem, rows=rows, part=partition.part
            ).to_batches(max_chunksize=65_536)


class DeltaSnapshotDataSource(DataSource):
    """``spark.read.format("lakedelta").option("table", ...)``: a lake table as a DataFrame."""

    @classmethod
    def name(cls) -> str:
        """Format name: ``lakedelta``."""
        return "lakedelta"

    def _layout(self) -> tuple[pa.Schema, list[str]]:
        for required in ("root", "table"):
            if required not in self.options:
                raise InputError(f"lakedelta reader needs option {required!r}")
        return table_layout(open_store(load_settings(root=self.options["root"])), self.options["table"])

    def schema(self):
        """The table's schema (declared in :data:`metrics_lake.lake_schemas.tables.TABLES`, else its Delta schema) for Spark."""
        return spark_schema(self._layout()[0])

    def reader(self, schema) -> DeltaSnapshotReader:
        """A reader of the snapshot named by the options."""
        return DeltaSnapshotReader(self.options, *self._layout())

    def writer(self, schema, overwrite: bool):
        """Refused: the lake's tables are written by its pipelines only (exactly once), never through SQL.

        Raises :class:`~metrics_lake.lake_schemas.errors.InputError`.
        """
        raise InputError(
            f"{self.options.get('table', 'lake tables')} is read-only through SQL: the lake's pipelines write it; "
            "save results to a table of your own session instead"
        )


def table_source(root: str, table: str) -> type[DeltaSnapshotDataSource]:
    """A data source named ``lake_<table>`` that reads table ``table`` of the lake at ``root``.

    Spark passes a catalog table's ``OPTIONS`` to a Python data source's
    reader only from the query (``WITH (...)``), not from ``CREATE TABLE``
    (verified with Spark 4.2), so each catalog table gets a format of its
    own with its root and table built in (:mod:`metrics_lake.spark.catalog`);
    ``version``/``timestamp`` come from the query.
    """

    class TableSource(DeltaSnapshotDataSource):
        def __init__(self, options) -> None:
            super().__init__({**options, "root": root, "table": table})

        @classmethod
        def name(cls) -> str:
            return f"lake_{table}"

    TableSource.__qualname__ = TableSource.__name__ = f"LakeTable_{table}"
    return TableSource
