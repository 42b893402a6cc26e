"""A Delta snapshot's data files, read with pyarrow: for Spark tasks and for the core's own rewrites.

delta-rs names the active files of a snapshot (``get_add_actions``); the
files are plain Parquet without their partition columns (Delta convention),
which :func:`read_data_file` restores from the ``add`` action's partition
values. Tables needing reader features this code does not implement
(deletion vectors, column mapping) are refused rather than read wrongly.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import table_folder, table_layout
from metrics_lake.core.tables.pruning import Predicate, keep_files
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.types import utc_time

__all__ = [
    "DataFile",
    "check_readable",
    "days_between",
    "read_data_file",
    "read_data_files",
    "snapshot_files",
    "windowed_files",
]

#: Reader features whose semantics this reader does not implement.
UNSUPPORTED_READER_FEATURES = {"deletionVectors", "columnMapping"}


@dataclass(frozen=True)
class DataFile:
    """One active data file of a snapshot.

    ``path``: where it is in the store's ``pyarrow.fs`` file system;
    ``relative``: its path as the Delta log names it (for remove actions);
    ``size`` in bytes; ``partition_values`` as Delta stores them (strings);
    ``records``: row count from the file's statistics (``None`` if absent);
    ``window_starts``: the smallest and largest ``window_start`` of a windowed
    table's file from its statistics (epoch µs; ``None`` if absent). Delta
    keeps timestamps to the millisecond, so a row's ``window_start`` lies in
    ``[low, high + 999]``.
    """

    path: str
    relative: str
    size: int
    partition_values: tuple[tuple[str, str | None], ...]
    records: int | None = None
    window_starts: tuple[int, int] | None = None


def check_readable(table: DeltaTable, name: str) -> None:
    """Raise :class:`~metrics_lake.lake_schemas.errors.InputError` if ``table`` needs reader features we lack."""
    unsupported = set(table.protocol().reader_features or []) & UNSUPPORTED_READER_FEATURES
    if unsupported:
        raise InputError(f"table {name} uses Delta reader features this reader lacks: {sorted(unsupported)}")


def snapshot_files(
    store: Store,
    name: str,
    table: DeltaTable,
    partition: tuple[str, str | tuple[str, ...]] | None = None,
    predicates: list[Predicate] | tuple[Predicate, ...] = (),
) -> list[DataFile]:
    """Active files of ``table`` (table ``name`` of ``store``), only those of ``partition`` if given, and only those
    that may hold rows matching every one of ``predicates`` (partition values and statistics:
    :func:`~metrics_lake.core.tables.pruning.keep_files`).

    ``partition`` is ``(column, value)`` or ``(column, (value, ...))``,
    values as Delta stores them (dates as ``YYYY-MM-DD``).
    """
    check_readable(table, name)
    _, base = table_folder(store, name)
    actions = pa.table(table.get_add_actions(flatten=True))
    if predicates and actions.num_rows:
        schema, partition_by = table_layout(store, name)
        actions = actions.filter(pa.array(keep_files(actions, list(predicates), schema, partition_by)))
    partition_columns = [c for c in actions.column_names if c.startswith("partition.")]
    wanted = None
    if partition is not None:
        wanted = {partition[1]} if isinstance(partition[1], str) else set(partition[1])
    files = []
    for row, window_starts in zip(actions.to_pylist(), _window_starts(actions), strict=True):
        relative = row["path"]
        path = unquote(relative)
        full = path.partition("://")[2] if "://" in path else path if path.startswith("/") else f"{base}/{path}"
        values = tuple(
            (c.removeprefix("partition."), None if row[c] is None else _text(row[c])) for c in partition_columns
        )
        if wanted is None or dict(values).get(partition[0]) in wanted:
            records = row.get("num_records")
            files.append(DataFile(full, relative, int(row["size_bytes"]), values, records, window_starts))
    return files


def _window_starts(actions: pa.Table) -> list[tuple[int, int] | None]:
    """Per add action, its file's ``(min, max)`` ``window_start`` statistics in epoch µs, or ``None``."""
    names = ("min.window_start", "max.window_start")
    if not all(name in actions.column_names for name in names):
        return [None] * actions.num_rows
    low, high = (pc.cast(actions.column(name).cast(pa.timestamp("us", tz="UTC")), pa.int64()) for name in names)
    return [
        None if lo is None or hi is None else (lo, hi) for lo, hi in zip(low.to_pylist(), high.to_pylist(), strict=True)
    ]


def windowed_files(
    store: Store, name: str, table: DeltaTable, days: list[str], lo_us: int, hi_us: int
) -> list[DataFile]:
    """Active files of windowed table ``name`` on ``days`` (ISO dates of its day partition) whose ``window_start``
    statistics overlap ``[lo_us, hi_us]`` (epoch µs); a file without statistics is kept."""
    predicates = [
        Predicate("event_date", "in", tuple(dt.date.fromisoformat(day) for day in days)),
        Predicate("window_start", ">=", utc_time(lo_us)),
        Predicate("window_start", "<=", utc_time(hi_us)),
    ]
    return snapshot_files(store, name, table, predicates=predicates) if days else []


#: Microseconds in a UTC day (no leap seconds in epoch time).
DAY_US = 86_400_000_000
EPOCH_DAY = dt.date(1970, 1, 1)


def days_between(lo_us: int, hi_us: int) -> list[str]:
    """ISO dates of the UTC days that ``[lo_us, hi_us)`` (epoch µs) overlaps.

    Integer days (floor division): a float of epoch seconds holds microseconds only to about 0.2 µs today.
    """
    first, last = lo_us // DAY_US, (hi_us - 1) // DAY_US
    return [(EPOCH_DAY + dt.timedelta(days=day)).isoformat() for day in range(first, last + 1)]


def _text(value) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def read_data_file(
    data_file: DataFile,
    schema: pa.Schema,
    filesystem: pafs.FileSystem,
    columns=None,
    dictionary: Iterable[str] = (),
    rows: pc.Expression | None = None,
    part: tuple[int, int] = (0, 1),
) -> pa.Table:
    """One data file with its partition columns restored, cast to ``schema`` (only ``columns``, if given).

    A column the file lacks (written before the column was added to the table) reads as null.
    String columns named in ``dictionary`` come back dictionary-encoded
    (``dictionary<int32, string>``, from Parquet's own dictionary pages):
    cheaper to read and to group by than materialised strings. ``rows``, a
    filter over stored (not partition) columns, keeps only matching rows and
    skips the row groups whose statistics exclude a match. ``part=(i, n)``
    reads only the i-th of n interleaved shares of those row groups, so n
    tasks can share one large file.
    """
    wanted = list(columns or schema.names)
    partition = dict(data_file.partition_values)
    stored = [c for c in wanted if c not in partition]
    encoded = [c for c in dictionary if c in stored]
    try:
        if part == (0, 1):
            data = pq.read_table(
                data_file.path, filesystem=filesystem, columns=stored, read_dictionary=encoded or None, filters=rows
            )
        else:
            data = _read_share(data_file.path, filesystem, stored, encoded, rows, part)
    except pa.ArrowInvalid:  # a file written before a column was added (schema evolution): it reads as null
        if part[0] != 0:  # the first share reads such a (rare, old) file whole
            return pa.schema([schema.field(c) for c in wanted]).empty_table()
        present = set(pq.read_schema(data_file.path, filesystem=filesystem).names)
        kept = [c for c in stored if c in present]
        data = pq.read_table(data_file.path, filesystem=filesystem, columns=kept, read_dictionary=encoded or None)
        for name in stored:
            if name not in present:
                data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
        if rows is not None:
            data = data.filter(rows)
    for name in wanted:
        if name in partition and name not in data.column_names:
            column = pa.array([partition[name]] * data.num_rows, pa.string()).cast(schema.field(name).type)
            data = data.append_column(name, column)
    as_dictionary = pa.dictionary(pa.int32(), pa.string())
    target = pa.schema([schema.field(c).with_type(as_dictionary) if c in encoded else schema.field(c) for c in wanted])
    return data.select(wanted).cast(target)


def _read_share(
    path: str,
    filesystem: pafs.FileSystem,
    columns: list[str],
    dictionary: list[str],
    rows: pc.Expression | None,
    part: tuple[int, int],
) -> pa.Table:
    """Rows of every ``part[1]``-th row group of ``path`` from the ``part[0]``-th, of those ``rows`` may match."""
    import pyarrow.dataset as pads  # here, not at the top: it imports pandas (0.2 s of every process importing this)

    file_format = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=dictionary))
    fragment = file_format.make_fragment(path, filesystem)
    groups = fragment.split_by_row_group(rows) if rows is not None else fragment.split_by_row_group()
    share = groups[part[0] :: part[1]]
    dataset = pads.FileSystemDataset(share, fragment.physical_schema, file_format, filesystem)
    return dataset.to_table(columns=columns, filter=rows)


def read_data_files(
    store: Store,
    files: list[DataFile],
    schema: pa.Schema,
    columns: list[str] | None = None,
    dictionary: Iterable[str] = (),
) -> pa.Table:
    """The rows of ``files`` (see :func:`read_data_file`) as one table; empty with ``schema`` if no files."""
    filesystem, _ = store.arrow_fs()
    parts = [read_data_file(f, schema, filesystem, columns, tuple(dictionary)) for f in files]
    if not parts:
        return pa.schema([schema.field(c) for c in columns or schema.names]).empty_table()
    return pa.concat_tables(parts)
