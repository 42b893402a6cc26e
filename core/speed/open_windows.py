"""The open windows' rows, kept in the speed layer's driver from one micro-batch to the next.

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
(:func:`~metrics_lake.core.kernels.windows.merge_into_rows`).

Memory: the rows of the files one commit wrote, about one minute's windows
(at 200,000 series near a minute's end: about 120 MB, most of it sketches).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from metrics_lake.core.tables.snapshots import DataFile

__all__ = ["OpenWindows"]


class OpenWindows:
    """Rows of the open-window data files the speed layer committed last, by their Delta log path.

    One per running stream (its driver); not thread-safe (a stream commits
    one batch at a time). Rows are :data:`~metrics_lake.lake_schemas.tables.METRIC_WINDOWS_1M`
    tables, partition column included, as
    :func:`~metrics_lake.core.tables.snapshots.read_data_files` returns them.
    """

    def __init__(self) -> None:
        self._rows: dict[str, pa.Table] = {}

    def rows_of(self, files: Iterable[DataFile]) -> list[pa.Table] | None:
        """The kept rows of each of ``files``, in their order; ``None`` unless every one is kept."""
        rows = [self._rows.get(f.relative) for f in files]
        return None if any(r is None for r in rows) else rows

    def remember(self, written: dict[str, pa.Table]) -> None:
        """After a committed rewrite: keep ``written`` (Delta log path -> the rows of that file); forget the rest.

        Call it only once the commit that added those files succeeded: a
        file of a failed commit is never in a snapshot, and its rows would
        only take memory.
        """
        self._rows = dict(written)

    @property
    def paths(self) -> list[str]:
        """The Delta log paths of the files whose rows are kept, sorted."""
        return sorted(self._rows)
