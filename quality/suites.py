"""Great Expectations suites for each lake table, and the derived columns they check.

GX 1.x has no expectation for "finite", "end - start = size" or "newer than
now - lag" on timestamps, and its row conditions compare values but cannot
match patterns, so :func:`prepare` adds plain columns that make
them ordinary expectations (``value_is_finite``, ``window_seconds``,
``ts_epoch_s`` ...). Each expectation carries ``severity``: ``critical``
ones gate downstream steps (rollups, stored queries); ``warning`` ones are
reported only.

Suites (``<table>``):

- ``bronze_events``: exact column set; required fields not null; finite
  values; event time within [now - retention, now + clock skew]; metric
  names as in the contract; no duplicate (topic, partition, offset).
- ``metric_windows_1m`` and the rollups: count > 0; min <= avg <= max;
  min <= p50 <= p95 <= p99 <= max; window_end - window_start = the window
  size; unique (metric, server, window_start); plausible ranges for known
  metric families (``*.utilization`` in 0..100, ``*_ms`` >= 0); freshness
  (newest window no older than the configured lag, checked for today
  only); volume (the day's row count within a band around the trailing
  7-day median, once 3 earlier days exist).
- ``lambda_reconciliation``: relative speed vs batch count difference within
  the tolerance.
"""

from __future__ import annotations

import datetime as dt
import statistics

from metrics_lake.core.config import LakeSettings
from metrics_lake.lake_schemas.tables import TABLES, Table

#: Tables with a suite (``quality_suite`` in the table registry), and each one's window size in seconds (None: not a window table).
SUITE_TABLES: dict[str, int | None] = {name: spec.window_seconds for name, spec in TABLES.items() if spec.quality_suite}
CRITICAL, WARNING = "critical", "warning"


def prepare(frame, table: str):
    """Add the derived columns ``table``'s suite checks to a Spark DataFrame of its rows."""
    from pyspark.sql import functions as F

    if table == Table.BRONZE_EVENTS:
        return frame.withColumn(
            "value_is_finite", ~(F.isnan("value") | F.col("value").isin(float("inf"), float("-inf")))
        ).withColumn("ts_epoch_s", F.unix_timestamp("ts"))
    if SUITE_TABLES.get(table):
        family = (
            F.when(F.col("metric").endswith(".utilization"), "utilization")
            .when(F.col("metric").endswith("_ms"), "latency")
            .otherwise("other")
        )
        return (
            frame.withColumn("window_seconds", F.unix_timestamp("window_end") - F.unix_timestamp("window_start"))
            .withColumn("window_end_epoch_s", F.unix_timestamp("window_end"))
            .withColumn("metric_family", family)
        )
    if table == Table.LAMBDA_RECONCILIATION:
        return frame.withColumn(
            "count_diff_ratio",
            F.abs(F.col("batch_count") - F.col("speed_count")) / F.greatest(F.col("batch_count"), F.lit(1)),
        )
    return frame


def volume_band(previous_counts: list[int], band: float) -> tuple[int, int] | None:
    """(min, max) rows for a day: ``band`` around the median of the trailing days' counts; None with < 3 days."""
    if len(previous_counts) < 3:
        return None
    median = statistics.median(previous_counts)
    return int(median * (1 - band)), int(median * (1 + band)) + 1


def build_suite(table: str, settings: LakeSettings, day: dt.date, now: dt.datetime, previous_counts: list[int]):
    """The ``great_expectations.ExpectationSuite`` for ``table``'s ``day`` partition, checked at ``now``.

    ``previous_counts`` are the row counts of the up to 7 days before
    ``day`` (for the volume expectation). Raises ``KeyError`` for a table
    without a suite.
    """
    import great_expectations as gx
    from great_expectations import expectations as E
    from great_expectations.expectations.row_conditions import Column

    window = SUITE_TABLES[table]
    suite = gx.ExpectationSuite(name=table)
    add = suite.add_expectation
    add(E.ExpectTableRowCountToBeBetween(min_value=0, severity=WARNING))  # records the row count for trends
    if table == Table.BRONZE_EVENTS:
        add(
            E.ExpectTableColumnsToMatchSet(
                column_set=list(TABLES[table].schema.names) + ["value_is_finite", "ts_epoch_s"],
                exact_match=True,
                severity=CRITICAL,
            )
        )
        for column in ("topic", "partition", "offset", "ts", "server", "metric", "value"):
            add(E.ExpectColumnValuesToNotBeNull(column=column, severity=CRITICAL))
        add(E.ExpectColumnValuesToBeInSet(column="value_is_finite", value_set=[True], severity=CRITICAL))
        oldest = now - dt.timedelta(days=settings.retention_bronze_days + 1)
        newest = now + dt.timedelta(seconds=settings.quality_clock_skew_seconds)
        add(
            E.ExpectColumnValuesToBeBetween(
                column="ts_epoch_s",
                min_value=int(oldest.timestamp()),
                max_value=int(newest.timestamp()),
                severity=WARNING,
            )
        )
        add(E.ExpectColumnValuesToMatchRegex(column="metric", regex=r"^[a-z0-9_.]{1,128}$", severity=CRITICAL))
        add(E.ExpectCompoundColumnsToBeUnique(column_list=list(TABLES[table].key), severity=CRITICAL))
    elif window:
        add(E.ExpectColumnValuesToBeBetween(column="count", min_value=1, severity=CRITICAL))
        for high, low in (
            ("avg", "min"),
            ("max", "avg"),
            ("p50", "min"),
            ("p95", "p50"),
            ("p99", "p95"),
            ("max", "p99"),
        ):
            add(
                E.ExpectColumnPairValuesAToBeGreaterThanB(column_A=high, column_B=low, or_equal=True, severity=CRITICAL)
            )
        add(E.ExpectColumnValuesToBeInSet(column="window_seconds", value_set=[window], severity=CRITICAL))
        # one day is checked at a time, so the key without its day column is unique too
        key = [c for c in TABLES[table].key if c != TABLES[table].day_column]
        add(E.ExpectCompoundColumnsToBeUnique(column_list=key, severity=CRITICAL))
        family = Column("metric_family")
        for column, bounds, which in (
            ("min", {"min_value": 0}, "utilization"),
            ("max", {"max_value": 100}, "utilization"),
            ("min", {"min_value": 0}, "latency"),
        ):
            add(
                E.ExpectColumnValuesToBeBetween(
                    column=column, **bounds, row_condition=family == which, severity=WARNING
                )
            )
        if day == now.date():
            fresh = now - dt.timedelta(seconds=settings.quality_freshness_lag_seconds)
            add(
                E.ExpectColumnMaxToBeBetween(
                    column="window_end_epoch_s", min_value=int(fresh.timestamp()), severity=WARNING
                )
            )
        band = volume_band(previous_counts, settings.quality_volume_band)
        if band is not None:
            add(E.ExpectTableRowCountToBeBetween(min_value=band[0], max_value=band[1], severity=WARNING))
    else:  # lambda_reconciliation
        add(
            E.ExpectColumnValuesToBeBetween(
                column="count_diff_ratio", max_value=settings.quality_reconciliation_tolerance, severity=WARNING
            )
        )
    return suite
