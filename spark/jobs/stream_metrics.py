"""The speed layer: log -> bronze/quarantine and 1-minute windows, exactly once.

Two Spark Structured Streaming queries read the same topic (format
``lakelog``), each with its own checkpoint under ``LAKE_CHECKPOINT_DIR``:

``bronze``
    log rows -> ``lakebronze`` sink (append): valid events to
    ``bronze_events``, rejected ones to ``quarantine_events``, each Delta
    commit carrying ``txn(appId, batchId)``.
``windows``
    valid events -> event-time watermark -> 1-minute tumbling windows per
    (metric, server) with count/sum/min/max and a KLL sketch, in **update**
    mode -> ``foreachBatch`` upsert into ``metric_windows_1m`` with delta-rs
    ``merge`` carrying ``txn(appId, batchId)``. Python data source sinks are
    append-only in Spark 4.2, hence foreachBatch for update mode.

Exactly once: Spark writes a batch's offsets to its offset log before running
it and re-runs the same batch id with the same offsets after a crash; the
source returns the same rows (immutable segments); each sink skips a batch id
its table already recorded for the query's appId. Events later than the
watermark are in bronze but not in the speed layer's windows; the nightly
recompute from bronze covers them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.log.log import SegmentLog, TopicNotFoundError
from metrics_lake.core.storage import LocalStore, ObjectExistsError, Store, open_store
from metrics_lake.core.tables import ensure_table, merge_rows
from metrics_lake.schemas import TABLES

log = logging.getLogger(__name__)
WINDOWS_TABLE = "metric_windows_1m"
#: The speed layer's tumbling window as a Spark interval, from the table registry.
WINDOW_INTERVAL = f"{TABLES[WINDOWS_TABLE].window_seconds} seconds"
QUANTILES = (0.5, 0.95, 0.99)


def query_app_id(checkpoint: Path) -> str:
    """The appId of the query checkpointed at ``checkpoint``, created on first use.

    It lives inside the checkpoint, so it is stable across restarts and
    changes only when the checkpoint is deleted, which also restarts batch
    ids at 0 (the same lifetime Delta-Spark gives its sink's queryId).
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    store = LocalStore(checkpoint)
    try:
        store.create("lake_app_id", f"{checkpoint.name}-{uuid.uuid4().hex}".encode())
    except ObjectExistsError:
        pass
    return store.read("lake_app_id").decode()


#: Consumer groups of the speed layer's two queries (see ``lake consumers``).
BRONZE_GROUP = "speed-bronze"
WINDOWS_GROUP = "speed-windows"


def log_stream(spark, settings: LakeSettings, consumer_group: str | None = None):
    """The topic as a streaming DataFrame of log rows; ``consumer_group`` commits its offsets after each batch."""
    reader = (
        spark.readStream.format("lakelog")
        .option("root", settings.root)
        .option("topic", settings.topic)
        .option("maxRecordsPerBatch", str(settings.max_records_per_batch))
    )
    return (reader.option("consumerGroup", consumer_group) if consumer_group else reader).load()


def event_aggregates() -> list:
    """Aggregate columns of a 1-minute window over raw events: count, sum, min, max and a KLL sketch of ``value``."""
    from pyspark.sql import functions as F

    return [
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.expr("kll_sketch_agg_double(value)").alias("sketch"),
    ]


def merged_aggregates() -> list:
    """The same columns over window rows (for coarser windows): counts and sums added, sketches merged."""
    from pyspark.sql import functions as F

    return [
        F.sum("count").alias("count"),
        F.sum("sum").alias("sum"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        F.expr("kll_merge_agg_double(sketch)").alias("sketch"),
    ]


def window_aggregates(events, watermark_seconds: int):
    """Streaming 1-minute tumbling-window aggregates of valid events.

    Output columns: ``metric, server, window (struct start,end), count, sum,
    min, max, sketch`` (KLL doubles sketch, binary).
    """
    from pyspark.sql import functions as F

    return (
        events.where(F.col("reason").isNull())
        .withWatermark("ts", f"{watermark_seconds} seconds")
        .groupBy(F.window("ts", WINDOW_INTERVAL).alias("window"), "metric", "server")
        .agg(*event_aggregates())
    )


def finalize_windows(aggregates):
    """Add ``avg`` and p50/p95/p99 (read from the sketch) in the table's column order."""
    from pyspark.sql import functions as F

    quantiles = ", ".join(f"{q}D" for q in QUANTILES)
    return aggregates.withColumn("q", F.expr(f"kll_sketch_get_quantile_double(sketch, array({quantiles}))")).select(
        "metric",
        "server",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "count",
        "sum",
        "min",
        "max",
        (F.col("sum") / F.col("count")).alias("avg"),
        F.col("q")[0].alias("p50"),
        F.col("q")[1].alias("p95"),
        F.col("q")[2].alias("p99"),
        "sketch",
        F.current_timestamp().alias("updated_at"),
        F.to_date("window.start").alias("event_date"),
    )


def upsert_windows(store: Store, app_id: str) -> Callable:
    """foreachBatch function: merge a batch's updated windows into ``metric_windows_1m``.

    The batch is always computed (so Spark's state store commits its
    version) but only merged if this appId has not committed ``batch_id``.
    """

    def upsert(batch_df, batch_id: int) -> None:
        rows = finalize_windows(batch_df).toArrow()
        if rows.num_rows:
            merge_rows(store, WINDOWS_TABLE, rows, app_id=app_id, batch_id=batch_id)

    return upsert


@dataclass
class StreamHandles:
    """The two running queries."""

    bronze: object
    windows: object

    def all(self) -> list:
        """Both queries."""
        return [self.bronze, self.windows]


def prepare_lake(settings: LakeSettings) -> Store:
    """Make sure the topic and every table exist; returns the store.

    Cheap and idempotent; commands call it before starting Spark, so a
    wrong root, bad credentials or a missing permission fail in a second
    instead of after the JVM started.
    """
    store = open_store(settings)
    try:
        SegmentLog(store).partitions(settings.topic)
    except TopicNotFoundError:  # started before any producer: create it (needs write access to log/)
        SegmentLog(store).ensure_topic(settings.topic, settings.partitions)
    for name in TABLES:
        ensure_table(store, name)
    return store


def start_queries(spark, settings: LakeSettings, *, trigger_seconds: float) -> StreamHandles:
    """Start the bronze and windows queries for ``settings.topic``.

    Micro-batches start every ``trigger_seconds`` (0: back to back), each
    reading at most ``settings.max_records_per_batch`` records.
    """
    store = prepare_lake(settings)
    base = settings.checkpoint_path / settings.topic
    trigger = {"processingTime": f"{trigger_seconds} seconds"}

    bronze = (
        log_stream(spark, settings, BRONZE_GROUP)
        .writeStream.format("lakebronze")
        .queryName(f"bronze[{settings.topic}]")
        .option("root", settings.root)
        .option("appId", query_app_id(base / "bronze"))
        .option("checkpointLocation", str(base / "bronze"))
        .trigger(**trigger)
        .start()
    )
    windows = (
        window_aggregates(log_stream(spark, settings, WINDOWS_GROUP), settings.watermark_seconds)
        .writeStream.outputMode("update")
        .queryName(f"windows[{settings.topic}]")
        .foreachBatch(upsert_windows(store, query_app_id(base / "windows")))
        .option("checkpointLocation", str(base / "windows"))
        .trigger(**trigger)
        .start()
    )
    return StreamHandles(bronze, windows)


def run_stream(spark, settings: LakeSettings, *, once: bool, stop: threading.Event | None = None) -> None:
    """Run the speed layer; with ``once``, until all available data is processed.

    ``once`` runs micro-batches back to back until the queries have caught up
    with the log, then stops. (Spark's ``availableNow`` trigger is not used:
    for Python data sources it reads the whole backlog as one batch,
    ignoring ``maxRecordsPerBatch``.) Without ``once`` it runs every
    ``settings.trigger_seconds`` until ``stop`` is set (a signal handler sets
    it: raising inside a blocking py4j call could break the JVM gateway) or
    a query fails. Raises ``pyspark.errors.StreamingQueryException`` if a
    query fails.
    """
    handles = start_queries(spark, settings, trigger_seconds=0 if once else settings.trigger_seconds)
    try:
        if once:
            for query in handles.all():
                query.processAllAvailable()
        else:
            stop = stop or threading.Event()
            while not stop.is_set() and not spark.streams.awaitAnyTermination(1.0):
                pass
        for query in handles.all():
            if query.exception() is not None:
                raise query.exception()
    finally:
        for query in handles.all():
            if query.isActive:
                query.stop()
