"""The open windows' rows and the stored queries' window rows, kept in the speed layer's driver between micro-batches.

Every batch rewrites the file of each open window it touches
(:mod:`metrics_lake.core.speed.micro_batch`, "Window files"), and under
steady load a batch touches nearly every series of the current minute. At
200,000 series that file holds 200,000 rows and, by the minute's end, about
7 M sketch buckets (random values: about one bucket per sample). Reading it
back cost 0.2 s a batch, and regrouping all of its rows with the batch's
(:func:`~metrics_lake.core.kernels.windows.merge_states`) 0.5–1.5 s more
(``bench/steady_load.py``).

:class:`OpenWindows` keeps the rows of the open-window files the driver
wrote in its last windows commit, keyed by their path in the Delta log. A
data file is immutable and its name unique (a uuid), so kept rows are
exactly the file's content, and the table stays the truth. A batch looks up
only the files of the snapshot it plans from, uses the kept rows only when
it holds every one of them, and reads the files otherwise (after a restart,
or when another writer such as compaction rewrote them). Either way the
upsert inserts the batch's states into those rows
(:func:`~metrics_lake.core.kernels.windows.merge_into_rows`). A large open
minute is several files, one per shard of its series, each kept.

Stored queries read more than the minute being written: a 1-hour window
holds every minute of its hour. A query window is the merge of its minutes,
and a minute's state the merge of every selected series' window of that
minute (:func:`~metrics_lake.core.kernels.stored_queries.merge_minutes`).
Merging is what costs: the fleet's hourly query merged every minute of the
hour so far again in each batch (in process, 2,500 servers x 10 metrics,
batches of 20 s of events: at minute 8 of the hour 0.15 s of a batch's 0.29 s
of query results, growing with the minute; 0.14 s of CPU with the merges
kept). The driver therefore keeps each query's merged minutes with the files
that may hold that minute's rows (:meth:`OpenWindows.merged_minutes`): the
files whose ``window_start`` statistics cover the minute
(:func:`minute_files`). A file is immutable and its name unique, so a minute
covered by the very same files has the very same rows, and its merge is
reused; only the minutes whose files changed (the batch's own, a late
event's, a compaction's or a recompute's) are merged again. A file that
covers a minute by its statistics without holding rows of it only makes
that minute merge again when the file comes or goes.

A ``PER SERVER`` query's windows are each server's own minutes merged, 15
of them at the end of a quarter hour: the 2-hour soak's batches took 0.65 s
at the start of each quarter hour and 1.05 s at its end, merging the
quarter hour's 30,000 server-minutes (2,000 servers) again in each batch.
The driver therefore keeps, for each tumbling ``PER SERVER`` query, its
newest window's *settled* minutes (all but the last two with rows) merged
per server, with the files that covered each of them
(:meth:`OpenWindows.settled_minutes`). A batch merges that one row per
server with the rows of the later minutes only. Merging is a fold in minute
order (sums added row by row), so a server's settled row followed by its
later minutes gives exactly the state of all its minutes; a settled minute
whose files changed (a late event, a compaction) makes the window merge
every minute again.

So the rows an evaluation needs are those of the minutes it merges again
(:meth:`OpenWindows.stale_minutes`) and, for a ``PER SERVER`` query, every
minute of its windows (each server's rows are its own states; the settled
ones are only used when the memo cannot be). The driver
keeps, from one evaluation to the next, the rows of the queried metrics it
took from each file it needed (a *selection*), since the next batch needs
nearly the same: a ``PER SERVER`` query's earlier minutes again, and the
minute being written, whose last file is one the driver wrote and kept. A
file neither kept nor selected is read, with the metric filter pushed into
the Parquet reader. Keeping every file of the hour instead held 43 MB at
minute 7 of the hour (4,000 servers, the default queries), growing by about
6 MB a minute until the hour ended.

The ``query_results`` files of open query windows are rewritten by nearly
every batch too (a window's rows replaced, the other queries' rows of the
same window kept), and reading each candidate file's keys and then its rows
was about a fifth of an in-process batch's time. The driver keeps the rows
of the open-window files its last ``query_results`` commit wrote, and of the
kept files that commit left as they were (:meth:`OpenWindows.remember_results`),
and reads only the others.

Memory: the rows of the files one commit wrote, about one minute's windows
(at 200,000 series near a minute's end: about 120 MB, most of it sketches),
plus the selections the last evaluation needed (for the default stored
queries: the CPU rows of the current quarter hour for ``server_cpu_15m``, and
the rows of the minutes merged again, usually the current one), plus each
query's merged minutes (a row per minute for a fleet-wide query, a row per
group and minute for ``BY``), plus a row per server for each ``PER SERVER``
query's newest window, plus the ``query_results`` rows of the open query
windows (a row per aggregate and window, and per server for ``PER SERVER``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.stored_queries import StoredQuery, merge_minutes, merge_selected, sorted_rows
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states
from metrics_lake.core.tables.snapshots import DataFile

__all__ = ["MINUTE_US", "OpenWindows", "minute_files"]

#: A 1-minute window's length in µs: the step of ``metric_windows_1m``'s ``window_start``.
MINUTE_US = 60_000_000


def minute_files(files: Iterable[DataFile], lo_us: int, hi_us: int) -> dict[int, frozenset[str]]:
    """Each minute in ``[lo_us, hi_us)`` (epoch µs) that one of ``files`` may hold rows of, mapped to the Delta log
    paths of those files: those whose ``window_start`` statistics cover it (a file without statistics covers every
    minute). Every row of a minute comes from a file its set names; the set may name more."""
    covered: dict[int, set[str]] = {}
    for data_file in files:
        low, high = data_file.window_starts or (lo_us, hi_us - 1)
        low, high = max(low, lo_us), min(high + 999, hi_us - 1)  # Delta keeps the statistics to the millisecond
        for minute in range(low + (-low) % MINUTE_US, high + 1, MINUTE_US):
            covered.setdefault(minute, set()).add(data_file.relative)
    return {minute: frozenset(paths) for minute, paths in covered.items()}


class OpenWindows:
    """Rows of the open-window files the speed layer committed last, selections of window files, by Delta log path,
    the stored queries' merged minutes, and the rows of the ``query_results`` files the last evaluation wrote.

    One per running stream (its driver); not thread-safe (a stream commits
    one batch at a time). Kept rows are :data:`~metrics_lake.lake_schemas.tables.METRIC_WINDOWS_1M`
    tables, partition column included, as
    :func:`~metrics_lake.core.tables.snapshots.read_data_files` returns them;
    selections hold the columns they were taken with.
    """

    def __init__(self) -> None:
        self._rows: dict[str, pa.Table] = {}
        self._columns: tuple[str, ...] = ()  # of every selection
        self._selections: dict[str, tuple[frozenset[str], pa.Table]] = {}  # path -> (metrics, their rows)
        # query -> minute (epoch µs) -> (paths of the files covering it, the minute merged)
        self._minutes: dict[tuple[str, int, str], dict[int, tuple[frozenset[str], pa.Table]]] = {}
        # PER SERVER query -> its newest window's settled minutes: (window start, minute -> paths of the files
        # covering it, the rows of those minutes merged per server with window_start the window's start), all µs
        self._settled: dict[tuple[str, int, str], tuple[int, dict[int, frozenset[str] | None], pa.Table]] = {}
        self._results: dict[str, pa.Table] = {}  # path -> rows of a query_results file this driver wrote or read

    def rows_of(self, files: Iterable[DataFile]) -> list[pa.Table] | None:
        """The kept rows of each of ``files``, in their order; ``None`` unless every one is kept."""
        rows = [self._rows.get(f.relative) for f in files]
        return None if any(r is None for r in rows) else rows

    def remember(self, written: Mapping[str, pa.Table]) -> None:
        """After a committed rewrite: keep ``written`` (Delta log path -> the rows of that file); forget the rest.

        Call it only once the commit that added those files succeeded: a
        file of a failed commit is never in a snapshot, and its rows would
        only take memory.
        """
        self._rows = dict(written)

    def result_rows(self, data_file: DataFile) -> pa.Table | None:
        """The kept rows of ``query_results`` file ``data_file`` (every column of
        :data:`~metrics_lake.lake_schemas.tables.QUERY_RESULTS`), or ``None``."""
        return self._results.get(data_file.relative)

    def remember_results(self, rows: Mapping[str, pa.Table]) -> None:
        """After a committed ``query_results`` rewrite: keep ``rows`` (Delta log path -> every row of that file) and
        forget the rest, so what is kept follows the files the last evaluation touched, not the run's history.

        Call it only once the commit succeeded (a file of a failed commit is
        never in a snapshot); a file named here must still be in the table.
        """
        self._results = dict(rows)

    def selection_of(self, data_file: DataFile, metrics: frozenset[str], columns: tuple[str, ...]) -> pa.Table | None:
        """``columns`` of the rows of ``metrics`` in ``data_file``, if kept: from a selection the last evaluation took
        of the same columns and of these metrics or more, or from the file's kept rows; else ``None``."""
        kept = self._selections.get(data_file.relative) if self._columns == columns else None
        if kept is not None and kept[0] == metrics:
            return kept[1]
        rows = kept[1] if kept is not None and kept[0] >= metrics else self._rows.get(data_file.relative)
        if rows is None:
            return None
        wanted = pc.is_in(rows.column("metric"), pa.array(sorted(metrics), pa.string()))
        return rows.filter(wanted).select(list(columns))

    def keep_selections(
        self, columns: tuple[str, ...], selections: Mapping[str, tuple[frozenset[str], pa.Table]]
    ) -> None:
        """Keep ``selections`` (Delta log path -> (metrics, ``columns`` of their rows in that file)), forgetting
        the selections kept before: only the files the last evaluation needed stay."""
        self._columns = columns
        self._selections = dict(selections)

    def stale_minutes(self, query: StoredQuery, coverage: Mapping[int, frozenset[str]]) -> list[int]:
        """The minutes of ``coverage`` (minute -> the files covering it, :func:`minute_files`) that
        :meth:`merged_minutes` would merge again for ``query``: those not merged last time from the same files."""
        previous = self._minutes.get(_key(query), {})
        return sorted(at for at, files in coverage.items() if at not in previous or previous[at][0] != files)

    def merged_minutes(
        self,
        query: StoredQuery,
        windows: pa.Table,
        keep: pa.ChunkedArray | pa.Array,
        keyed: Callable[[pa.Table], pa.Table],
        *,
        coverage: Mapping[int, frozenset[str]] | None = None,
    ) -> pa.Table:
        """A :data:`~metrics_lake.core.kernels.stored_queries.MinuteMerge` that remembers: the rows of ``windows``
        that ``keep`` selects, keyed and merged per key and minute, each minute of ``coverage`` (minute -> the files
        covering it, :func:`minute_files`, for every minute of the query's windows) merged last time for ``query``
        from exactly the same files reused. Bind ``coverage`` (``functools.partial``); without it every minute is
        merged and nothing kept.

        ``windows`` must hold every row of ``query`` in the minutes :meth:`stale_minutes` names; other minutes'
        rows are not used. Keeps this call's minutes for the next one (those of ``query`` it did not see are
        forgotten). A stored query's text and revision name it: an edited query merges anew.
        """
        if coverage is None:
            return merge_selected(query, windows, keep, keyed)
        key = _key(query)
        stale = self.stale_minutes(query, coverage)
        previous = self._minutes.get(key, {})
        kept = {at: previous[at] for at in coverage if at in previous and previous[at][0] == coverage[at]}
        if stale:
            todo = np.array(stale, np.int64)
            minute = pc.cast(windows.column("window_start"), pa.int64())
            rows = windows.filter(pc.and_(pc.fill_null(keep, False), pc.is_in(minute, pa.array(todo))))
            fresh = merge_minutes(keyed(rows)) if rows.num_rows else WINDOW_STATE.empty_table()
            starts = pc.cast(fresh.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
            bounds = np.searchsorted(starts, todo)
            for at, lo, hi in zip(stale, bounds, [*bounds[1:], len(starts)], strict=True):
                kept[at] = (coverage[at], fresh.slice(int(lo), int(hi - lo)))
        for stale_key in [k for k in self._minutes if k[0] == query.name and k != key]:  # the query before an edit
            del self._minutes[stale_key]
        self._minutes[key] = kept
        if not kept:  # no minute covered
            return WINDOW_STATE.empty_table()
        return pa.concat_tables([kept[at][1] for at in sorted(kept)])

    def settled_minutes(
        self,
        query: StoredQuery,
        windows: pa.Table,
        keep: pa.ChunkedArray | pa.Array,
        *,
        coverage: Mapping[int, frozenset[str]] | None = None,
    ) -> pa.Table:
        """A :data:`~metrics_lake.core.kernels.stored_queries.ServerRows` that remembers: the rows of ``windows``
        that ``keep`` selects (a ``PER SERVER`` query's own 1-minute rows), sorted by minute, with the newest
        window's settled minutes replaced by one merged row per server, kept from the evaluation before while every
        one of those minutes is covered by exactly the same files (``coverage``: minute -> the files covering it,
        :func:`minute_files`; bind it with ``functools.partial``; without it, the rows and nothing kept).

        A minute settles once two later minutes of its window have rows: the newest window's minutes before
        those two are merged (the kept row, or the window's rows) and kept for the next call. Only tumbling
        queries' windows are kept (a hopping query's minute belongs to several). Rows of other windows are
        returned as they are.
        """
        key = _key(query)
        if coverage is None or query.slide_s != query.duration_s:
            self._settled.pop(key, None)
            return sorted_rows(query, windows, keep)
        selected = pc.fill_null(keep, False).to_numpy(zero_copy_only=False)
        if not selected.any():
            self._settled.pop(key, None)
            return sorted_rows(query, windows, keep)
        minute = pc.cast(windows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
        window = minute - np.mod(minute, query.duration_s * 1_000_000)
        newest = int(window[selected].max())
        mine = selected & (window == newest)
        kept = self._settled.get(key)
        if kept is not None and (kept[0] != newest or any(coverage.get(at) != files for at, files in kept[1].items())):
            kept = None  # another window, or a settled minute's files changed: merge the window anew
        through = max(kept[1]) if kept is not None else newest - MINUTE_US  # the last minute merged so far
        minutes = np.unique(minute[mine])
        settle_to = int(minutes[-3]) if len(minutes) >= 3 else through
        if settle_to > through:  # minutes that settled since: merged onto what was kept
            joining = sorted_rows(query, windows, pa.array(mine & (minute > through) & (minute <= settle_to)))
            merged = self._merged(joining.select(WINDOW_STATE.names), newest, kept)
            settled = {at: coverage.get(at) for at in range(newest, settle_to + 1, MINUTE_US)}
            kept, through = (newest, settled, merged), settle_to
        if kept is None:
            self._settled.pop(key, None)
            return sorted_rows(query, windows, keep)
        self._settled[key] = kept
        later = sorted_rows(query, windows, pa.array(selected & (~mine | (minute > through))))
        later = later.select(WINDOW_STATE.names)
        return pa.concat_tables([kept[2].cast(later.schema), later]).sort_by([("window_start", "ascending")])

    @staticmethod
    def _merged(rows: pa.Table, window_us: int, kept) -> pa.Table:
        """``rows`` (minutes of the window starting at ``window_us``, sorted) merged per server after ``kept``'s
        merged row of each server (if any): one row per server, ``window_start`` the window's start."""
        starts = pa.array(np.full(rows.num_rows, window_us, np.int64)).cast(rows.schema.field("window_start").type)
        moved = rows.set_column(rows.schema.get_field_index("window_start"), "window_start", starts)
        parts = ([kept[2].cast(rows.schema)] if kept is not None else []) + [moved]
        return merge_states(pa.concat_tables(parts).select(WINDOW_STATE.names))

    def forget_queries_except(self, names: Iterable[str]) -> None:
        """Forget the merged minutes of every stored query not in ``names`` (those the config store holds now).

        :meth:`merged_minutes` forgets a query's older revisions when it
        merges the query again; a query removed from the config store is never
        merged again, so without this its minutes stayed until the stream
        restarted.
        """
        live = set(names)
        for stale in [key for key in self._minutes if key[0] not in live]:
            del self._minutes[stale]
        for stale in [key for key in self._settled if key[0] not in live]:
            del self._settled[stale]

    @property
    def queries(self) -> list[str]:
        """The names of the stored queries whose merged minutes are kept, sorted."""
        return sorted({name for name, _, _ in [*self._minutes, *self._settled]})

    @property
    def paths(self) -> list[str]:
        """The Delta log paths of the files whose rows are kept, sorted."""
        return sorted(self._rows)

    @property
    def selected_paths(self) -> list[str]:
        """The Delta log paths of the files a selection is kept of, sorted."""
        return sorted(self._selections)

    @property
    def result_paths(self) -> list[str]:
        """The Delta log paths of the ``query_results`` files whose rows are kept, sorted."""
        return sorted(self._results)


def _key(query: StoredQuery) -> tuple[str, int, str]:
    """What names a stored query's merged minutes: its name, revision and text."""
    return query.name, query.revision, query.text
