"""How far the speed layer got, as its tables record it: positions, watermark, and what follows from them.

Every table the speed layer writes records, per log partition, the next
offset it holds (a Delta ``txn`` action of appId
``speed-layer/<topic>/<partition>``, :mod:`metrics_lake.core.tables.commits`),
and ``metric_windows_1m`` records the watermark (epoch ms, appId
``speed-layer/<topic>/watermark``) in the same commits as their data
(:mod:`metrics_lake.core.speed.micro_batch` writes them). This module reads
them back for everyone who must know the speed layer's progress without
running it: where a stream without a checkpoint starts
(:func:`starting_offsets`), which days maintenance must leave alone
(:func:`rewritable_from`), how fresh the windows are (:func:`newest_window_end`,
the dashboard and the quality checks), and which revision of each stored
query ``query_results`` holds (:func:`query_progress`).

``last_seen`` and ``alerts`` describe the present, not the history: when
they first appear in a lake that already holds data (an upgrade), they
start from the windows table's positions instead of the log's start
(:func:`table_positions`), so adding them does not make the speed layer
read the whole retained log again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from metrics_lake.core.log.consumer import start_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import committed_offsets
from metrics_lake.core.tables.delta import LatestTables, open_table
from metrics_lake.lake_schemas.table_access import STREAM
from metrics_lake.lake_schemas.tables import TABLES, Table
from metrics_lake.lake_schemas.types import utc_time

__all__ = [
    "CONSUMER",
    "WINDOW_SECONDS",
    "QueryProgress",
    "backfilled_through_app_id",
    "backfill_revision_app_id",
    "live_revision_app_id",
    "query_progress",
    "first_open_day",
    "newest_window_end",
    "window_start_bounds",
    "rewritable_from",
    "starting_offsets",
    "table_positions",
    "watermark_app_id",
]

#: The consumer the tables' positions belong to (``txn`` appId prefix), also the consumer group name.
CONSUMER = "speed-layer"
#: Length of the speed layer's tumbling windows, in seconds (the 1-minute windows table's).
WINDOW_SECONDS = TABLES[Table.METRIC_WINDOWS_1M].window_seconds
#: Tables the speed layer rewrites (upserts); the others it only appends to.
_REWRITTEN = (Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS)
#: Tables that start where the windows are when they first appear (module docstring).
_FOLLOWERS = (Table.LAST_SEEN, Table.ALERTS)


def watermark_app_id(topic: str) -> str:
    """The ``txn`` appId under which the windows table records the speed layer's watermark (epoch ms)."""
    return f"{CONSUMER}/{topic}/watermark"


def live_revision_app_id(query: str) -> str:
    """The ``txn`` appId under which ``query_results`` records the revision of ``query`` the speed layer adopted."""
    return f"{CONSUMER}/query/{query}/revision"


def backfill_revision_app_id(query: str) -> str:
    """The ``txn`` appId under which ``query_results`` records the revision of ``query`` last backfilled."""
    return f"backfill/query/{query}/revision"


def backfilled_through_app_id(query: str) -> str:
    """The ``txn`` appId recording up to which watermark (epoch ms) that backfill replaced the windows."""
    return f"backfill/query/{query}/through"


@dataclass(frozen=True)
class QueryProgress:
    """What ``query_results`` holds of one stored query (``None``: never).

    ``live_revision``: the config store revision the speed layer evaluates (it
    replaced every window ending after its watermark then);
    ``backfilled_revision``: the revision whose closed windows the backfill
    replaced, up to ``backfilled_through_ms`` (a watermark, epoch ms).
    """

    live_revision: int | None
    backfilled_revision: int | None
    backfilled_through_ms: int | None

    def is_live(self, revision: int) -> bool:
        """Whether the speed layer evaluates ``revision`` (it adopted it)."""
        return self.live_revision == revision

    def is_backfilled(self, revision: int) -> bool:
        """Whether the backfill replaced the closed windows of ``revision``."""
        return self.backfilled_revision == revision

    def backfilled(self, revision: int) -> bool:
        """Whether every retained window of ``revision`` is in the table (backfill and live both at it)."""
        return self.is_backfilled(revision) and self.is_live(revision)


def query_progress(query_results: DeltaTable, query: str) -> QueryProgress:
    """Read :class:`QueryProgress` of ``query`` from the ``txn`` actions of the ``query_results`` snapshot."""
    return QueryProgress(
        query_results.transaction_version(live_revision_app_id(query)),
        query_results.transaction_version(backfill_revision_app_id(query)),
        query_results.transaction_version(backfilled_through_app_id(query)),
    )


def window_start_bounds(table: DeltaTable) -> tuple[int | None, int | None]:
    """The oldest and newest ``window_start`` (epoch µs) of a windowed table, from its files' statistics (no data
    read); Nones when it has no file."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0 or "max.window_start" not in actions.column_names:
        return None, None
    oldest = pc.min(pc.cast(actions.column("min.window_start"), pa.int64())).as_py()
    newest = pc.max(pc.cast(actions.column("max.window_start"), pa.int64())).as_py()
    return (None, None) if oldest is None or newest is None else (int(oldest), int(newest))


def newest_window_end(windows: DeltaTable) -> dt.datetime | None:
    """End of the newest 1-minute window of ``metric_windows_1m`` (its files' statistics, no data read), or None."""
    _, newest = window_start_bounds(windows)
    if newest is None:
        return None
    return utc_time(newest) + dt.timedelta(seconds=WINDOW_SECONDS)


#: The tables the speed layer commits with its log positions, in commit order (every table it writes but
#: ``servers``, a fold of the inventory).
POSITION_TABLES = tuple(name for name in STREAM.writes if name != Table.SERVERS)


def table_positions(
    store: Store, name: str, topic: str, partitions, tables: LatestTables | None = None
) -> dict[int, int | None]:
    """Per log partition, the next offset table ``name`` holds for the speed layer (None: nothing yet).

    A table of :data:`_FOLLOWERS` that never committed starts at the windows
    table's positions (module docstring). ``tables``: where to get the tables
    (default: opened for this call; created if absent either way).
    """
    tables = tables or LatestTables()
    marks = committed_offsets(tables.latest(store, name), CONSUMER, topic, partitions)
    if name in _FOLLOWERS and all(mark is None for mark in marks.values()):
        return committed_offsets(tables.latest(store, Table.METRIC_WINDOWS_1M), CONSUMER, topic, partitions)
    return marks


def starting_offsets(store: Store, topic: str, tables: LatestTables | None = None) -> dict[int, int]:
    """Where a speed layer with no checkpoint starts: per partition, the lowest position any of its tables holds.

    ``tables``: tables the caller keeps open between calls (the ``lakelog`` source asks at every trigger:
    10 ms instead of 32 ms with the six tables opened anew, measured); default: opened for this call.
    """
    log = SegmentLog(store)
    first = start_offsets(log, topic)
    tables = tables or LatestTables()
    marks = [table_positions(store, name, topic, first, tables) for name in POSITION_TABLES]
    return {p: min(max(m[p] or 0, first[p]) for m in marks) for p in first}


def rewritable_from(store: Store, table: str) -> dt.date | None:
    """The first day of ``table`` the speed layer may still rewrite (compaction must leave it alone), or None.

    Only ``metric_windows_1m`` and ``query_results`` are rewritten day by day (bronze, quarantine and alerts are
    append-only); ``last_seen`` is rewritten whole by every micro-batch, so every day of it stays open.
    """
    if table == Table.LAST_SEEN:
        return dt.date.min
    return first_open_day(store) if table in _REWRITTEN else None


def first_open_day(store: Store) -> dt.date | None:
    """The first UTC day of ``metric_windows_1m`` the speed layer may still rewrite, over every topic.

    The day of the lowest recorded watermark; windows before it are closed
    and never rewritten again (the watermark never moves back). Before the
    speed layer recorded any watermark it may touch any day: returns
    ``dt.date.min`` then. ``None`` if the lake has no topic.
    """
    topics = SegmentLog(store).topics()
    if not topics:
        return None
    try:
        table = open_table(store, Table.METRIC_WINDOWS_1M)
    except TableNotFoundError:
        return None
    marks = [table.transaction_version(watermark_app_id(topic)) for topic in topics]
    if any(mark is None for mark in marks):
        return dt.date.min
    return dt.datetime.fromtimestamp(min(marks) / 1000, dt.UTC).date()
