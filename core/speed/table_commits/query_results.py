"""Live stored queries: after each micro-batch, every query window holding a minute it touched is evaluated again.

The windows come from ``metric_windows_1m`` as committed (this batch's included), and ``query_results`` gets the
re-evaluated windows' rows in one commit with its log positions (:func:`upsert_query_results`), so the table is
exact after a crash or a lost checkpoint, and the rows are those the nightly evaluation
(:mod:`metrics_lake.spark.jobs.evaluate_queries`) computes from the same windows.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Transaction

from metrics_lake.core.kernels.stored_queries import (
    MinuteMerge,
    ServerRows,
    StoredQuery,
    affected_windows,
    query_rows,
    window_span,
    window_states,
)
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states
from metrics_lake.core.speed.batch_plan import QUERIES, WINDOWS, BatchPlan
from metrics_lake.core.speed.open_windows import OpenWindows, minute_files
from metrics_lake.core.speed.progress import (
    CONSUMER,
    backfill_revision_app_id,
    backfilled_through_app_id,
    live_revision_app_id,
    query_progress,
    window_start_bounds,
)
from metrics_lake.core.speed.table_commits.batch import ProcessedBatch
from metrics_lake.core.speed.table_commits.positions import commit_with_positions
from metrics_lake.core.speed.table_commits.windows import write_window_files
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, offset_transactions, remove_action
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.core.tables.snapshots import DataFile, days_between, read_data_file, read_data_files, windowed_files
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M, QUERY_RESULTS

__all__ = [
    "QueryResultsCommit",
    "upsert_query_results",
]


def upsert_query_results(
    store: Store,
    tables: LatestTables,
    plan: BatchPlan,
    touched: dict[str, set[int]],
    queries: list[StoredQuery],
    watermark: int | None,
    open_windows: OpenWindows | None = None,
) -> int:
    """Evaluate again every stored query window holding a ``touched`` minute and replace its rows; returns rows.

    The windows are read from ``metric_windows_1m`` as committed (this
    batch's states included; files ``open_windows`` keeps are not read
    again), so the rows are those the nightly evaluation would compute from
    the same windows.

    A query whose config store revision ``query_results`` does not hold yet (new
    or changed since the last batch) is *adopted*: every window of it ending
    after a cutoff is evaluated and every row of it ending after the cutoff
    replaced, and the revision recorded (``txn``, same commit). The cutoff is
    where the backfill of this revision stopped if it ran first, else the
    watermark; the backfill (:mod:`metrics_lake.core.maintenance.query_backfill`)
    replaces the closed windows up to its own watermark, so together they
    cover every retained window without a gap, whichever runs first.
    """
    written = 0
    affected = {
        q.name: affected_windows(q, np.array(sorted(touched[q.metric]), np.int64))
        for q in queries
        if q.metric in touched
    }
    affected = {name: starts for name, starts in affected.items() if len(starts)}
    by_name = {q.name: q for q in queries}
    if open_windows is not None:
        open_windows.forget_queries_except(by_name)

    def commit(table, advances: dict[int, int]) -> None:
        nonlocal written
        files, removes, transactions, open_files, untouched = [], [], [], {}, {}
        starts = dict(affected)
        cutoffs: dict[str, int | None] = {}  # adopted query -> rows ending after this (epoch µs) are replaced
        for query in queries:
            live = table.transaction_version(live_revision_app_id(query.name))  # one lookup per query and batch
            if live is not None and live >= query.revision:
                continue
            progress = query_progress(table, query.name)
            if progress.backfilled_revision == query.revision and progress.backfilled_through_ms is not None:
                cutoffs[query.name] = progress.backfilled_through_ms * 1000
            else:  # before the first watermark no window was closed: adopting evaluates every window there is
                cutoffs[query.name] = None if plan.watermark_ms is None or watermark is None else watermark * 1000
            transactions.append(Transaction(live_revision_app_id(query.name), query.revision))
            if cutoffs[query.name] is None:  # no window is closed yet: adopting covers all, nothing to backfill
                transactions += [
                    Transaction(backfill_revision_app_id(query.name), query.revision),
                    Transaction(backfilled_through_app_id(query.name), 0),
                ]
            adopted = _windows_after(store, tables, query, cutoffs[query.name])
            if len(adopted):
                starts[query.name] = np.union1d(starts.get(query.name, np.zeros(0, np.int64)), adopted)
        if starts or cutoffs:
            chosen = [by_name[name] for name in starts]
            results = QUERY_RESULTS.empty_table()
            if chosen:
                states = _query_states(store, tables, chosen, starts, open_windows)
                results = query_rows(merge_states(states), chosen, None, dt.datetime.now(dt.UTC))
            replaced = pa.table(
                {
                    "query": pa.array([n for n, s in starts.items() for _ in s], pa.string()),
                    "window_start": pa.array(
                        np.concatenate([np.zeros(0, np.int64), *starts.values()]), pa.int64()
                    ).cast(QUERY_RESULTS.field("window_start").type),
                }
            )
            # Only files holding a replaced row are rewritten: files of closed windows (and of other queries)
            # often overlap the range by their statistics but stay as they are.
            rewritten, kept = [], []
            for candidate in _result_files(store, table, starts, cutoffs, by_name):
                existing = open_windows.result_rows(candidate) if open_windows is not None else None
                if existing is None:
                    keys = read_data_files(store, [candidate], QUERY_RESULTS, ["query", "window_start", "window_end"])
                    if not _replaced_mask(keys, replaced, cutoffs).any():
                        continue
                    existing = read_data_files(store, [candidate], QUERY_RESULTS).select(QUERY_RESULTS.names)
                replaced_rows = _replaced_mask(existing, replaced, cutoffs)
                if not replaced_rows.any():
                    untouched[candidate.relative] = existing  # kept rows of a file this batch leaves as it is
                    continue
                rewritten.append(candidate)
                kept.append(existing.filter(pa.array(~replaced_rows)))
            rows = pa.concat_tables([*kept, results])
            sealed_before_us = None if watermark is None else watermark * 1000
            files, open_files = write_window_files(store, rows, sealed_before_us, name=QUERIES)
            removes = [remove_action(f) for f in rewritten]
            written = results.num_rows
        commit_changes(
            table,
            QUERIES,
            files,
            removes,
            transactions=offset_transactions(CONSUMER, plan.topic, advances) + transactions,
            operation="STREAMING QUERIES",
        )
        if open_windows is not None and (starts or cutoffs):
            # The open query windows' files this commit wrote are the next batch's files to rewrite: their rows
            # are kept instead of read back (a file is immutable and its name unique, so they are its content).
            open_windows.remember_results(untouched | open_files)

    return written if commit_with_positions(store, tables, plan, QUERIES, commit) else 0


def _windows_after(store: Store, tables: LatestTables, query: StoredQuery, cutoff_us: int | None) -> np.ndarray:
    """Starts (epoch µs, sorted) of ``query``'s windows ending after ``cutoff_us`` (None: all) that hold a minute
    of the committed windows table."""
    table = tables.latest(store, WINDOWS)
    oldest, newest = window_start_bounds(table)
    if newest is None:
        return np.zeros(0, np.int64)
    lo = oldest if cutoff_us is None else max(oldest, cutoff_us - query.duration_s * 1_000_000)
    if newest < lo:
        return np.zeros(0, np.int64)
    # Only the minutes: reading the window states (sketches) here cost most of a first batch's query results.
    files = _window_files(store, tables, lo, newest + 1)
    windows = _read_windows(store, {query.metric: files}, lo, newest + 1, columns=["metric", "window_start"])
    minutes = np.unique(pc.cast(windows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False))
    starts = affected_windows(query, minutes)
    return starts if cutoff_us is None else starts[starts + query.duration_s * 1_000_000 > cutoff_us]


def _result_files(store: Store, table, starts: dict, cutoffs: dict, by_name: dict) -> list:
    """Files of ``query_results`` that may hold a row to replace: by ``window_start`` statistics, of a replaced
    window, or ending after an adopted query's cutoff (a query's old text may have had windows up to a day)."""
    oldest, newest = window_start_bounds(table)
    if newest is None:
        return []
    lows = [int(s[0]) for s in starts.values() if len(s)]
    lows += [oldest if cut is None else cut - 86_400_000_000 for cut in cutoffs.values()]
    if not lows:
        return []
    lo = max(min(lows), oldest)
    hi = max([newest, *(int(s[-1]) for s in starts.values() if len(s))])
    if hi < lo:
        return []
    return windowed_files(store, QUERIES, table, days_between(lo, hi + 1), lo, hi)


def _replaced_mask(rows: pa.Table, replaced: pa.Table, cutoffs: dict[str, int | None]) -> np.ndarray:
    """Which ``query_results`` rows a batch replaces: a re-evaluated ``(query, window_start)``, or a row of an
    adopted query ending after its cutoff."""
    start = pc.cast(rows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
    keys = pa.table({"query": rows.column("query"), "window_start": pa.array(start), "i": np.arange(rows.num_rows)})
    wanted = pa.table(
        {"query": replaced.column("query"), "window_start": pc.cast(replaced.column("window_start"), pa.int64())}
    )
    mask = np.zeros(rows.num_rows, bool)
    hit = keys.join(wanted, ["query", "window_start"], join_type="left semi").column("i").to_numpy()
    mask[hit] = True
    if cutoffs:
        names = rows.column("query").to_numpy(zero_copy_only=False)
        end = pc.cast(rows.column("window_end"), pa.int64()).to_numpy(zero_copy_only=False)
        for name, cut in cutoffs.items():
            mask |= (names == name) & (end > (-1 if cut is None else cut))
    return mask


def _query_states(
    store: Store,
    tables: LatestTables,
    queries: list[StoredQuery],
    starts: dict[str, np.ndarray],
    open_windows: OpenWindows | None,
) -> pa.Table:
    """Window states of each of ``queries``' windows starting at ``starts[name]`` (epoch µs, sorted), from the
    committed windows table (:func:`~metrics_lake.core.kernels.stored_queries.window_states`).

    Without ``open_windows`` every file of the windows' minutes is read and
    every minute merged. With it, only the files covering a minute whose
    rows are needed are taken (from what it keeps, else read): each minute
    of a ``PER SERVER`` query's windows, and the minutes it merges again for
    the others (:meth:`~metrics_lake.core.speed.open_windows.OpenWindows.stale_minutes`);
    the rest of each minute comes merged from the evaluation before, and a ``PER SERVER`` query's settled
    minutes too (:meth:`~metrics_lake.core.speed.open_windows.OpenWindows.settled_minutes`).
    """
    spans = {q.name: window_span(q, starts[q.name]) for q in queries}
    lo, hi = min(span[0] for span in spans.values()), max(span[1] for span in spans.values())
    files = _window_files(store, tables, lo, hi)
    merges: dict[str, MinuteMerge | None] = dict.fromkeys(spans)
    settles: dict[str, ServerRows | None] = dict.fromkeys(spans)
    needed: dict[str, list[DataFile]] = {q.metric: files for q in queries}
    if open_windows is not None:
        wanted: dict[str, set[str]] = {}  # metric -> paths of the files whose rows of it are needed
        for query in queries:
            coverage = minute_files(files, *spans[query.name])
            minutes = coverage if query.per_server else open_windows.stale_minutes(query, coverage)
            wanted.setdefault(query.metric, set()).update(*(coverage[at] for at in minutes))
            merges[query.name] = partial(open_windows.merged_minutes, coverage=coverage)
            settles[query.name] = partial(open_windows.settled_minutes, coverage=coverage)
        needed = {metric: [f for f in files if f.relative in paths] for metric, paths in wanted.items()}
    windows = _read_windows(store, needed, lo, hi, open_windows=open_windows)
    states = [window_states(windows, q, starts[q.name], merges[q.name], settles[q.name]) for q in queries]
    return pa.concat_tables(states)


def _window_files(store: Store, tables: LatestTables, lo_us: int, hi_us: int) -> list[DataFile]:
    """Files of the committed windows table that may hold a ``window_start`` in ``[lo_us, hi_us)`` (statistics)."""
    table = tables.latest(store, WINDOWS)
    return windowed_files(store, WINDOWS, table, days_between(lo_us, hi_us), lo_us, hi_us - 1)


def _read_windows(
    store: Store,
    needed: dict[str, list[DataFile]],
    lo_us: int,
    hi_us: int,
    columns: list[str] | None = None,
    open_windows: OpenWindows | None = None,
) -> pa.Table:
    """Window states with ``lo_us <= window_start < hi_us`` of each metric of ``needed`` from the files it names
    (metric -> files of the committed windows table).

    ``columns``: those to read, ``metric`` and ``window_start`` among them
    (default: every column of :data:`~metrics_lake.core.kernels.windows.WINDOW_STATE`). A file's rows of
    its metrics come from ``open_windows`` if it keeps them, else from the
    file with the metric filter pushed into the Parquet reader; ``open_windows``
    then keeps what this call took from each file, and only that
    (:mod:`metrics_lake.core.speed.open_windows`).
    """
    names = tuple(columns or WINDOW_STATE.names)
    target = pa.schema([METRIC_WINDOWS_1M.field(c) for c in names])
    by_path: dict[str, DataFile] = {}
    metrics_of: dict[str, set[str]] = {}
    for metric, files in needed.items():
        for data_file in files:
            by_path[data_file.relative] = data_file
            metrics_of.setdefault(data_file.relative, set()).add(metric)
    filesystem, _ = store.arrow_fs()
    selections: dict[str, tuple[frozenset[str], pa.Table]] = {}
    for path, data_file in by_path.items():
        metrics = frozenset(metrics_of[path])
        kept = open_windows.selection_of(data_file, metrics, names) if open_windows is not None else None
        if kept is None:
            of_metrics = pc.field("metric").isin(pa.array(sorted(metrics), pa.string()))
            kept = read_data_file(data_file, METRIC_WINDOWS_1M, filesystem, list(names), rows=of_metrics)
        selections[path] = (metrics, kept.cast(target))
    if open_windows is not None:
        open_windows.keep_selections(names, selections)
    rows = pa.concat_tables([rows for _, rows in selections.values()]) if selections else target.empty_table()
    start = pc.cast(rows.column("window_start"), pa.int64())
    return rows.filter(pc.and_(pc.greater_equal(start, lo_us), pc.less(start, hi_us)))


@dataclass(frozen=True)
class QueryResultsCommit:
    """Evaluates again every stored query window holding a minute the batch's windows touched and replaces its
    rows in ``query_results`` (:func:`upsert_query_results`); :meth:`commit` returns the rows written."""

    table: str = QUERIES

    def commit(self, batch: ProcessedBatch) -> int:
        """Commit the touched query windows' rows; returns them (0 if the table held the positions)."""
        touched: dict[str, set[int]] = {}
        for result in batch.results:
            for metric, minutes in result.touched.items():
                touched.setdefault(metric, set()).update(minutes)
        return upsert_query_results(
            batch.store, batch.tables, batch.plan, touched, batch.queries, batch.watermark_ms, batch.open_windows
        )
