"""The speed layer's commit to ``metric_windows_1m``: the batch's window states merged into the files they touch.

**Window files.** Upserting windows rewrites the files holding the windows a
batch touched (one commit: remove the old files, add the new ones, record
positions). Rewritten rows are laid out so that later batches touch little:
windows that the new watermark has closed go to one *sealed* file per day
(never touched by the speed layer again), open windows to one file per
window (a large upsert runs on several threads, one shard of the series
each, and writes both kinds of file per shard:
:func:`_merge_and_write_windows`). A stream's driver keeps the rows of the
open-window files it committed last (:mod:`metrics_lake.core.speed.open_windows`)
and merges the next batch into them rather than reading them back, and the stored queries'
rows it took from each window file, so their evaluation reads a file at most
once; the table stays the truth: only files of the snapshot a batch plans
from are looked up.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Transaction

from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_into_rows, merge_states, series_shards
from metrics_lake.core.log.producer import group_by_partition
from metrics_lake.core.speed.batch_plan import WINDOWS, BatchPlan
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import CONSUMER, WINDOW_SECONDS, watermark_app_id
from metrics_lake.core.speed.table_commits.batch import ProcessedBatch
from metrics_lake.core.speed.table_commits.positions import commit_with_positions
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, offset_transactions, remove_action
from metrics_lake.core.tables.data_files import WrittenFile, write_data_files
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.core.tables.snapshots import DataFile, read_data_files, windowed_files
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M
from metrics_lake.lake_schemas.types import utc_dates

__all__ = [
    "UPSERT_ROWS_PER_SHARD",
    "WindowsCommit",
    "UPSERT_THREADS",
    "upsert_windows",
    "write_window_files",
]


def write_window_files(
    store: Store, rows: pa.Table, sealed_before_us: int | None, name: str = WINDOWS
) -> tuple[list[WrittenFile], dict[str, pa.Table]]:
    """Window rows of table ``name`` as files: closed windows (end <= ``sealed_before_us``) one file per day, open
    ones one per window (start, end) (of ``rows``: a shard's, when the caller splits them). Returns the files, and
    the rows of each open window's file by its Delta log path (what
    :class:`~metrics_lake.core.speed.open_windows.OpenWindows` keeps).

    Why (start, end) and not the start alone: a window's rows are one day's (one partition, one file) only
    together with its end. ``query_results`` dates a window by its last minute, so two stored queries' windows
    that start together at 23:58 may end on either side of midnight (a 2-minute and a 3-minute window)."""
    if rows.num_rows == 0:
        return [], {}
    end_us = rows.column("window_end").cast(pa.int64()).to_numpy(zero_copy_only=False)
    sealed = end_us <= sealed_before_us if sealed_before_us is not None else np.zeros(rows.num_rows, bool)
    files = write_data_files(store, name, rows.filter(pa.array(sealed)))
    open_files = {}
    open_rows = rows.filter(pa.array(~sealed))
    if open_rows.num_rows:
        starts = open_rows.column("window_start").cast(pa.int64()).to_numpy(zero_copy_only=False)
        ends = open_rows.column("window_end").cast(pa.int64()).to_numpy(zero_copy_only=False)
        order = np.lexsort((ends, starts))
        if np.any(order[1:] < order[:-1]):  # most batches touch one minute: rows already in order, no copy
            open_rows, starts, ends = open_rows.take(pa.array(order)), starts[order], ends[order]
        bounds = np.flatnonzero((np.diff(starts) != 0) | (np.diff(ends) != 0)) + 1
        for lo, hi in zip([0, *bounds], [*bounds, len(starts)], strict=True):
            window = open_rows.slice(int(lo), int(hi - lo))
            (data_file,) = write_data_files(store, name, window)  # one window (start, end): one day, one file
            files.append(data_file)
            open_files[data_file.path] = window
    return files, open_files


def _window_rows(store: Store, files: list[DataFile], open_windows: OpenWindows | None) -> list[pa.Table]:
    """The rows of windows-table ``files``: the kept ones (a table per file) if ``open_windows`` holds every file,
    else read (one table)."""
    kept = open_windows.rows_of(files) if open_windows is not None else None
    if kept:
        return kept
    return [read_data_files(store, files, METRIC_WINDOWS_1M)]


#: Rows (held and the batch's) an open-window upsert gives each thread at least; below twice that, one thread.
UPSERT_ROWS_PER_SHARD = 50_000


#: Threads an open-window upsert uses at most: the driver's cores. (Spark's executors are idle while a batch commits.)
UPSERT_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _merge_and_write_windows(
    store: Store, held: list[pa.Table], states: pa.Table, sealed_before_us: int | None
) -> tuple[list[WrittenFile], dict[str, pa.Table]]:
    """The batch's merged ``states`` upserted into the ``held`` window rows and written as files
    (:func:`write_window_files`: the files, and the rows of each open-window file by its Delta log path).

    With many rows the series are split into shards (:func:`~metrics_lake.core.kernels.windows.series_shards`,
    at least :data:`UPSERT_ROWS_PER_SHARD` rows each, at most :data:`UPSERT_THREADS`), each merged and written on a
    thread of its own, so an open minute is then one file per shard (and a day's windows that this batch closes,
    one sealed file per shard). Why: at 200,000 series the upsert of a
    minute's last seconds takes 0.55–0.75 s on one core (merge 0.4 s, Parquet encoding 0.3 s), nearly all of it in
    numpy and Arrow code that releases the GIL; on two threads 0.36–0.54 s (in process, one-second batches of
    ``FleetSimulator(servers=2000, metrics=100)``). The stable hash puts a series in the same shard every batch, so
    the files the stream kept from the last batch are each one shard and are merged without being split.
    """
    rows = sum(table.num_rows for table in held) + states.num_rows
    shards = max(1, min(UPSERT_THREADS, rows // UPSERT_ROWS_PER_SHARD))
    updated_at = dt.datetime.now(dt.UTC)  # one clock for every shard's touched rows

    def upsert(parts: list[pa.Table], shard_states: pa.Table) -> tuple[list[WrittenFile], dict[str, pa.Table]]:
        existing = pa.concat_tables(parts) if parts else METRIC_WINDOWS_1M.empty_table()
        merged = merge_into_rows(existing, shard_states, WINDOW_SECONDS, updated_at)
        return write_window_files(store, merged, sealed_before_us)

    if shards == 1:
        return upsert(held, states)
    held_shards: list[list[pa.Table]] = [[] for _ in range(shards)]
    for table in held:  # a file this stream kept from the last batch is one shard already: not copied
        split = group_by_partition(table, series_shards(table.column("metric"), table.column("server"), shards))
        for shard, part in split.items():
            held_shards[shard].append(part)
    state_shards = group_by_partition(states, series_shards(states.column("metric"), states.column("server"), shards))
    with ThreadPoolExecutor(shards, thread_name_prefix="windows-upsert") as pool:
        outcomes = list(
            pool.map(
                lambda shard: upsert(held_shards[shard], state_shards.get(shard, states.slice(0, 0))), range(shards)
            )
        )
    return [f for files, _ in outcomes for f in files], {k: v for _, kept in outcomes for k, v in kept.items()}


def upsert_windows(
    store: Store,
    tables: LatestTables,
    plan: BatchPlan,
    states: pa.Table,
    watermark: int | None,
    open_windows: OpenWindows | None,
) -> int:
    """Merge the batch's window states into ``metric_windows_1m`` with its positions; returns windows written.

    The rows of the files the states may touch, taken from ``open_windows`` if it holds every one of them, else
    read (:mod:`metrics_lake.core.speed.open_windows`), get the states merged in
    (:func:`~metrics_lake.core.kernels.windows.merge_into_rows`); ``open_windows`` then keeps the open-window files
    this commit wrote.
    """
    written = 0
    sealed_before_us = None if watermark is None else watermark * 1000
    transactions = []
    if watermark is not None and watermark != plan.watermark_ms:
        transactions.append(Transaction(watermark_app_id(plan.topic), watermark, int(time.time() * 1000)))

    def commit(table, advances: dict[int, int]) -> None:
        nonlocal written
        removes, files, open_files = [], [], {}
        if states.num_rows:
            start_us = states.column("window_start").cast(pa.int64())
            lo, hi = pc.min(start_us).as_py(), pc.max(start_us).as_py()
            days = sorted({d.isoformat() for d in pc.unique(utc_dates(states.column("window_start"))).to_pylist()})
            candidates = windowed_files(store, WINDOWS, table, days, lo, hi)
            held = _window_rows(store, candidates, open_windows)
            files, open_files = _merge_and_write_windows(store, held, states, sealed_before_us)
            removes = [remove_action(f) for f in candidates]
            written = states.num_rows  # merged states: one per window the batch touched
        commit_changes(
            table,
            WINDOWS,
            files,
            removes,
            transactions=offset_transactions(CONSUMER, plan.topic, advances) + transactions,
            operation="STREAMING WINDOWS",
        )
        if open_windows is not None and states.num_rows:
            open_windows.remember(open_files)

    return written if commit_with_positions(store, tables, plan, WINDOWS, commit) else 0


@dataclass(frozen=True)
class WindowsCommit:
    """Merges the tasks' window states (one row per window each chunk touched) and upserts them into
    ``metric_windows_1m`` with the new watermark (:func:`upsert_windows`); :meth:`commit` returns the windows
    written. The merge's seconds are the batch's ``windows merge`` stage."""

    table: str = WINDOWS

    def commit(self, batch: ProcessedBatch) -> int:
        """Commit the batch's windows; returns the windows written (0 if the table held the positions)."""
        results = batch.results
        states = merge_states(pa.concat_tables([r.states for r in results])) if results else WINDOW_STATE.empty_table()
        batch.lap("windows merge")
        return upsert_windows(batch.store, batch.tables, batch.plan, states, batch.watermark_ms, batch.open_windows)
