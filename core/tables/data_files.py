"""Writing a Delta table's data files: Parquet with the lake's encodings, and the Delta statistics of each file.

Files are written under the table but not committed: they stay invisible
until an ``add`` action names them (:mod:`metrics_lake.core.tables.commits`),
and VACUUM removes those a failed job never committed.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from metrics_lake.core import keys
from metrics_lake.core.parquet_layout import has_dictionary, is_string, used_values, write_options
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import table_layout
from metrics_lake.lake_schemas.types import utc_time

__all__ = [
    "MAX_STRING_STAT_CHARS",
    "WrittenFile",
    "dictionary_bounds",
    "footer_stats",
    "stat_value",
    "store_data_file",
    "write_data_files",
]


def stat_value(value):
    """A Python value as Delta writes it in statistics and partition values: ISO dates, UTC times with ms, no NaN."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


MAX_STRING_STAT_CHARS = 256
#: Rows of a Parquet row group when the caller sets none: pyarrow's default (``write_table``).
DEFAULT_ROW_GROUP_ROWS = 1 << 20


def footer_stats(metadata: pq.FileMetaData, schema: pa.Schema, rows: pa.Table | None = None) -> str:
    """Delta ``stats`` JSON for a data file (PROTOCOL.md "Per-file Statistics"), read from its Parquet footer.

    ``metadata``: the footer of the file as written (``schema``: its Arrow
    schema, partition columns dropped). The writer has computed each row
    group's statistics already (:func:`~metrics_lake.core.parquet_layout.write_options`);
    computing them again from the rows cost as much as writing them did.

    ``numRecords``; ``nullCount`` for every column that is not nested;
    ``minValues`` and ``maxValues`` for numeric, boolean, date and string
    columns, and for timestamps rounded outward to milliseconds (the
    precision Delta stats carry), so a reader's data skipping never excludes
    a file that holds a match. Bounds are left out, never guessed, where a
    row group holding values has none: all its floats are NaN, or a string
    is longer than the writer keeps (4 KiB). Strings get bounds only while
    both have at most :data:`MAX_STRING_STAT_CHARS` characters (long raw
    payloads would bloat the Delta log); measured with delta-rs 1.6, a
    string column with a zero null count but no bounds is pruned as if it
    matched nothing, so the columns we filter on (topic, server, metric)
    always get them. NaN is not a bound (Parquet's writers skip it, as
    Arrow's ``min_max`` does); infinities leave the column without bounds.

    ``rows``: the rows written, for their dictionary-encoded columns, which
    the lake writes without Parquet statistics (:func:`~metrics_lake.core.parquet_layout.write_options`):
    their null count is counted and their bounds are those of the
    dictionary values the rows use (:func:`dictionary_bounds`).
    """
    stats: dict = {"numRecords": metadata.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    columns = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
    for field in schema:
        if pa.types.is_nested(field.type):
            continue
        if pa.types.is_dictionary(field.type) and rows is not None:
            column = rows.column(field.name)
            stats["nullCount"][field.name] = int(pc.sum(pc.is_null(column)).as_py() or 0)
            bounds = dictionary_bounds(column)
            if bounds is not None:
                stats["minValues"][field.name], stats["maxValues"][field.name] = bounds
            continue
        chunks = [group.column(columns[field.name]).statistics for group in groups]
        if any(chunk is None or not chunk.has_null_count for chunk in chunks):
            continue  # not written: no claim about the column
        nulls = sum(chunk.null_count for chunk in chunks)
        stats["nullCount"][field.name] = nulls
        holding = [chunk for chunk in chunks if chunk.num_values > 0]  # num_values: the non-null ones
        if not holding or not all(chunk.has_min_max for chunk in holding):
            continue
        bounds = _bounds(field.type, holding)
        if bounds is not None:
            stats["minValues"][field.name], stats["maxValues"][field.name] = bounds
    return json.dumps(stats)


def dictionary_bounds(column: pa.Array | pa.ChunkedArray) -> tuple[str, str] | None:
    """(min, max) of a dictionary-encoded string column as Delta statistics carry them: of the dictionary values
    its rows use (a dictionary may hold more), compared as Parquet and Arrow compare strings (by UTF-8 bytes, which
    is by code point); None without values or where a bound has more than :data:`MAX_STRING_STAT_CHARS`
    characters. Costs a count of the indices (:func:`~metrics_lake.core.parquet_layout.used_values`), not a
    comparison per row."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    used = [used_values(chunk) for chunk in chunks]
    bounds = pc.min_max(pa.concat_arrays(used) if used else pa.array([], pa.string()))
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if lo is None or max(len(lo), len(hi)) > MAX_STRING_STAT_CHARS:
        return None
    return lo, hi


def _bounds(kind: pa.DataType, chunks: list) -> tuple | None:
    """The file's (min, max) as Delta writes them, from row-group statistics that all have both; None: no bounds."""
    if pa.types.is_timestamp(kind):
        unit = json.loads(chunks[0].logical_type.to_json())["timeUnit"]
        lo_us = _micros(min(chunk.min_raw for chunk in chunks), unit, up=False)
        hi_us = _micros(max(chunk.max_raw for chunk in chunks), unit, up=True)
        return stat_value(utc_time(lo_us - lo_us % 1000)), stat_value(utc_time(hi_us + -hi_us % 1000))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        lo, hi = min(chunk.min for chunk in chunks), max(chunk.max for chunk in chunks)
        return (lo, hi) if max(len(lo), len(hi)) <= MAX_STRING_STAT_CHARS else None
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_date(kind) or pa.types.is_boolean(kind):
        lo = stat_value(min(chunk.min for chunk in chunks))
        hi = stat_value(max(chunk.max for chunk in chunks))
        return (lo, hi) if lo is not None and hi is not None else None
    return None


def _micros(raw: int, unit: str, *, up: bool) -> int:
    """A raw Parquet timestamp of ``unit`` (its logical type's ``timeUnit``) in µs; nanoseconds rounded down or ``up``."""
    if unit == "nanoseconds":
        return -(-raw // 1000) if up else raw // 1000
    return raw * 1000 if unit == "milliseconds" else raw


@dataclass(frozen=True)
class WrittenFile:
    """A data file written for table ``table``, ready to commit (picklable for Spark)."""

    table: str
    path: str
    size: int
    partition_values: dict[str, str]
    stats: str
    modification_time: int

    def add_action(self, data_change: bool = True) -> AddAction:
        """The Delta ``add`` action for this file (``data_change=False``: a rewrite of rows already in the table)."""
        return AddAction(self.path, self.size, self.partition_values, self.modification_time, data_change, self.stats)


def write_data_files(
    store: Store, name: str, data: pa.Table, *, prefix: str = "part-", row_group_rows: int | None = None
) -> list[WrittenFile]:
    """Write ``data`` (the table's full schema) as Parquet files, one per partition value.

    Files are named ``<prefix><uuid>.zstd.parquet``; ``row_group_rows``
    caps a Parquet row group (default: pyarrow's, 1 Mi rows).

    Partition columns are dropped from the files and recorded as partition
    values (Delta convention). Files get unique names, so a retried Spark
    task never clobbers another attempt's file; files never committed stay
    invisible and are removed by VACUUM. Returns one :class:`WrittenFile` per
    file.

    String columns (and map keys and values) that ``data`` holds
    dictionary-encoded are written from their indices
    (:func:`~metrics_lake.core.parquet_layout.write_options`), in files that
    read back as the table's schema (no dictionary types in them): the speed
    layer's bronze rows keep the log segments' dictionaries, and 500,000 of
    them were written in 84 ms, against 133 ms cast to strings first
    (medians of 9, the same bytes). Their Delta bounds then come from the dictionaries, and
    the file has no Parquet statistics for them; a file of more than one row
    group (``row_group_rows``) is written from plain strings, with statistics per row group.
    """
    schema, partition_by = table_layout(store, name)
    data = _conformed(data.select(schema.names), schema)
    if data.num_rows == 0:
        return []
    groups = data.group_by(partition_by).aggregate([]).to_pylist() if partition_by else [{}]
    written = []
    for group in groups:
        part = data
        for column, value in group.items() if len(groups) > 1 else ():  # one group: all rows, not a copy
            part = part.filter(pc.equal(part.column(column), pa.scalar(value, schema.field(column).type)))
        values = {column: stat_value(value) for column, value in group.items()}
        body = part.drop_columns(partition_by)
        if body.num_rows > (row_group_rows or DEFAULT_ROW_GROUP_ROWS):  # statistics per row group: Arrow's
            body = body.cast(pa.schema([schema.field(column) for column in body.column_names]))
        sink = pa.BufferOutputStream()
        # Arrow would record dictionary types in the file's Arrow schema, and readers would return them.
        plain = not any(has_dictionary(field) for field in body.schema)
        pq.write_table(body, sink, row_group_size=row_group_rows, store_schema=plain, **write_options(body.schema))
        written.append(store_data_file(store, name, values, sink.getvalue(), body.schema, prefix=prefix, rows=body))
    return written


def store_data_file(
    store: Store,
    name: str,
    partition_values: dict,
    encoded: pa.Buffer,
    schema: pa.Schema,
    *,
    prefix: str,
    rows: pa.Table | None = None,
) -> WrittenFile:
    """Create the encoded Parquet file ``encoded`` as a new, uncommitted data file of table ``name``.

    It is named ``<prefix><uuid>.zstd.parquet`` in the folder of ``partition_values`` (partition column -> value,
    in the table's order), so no two writers' files collide. ``schema``: the file's Arrow schema (partition
    columns dropped); its Delta statistics come from its footer (:func:`footer_stats`, with ``rows`` for the
    dictionary-encoded columns the lake writes without Parquet statistics).
    """
    directory = "/".join(f"{column}={value}" for column, value in partition_values.items())
    relative = f"{directory}/{prefix}{uuid.uuid4().hex}.zstd.parquet".lstrip("/")
    footer = pq.read_metadata(pa.BufferReader(encoded))
    store.create(keys.table_key(name, relative), encoded)
    return WrittenFile(
        table=name,
        path=relative,
        size=encoded.size,
        partition_values={column: str(value) for column, value in partition_values.items()},
        stats=footer_stats(footer, schema, rows),
        modification_time=int(time.time() * 1000),
    )


def _conformed(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` cast to ``schema``, but its dictionary-encoded string columns (and map keys and values) kept so,
    each such column one chunk with one dictionary (Arrow unifies the chunks' dictionaries): Arrow's Parquet
    writer writes a column whose chunks have differing dictionaries as plain strings."""
    target = pa.schema(
        [field.with_type(_coded(data.schema.field(field.name).type, field.type)) for field in schema],
        metadata=schema.metadata,
    )
    data = data.cast(target)
    for index, field in enumerate(target):
        if has_dictionary(field) and data.column(index).num_chunks > 1:
            data = data.set_column(index, field, data.column(index).combine_chunks())
    return data


def _coded(given: pa.DataType, wanted: pa.DataType) -> pa.DataType:
    """``wanted``, or a dictionary of it where ``wanted`` is a string and ``given`` a dictionary of strings."""
    if pa.types.is_dictionary(given) and is_string(given) and is_string(wanted):
        return pa.dictionary(given.index_type, wanted)
    if pa.types.is_map(given) and pa.types.is_map(wanted):
        return pa.map_(
            wanted.key_field.with_type(_coded(given.key_type, wanted.key_type)),
            wanted.item_field.with_type(_coded(given.item_type, wanted.item_type)),
        )
    return wanted
