"""Missing data is a signal: how old the newest window and each stored query's newest result are.

A day's Great Expectations suites validate the rows a day has; they cannot
fail a day that has none, which is exactly what a stalled pipeline looks
like. So a run for today also checks, outside GX, that the newest 1-minute
window of ``metric_windows_1m`` and the newest window of every stored query
in ``query_results`` ended at most ``LAKE_QUALITY_FRESHNESS_LAG_SECONDS``
ago. Each check is a critical :class:`~metrics_lake.quality.checkpoint.Outcome`
(so a ``dq_results`` row, and exit 1 of a bare ``lake quality``). Newest
times come from the Delta files' statistics (windows) and a scan of the last
two days' partitions (query results): no Spark.
"""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import TableNotFoundError

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.core.speed.progress import newest_window_end
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import open_table, table_dataset
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.quality.checkpoint import Outcome

__all__ = ["EXPECTATION", "freshness_outcomes"]

#: The ``expectation`` name of these checks in ``dq_results``.
EXPECTATION = "expect_newest_window_within_freshness_lag"


def freshness_outcomes(settings: LakeSettings, queries: list[StoredQuery], now: dt.datetime) -> list[Outcome]:
    """One critical outcome for the windows table and one per stored query: newest window end within the lag.

    ``observed_value`` says how old the newest window is (or that there is
    none); ``threshold`` holds the allowed lag in seconds.
    """
    store = open_store(settings)
    limit = settings.quality_freshness_lag_seconds
    outcomes = [_outcome(Table.METRIC_WINDOWS_1M, "window_end", _newest_window_end(store), now, limit)]
    newest = _newest_query_windows(store, now)
    for query in queries:
        outcomes.append(
            _outcome(Table.QUERY_RESULTS, f"window_end where query = {query.name}", newest.get(query.name), now, limit)
        )
    return outcomes


def _outcome(table: str, column: str, newest: dt.datetime | None, now: dt.datetime, limit: int) -> Outcome:
    if newest is None:
        observed, success = "no window at all", False
    else:
        age = (now - newest).total_seconds()
        observed, success = f"newest window ended {newest.isoformat()} ({age:,.0f} s before the check)", age <= limit
    return Outcome(
        table=table,
        expectation=EXPECTATION,
        column=column,
        critical=True,
        success=success,
        observed_value=observed,
        unexpected_count=None,
        unexpected_percent=None,
        threshold=json.dumps({"max_lag_seconds": limit}),
        sample=None,
    )


def _newest_window_end(store) -> dt.datetime | None:
    try:
        return newest_window_end(open_table(store, Table.METRIC_WINDOWS_1M))
    except TableNotFoundError:
        return None


def _newest_query_windows(store, now: dt.datetime) -> dict[str, dt.datetime]:
    try:
        table = open_table(store, Table.QUERY_RESULTS)
    except TableNotFoundError:
        return {}
    days = pa.array([now.date() - dt.timedelta(days=d) for d in (-1, 0, 1)], pa.date32())
    rows = table_dataset(store, Table.QUERY_RESULTS, table).to_table(
        columns=["query", "window_end"], filter=pc.field("event_date").isin(days)
    )
    if rows.num_rows == 0:
        return {}
    newest = rows.group_by("query").aggregate([("window_end", "max")])
    return dict(zip(newest.column("query").to_pylist(), newest.column("window_end_max").to_pylist(), strict=True))
