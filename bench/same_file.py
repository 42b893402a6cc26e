"""Benchmark: one JSON Lines file into bronze and 1-minute windows, the lake's CLI against DuckDB, same file, same run.

For each size (servers x metrics x seconds of the fleet simulator, one sample
per series and second, one line in 1,000 broken in one of four ways):

- **lake**: ``lake produce --from-file F`` then ``lake stream --once`` on a
  fresh local lake, each a fresh process (CLI wall time, Spark's start-up
  included), with the peak RSS of each command's process tree (driver JVM,
  Python workers) and of its largest process;
- **DuckDB** (``threads=2``): read the file, keep the valid events (the
  contract's checks in SQL), write bronze Parquet partitioned by date, and
  1-minute windows per (metric, server) with count/sum/min/max/avg and
  ``approx_quantile`` p50/p95/p99 to Parquet — what a one-machine user would
  do instead;
- ``pyarrow.json`` parsing the file alone, as the floor of any Arrow reader.

The outputs are checked against each other (valid events and windows
counted) before anything is printed. Run:
``python bench/same_file.py [--sizes 500x10x240 500x10x2400]``.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow.json as pj
from common import BROKEN, LAKE, duckdb_windows_sql, lake_env, mib, run_measured, write_jsonl
from deltalake import DeltaTable

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.lake_schemas.tables import Table

START_MS = 1_763_596_800_000  # 2025-11-20T00:00:00Z


def duckdb_peer(source: Path, out: Path) -> tuple[float, int, int]:
    """Seconds, valid events and windows for DuckDB doing the same work with two threads."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute(f"SET temp_directory = '{out / 'spill'}'")  # not ./.tmp wherever this runs
    con.execute(
        f"""
        CREATE TEMP VIEW events AS
        SELECT epoch_ms(ts) AS ts, server, metric, value, tags
        FROM read_json('{source}', format = 'newline_delimited', ignore_errors = true,
             columns = {{ts: 'BIGINT', server: 'VARCHAR', metric: 'VARCHAR', value: 'DOUBLE',
                         tags: 'MAP(VARCHAR, VARCHAR)'}})
        WHERE ts BETWEEN 946684800000 AND 4102444799999
          AND server IS NOT NULL AND length(server) BETWEEN 1 AND 128
          AND regexp_full_match(metric, '[a-z0-9_.]{{1,128}}')
          AND value IS NOT NULL AND isfinite(value)
        """
    )
    con.execute(
        f"""COPY (SELECT *, CAST(ts AS DATE) AS event_date FROM events)
            TO '{out / "bronze"}' (FORMAT parquet, PARTITION_BY (event_date), COMPRESSION zstd)"""
    )
    windows = out / "windows.parquet"
    con.execute(f"COPY ({duckdb_windows_sql('events')}) TO '{windows}' (FORMAT parquet, COMPRESSION zstd)")
    seconds = time.perf_counter() - started
    events = con.execute(f"SELECT count(*) FROM read_parquet('{out / 'bronze'}/*/*.parquet')").fetchone()[0]
    windows = con.execute(f"SELECT count(*) FROM read_parquet('{out / 'windows.parquet'}')").fetchone()[0]
    return seconds, events, windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["500x10x240", "500x10x2400"])
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        servers, metrics, seconds = (int(x) for x in size.split("x"))
        with tempfile.TemporaryDirectory(prefix="lake-bench-") as tmp:
            work = Path(tmp)
            source = work / "events.jsonl"
            events = FleetSimulator(
                servers=servers, metrics=metrics, seconds=seconds, seed=1, start_ms=START_MS
            ).generate()
            invalid = write_jsonl(events, source, invalid_every=1000)
            total = events.num_rows + invalid
            del events
            clean = b"\n".join(line for line in source.read_bytes().split(b"\n") if line not in BROKEN)
            started = time.perf_counter()
            pj.read_json(io.BytesIO(clean))  # the valid lines only: it cannot read the broken ones
            parse = time.perf_counter() - started
            del clean
            env = lake_env(work)
            produce = run_measured([LAKE, "produce", "--from-file", str(source)], env, cwd=work)
            stream = run_measured([LAKE, "stream", "--once"], env, cwd=work)
            lake = work / "lakehouse"
            bronze = DeltaTable(str(lake / keys.table_prefix(Table.BRONZE_EVENTS))).to_pyarrow_table(columns=["offset"])
            windows = DeltaTable(str(lake / keys.table_prefix(Table.METRIC_WINDOWS_1M))).to_pyarrow_table(
                columns=["count"]
            )
            bronze, windows = bronze.num_rows, windows.num_rows
            duck_seconds, duck_events, duck_windows = duckdb_peer(source, work / "duckdb")
            assert bronze == duck_events == total - invalid, (bronze, duck_events, total - invalid)
            assert windows == duck_windows, (windows, duck_windows)
            lake_seconds = produce.seconds + stream.seconds
            rows.append(
                (
                    f"{total:,}",
                    f"{produce.seconds:.1f} ({total / produce.seconds / 1e6:.2f} M/s)",
                    f"{stream.seconds:.1f}",
                    f"{lake_seconds:.1f} ({total / lake_seconds / 1e6:.2f} M/s)",
                    f"{duck_seconds:.1f} ({total / duck_seconds / 1e6:.2f} M/s)",
                    f"{duck_seconds / lake_seconds:.2f}x",
                    f"{total / parse / 1e6:.2f}",
                    f"{mib(produce.peak_tree_rss)} / {mib(stream.peak_tree_rss)} ({mib(stream.peak_process_rss)})",
                )
            )
    header = (
        "events",
        "lake produce s",
        "lake stream --once s",
        "lake total s",
        "DuckDB s",
        "lake vs DuckDB",
        "pyarrow.json M/s",
        "peak RSS MiB produce / stream (largest process)",
    )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
