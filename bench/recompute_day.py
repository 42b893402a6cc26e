"""Benchmark: the nightly recompute of one simulated day, against DuckDB on the same bronze files.

Builds a lake whose ``bronze_events`` holds two UTC days of simulator events
(each ``--servers`` x ``--metrics`` series at ``--rate`` samples/s for 86,400 s;
the demo's fleet is 20 x 8 at 1/s = 13.8 M events a day), written in hourly
chunks straight into bronze (not timed), then times, in this process:

- **recompute**: the batch layer's recompute of a day (Spark local[2]:
  tasks read the day's files and compute window states, a shuffle by series,
  merged and finalized windows written by the tasks, one Delta commit, the
  reconciliation), Spark's session start excluded. The first day runs in a
  *cold* session (its first jobs start Spark's Python workers and warm the
  JVM, as a one-day ``lake recompute`` pays); the second in the same, now
  *warm*, session (as each further day of a backfill or a long-lived job).
  The session start is printed too, with the session and the cold day
  together (the session starts the Python workers in the background, so
  part of their start may fall in either);
- **DuckDB** (``threads=2``): the second day's bronze Parquet files grouped
  by (metric, server, minute) with count/sum/min/max/avg and
  ``approx_quantile`` p50/p95/p99, written to Parquet;
- **chDB** (in-process ClickHouse, ``max_threads=2``): the same windows from
  the same files, with a mergeable sketch as the lake keeps (a serialised
  t-digest state, :func:`common.chdb_windows_sql`).

Prints events/s for both, the ratio, and the peak RSS of this process
(driver) and of Spark's Python workers. Run:
``python bench/recompute_day.py [--servers 20 --metrics 8 --rate 1]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import time
from pathlib import Path

import duckdb
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from common import chdb_session, chdb_windows_sql, duckdb_windows_sql, scratch_dir

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import BRONZE_EVENTS, Table
from metrics_lake.spark.jobs.recompute import recompute
from metrics_lake.spark.session import build_session

DAYS = (dt.date(2027, 1, 15), dt.date(2027, 1, 16))


def fill_bronze(settings, day: dt.date, servers: int, metrics: int, rate: float, first_offset: int) -> int:
    """Write one day of events into bronze_events, one commit per hour; returns the event count."""
    store = open_store(settings)
    day_start_ms = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)
    total = first_offset
    for hour in range(24):
        sim = FleetSimulator(
            servers=servers,
            metrics=metrics,
            seconds=3600,
            rate=rate,
            seed=day.toordinal() * 24 + hour,
            start_ms=day_start_ms + hour * 3_600_000,
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
                "labels": pa.nulls(n, BRONZE_EVENTS.field("labels").type),  # written before the lake had an inventory
            }
        )
        files = write_data_files(store, Table.BRONZE_EVENTS, rows)
        commit_files(store, Table.BRONZE_EVENTS, [f.add_action() for f in files], app_id="bench", batch_id=total)
        total += n
    return total - first_offset


def day_files(settings, day: dt.date) -> list[str]:
    """Paths of the active bronze files of ``day``."""
    table = open_table(open_store(settings), Table.BRONZE_EVENTS)
    return [
        f"{settings.root}/{keys.table_key(Table.BRONZE_EVENTS, p)}"
        for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
        if f"event_date={day.isoformat()}/" in p
    ]


def duckdb_peer(settings, day: dt.date, out: Path) -> float:
    """Seconds for DuckDB (2 threads) to compute the same windows from ``day``'s bronze files."""
    paths = day_files(settings, day)
    started = time.monotonic()
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute(f"SET temp_directory = '{out.parent / 'duckdb-spill'}'")  # not ./.tmp wherever this runs
    listing = ", ".join(f"'{p}'" for p in paths)
    con.execute(
        f"COPY ({duckdb_windows_sql(f'read_parquet([{listing}])')}) TO '{out}' (FORMAT parquet, COMPRESSION zstd)"
    )
    return time.monotonic() - started


def chdb_peer(settings, day: dt.date, out: Path) -> tuple[float, int]:
    """Seconds and windows for chDB (2 threads) computing the same windows, with sketches, from ``day``'s bronze
    files."""
    paths = day_files(settings, day)
    folders = {str(Path(p).parent) for p in paths}
    assert len(folders) == 1, folders  # a day's files share its partition folder
    names = ",".join(Path(p).name for p in paths)
    chdb = chdb_session(out.parent / "chdb-session")
    started = time.monotonic()
    source = f"file('{folders.pop()}/{{{names}}}', 'Parquet')"  # {a,b}: ClickHouse's alternatives in a path
    chdb.query(
        f"INSERT INTO FUNCTION file('{out}', 'Parquet') {chdb_windows_sql(source)} "
        "SETTINGS output_format_parquet_compression_method = 'zstd'"
    )
    seconds = time.monotonic() - started
    windows = int(chdb.query(f"SELECT count() FROM file('{out}', 'Parquet')", "CSV").bytes())
    chdb.close()
    return seconds, windows


def children_rss() -> dict[str, int]:
    """Summed RSS of this process's children by kind: the driver JVM (``java``) and Spark's Python workers."""
    totals = {"java": 0, "python": 0}
    for child in psutil.Process().children(recursive=True):
        try:
            kind = "java" if "java" in child.name() else "python" if "python" in child.name() else None
            if kind:
                totals[kind] += child.memory_info().rss
        except psutil.Error:
            pass
    return totals


def main() -> None:
    """Fill bronze, then time the recompute and the peer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1.0)
    args = parser.parse_args()
    work = scratch_dir("bench-recompute-")
    settings = load_settings(root=str(work / "lake"), checkpoint_dir=str(work / "ck"), shuffle_partitions=4)
    started = time.monotonic()
    events = []
    for day in DAYS:
        events.append(fill_bronze(settings, day, args.servers, args.metrics, args.rate, sum(events)))
    print(
        f"bronze: {events[0]:,} events on each of {DAYS[0]} and {DAYS[1]}, written in "
        f"{time.monotonic() - started:.0f} s (not timed)"
    )
    session_started = time.monotonic()
    spark = build_session(settings, "bench-recompute")
    session_seconds = time.monotonic() - session_started
    cold, warm = recompute(spark, settings, list(DAYS))
    rss = children_rss()
    for label, result in (("recompute, cold session", cold), ("recompute, warm session", warm)):
        print(
            f"{label}  {result.seconds:7.1f} s  {result.events / result.seconds:>12,.0f} ev/s  "
            f"({result.windows:,} windows)",
            flush=True,  # before the peer runs: its failure must not lose them
        )
    whole = session_seconds + cold.seconds
    print(
        f"  Spark session start {session_seconds:.1f} s, not in the figures above; session + cold day "
        f"{whole:.1f} s, {cold.events / whole:,.0f} ev/s (what a one-day `lake recompute` waits for)",
        flush=True,
    )
    seconds = duckdb_peer(settings, DAYS[1], work / "duckdb-windows.parquet")
    print(
        f"DuckDB                   {seconds:7.1f} s  {events[1] / seconds:>12,.0f} ev/s  (2 threads, approx_quantile)"
    )
    ch_seconds, ch_windows = chdb_peer(settings, DAYS[1], work / "chdb-windows.parquet")
    assert ch_windows == warm.windows, (ch_windows, warm.windows)
    print(
        f"chDB                     {ch_seconds:7.1f} s  {events[1] / ch_seconds:>12,.0f} ev/s  "
        "(2 threads, t-digest state kept as the sketch)"
    )
    print(f"recompute / DuckDB: cold {seconds / cold.seconds:.2f}, warm {seconds / warm.seconds:.2f}")
    print(f"recompute / chDB:   cold {ch_seconds / cold.seconds:.2f}, warm {ch_seconds / warm.seconds:.2f}")
    print(
        f"memory after the recomputes: driver JVM {rss['java'] / 2**20:,.0f} MiB, Spark's Python workers "
        f"{rss['python'] / 2**20:,.0f} MiB; this Python process peaked at "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB (it also ran DuckDB)"
    )
    spark.stop()


if __name__ == "__main__":
    main()
