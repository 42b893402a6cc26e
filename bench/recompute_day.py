"""Benchmark: the nightly recompute of one simulated day, against a pyarrow peer.

Builds a lake whose ``bronze_events`` holds one UTC day of simulator events
(``--servers`` x ``--metrics`` series at ``--rate`` samples/s for 86,400 s;
the demo's fleet is 20 x 8 at 1/s = 13.8 M events), written in hourly chunks
straight into bronze with the sink's own functions (not timed), then times:

- **recompute**: ``lake recompute`` of that day (Spark: read the day, 1-minute
  windows with count/sum/min/max and KLL sketches, files written by
  executors, one Delta commit, reconciliation);
- **peer**: pyarrow reading the same bronze files and grouping by (metric,
  server, minute) with count/sum/min/max only (no sketches), in this process.

Prints events/s for both and the ratio. Run:
``python bench/recompute_day.py [--servers 20 --metrics 8 --rate 1]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables import commit_files, open_table, write_data_files
from metrics_lake.schemas import BRONZE_EVENTS
from metrics_lake.spark.jobs.recompute import recompute
from metrics_lake.spark.session import build_session

DAY = dt.date(2027, 1, 15)
DAY_START_MS = int(dt.datetime(2027, 1, 15, tzinfo=dt.UTC).timestamp() * 1000)


def fill_bronze(settings, servers: int, metrics: int, rate: float) -> int:
    """Write one day of events into bronze_events, one commit per hour; returns the event count."""
    store = open_store(settings)
    total = 0
    for hour in range(24):
        sim = FleetSimulator(
            servers=servers,
            metrics=metrics,
            seconds=3600,
            rate=rate,
            seed=hour,
            start_ms=DAY_START_MS + hour * 3_600_000,
        )
        events = sim.generate()
        n = events.num_rows
        rows = pa.table(
            {
                "topic": pa.array(["metrics"] * n),
                "partition": pa.array([0] * n, pa.int32()),
                "offset": pa.array(range(total, total + n), pa.int64()),
                "ts": events.column("ts").cast(BRONZE_EVENTS.field("ts").type),
                "server": events.column("server"),
                "metric": events.column("metric"),
                "value": events.column("value"),
                "tags": events.column("tags"),
                "ingested_at": events.column("ts").cast(BRONZE_EVENTS.field("ingested_at").type),
                "event_date": pc.cast(events.column("ts"), pa.date32()),
            }
        )
        files = write_data_files(store, "bronze_events", rows)
        commit_files(store, "bronze_events", [f.add_action() for f in files], app_id="bench", batch_id=hour)
        total += n
    return total


def peer(settings) -> float:
    """Seconds for pyarrow to read the day's bronze files and aggregate count/sum/min/max per window."""
    started = time.monotonic()
    table = open_table(open_store(settings), "bronze_events")
    paths = [
        f"{settings.root}/tables/bronze_events/{p}"
        for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    ]
    data = pq.read_table(paths, columns=["ts", "server", "metric", "value"])
    minute = pc.floor_temporal(data.column("ts"), unit="minute")
    data.append_column("minute", minute).group_by(["metric", "server", "minute"]).aggregate(
        [("value", "count"), ("value", "sum"), ("value", "min"), ("value", "max")]
    )
    return time.monotonic() - started


def main() -> None:
    """Fill bronze, then time the recompute and the peer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-recompute-"))
    settings = load_settings(root=str(work / "lake"), checkpoint_dir=str(work / "ck"), shuffle_partitions=4)
    started = time.monotonic()
    events = fill_bronze(settings, args.servers, args.metrics, args.rate)
    print(f"bronze: {events:,} events for {DAY} written in {time.monotonic() - started:.0f} s (not timed)")
    spark = build_session(settings, "bench-recompute")
    (result,) = recompute(spark, settings, [DAY])
    print(f"recompute   {result.seconds:7.1f} s  {events / result.seconds:>10,.0f} ev/s  ({result.windows:,} windows)")
    seconds = peer(settings)
    print(f"peer        {seconds:7.1f} s  {events / seconds:>10,.0f} ev/s  (pyarrow group-by, no sketches)")
    print(f"recompute / peer: {seconds / result.seconds:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
