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
holds every minute of its hour, so without more each batch would read every
earlier minute's file of the hour again (at 200,000 series and minute 30,
about 30 files of 120 MB) for the few rows of the queried metrics. The
driver therefore also keeps, from one query evaluation to the next, the
rows of the queried metrics it took from each file (a *selection*: a few
thousand rows a minute). A minute's last file is one the driver wrote and
kept, so the evaluation after it takes its selection without reading it; a
file neither kept nor selected is read, with the metric filter pushed into
the Parquet reader.

A query window is the merge of its minutes, and a minute's state the
merge of every selected series' window of that minute
(:func:`~metrics_lake.core.kernels.stored_queries.merge_minutes`). Merging
is what costs: the fleet's hourly query merged every minute of the hour so
far again in each batch (in process, 2,500 servers x 10 metrics, batches
of 20 s of events: at minute 8 of the hour 0.15 s of a batch's 0.29 s of
query results, growing with the minute; 0.14 s of CPU with the merges kept). The driver
therefore also keeps each query's merged minutes with the files their rows
came from (:meth:`OpenWindows.merged_minutes`): a minute merged before from
the very same files has the very same rows, so its merge is reused, and
only the minutes whose files changed (the batch's own, a late event's, a
compaction's or a recompute's) are merged again.

Memory: the rows of the files one commit wrote, about one minute's windows
(at 200,000 series near a minute's end: about 120 MB, most of it sketches),
plus the selections the last query evaluation took (for the default stored
queries at 2,000 servers: 6,000 rows for each minute of the current hour,
sketches included), plus each query's merged minutes (a row per minute for
a fleet-wide query, a row per group and minute for ``BY``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.stored_queries import StoredQuery, merge_minutes, merge_selected
from metrics_lake.core.kernels.windows import WINDOW_STATE
from metrics_lake.core.tables.snapshots import DataFile

__all__ = ["SOURCE", "OpenWindows", "with_sources"]

#: The column :func:`with_sources` adds to window rows: the Delta log path of the file each row came from.
SOURCE = "source"


def with_sources(selections: Mapping[str, pa.Table]) -> pa.Table:
    """The rows of ``selections`` (Delta log path -> rows taken from that file), concatenated, with a
    :data:`SOURCE` column (dictionary-encoded path) naming each row's file: what
    :meth:`OpenWindows.merged_minutes` tells unchanged minutes by."""
    rows = pa.concat_tables(selections.values())
    files = np.repeat(np.arange(len(selections), dtype=np.int32), [t.num_rows for t in selections.values()])
    paths = pa.DictionaryArray.from_arrays(pa.array(files, pa.int32()), pa.array(list(selections), pa.string()))
    return rows.append_column(SOURCE, paths)


class OpenWindows:
    """Rows of the open-window files the speed layer committed last, and selections of window files, by Delta log path.

    One per running stream (its driver); not thread-safe (a stream commits
    one batch at a time). Kept rows are :data:`~metrics_lake.lake_schemas.tables.METRIC_WINDOWS_1M`
    tables, partition column included, as
    :func:`~metrics_lake.core.tables.snapshots.read_data_files` returns them;
    selections hold the columns they were taken with.
    """

    def __init__(self) -> None:
        self._rows: dict[str, pa.Table] = {}
        self._selected: tuple[frozenset[str], tuple[str, ...]] | None = None  # (metrics, columns) of _selections
        self._selections: dict[str, pa.Table] = {}
        # query -> minute (epoch µs) -> (paths of the files its rows came from, the minute merged)
        self._minutes: dict[tuple[str, int, str], dict[int, tuple[frozenset[str], pa.Table]]] = {}

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

    def selection_of(self, data_file: DataFile, metrics: frozenset[str], columns: tuple[str, ...]) -> pa.Table | None:
        """``columns`` of the rows of ``metrics`` in ``data_file``, if kept: a selection the last query evaluation
        took with the same metrics and columns, or the file's kept rows filtered; else ``None``."""
        if self._selected == (metrics, columns) and data_file.relative in self._selections:
            return self._selections[data_file.relative]
        rows = self._rows.get(data_file.relative)
        if rows is None:
            return None
        wanted = pc.is_in(rows.column("metric"), pa.array(sorted(metrics), pa.string()))
        return rows.filter(wanted).select(list(columns))

    def keep_selections(
        self, metrics: frozenset[str], columns: tuple[str, ...], selections: Mapping[str, pa.Table]
    ) -> None:
        """Keep ``selections`` (Delta log path -> ``columns`` of the rows of ``metrics`` in that file), forgetting
        the selections kept before: only the files the last evaluation read stay."""
        self._selected = (metrics, columns)
        self._selections = dict(selections)

    def merged_minutes(
        self,
        query: StoredQuery,
        windows: pa.Table,
        keep: pa.ChunkedArray | pa.Array,
        keyed: Callable[[pa.Table], pa.Table],
    ) -> pa.Table:
        """A :data:`~metrics_lake.core.kernels.stored_queries.MinuteMerge` that remembers: the rows of ``windows``
        that ``keep`` selects, keyed and merged per key and minute, each minute merged last time for ``query`` from
        exactly the same files reused, and only the other minutes' rows taken from ``windows``. Keeps this call's
        minutes for the next one (those of ``query`` it did not see are forgotten).

        ``windows`` carry :data:`SOURCE` (:func:`with_sources`); without it every minute is merged. A file is
        immutable and its name unique, so the same files give a minute the same rows; a minute a commit changed
        (the batch's states, a compaction, a recompute) has rows from another file. A stored query's text and
        revision name it: an edited query merges anew.
        """
        if SOURCE not in windows.column_names:
            return merge_selected(query, windows, keep, keyed)
        selected = pc.fill_null(keep, False)
        minute = pc.cast(windows.column("window_start"), pa.int64())
        pairs = pa.table({"minute": minute, "file": windows.column(SOURCE)}).filter(selected)  # two small columns
        pairs = pairs.set_column(1, "file", pairs.column("file").cast(pa.string()))
        distinct = pairs.group_by(["minute", "file"]).aggregate([])
        files: dict[int, set[str]] = {}
        for at, path in zip(distinct.column("minute").to_pylist(), distinct.column("file").to_pylist(), strict=True):
            files.setdefault(at, set()).add(path)
        key = (query.name, query.revision, query.text)
        previous, kept = self._minutes.get(key, {}), {}
        for at, sources in files.items():
            hit = previous.get(at)
            if hit is not None and hit[0] == sources:
                kept[at] = hit
        todo = np.array(sorted(set(files) - set(kept)), np.int64)
        if len(todo):
            fresh = merge_minutes(keyed(windows.filter(pc.and_(selected, pc.is_in(minute, pa.array(todo))))))
            starts = pc.cast(fresh.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
            bounds = np.searchsorted(starts, todo)
            for at, lo, hi in zip(todo.tolist(), bounds, [*bounds[1:], len(starts)], strict=True):
                kept[at] = (frozenset(files[at]), fresh.slice(int(lo), int(hi - lo)))
        for stale in [k for k in self._minutes if k[0] == query.name and k != key]:  # the query before an edit
            del self._minutes[stale]
        self._minutes[key] = kept
        if not kept:  # no row selected
            return WINDOW_STATE.empty_table()
        return pa.concat_tables([kept[at][1] for at in sorted(kept)])

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

    @property
    def queries(self) -> list[str]:
        """The names of the stored queries whose merged minutes are kept, sorted."""
        return sorted({name for name, _, _ in self._minutes})

    @property
    def paths(self) -> list[str]:
        """The Delta log paths of the files whose rows are kept, sorted."""
        return sorted(self._rows)

    @property
    def selected_paths(self) -> list[str]:
        """The Delta log paths of the files a selection is kept of, sorted."""
        return sorted(self._selections)
