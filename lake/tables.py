"""Delta tables of the lake, through delta-rs (``deltalake``).

Every table lives at ``<LAKE_ROOT>/tables/<name>`` with the schema and
partition columns declared in the registry :data:`metrics_lake.schemas.TABLES`.
The exactly-once commit path is here, in two forms:

- **Log positions** (the speed layer): a table records, for every log
  partition it has consumed, the next offset it holds, as the Delta
  transaction action ``txn(appId="<consumer>/<topic>/<partition>",
  version=<next offset>)`` (:func:`offset_transactions`,
  :func:`committed_offsets`). Data files and the new positions are committed
  in one Delta version (:func:`commit_changes`), so a table never holds a
  row without also holding its position, whatever the process or its
  checkpoint went through. delta-rs fails a commit whose ``txn`` appIds a
  concurrent commit changed, and one that removes a file a concurrent commit
  removed (both verified with delta-rs 1.6), so two writers cannot both
  commit the same positions.
- **Batch ids** (replay): :func:`commit_files` commits files with
  ``txn(appId, version=batchId)`` and skips a batch id already recorded, as
  Delta-Spark's streaming sink does (``DeltaSink.addBatch``; Delta
  PROTOCOL.md "Transaction Identifiers").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from metrics_lake.core.log.lease import acquire_lease_at, release_lease, renew_lease
from metrics_lake.core.names import check_name
from metrics_lake.core.parquet_layout import write_options
from metrics_lake.core.storage import Store
from metrics_lake.schemas import TABLES, table_spec

log = logging.getLogger(__name__)
T = TypeVar("T")


#: How often a Delta commit that lost to a concurrent one (CommitFailedError)
#: is re-planned and retried before the error is raised.
COMMIT_ATTEMPTS = 10


def retry_on_conflict(commit: Callable[[], T], what: str, attempts: int = COMMIT_ATTEMPTS) -> T:
    """Run ``commit`` (which re-reads the table), retrying when a concurrent writer wins the Delta commit.

    delta-rs raises ``CommitFailedError`` when a concurrent commit conflicts
    (say compaction removed a file a merge rewrites); the loser changed
    nothing, so re-planning on the new snapshot is safe. Waits 0.1, 0.2, ...
    s (capped at 2 s) between attempts, then re-raises the last error.
    """
    for attempt in range(1, attempts + 1):
        try:
            return commit()
        except CommitFailedError as exc:
            if attempt == attempts:
                raise
            log.info("%s: concurrent commit won (%s); retrying (%d/%d)", what, exc, attempt, attempts - 1)
            time.sleep(min(0.1 * attempt, 2.0))
    raise AssertionError("unreachable")


#: How long a maintenance lease lasts without renewal (a holder that dies frees the table after this).
MAINTENANCE_LEASE_TTL_MS = 15 * 60 * 1000


@contextlib.contextmanager
def maintenance_lease(store: Store, name: str, *, wait_s: float = 900.0) -> Iterator[Callable[[], None]]:
    """Hold table ``name``'s maintenance lease for the block; yields a function that renews it.

    Compaction and day replacements rewrite a table's files. delta-rs 1.6
    does not fail a commit that removes a file a concurrent OPTIMIZE
    (``dataChange=false``) already removed, which would leave both
    rewrites' files active: duplicated rows (Delta-Spark raises
    ``ConcurrentDeleteDeleteException`` there; verified here with delta-rs
    1.6.6). So those writers take this lease (``tables/_leases/<name>.json``,
    compare-and-swap like the log's partition leases) and never interleave;
    the speed layer instead never rewrites what compaction may touch (see
    :func:`metrics_lake.core.speed_layer.first_open_day`). Waits up to
    ``wait_s`` for another holder, then raises
    :class:`~metrics_lake.core.log.lease.LeaseHeldError`.
    """
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    key = f"tables/_leases/{name}.json"
    lease = acquire_lease_at(
        store,
        key,
        f"table {name}",
        owner,
        ttl_ms=MAINTENANCE_LEASE_TTL_MS,
        wait_s=wait_s,
        hint="Another compaction or day rewrite of this table is running; wait for it or for its lease to expire.",
    )
    held = [lease]

    def renew() -> None:
        held[0] = renew_lease(store, held[0], MAINTENANCE_LEASE_TTL_MS)

    try:
        yield renew
    finally:
        release_lease(store, held[0])


def table_uri(store: Store, name: str) -> str:
    """URI of table ``name`` for delta-rs and Spark readers; :class:`InputError` for a name that is not valid."""
    return store.uri(f"tables/{check_name('table', name)}")


def table_layout(store: Store, name: str) -> tuple[pa.Schema, list[str]]:
    """(schema, partition columns) of table ``name``.

    Declared tables come from the registry :data:`metrics_lake.schemas.TABLES`; any
    other table (one made by ``lake replay --into``) from its own Delta metadata.
    Raises ``KeyError`` if the name is neither declared nor an existing table.
    """
    if name in TABLES:
        return TABLES[name].schema, list(TABLES[name].partition_by)
    try:
        table = open_table(store, name)
    except TableNotFoundError:
        raise KeyError(f"no table {name!r}: not declared in the table registry and not under tables/") from None
    return pa.schema(table.schema().to_arrow()), list(table.metadata().partition_columns)


def ensure_table(store: Store, name: str, like: str | None = None) -> DeltaTable:
    """Open table ``name``, creating it empty if absent with the schema of declared table ``like or name``.

    Raises ``KeyError`` if it must be created and that name is not declared
    in :data:`metrics_lake.schemas.TABLES`.
    """
    uri = table_uri(store, name)
    try:
        return DeltaTable(uri, storage_options=store.storage_options())
    except TableNotFoundError:
        spec = table_spec(like or name)
        return DeltaTable.create(
            uri,
            spec.schema,
            mode="ignore",
            partition_by=list(spec.partition_by),
            name=name,
            storage_options=store.storage_options(),
        )


def open_table(store: Store, name: str, version: int | None = None) -> DeltaTable:
    """Open an existing table, optionally at ``version`` (time travel).

    Raises ``deltalake.exceptions.TableNotFoundError`` if it does not exist.
    """
    return DeltaTable(table_uri(store, name), version=version, storage_options=store.storage_options())


def list_tables(store: Store) -> list[str]:
    """Names of tables that exist under ``tables/``."""
    return [name for name in store.list("tables") if store.exists(f"tables/{name}/_delta_log")]


def committed_batch(table: DeltaTable, app_id: str) -> int:
    """Highest batch id committed by ``app_id`` (``-1`` if none)."""
    version = table.transaction_version(app_id)
    return -1 if version is None else int(version)


def batch_commit_properties(app_id: str, batch_id: int, operation: str) -> CommitProperties:
    """delta-rs commit properties for micro-batch ``batch_id`` of ``app_id``.

    Carries the transaction action ``txn(app_id, batch_id)`` that makes the
    commit idempotent, and ``lake.*`` commit info naming the operation.
    """
    return CommitProperties(
        app_transactions=[Transaction(app_id, batch_id, int(time.time() * 1000))],
        custom_metadata={"lake.operation": operation, "lake.appId": app_id, "lake.batchId": str(batch_id)},
    )


def commit_files(store: Store, name: str, actions: list[AddAction], *, app_id: str, batch_id: int) -> bool:
    """Commit ``actions`` (files already written under the table) for one micro-batch.

    Returns False, committing nothing, if ``app_id`` already committed
    ``batch_id`` or later; True after committing one Delta version. An empty
    ``actions`` list still commits, so the batch id is recorded. A commit
    lost to a concurrent writer is retried (:func:`retry_on_conflict`).
    """

    def commit() -> bool:
        table = ensure_table(store, name)
        if committed_batch(table, app_id) >= batch_id:
            return False
        schema, partition_by = table_layout(store, name)
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema,
            partition_by=partition_by,
            commit_properties=batch_commit_properties(app_id, batch_id, "STREAMING UPDATE"),
        )
        return True

    return retry_on_conflict(commit, f"{name} batch {batch_id}")


def offset_app_id(consumer: str, topic: str, partition: int) -> str:
    """The ``txn`` appId under which a table records ``consumer``'s position in one log partition."""
    return f"{consumer}/{topic}/{partition}"


def committed_offsets(table: DeltaTable, consumer: str, topic: str, partitions) -> dict[int, int | None]:
    """Per log partition, the next offset ``table`` holds for ``consumer`` (``None``: nothing recorded yet)."""
    return {p: table.transaction_version(offset_app_id(consumer, topic, p)) for p in partitions}


def offset_transactions(consumer: str, topic: str, ends: dict[int, int]) -> list[Transaction]:
    """``txn`` actions recording that a table now holds ``consumer``'s records up to ``ends`` (next offsets)."""
    now = int(time.time() * 1000)
    return [Transaction(offset_app_id(consumer, topic, p), end, now) for p, end in sorted(ends.items())]


def remove_action(data_file) -> RemoveAction:
    """The Delta ``remove`` action for an active :class:`~metrics_lake.core.snapshots.DataFile`."""
    return RemoveAction(
        path=data_file.relative,
        data_change=True,
        deletion_timestamp=int(time.time() * 1000),
        size=data_file.size,
        partition_values=dict(data_file.partition_values),
    )


def commit_changes(
    table: DeltaTable,
    name: str,
    adds: list[WrittenFile],
    removes: list[RemoveAction],
    *,
    transactions: list[Transaction],
    operation: str,
) -> None:
    """Commit ``adds`` and ``removes`` with ``transactions`` as one Delta version on ``table``'s snapshot.

    Committing on the snapshot the caller planned from is what makes
    delta-rs detect a concurrent writer (module docstring); it raises
    ``CommitFailedError`` then and nothing is committed, so the caller
    re-plans on a fresh snapshot.
    """
    spec = table_spec(name)
    table.create_write_transaction(
        [f.add_action() for f in adds] + removes,
        mode="append",
        schema=spec.schema,
        partition_by=list(spec.partition_by),
        commit_properties=CommitProperties(
            app_transactions=transactions, custom_metadata={"lake.operation": operation}
        ),
    )


def _stat_value(value):
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
            stats["minValues"][field.name] = _stat_value(lo.as_py())
            stats["maxValues"][field.name] = _stat_value(hi.as_py())
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
            lo, hi = _stat_value(bounds["min"].as_py()), _stat_value(bounds["max"].as_py())
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

    def add_action(self) -> AddAction:
        """The Delta ``add`` action for this file."""
        return AddAction(self.path, self.size, self.partition_values, self.modification_time, True, self.stats)


def write_data_files(store: Store, name: str, data: pa.Table) -> list[WrittenFile]:
    """Write ``data`` (the table's full schema) as Parquet files, one per partition value.

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
        for column, value in group.items():
            part = part.filter(pc.equal(part.column(column), pa.scalar(value, schema.field(column).type)))
        values = {column: _stat_value(value) for column, value in group.items()}
        directory = "/".join(f"{column}={value}" for column, value in values.items())
        relative = f"{directory}/part-{uuid.uuid4().hex}.zstd.parquet".lstrip("/")
        body = part.drop_columns(partition_by)
        key = f"tables/{name}/{relative}"
        sink = pa.BufferOutputStream()
        pq.write_table(body, sink, **write_options(body.schema))
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


@dataclass(frozen=True)
class TableSummary:
    """One table's current snapshot: Delta version, active files, rows and bytes."""

    name: str
    version: int
    files: int
    rows: int
    size_bytes: int


def summarize_tables(store: Store) -> list[TableSummary]:
    """A :class:`TableSummary` per existing table, rows counted from file statistics."""
    summaries = []
    for name in list_tables(store):
        table = open_table(store, name)
        actions = pa.table(table.get_add_actions(flatten=True))
        rows = pc.sum(actions.column("num_records")).as_py() if actions.num_rows else 0
        size = pc.sum(actions.column("size_bytes")).as_py() if actions.num_rows else 0
        summaries.append(TableSummary(name, table.version(), actions.num_rows, rows or 0, size or 0))
    return summaries
