"""``lake rollup``: downsample a day of 1-minute windows to 1-hour and 1-day rollups.

``metric_rollup_1h`` is built from the day's ``metric_windows_1m`` rows and
``metric_rollup_1d`` from the day's ``metric_rollup_1h`` rows, per
(metric, server, period): count and sum are summed, min and max taken, avg
= sum / count, and the KLL sketches merged with ``kll_merge_agg_double``, so
p50/p95/p99 are quantiles of every event of the period, within the sketch's
normalized rank error (Apache DataSketches ``KllSketch.getNormalizedRankError``:
2.296 / k^0.9723, about 1.33 % at Spark's k=200), not averages of per-minute
percentiles, which have no error bound.

Each day is replaced in one Delta commit per table (see
:mod:`metrics_lake.spark.jobs.day_partitions`), so re-running a day is idempotent: the
rows come out the same (percentiles within the rank error: KLL compaction
is randomized in DataSketches, so a re-merge may pick other samples). Run it
after the day's recompute.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables import ensure_table
from metrics_lake.schemas import rollup_chain
from metrics_lake.spark.jobs.day_partitions import read_days, replace_day, rows_written, write_on_executors

#: (target table, source table, period as a Spark interval), finest first, from the table registry.
ROLLUPS = tuple((spec.name, spec.rollup_of, f"{spec.window_seconds} seconds") for spec in rollup_chain())


@dataclass(frozen=True)
class RollupResult:
    """One table's rollup of one day: source rows read, rows written, wall seconds."""

    day: dt.date
    table: str
    rows: int
    seconds: float


def rollup_frame(source, period: str):
    """Roll window rows (``metric_windows_1m`` columns) up to ``period`` windows, same columns.

    ``period`` is a Spark interval such as ``"1 hour"``; it must be a
    multiple of the source's window size and divide a day, so each source
    window falls in exactly one period.
    """
    from pyspark.sql import functions as F

    from metrics_lake.spark.jobs.stream_metrics import finalize_windows, merged_aggregates

    window = F.window("window_start", period).alias("window")
    return finalize_windows(source.groupBy(window, "metric", "server").agg(*merged_aggregates()))


def rollup_day(spark, settings: LakeSettings, day: dt.date) -> list[RollupResult]:
    """Rebuild ``day`` in every table of :data:`ROLLUPS`, finest first; one result per table."""
    store = open_store(settings)
    results = []
    for table, source, period in ROLLUPS:
        started = time.monotonic()
        ensure_table(store, source)
        files = write_on_executors(
            rollup_frame(read_days(spark, settings.root, source, [day]), period), settings.root, table
        )
        replace_day(store, table, day, files, "ROLLUP")
        results.append(RollupResult(day, table, rows_written(files), time.monotonic() - started))
    return results


def rollup(
    spark, settings: LakeSettings, days: list[dt.date], progress: Callable[[RollupResult], None] | None = None
) -> list[RollupResult]:
    """Roll up ``days`` in order; ``progress`` gets each table's result as it finishes."""
    results = []
    for day in days:
        for result in rollup_day(spark, settings, day):
            results.append(result)
            if progress is not None:
                progress(result)
    return results
