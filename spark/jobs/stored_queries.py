"""``lake queries``: evaluate the stored queries over a UTC day into ``query_results``.

Every query (:mod:`metrics_lake.core.stored_queries`) is answered from the
1-minute windows: a query window (tumbling or hopping, whole minutes)
contains exactly the 1-minute windows that start inside it, so
``window(window_start, duration, slide)`` over ``metric_windows_1m`` assigns
each minute to every query window holding it. count and sum are summed, min
and max taken, and percentiles read from the merged KLL sketches
(``kll_merge_agg_double``), so a fleet-wide p99 is the p99 of all matching
events within the sketch's rank error (about 1.33 % at k=200).

A window belongs to the day its last minute falls in (``window_end`` in
``(D 00:00, D+1 00:00]``), so it reads the 1-minute rows of days D-1 and D,
both complete when day D's nightly run starts; a day is replaced in one
Delta commit (:func:`metrics_lake.spark.jobs.day_partitions.replace_day`).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.core.stored_queries import Aggregate, StoredQuery
from metrics_lake.core.tables import ensure_table
from metrics_lake.spark.jobs.day_partitions import read_days, replace_day, rows_written, write_on_executors

SOURCE = "metric_windows_1m"
TARGET = "query_results"


@dataclass(frozen=True)
class QueriesResult:
    """One day's evaluation: queries run, result rows written, wall seconds."""

    day: dt.date
    queries: int
    rows: int
    seconds: float


def server_pattern(servers: tuple[str, ...]) -> str | None:
    """A Java regex matching any of ``servers`` (names or ``*``/``?`` globs), or None for every server."""
    if "*" in servers:
        return None
    alternatives = ["".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in s) for s in servers]
    return "^(?:" + "|".join(alternatives) + ")$"


def _value(aggregate: Aggregate):
    from pyspark.sql import functions as F

    if aggregate.kind == "percentile":
        return F.expr(f"kll_sketch_get_quantile_double(sketch, {aggregate.quantile!r}D)")
    if aggregate.kind == "avg":
        return F.col("sum") / F.col("count")
    return F.col(aggregate.kind).cast("double")


def query_frame(windows, query: StoredQuery, day: dt.date):
    """``query_results`` rows of ``query`` for ``day`` from 1-minute window rows covering days D-1 and D."""
    from pyspark.sql import functions as F

    from metrics_lake.spark.jobs.stream_metrics import merged_aggregates

    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    end = start + dt.timedelta(days=1)
    rows = windows.where(
        (F.col("metric") == query.metric)
        & (F.col("window_start") >= F.lit(start - dt.timedelta(seconds=query.duration_s)))
        & (F.col("window_start") < F.lit(end))
    )
    pattern = server_pattern(query.servers)
    if pattern is not None:
        rows = rows.where(F.col("server").rlike(pattern))
    window = F.window("window_start", f"{query.duration_s} seconds", f"{query.slide_s} seconds").alias("window")
    keys = [window, "server"] if query.per_server else [window]
    grouped = (
        rows.groupBy(*keys)
        .agg(*merged_aggregates())
        .where((F.col("window.end") > F.lit(start)) & (F.col("window.end") <= F.lit(end)))
    )
    results = F.array(
        *[F.struct(F.lit(a.label).alias("aggregate"), _value(a).alias("value")) for a in query.aggregates]
    )
    return grouped.select(
        F.lit(query.name).alias("query"),
        F.lit(query.metric).alias("metric"),
        (F.col("server") if query.per_server else F.lit(None).cast("string")).alias("server"),
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.explode(results).alias("result"),
        F.current_timestamp().alias("computed_at"),
        F.lit(day).alias("event_date"),
    ).select("query", "metric", "server", "window_start", "window_end", "result.*", "computed_at", "event_date")


def evaluate_day(spark, settings: LakeSettings, queries: list[StoredQuery], day: dt.date) -> QueriesResult:
    """Evaluate ``queries`` for ``day`` and replace that day of ``query_results`` in one commit."""
    started = time.monotonic()
    store = open_store(settings)
    ensure_table(store, SOURCE)
    ensure_table(store, TARGET)
    windows = read_days(spark, settings.root, SOURCE, [day - dt.timedelta(days=1), day])
    files = []
    if queries:
        frames = [query_frame(windows, query, day) for query in queries]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        files = write_on_executors(union, settings.root, TARGET)
    replace_day(store, TARGET, day, files, "STORED QUERIES")
    return QueriesResult(day, len(queries), rows_written(files), time.monotonic() - started)
