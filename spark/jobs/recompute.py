"""``lake recompute``: the batch layer. Rebuild a day's 1-minute windows from bronze, late events included.

For each UTC day:

1. Spark tasks read that day's ``bronze_events`` files and compute the
   speed layer's window states with the same code
   (:func:`metrics_lake.core.kernels.windows.aggregate_events`), with no watermark, so
   events that arrived too late for the speed layer count; Spark shuffles
   the states by series and tasks merge and finalize them
   (:mod:`metrics_lake.spark.jobs.day_partitions`).
2. Executors write the windows as Parquet files (invisible until committed).
3. The driver sums the speed layer's count and sum per metric for the day,
   then commits the new files with delta-rs ``create_write_transaction``
   in ``overwrite`` mode with ``partition_filters=[("event_date", "=", day)]``:
   one Delta version removes the day's old files and adds the new ones, so a
   reader sees the old day or the new day, never a mix (Delta commits are
   atomic; PROTOCOL.md "Atomic commits").
4. It replaces the day in ``lambda_reconciliation``: per metric, speed vs
   batch count and sum and ``late_events`` = batch count - speed count.

Windows belong to the day they start in, which is the event day of every
event in them, so a day's windows come from exactly that day's bronze.

Re-running changes nothing: the reconciliation rows record fingerprints of
the bronze files read and the window files written; when both still match
the tables, the day is skipped without a commit. If only bronze changed
(late data landed after the last recompute), the speed layer's figures are
kept from the previous reconciliation, since the windows table then holds
the batch layer's numbers, not the speed layer's.

Run it for days the speed layer has finished (older than its watermark): a
speed-layer merge into the same day during the recompute is replaced by it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.kernels.windows import aggregate_events, finalize
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table, table_dataset
from metrics_lake.lake_schemas.table_access import RECOMPUTE
from metrics_lake.lake_schemas.tables import TABLES, Table
from metrics_lake.spark.datasources.delta_reader import table_files
from metrics_lake.spark.jobs.day_partitions import compute_day_files, replace_day, rows_written

BRONZE, WINDOWS, RECONCILIATION = Table.BRONZE_EVENTS, Table.METRIC_WINDOWS_1M, Table.LAMBDA_RECONCILIATION


@dataclass(frozen=True)
class DayResult:
    """One day's recompute: windows written, events counted, late events found, wall seconds; or ``skipped``."""

    day: dt.date
    windows: int
    events: int
    late_events: int
    seconds: float
    skipped: bool = False


def fingerprint(root: str, table: str, day: dt.date) -> str:
    """SHA-256 of the sorted paths of ``table``'s active files for ``event_date = day``.

    Data files are immutable and uniquely named, so it changes exactly when
    the day's data changes.
    """
    files = table_files(root, table, None, ("event_date", day.isoformat()))
    return hashlib.sha256("\n".join(sorted(f.path for f in files)).encode()).hexdigest()


def batch_windows(spark, settings: LakeSettings, day: dt.date):
    """Write ``day``'s windows (``metric_windows_1m`` rows) computed from bronze without a watermark.

    Returns the files written (not committed) and per-metric (count, sum) totals.
    """
    window = TABLES[WINDOWS].window_seconds
    return compute_day_files(
        spark,
        settings.root,
        BRONZE,
        [day],
        ["ts", "server", "metric", "value", "offset", "tags", "labels"],
        lambda events: aggregate_events(events, window),
        WINDOWS,
        lambda merged: finalize(merged, window),
        settings.shuffle_partitions,
        dictionary=("server", "metric"),
    )


def _totals(rows: pa.Table) -> dict[str, tuple[int, float]]:
    """metric -> (sum of count, sum of sum) over window rows."""
    if rows.num_rows == 0:
        return {}
    grouped = rows.group_by("metric").aggregate([("count", "sum"), ("sum", "sum")]).to_pylist()
    return {g["metric"]: (g["count_sum"], g["sum_sum"]) for g in grouped}


def recompute_day(spark, settings: LakeSettings, day: dt.date) -> DayResult:
    """Recompute one UTC day; see the module docstring."""
    started = time.monotonic()
    store, root = open_store(settings), settings.root
    for name in RECOMPUTE.tables:
        ensure_table(store, name)
    on_day = pc.field("event_date") == day
    previous = table_dataset(store, RECONCILIATION).to_table(filter=on_day).to_pylist()
    bronze_fp, windows_fp = fingerprint(root, BRONZE, day), fingerprint(root, WINDOWS, day)
    ours = bool(previous) and previous[0]["windows_fingerprint"] == windows_fp
    if ours and previous[0]["bronze_fingerprint"] == bronze_fp:
        return DayResult(day, 0, 0, 0, time.monotonic() - started, skipped=True)
    if ours:  # the day's windows are still our last recompute's: the speed figures are in reconciliation
        speed = {r["metric"]: (r["speed_count"], r["speed_sum"]) for r in previous}
    else:
        speed = _totals(table_dataset(store, WINDOWS).to_table(columns=["metric", "count", "sum"], filter=on_day))

    files, batch = batch_windows(spark, settings, day)
    replace_day(store, WINDOWS, day, files, "RECOMPUTE")

    computed_at = dt.datetime.now(dt.UTC)
    new_windows_fp = fingerprint(root, WINDOWS, day)
    rows = []
    for metric in sorted(set(speed) | set(batch)):
        speed_count, speed_sum = speed.get(metric, (0, 0.0))
        batch_count, batch_sum = batch.get(metric, (0, 0.0))
        rows.append(
            dict(
                event_date=day,
                metric=metric,
                speed_count=speed_count,
                speed_sum=speed_sum,
                batch_count=batch_count,
                batch_sum=batch_sum,
                late_events=batch_count - speed_count,
                computed_at=computed_at,
                bronze_fingerprint=bronze_fp,
                windows_fingerprint=new_windows_fp,
            )
        )
    reconciliation = pa.Table.from_pylist(rows, schema=TABLES[RECONCILIATION].schema)
    replace_day(store, RECONCILIATION, day, write_data_files(store, RECONCILIATION, reconciliation), "RECOMPUTE")
    late = int(pc.sum(reconciliation.column("late_events")).as_py() or 0)
    events = sum(count for count, _ in batch.values())
    return DayResult(day, rows_written(files), events, late, time.monotonic() - started)


def recompute(
    spark, settings: LakeSettings, days: list[dt.date], progress: Callable[[DayResult], None] | None = None
) -> list[DayResult]:
    """Recompute ``days`` in order; ``progress`` gets each day's result as it finishes."""
    results = []
    for day in days:
        results.append(recompute_day(spark, settings, day))
        if progress is not None:
            progress(results[-1])
    return results
