"""Benchmark: the data-quality checkpoints over one simulated day at the demo's fleet size.

Fills ``bronze_events`` with one UTC day (``--servers`` x ``--metrics`` at 1
sample/s: 20 x 8 = 13.8 M events, with the recompute benchmark's loader),
recomputes the day's windows and rollups (not timed), then times ``lake
quality`` for the day over every table with a suite, and, as a peer in the
same process, a plain Spark job computing the same kind of checks on bronze
by hand (null counts, non-finite values, duplicate positions) in one pass.

Run: ``python bench/quality_day.py [--servers 20 --metrics 8]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

from common import scratch_dir
from recompute_day import DAY, fill_bronze  # the sibling benchmark (this directory is on sys.path)

from metrics_lake.core.config import load_settings
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.quality.checkpoint import run_quality
from metrics_lake.spark.jobs.day_partitions import read_days
from metrics_lake.spark.jobs.recompute import recompute
from metrics_lake.spark.jobs.rollups import rollup
from metrics_lake.spark.session import build_session


def peer(spark, root: str) -> float:
    """Seconds for hand-written Spark checks on the day's bronze: nulls, non-finite values, duplicates."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    bronze = read_days(spark, root, Table.BRONZE_EVENTS, [DAY])
    bronze.agg(
        *[F.sum(F.col(c).isNull().cast("int")).alias(f"null_{c}") for c in ("ts", "server", "metric", "value")],
        F.sum((F.isnan("value") | F.col("value").isin(float("inf"), float("-inf"))).cast("int")).alias("non_finite"),
        F.count(F.lit(1)).alias("rows"),
    ).collect()
    bronze.groupBy("topic", "partition", "offset").count().where("count > 1").count()
    return time.perf_counter() - started


def main() -> None:
    """Build the day, then time the checkpoints and the peer."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=8)
    args = parser.parse_args()
    base = scratch_dir("bench-quality-")
    settings = load_settings(root=str(base / "lake"), checkpoint_dir=str(base / "ck"), spark_master="local[2]")
    events = fill_bronze(settings, args.servers, args.metrics, 1.0)
    spark = build_session(settings, "bench-quality")
    recompute(spark, settings, [DAY])
    rollup(spark, settings, [DAY])
    print(f"{events:,} events in bronze for {DAY}; checking ...", flush=True)
    report = run_quality(spark, settings, DAY, now=dt.datetime.combine(DAY, dt.time(23, 59), dt.UTC))
    checked = sum(report.rows.values())
    print(f"lake quality: {report.seconds:.1f} s for {len(report.outcomes)} expectations over {checked:,} rows")
    for table, rows in report.rows.items():
        print(f"  {table}: {rows:,} rows")
    seconds = peer(spark, settings.root)
    print(f"peer (hand-written Spark checks on bronze, one pass + duplicate scan): {seconds:.1f} s")
    print(f"checkpoints / peer = {report.seconds / seconds:.1f}x the time")


if __name__ == "__main__":
    main()
