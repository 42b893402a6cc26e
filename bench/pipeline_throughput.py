"""Benchmark: events/s from producer to bronze + 1-minute windows, against a peer.

For each size, in one process and one SparkSession:

- **lake**: produce simulator events into the segment log (timed), then run
  the speed layer once over them (``run_stream(once=True)``, timed);
- **peer**: the same events as JSON Lines files, read by Spark's own JSON
  file source in one streaming query whose ``foreachBatch`` appends bronze
  with delta-rs ``write_deltalake`` and merges the same windows (count, sum,
  min, max, KLL quantiles) with delta-rs — the DESIGN's reference peer.
  Writing the JSON input is not timed.

Prints events/s for each and the ratio lake/peer. Spark session start-up is
reported once and excluded. Run: ``python bench/pipeline_throughput.py``
(``--sizes`` takes servers x metrics x seconds triples).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables import batch_commit_properties, ensure_table, merge_rows, open_table, table_uri
from metrics_lake.schemas import BRONZE_EVENTS
from metrics_lake.spark.jobs.stream_metrics import finalize_windows, run_stream
from metrics_lake.spark.session import build_session

START_MS = 1_800_000_000_000 - 1_800_000_000_000 % 60_000


def run_lake(spark, events: pa.Table, workdir: Path) -> tuple[float, float]:
    """(produce seconds, stream seconds) for the lake pipeline."""
    settings = load_settings(
        root=str(workdir / "lake"), checkpoint_dir=str(workdir / "ck"), spark_master="local[2]", shuffle_partitions=2
    )
    started = time.perf_counter()
    with Producer(SegmentLog(LocalStore(settings.root)), settings.topic, partitions=settings.partitions) as producer:
        producer.send(events)
    produced = time.perf_counter()
    run_stream(spark, settings, once=True)
    streamed = time.perf_counter()
    rows = open_table(LocalStore(settings.root), "bronze_events").to_pyarrow_table(columns=["offset"]).num_rows
    assert rows == events.num_rows, (rows, events.num_rows)
    return produced - started, streamed - produced


def run_peer(spark, events: pa.Table, workdir: Path) -> float:
    """Seconds for the JSON-source + foreachBatch + delta-rs peer."""
    from pyspark.sql import functions as F

    from metrics_lake.spark.jobs.stream_metrics import window_aggregates

    source = workdir / "json"
    source.mkdir()
    frame = events.select(["ts", "server", "metric", "value"]).to_pandas()
    frame["ts"] = frame["ts"].astype("int64") // 10**6 if frame["ts"].dtype.kind == "M" else frame["ts"]
    frame.to_json(source / "events.json", orient="records", lines=True)
    store = LocalStore(workdir / "peer")
    for name in ("bronze_events", "metric_windows_1m"):
        ensure_table(store, name)

    def upsert(batch_df, batch_id: int) -> None:
        batch_df = batch_df.persist()
        bronze = batch_df.select(
            F.lit("json").alias("topic"),
            F.lit(0).alias("partition"),
            F.lit(0).cast("long").alias("offset"),
            "ts",
            "server",
            "metric",
            "value",
            F.lit(None).cast("map<string,string>").alias("tags"),
            F.current_timestamp().alias("ingested_at"),
            F.to_date("ts").alias("event_date"),
        ).toArrow()
        write_deltalake(
            table_uri(store, "bronze_events"),
            bronze.cast(BRONZE_EVENTS),
            mode="append",
            partition_by=["event_date"],
            commit_properties=batch_commit_properties("peer", batch_id, "PEER WRITE"),
        )
        aggregated = window_aggregates(batch_df.withColumn("reason", F.lit(None).cast("string")), 120)
        rows = finalize_windows(aggregated).toArrow()
        merge_rows(store, "metric_windows_1m", rows, app_id="peer-w", batch_id=batch_id)
        batch_df.unpersist()

    started = time.perf_counter()
    query = (
        spark.readStream.schema("ts LONG, server STRING, metric STRING, value DOUBLE")
        .json(str(source))
        .withColumn("ts", F.timestamp_millis("ts"))
        .writeStream.foreachBatch(upsert)
        .option("checkpointLocation", str(workdir / "peer-ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    rows = open_table(store, "bronze_events").to_pyarrow_table(columns=["server"]).num_rows
    assert rows == events.num_rows, (rows, events.num_rows)
    return elapsed


def main() -> None:
    """Run every size and print a table of events/s and ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["20x8x60", "20x8x600", "100x10x600"],
        help="servers x metrics x seconds at 1 sample/s; default: demo-sized, 10x, 60x",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    spark = build_session(load_settings(spark_master="local[2]", shuffle_partitions=2), "bench-pipeline")
    print(f"spark session start: {time.perf_counter() - started:.1f} s (excluded below)")
    print(
        f"{'events':>9} {'produce ev/s':>13} {'lake stream ev/s':>17} {'lake e2e ev/s':>14} "
        f"{'peer ev/s':>10} {'lake/peer':>9}"
    )
    for size in args.sizes:
        servers, metrics, seconds = (int(part) for part in size.split("x"))
        events = FleetSimulator(servers=servers, metrics=metrics, seconds=seconds, seed=1, start_ms=START_MS).generate()
        n = events.num_rows
        with tempfile.TemporaryDirectory() as lake_dir, tempfile.TemporaryDirectory() as peer_dir:
            produce_s, stream_s = run_lake(spark, events, Path(lake_dir))
            peer_s = run_peer(spark, events, Path(peer_dir))
        lake_e2e = n / (produce_s + stream_s)
        print(
            f"{n:>9,} {n / produce_s:>13,.0f} {n / stream_s:>17,.0f} {lake_e2e:>14,.0f} "
            f"{n / peer_s:>10,.0f} {lake_e2e / (n / peer_s):>9.2f}"
        )
    spark.stop()


if __name__ == "__main__":
    main()
