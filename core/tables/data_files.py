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
from metrics_lake.core.parquet_layout import write_options
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import table_layout

__all__ = ["MAX_STRING_STAT_CHARS", "WrittenFile", "file_stats", "stat_value", "write_data_files"]


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


def file_stats(data: pa.Table) -> str:
    """Delta ``stats`` JSON for a data file (PROTOCOL.md "Per-file Statistics").

    ``numRecords`` and ``nullCount`` for every column; ``minValues`` and
    ``maxValues`` for numeric, boolean, date and string columns, and for timestamps
    rounded outward to milliseconds (the precision Delta stats carry), so a
    reader's data skipping never excludes a file that holds a match.
    Strings get bounds only while the largest value has at most
    :data:`MAX_STRING_STAT_CHARS` characters (long raw payloads would bloat
    the Delta log); measured with delta-rs 1.6, a string column with a zero
    null count but no bounds is pruned as if it matched nothing, so the
    columns we filter on (topic, server, metric) always get them.
    """
    stats: dict = {"numRecords": data.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for field in data.schema:
        column = data.column(field.name)
        if pa.types.is_map(field.type) or pa.types.is_nested(field.type):
            continue
        stats["nullCount"][field.name] = column.null_count
        if data.num_rows == column.null_count:
            continue
        if pa.types.is_timestamp(field.type):
            as_ms = column.cast(pa.timestamp("us", tz="UTC"))
            lo = pc.floor_temporal(pc.min(as_ms), unit="millisecond")
            hi = pc.ceil_temporal(pc.max(as_ms), unit="millisecond")
            stats["minValues"][field.name] = stat_value(lo.as_py())
            stats["maxValues"][field.name] = stat_value(hi.as_py())
        elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            bounds = pc.min_max(column)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if len(hi) <= MAX_STRING_STAT_CHARS:
                stats["minValues"][field.name] = lo
                stats["maxValues"][field.name] = hi
        elif (
            pa.types.is_integer(field.type)
            or pa.types.is_floating(field.type)
            or pa.types.is_date(field.type)
            or (pa.types.is_boolean(field.type))
        ):
            bounds = pc.min_max(column)
            lo, hi = stat_value(bounds["min"].as_py()), stat_value(bounds["max"].as_py())
            if lo is not None and hi is not None:
                stats["minValues"][field.name] = lo
                stats["maxValues"][field.name] = hi
    return json.dumps(stats)


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
    """
    schema, partition_by = table_layout(store, name)
    data = data.select(schema.names).cast(schema)
    if data.num_rows == 0:
        return []
    groups = data.group_by(partition_by).aggregate([]).to_pylist() if partition_by else [{}]
    written = []
    for group in groups:
        part = data
        for column, value in group.items() if len(groups) > 1 else ():  # one group: all rows, not a copy
            part = part.filter(pc.equal(part.column(column), pa.scalar(value, schema.field(column).type)))
        values = {column: stat_value(value) for column, value in group.items()}
        directory = "/".join(f"{column}={value}" for column, value in values.items())
        relative = f"{directory}/{prefix}{uuid.uuid4().hex}.zstd.parquet".lstrip("/")
        body = part.drop_columns(partition_by)
        key = keys.table_key(name, relative)
        sink = pa.BufferOutputStream()
        pq.write_table(body, sink, row_group_size=row_group_rows, **write_options(body.schema))
        encoded = sink.getvalue()
        store.create(key, encoded)
        written.append(
            WrittenFile(
                table=name,
                path=relative,
                size=encoded.size,
                partition_values={k: str(v) for k, v in values.items()},
                stats=file_stats(body),
                modification_time=int(time.time() * 1000),
            )
        )
    return written
