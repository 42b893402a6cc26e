"""Delta tables of the lake through delta-rs (``deltalake``): where they live, opening, creating, listing.

Every table lives at ``<LAKE_ROOT>/tables/<name>`` (:func:`metrics_lake.core.keys.table_prefix`) with
the schema and partition columns declared in the table registry
:data:`metrics_lake.lake_schemas.tables.TABLES`; a table made by ``lake replay
--into`` carries its own in its Delta metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import Schema as DeltaSchema

from metrics_lake.core import keys
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.app_transactions import followed
from metrics_lake.lake_schemas.errors import NotFoundError
from metrics_lake.lake_schemas.tables import TABLES, table_spec

if TYPE_CHECKING:  # importing pyarrow.dataset imports pandas (pyarrow 26): 0.2 s of every process that imports this
    import pyarrow.dataset as pads

__all__ = [
    "LOG_RETENTION",
    "TOMBSTONE_RETENTION",
    "TABLE_PROPERTIES",
    "TableSummary",
    "LatestTables",
    "committed_after",
    "ensure_table",
    "list_tables",
    "open_table",
    "summarize_tables",
    "table_dataset",
    "table_folder",
    "table_layout",
    "table_uri",
]

#: Delta table properties every lake table has. ``delta.checkpointInterval``:
#: a checkpoint every 10 commits instead of Delta's default 100. Opening a
#: table replays the JSON commits since its last checkpoint, and the speed
#: layer opens each table to plan and again to commit, every second. Measured
#: on a ``metric_windows_1m`` of a 200,000-series stream, 80 commits after
#: creation: an open took 17-27 ms and ``transaction_version`` 4 ms; after a
#: checkpoint 3-5 ms and 0.8 ms. Writing a checkpoint took 30-40 ms (delta-rs
#: writes it after the commit whose version + 1 is a multiple of the interval).
#: A running stream now keeps its tables open (:class:`LatestTables`); every
#: other reader and writer still opens them.
#:
#: ``delta.enableExpiredLogCleanup`` off: delta-rs's post-commit hook would
#: otherwise look for expired log entries at every checkpoint by listing the
#: whole ``_delta_log``, a cost that grows with every commit the log holds.
#: Measured on a local table (2026-11-27, tmpfs): a commit took 4.4 ms at 80
#: versions, 43 ms at 3,000 with the hook, 11.5 ms without. The lake cleans
#: the log itself instead: the stream's compaction round for the tables it
#: writes every batch (:func:`metrics_lake.core.maintenance.continuous_compaction.clean_delta_log`),
#: the nightly retention for all.
TABLE_PROPERTIES = {"delta.checkpointInterval": "10", "delta.enableExpiredLogCleanup": "false"}
#: The Delta table property that says how long log entries (the versions time travel reaches) are kept.
LOG_RETENTION = "delta.logRetentionDuration"
#: The Delta table property that says how long a removed file's tombstone (its ``remove`` action) stays in the
#: checkpoints (Delta's default: 7 days).
TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"


def table_uri(store: Store, name: str) -> str:
    """URI of table ``name`` for delta-rs and Spark readers; :class:`InputError` for a name that is not valid."""
    return store.uri(keys.table_prefix(name))


def table_folder(store: Store, name: str) -> tuple[pafs.FileSystem, str]:
    """Table ``name``'s folder in the store's Arrow file system (:meth:`~metrics_lake.core.storage.Store.arrow_fs`):
    ``(file system, path)``: the folder its Delta log's file paths are relative to."""
    filesystem, root = store.arrow_fs()
    return filesystem, f"{root}/{keys.table_prefix(name)}"


def table_layout(store: Store, name: str) -> tuple[pa.Schema, list[str]]:
    """(schema, partition columns) of table ``name``.

    Declared tables come from the table registry :data:`metrics_lake.lake_schemas.tables.TABLES`; any
    other table (one made by ``lake replay --into``) from its own Delta metadata.
    Raises :class:`~metrics_lake.lake_schemas.errors.NotFoundError` if the name is
    neither declared nor an existing table.
    """
    if name in TABLES:
        return TABLES[name].schema, list(TABLES[name].partition_by)
    try:
        table = open_table(store, name)
    except TableNotFoundError:
        raise NotFoundError(
            f"no table {str(name)!r}: not declared in the table registry and not under {keys.TABLES_PREFIX}/; "
            f"declared tables: {', '.join(TABLES)}"
        ) from None
    return pa.schema(table.schema().to_arrow()), list(table.metadata().partition_columns)


def ensure_table(
    store: Store, name: str, like: str | None = None, properties: dict[str, str] | None = None
) -> DeltaTable:
    """Open table ``name``, creating it empty if absent with the schema of declared table ``like or name``, and
    adding the declared columns an existing table lacks (:func:`_add_new_columns`).

    A table lacking :data:`TABLE_PROPERTIES` (made by an older release) or
    ``properties`` (more Delta table properties, e.g. :data:`LOG_RETENTION`;
    a new table is created with them) gets them, in one commit.

    Raises ``KeyError`` if it must be created and that name is not declared
    in :data:`metrics_lake.lake_schemas.tables.TABLES`.
    """
    uri = table_uri(store, name)
    wanted = TABLE_PROPERTIES | (properties or {})
    try:
        table = DeltaTable(uri, storage_options=store.storage_options())
    except TableNotFoundError:
        spec = table_spec(like or name)
        table = DeltaTable.create(
            uri,
            spec.schema,
            mode="ignore",
            partition_by=list(spec.partition_by),
            name=name,
            configuration=wanted,
            storage_options=store.storage_options(),
        )
    table = _set_properties(store, name, table, wanted)
    declared = like or name
    return _add_new_columns(store, name, table, TABLES[declared].schema) if declared in TABLES else table


def _set_properties(store: Store, name: str, table: DeltaTable, properties: dict[str, str]) -> DeltaTable:
    """``table`` with ``properties`` set (one commit if one differs; a concurrent setter may win)."""
    configuration = table.metadata().configuration
    if all(configuration.get(key) == value for key, value in properties.items()):
        return table
    try:
        table.alter.set_table_properties(properties)
    except CommitFailedError:
        pass  # another process set them first
    return DeltaTable(table_uri(store, name), storage_options=store.storage_options())


def _add_new_columns(store: Store, name: str, table: DeltaTable, schema: pa.Schema) -> DeltaTable:
    """Schema evolution: add the declared columns ``table`` lacks (a lake made by an older release), as nullable.

    Columns are only ever added at the end of a declared schema, so an evolved table has the declared column
    order. Rows written before read null there (Delta's rule for added columns). Two processes evolving the
    same table at once: the loser's commit conflicts and it re-reads the table, which has the columns.
    """
    present = set(table.schema().to_arrow().names)
    missing = [field for field in schema if field.name not in present]
    if not missing:
        return table
    try:
        table.alter.add_columns(list(DeltaSchema.from_arrow(pa.schema(missing)).fields))
    except CommitFailedError:
        pass  # another process added them first
    return DeltaTable(table_uri(store, name), storage_options=store.storage_options())


def open_table(store: Store, name: str, version: int | None = None) -> DeltaTable:
    """Open an existing table, optionally at ``version`` (time travel).

    Raises ``deltalake.exceptions.TableNotFoundError`` if it does not exist.
    """
    return DeltaTable(table_uri(store, name), version=version, storage_options=store.storage_options())


class LatestTables:
    """Delta tables kept open between uses, each brought to its latest version whenever it is asked for.

    What a speed layer's driver holds from one micro-batch to the next: a batch asks for each table to plan
    and again to commit (and for ``metric_windows_1m`` and the alert inputs in between). Opening a table reads
    its last checkpoint and every commit after it; bringing an open one up to date
    (``DeltaTable.update_incremental``) reads only the commits made since it was last asked for. A table asked
    for the first time is opened with :func:`ensure_table` (created or evolved if need be). A table with no commit
    after the version it holds is handed out without asking delta-rs (:func:`committed_after`). If bringing a table
    up to date raises a ``DeltaError`` (an object store that failed a read, say), the table is dropped and opened
    again, so a half-updated table is never handed out; the open raises if the cause persists. (delta-rs 1.6
    brings a table up to date from a checkpoint when the commits before it were cleaned up or unreadable:
    tried.) A table deleted and made again under the same name is not noticed: nothing in the lake does that
    while a stream runs.

    Keeping them open saves about 0.09 s of a 1.2 s batch at 200,000 events/s (docs/performance.md, "Tables kept
    open between batches"). Each is a :class:`~metrics_lake.core.tables.app_transactions.FollowedTable`: its
    ``transaction_version`` asks delta-rs once per appId and then follows the commits.

    A returned table is the caller's to read and commit on until it asks for the same name again; it must not
    be moved to another version (``load_as_version``). Not for concurrent use (a stream commits one batch at a
    time, whichever thread runs it).
    """

    def __init__(self) -> None:
        self._tables: dict[str, DeltaTable] = {}

    def latest(self, store: Store, name: str) -> DeltaTable:
        """Table ``name`` of ``store`` at its latest version; raises as :func:`ensure_table` does."""
        uri = table_uri(store, name)
        table = self._tables.get(uri)
        if table is not None:
            if not committed_after(store, name, table.version()):
                return table
            try:
                table.update_incremental()
                return table
            except DeltaError:
                del self._tables[uri]  # reopened below: that raises the error that matters, if any
        table = self._tables[uri] = followed(store, name, ensure_table(store, name))
        return table


def committed_after(store: Store, name: str, version: int) -> bool:
    """Whether table ``name`` has a version after ``version``: its commit ``version + 1`` exists (Delta versions
    are consecutive, and a commit is created whole, put-if-absent), or commit ``version`` itself no longer does
    (log retention cleaned the log up past it: cleanup removes the oldest commits first, and only those before a
    newer checkpoint, so a table left unasked for longer than the log retention is still brought up to date).

    Two stats (HEADs on S3) instead of ``update_incremental``'s listing, which on a local lake reads every
    entry the log holds: about 10 of the 16 a batch asks for find nothing new (counted over 25 batches:
    257 of 404), and each listing costs about 1.5 µs per log entry (docs/performance.md, "The Delta log's
    length"). Raises what the store raises for a failed stat other than a missing object.
    """
    return _exists(store, keys.table_commit_key(name, version + 1)) or not _exists(
        store, keys.table_commit_key(name, version)
    )


def _exists(store: Store, key: str) -> bool:
    """Whether object ``key`` exists (a stat)."""
    try:
        store.size(key)
    except FileNotFoundError:
        return False
    return True


def table_dataset(store: Store, name: str, table: DeltaTable | None = None) -> pads.Dataset:
    """The snapshot of ``table`` (default: table ``name``'s latest) as a pyarrow dataset.

    Each file's partition values and min/max statistics are its fragment's
    partition expression (delta-rs), so ``.to_table(columns=..., filter=expr)``
    skips the files that cannot match and filters the rows of the others.

    The files are read through the store's own Arrow file system
    (:meth:`~metrics_lake.core.storage.Store.arrow_fs`), not through
    ``DeltaTable.to_pyarrow_dataset()``'s default, delta-rs's Python file
    system (a ``pyarrow.fs.PyFileSystem``): with that one Arrow's I/O threads
    call into Python, and a call still under way when the interpreter exits
    ends in ``pthread_exit`` inside C++ and ``std::terminate``. Measured with
    8 concurrent short processes, each reading one ``lake replay`` chunk's
    positions from ``bronze_events`` on S3 and exiting: through
    ``to_pyarrow_table`` 19 and 23 of 400 died with "terminate called without
    an active exception" (SIGABRT, exit -6), through this function 0 of 400,
    twice (apache/arrow#39162 and #50482 report the same with other Python
    file systems).

    Raises ``deltalake.exceptions.TableNotFoundError`` if the table does not
    exist, ``deltalake.exceptions.DeltaProtocolError`` if it needs reader
    features delta-rs's pyarrow reader lacks.
    """
    filesystem, path = table_folder(store, name)
    folder = pafs.SubTreeFileSystem(path, filesystem)
    return (table if table is not None else open_table(store, name)).to_pyarrow_dataset(filesystem=folder)


def list_tables(store: Store) -> list[str]:
    """Names of tables that exist under ``tables/`` (a folder with a Delta log), sorted."""
    return [
        name
        for name in store.list(keys.TABLES_PREFIX)
        if keys.is_name(name) and store.exists(keys.table_key(name, "_delta_log"))
    ]


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
