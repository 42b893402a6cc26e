"""Backfill of stored queries: a new or changed query's closed windows over every retained day, and purges.

The speed layer keeps a query live from the moment it adopts its revision
(:mod:`metrics_lake.core.speed.micro_batch`: windows ending after its
watermark). The windows before that are the batch layer's to fill, off the
hot path: :func:`backfill_queries` evaluates every window of the query that
holds a retained 1-minute window and ended by the watermark (closed: the
speed layer never changes its minutes again), replaces every row of the
query ending by then in one Delta commit, and records the revision and the
watermark it covered (``txn`` actions of ``query_results``,
:func:`metrics_lake.core.speed.progress.query_progress`). Readers see the
old rows or the new ones, never a mix.

The evaluation is the one the stream and the nightly run use
(:func:`metrics_lake.core.kernels.stored_queries.query_states`, a day at a
time over days D-1 and D of the windows), so a backfilled row equals the
nightly row of the same windows. It runs in this process with Arrow, one
query and one day in memory at a time: one metric's 1-minute windows of two
days (about 2,880 rows per series).

:func:`purge_query` deletes every row of a query (``lake queries rm --purge``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Transaction

from metrics_lake.core.kernels.stored_queries import StoredQuery, query_rows, query_states
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states
from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.speed.progress import (
    backfill_revision_app_id,
    backfilled_through_app_id,
    query_progress,
    watermark_app_id,
)
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, remove_action, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.core.tables.snapshots import read_data_files, snapshot_files
from metrics_lake.lake_schemas.table_access import QUERIES
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M, QUERY_RESULTS

__all__ = ["BackfillResult", "backfill_queries", "pending_backfills", "purge_query"]

_WINDOWS, _RESULTS = QUERIES.reads  # the windows evaluated, and the results (also written)


@dataclass(frozen=True)
class BackfillResult:
    """One query's backfill: its revision, the days evaluated, rows written, the watermark covered (epoch ms)."""

    query: str
    revision: int
    days: int
    rows: int
    through_ms: int | None
    seconds: float


def pending_backfills(store: Store, queries: list[StoredQuery]) -> list[StoredQuery]:
    """The queries whose current revision ``query_results`` has not backfilled yet."""
    table = ensure_table(store, _RESULTS)
    return [q for q in queries if not query_progress(table, q.name).is_backfilled(q.revision)]


def backfill_queries(
    store: Store,
    topic: str,
    queries: list[StoredQuery],
    *,
    progress: Callable[[BackfillResult], None] | None = None,
) -> list[BackfillResult]:
    """Backfill each of ``queries`` (module docstring) up to the speed layer's watermark on ``topic``.

    Before the speed layer recorded a watermark every window counts as
    closed: the backfill then covers all retained windows. Returns one
    :class:`BackfillResult` per query, in order, calling ``progress`` after each.
    """
    ensure_table(store, _RESULTS)
    results = []
    for query in queries:
        result = _backfill_one(store, topic, query)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def _backfill_one(store: Store, topic: str, query: StoredQuery) -> BackfillResult:
    started = time.monotonic()
    windows_table = ensure_table(store, _WINDOWS)
    through_ms = windows_table.transaction_version(watermark_app_id(topic))
    through_us = None if through_ms is None else through_ms * 1000
    all_files = snapshot_files(store, _WINDOWS, windows_table)
    days = sorted({dict(f.partition_values)["event_date"] for f in all_files})
    computed_at = dt.datetime.now(dt.UTC)
    pieces = []
    by_day: dict[str, pa.Table] = {}  # the query's metric's minutes per day, read once each

    def minutes_of(day: str) -> pa.Table:
        if day not in by_day:
            files = [f for f in all_files if dict(f.partition_values)["event_date"] == day]
            rows = read_data_files(store, files, METRIC_WINDOWS_1M, WINDOW_STATE.names)
            by_day[day] = rows.filter(pc.equal(rows.column("metric"), query.metric))
        return by_day[day]

    for day in [dt.date.fromisoformat(d) for d in days]:
        # A window belongs to the day of its last minute, so day D's windows read the minutes of D-1 and D.
        previous = (day - dt.timedelta(days=1)).isoformat()
        minutes = pa.concat_tables([minutes_of(previous), minutes_of(day.isoformat())])
        by_day.pop(previous)  # no later day needs it
        states = query_states(minutes, query, day)
        if through_us is not None and states.num_rows:
            end = pc.cast(states.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
            states = states.filter(pa.array(end + query.duration_s * 1_000_000 <= through_us))
        if states.num_rows:
            pieces.append(query_rows(merge_states(states), [query], day, computed_at))
    rows = pa.concat_tables(pieces) if pieces else QUERY_RESULTS.empty_table()

    def replaced(data: pa.Table) -> np.ndarray:
        mine = pc.equal(data.column("query"), query.name).to_numpy(zero_copy_only=False)
        if through_us is None:
            return mine
        end = pc.cast(data.column("window_end"), pa.int64()).to_numpy(zero_copy_only=False)
        return mine & (end <= through_us)

    transactions = [
        Transaction(backfill_revision_app_id(query.name), query.revision),
        Transaction(backfilled_through_app_id(query.name), _through_recorded(through_ms, rows)),
    ]
    _rewrite(store, replaced, rows, transactions, f"BACKFILL QUERY {query.name}")
    return BackfillResult(query.name, query.revision, len(days), rows.num_rows, through_ms, time.monotonic() - started)


def _through_recorded(through_ms: int | None, rows: pa.Table) -> int:
    """The watermark (epoch ms) a backfill recorded as covered: the speed layer's, else the newest window end."""
    if through_ms is not None:
        return through_ms
    if rows.num_rows == 0:
        return 0
    return int(pc.max(pc.cast(rows.column("window_end"), pa.int64())).as_py() // 1000)


def purge_query(store: Store, name: str) -> int:
    """Delete every ``query_results`` row of stored query ``name`` in one commit; returns the rows deleted."""
    ensure_table(store, _RESULTS)
    return _rewrite(
        store,
        lambda data: pc.equal(data.column("query"), name).to_numpy(zero_copy_only=False),
        QUERY_RESULTS.empty_table(),
        [],
        f"PURGE QUERY {name}",
    )


def _rewrite(
    store: Store, replaced: Callable[[pa.Table], np.ndarray], rows: pa.Table, transactions: list, operation: str
) -> int:
    """Replace the ``query_results`` rows that ``replaced`` marks by ``rows``, in one commit; returns rows replaced.

    Only files holding a replaced row are rewritten (their other rows kept).
    Retried on a fresh snapshot when a concurrent commit (the speed layer,
    compaction) wins. Holds the table's maintenance lease: the stream's
    continuous compaction merges the same closed windows' files, and delta-rs
    would let both commits remove one file
    (:func:`~metrics_lake.core.leases.maintenance_lease`).
    """

    def attempt() -> int:
        table = ensure_table(store, _RESULTS)
        rewritten, kept, dropped = [], [], 0
        for data_file in snapshot_files(store, _RESULTS, table):
            keys = read_data_files(store, [data_file], QUERY_RESULTS, ["query", "window_end"])
            hits = int(np.count_nonzero(replaced(keys)))
            if not hits:
                continue
            existing = read_data_files(store, [data_file], QUERY_RESULTS)
            rewritten.append(data_file)
            kept.append(existing.filter(pa.array(~replaced(existing))))
            dropped += hits
        files = write_data_files(store, _RESULTS, pa.concat_tables([*kept, rows]))
        commit_changes(
            table,
            _RESULTS,
            files,
            [remove_action(f) for f in rewritten],
            transactions=transactions,
            operation=operation,
        )
        return dropped

    with maintenance_lease(store, _RESULTS):
        return retry_on_conflict(attempt, _RESULTS)
