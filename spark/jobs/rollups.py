"""``lake rollup``: downsample a day of 1-minute windows to 1-hour and 1-day rollups.

``metric_rollup_1h`` is built from the day's ``metric_windows_1m`` rows and
``metric_rollup_1d`` from the day's ``metric_rollup_1h`` rows, per
(metric, server, period): count and sum are summed, min and max taken, avg
= sum / count, and the sketches merged (:func:`metrics_lake.core.kernels.windows.rewindow`),
so p50/p95/p99 are quantiles of every event of the period within the
sketch's relative error (:data:`metrics_lake.core.kernels.sketch.RELATIVE_ERROR`, 0.54 %),
not averages of per-minute percentiles, which have no error bound.

Each day is replaced in one Delta commit per table (see
:mod:`metrics_lake.spark.jobs.day_partitions`), so re-running a day is
idempotent; sketch merges are deterministic, so a re-run gives the same
values. Run it after the day's recompute.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.kernels.windows import WINDOW_STATE, finalize, rewindow
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.lake_schemas.tables import rollup_chain
from metrics_lake.spark.jobs.day_partitions import compute_day_files, replace_day, rows_written

#: (target table, source table, period in seconds), finest first, from the table registry.
ROLLUPS = tuple((spec.name, spec.rollup_of, spec.window_seconds) for spec in rollup_chain())


@dataclass(frozen=True)
class RollupResult:
    """One table's rollup of one day: rows written, wall seconds."""

    day: dt.date
    table: str
    rows: int
    seconds: float


def rollup_day(spark, settings: LakeSettings, day: dt.date) -> list[RollupResult]:
    """Rebuild ``day`` in every table of :data:`ROLLUPS`, finest first; one result per table."""
    store = open_store(settings)
    results = []
    for table, source, period in ROLLUPS:
        started = time.monotonic()
        ensure_table(store, source)
        files, _ = compute_day_files(
            spark,
            settings.root,
            source,
            [day],
            WINDOW_STATE.names,
            lambda rows, p=period: rewindow(rows, p),
            table,
            lambda merged, p=period: finalize(merged, p),
            settings.shuffle_partitions,
            dictionary=("metric", "server"),
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
