"""``lake queries``: evaluate the stored queries over a UTC day into ``query_results``.

Every query (:mod:`metrics_lake.core.kernels.stored_queries`) is answered from the
1-minute windows: Spark tasks read the window rows of days D-1 and D and
turn them into each query's partial window states
(:func:`~metrics_lake.core.kernels.stored_queries.query_states`: a query window,
tumbling or hopping, holds exactly the minutes that start inside it); Spark
shuffles the states by key, tasks merge them and compute each ``COMPUTE``
aggregate (:func:`~metrics_lake.core.kernels.stored_queries.query_rows`): count,
sum, min and max exactly, percentiles from the merged sketches, so a
fleet-wide p99 is the p99 of all matching events within the sketch's
relative error (0.54 %).

A window belongs to the day its last minute falls in (``window_end`` in
``(D 00:00, D+1 00:00]``), so it reads the 1-minute rows of days D-1 and D,
both complete when day D's nightly run starts; a day is replaced in one
Delta commit (:func:`metrics_lake.spark.jobs.day_partitions.replace_day`).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import pyarrow as pa

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.kernels.stored_queries import StoredQuery, query_rows, query_states
from metrics_lake.core.kernels.windows import WINDOW_STATE
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.lake_schemas.table_access import QUERIES
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.spark.jobs.day_partitions import compute_day_files, replace_day, rows_written

__all__ = ["QueriesResult", "evaluate_queries_for_day"]

SOURCE, (TARGET,) = Table.METRIC_WINDOWS_1M, QUERIES.writes


@dataclass(frozen=True)
class QueriesResult:
    """One day's evaluation: queries run, result rows written, wall seconds."""

    day: dt.date
    queries: int
    rows: int
    seconds: float


def evaluate_queries_for_day(spark, settings: LakeSettings, queries: list[StoredQuery], day: dt.date) -> QueriesResult:
    """Evaluate ``queries`` for ``day`` and replace that day of ``query_results`` in one commit."""
    started = time.monotonic()
    store = open_store(settings)
    ensure_table(store, SOURCE)
    ensure_table(store, TARGET)
    files = []
    if queries:

        def to_states(windows: pa.Table) -> pa.Table:
            return pa.concat_tables([query_states(windows, query, day) for query in queries])

        computed_at = dt.datetime.now(dt.UTC)
        files, _ = compute_day_files(
            spark,
            settings.root,
            SOURCE,
            [day - dt.timedelta(days=1), day],
            WINDOW_STATE.names,
            to_states,
            TARGET,
            lambda merged: query_rows(merged, queries, day, computed_at),
            settings.shuffle_partitions,
        )
    replace_day(store, TARGET, day, files, "STORED QUERIES")
    return QueriesResult(day, len(queries), rows_written(files), time.monotonic() - started)
