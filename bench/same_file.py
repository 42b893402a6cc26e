"""Benchmark: one JSON Lines file into bronze and 1-minute windows, the lake's CLI against DuckDB and chDB, same file, same run.

For each size (servers x metrics x seconds of the fleet simulator, one sample
per series and second, one line in 1,000 broken in one of four ways):

- **lake, sequential**: ``lake produce --from-file F`` then ``lake stream
  --once`` on a fresh local lake, each a fresh process (CLI wall time,
  Spark's start-up included), with the peak RSS of each command's process
  tree (driver JVM, Python workers) and of its largest process;
- **lake, overlapped**: on another fresh lake, ``lake stream --trigger 1``
  and ``lake produce --from-file F`` started together (the stream consumes
  while the import appends), timed until the speed layer has committed the
  log's last record (its consumer group reaches the log's end offsets);
- **lake, into a running stream**: the same, but the stream was started
  first and has committed a one-event warm-up import before the clock
  starts (production's case: the speed layer runs all along, so its
  start-up is not part of an import);
- **DuckDB** (``threads=2``): read the file, keep the valid events (the
  contract's checks in SQL), write bronze Parquet partitioned by date, and
  1-minute windows per (metric, server) with count/sum/min/max/avg and
  ``approx_quantile`` p50/p95/p99 to Parquet — what a one-machine user would
  do instead;
- **chDB** (in-process ClickHouse, ``max_threads=2``): the same work, the
  windows with a mergeable sketch as the lake's (a serialised t-digest
  state, :func:`common.chdb_windows_sql`);
- ``pyarrow.json`` parsing the file alone, as the floor of any Arrow reader.

The outputs are checked against each other (valid events and windows
counted) before anything is printed. A second table compares what each
system stored: bytes per event of the log, of bronze (data files, without
the Delta log) and bytes per window. ``--repeat N`` runs every system N
times per size (fresh lakes and outputs each time) and prints the median
seconds with their range, and the median of each run's own ratio: a single
run of the overlapped import varies by about a second here (which
micro-batch is in flight when the import ends). Run:
``python bench/same_file.py [--sizes 500x10x240 2500x10x480] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import io
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow.json as pj
from common import (
    BROKEN,
    LAKE,
    chdb_session,
    chdb_windows_sql,
    data_bytes,
    duckdb_windows_sql,
    lake_env,
    mib,
    print_table,
    run_measured,
    write_jsonl,
)
from deltalake import DeltaTable

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.consumer_groups import committed_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.storage import open_store
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


def chdb_peer(source: Path, out: Path) -> tuple[float, int, int]:
    """Seconds, valid events and windows for chDB doing the same work as :func:`duckdb_peer` with two threads.

    Lines are read as text and parsed with ``JSONExtract``: ClickHouse's
    ``JSONEachRow`` reader splits a file for its threads by counting braces,
    and one truncated line (the file has some) makes it fail the whole file.
    The valid events are held in memory once for both outputs.
    """
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    chdb = chdb_session(out / "session")
    chdb.query(
        f"""
        CREATE TABLE events ENGINE = Memory AS
        SELECT fromUnixTimestamp64Milli(ts_ms, 'UTC') AS ts, server, metric, value, tags FROM (
            SELECT JSONExtract(line, 'ts', 'Nullable(Int64)') AS ts_ms,
                   JSONExtract(line, 'server', 'Nullable(String)') AS server,
                   JSONExtract(line, 'metric', 'Nullable(String)') AS metric,
                   JSONExtract(line, 'value', 'Nullable(Float64)') AS value,
                   JSONExtract(line, 'tags', 'Map(String, String)') AS tags
            FROM file('{source}', 'LineAsString'))
        WHERE ts_ms BETWEEN 946684800000 AND 4102444799999
          AND server IS NOT NULL AND length(server) BETWEEN 1 AND 128
          AND match(metric, '^[a-z0-9_.]{{1,128}}$')
          AND value IS NOT NULL AND isFinite(value)
        """
    )
    zstd = "SETTINGS output_format_parquet_compression_method = 'zstd'"
    chdb.query(
        f"""INSERT INTO FUNCTION file('{out}/bronze/event_date={{_partition_id}}/data.parquet', 'Parquet')
            PARTITION BY toDate(ts) SELECT * FROM events {zstd}"""
    )
    chdb.query(f"INSERT INTO FUNCTION file('{out}/windows.parquet', 'Parquet') {chdb_windows_sql('events')} {zstd}")
    seconds = time.perf_counter() - started
    events = int(chdb.query(f"SELECT count() FROM file('{out}/bronze/*/*.parquet')", "CSV").bytes())
    windows = int(chdb.query(f"SELECT count() FROM file('{out}/windows.parquet')", "CSV").bytes())
    chdb.close()
    return seconds, events, windows


def overlapped(source: Path, work: Path, *, running: bool) -> float:
    """Wall seconds for ``lake produce --from-file`` into a ``lake stream`` on a fresh lake under ``work``, until the
    speed layer has committed every record the import appended.

    ``running``: the stream is started first and has committed a one-event
    warm-up import before the clock starts, as in production, where the
    speed layer runs all along; else the two start together, and the
    stream's start-up (JVM, session, Spark's planning processes for the
    log source) is on the clock and competes with the import for the cores.
    """
    work.mkdir(parents=True)
    env = lake_env(work)
    settings = load_settings(root=env["LAKE_ROOT"])
    store = open_store(settings)
    with open(work / "stream.log", "w") as log:
        stream = subprocess.Popen([LAKE, "stream", "--trigger", "1"], env=env, cwd=work, stderr=log)
        try:
            if running:
                warm_up = work / "warm-up.jsonl"
                warm_up.write_text(f'{{"ts":{START_MS},"server":"bench-warm-up","metric":"bench.warm_up","value":1}}\n')
                run_measured([LAKE, "produce", "--from-file", str(warm_up)], env, cwd=work)
                _wait_until_committed(store, settings.topic, stream, work, timeout=300)
            started = time.perf_counter()
            run_measured([LAKE, "produce", "--from-file", str(source)], env, cwd=work)
            _wait_until_committed(store, settings.topic, stream, work, timeout=600)
            seconds = time.perf_counter() - started
        finally:
            stream.send_signal(signal.SIGINT)
            stream.wait(120)
    return seconds


def _wait_until_committed(store, topic: str, stream: subprocess.Popen, work: Path, *, timeout: float) -> None:
    """Wait until the speed layer's consumer group has reached ``topic``'s end offsets (polled every 50 ms)."""
    ends = end_offsets(SegmentLog(store), topic)
    deadline = time.monotonic() + timeout
    while committed_offsets(store, CONSUMER, topic) != ends:
        if stream.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"lake stream ended or stalled; see {work / 'stream.log'}")
        time.sleep(0.05)


def run_once(source: Path, work: Path, total: int, invalid: int) -> dict:
    """One timing of every system on ``source`` under ``work``: seconds per system (``produce``, ``stream``,
    ``sequential``, ``overlapped``, ``running``, ``duckdb``, ``chdb``), peak RSS, and the counts checked equal."""
    work.mkdir(parents=True)
    env = lake_env(work)
    produce = run_measured([LAKE, "produce", "--from-file", str(source)], env, cwd=work)
    stream = run_measured([LAKE, "stream", "--once"], env, cwd=work)
    lake = work / "lakehouse"
    bronze = DeltaTable(str(lake / keys.table_prefix(Table.BRONZE_EVENTS))).to_pyarrow_table(columns=["offset"])
    windows = DeltaTable(str(lake / keys.table_prefix(Table.METRIC_WINDOWS_1M))).to_pyarrow_table(columns=["count"])
    bronze, windows = bronze.num_rows, windows.num_rows
    duck_seconds, duck_events, duck_windows = duckdb_peer(source, work / "duckdb")
    ch_seconds, ch_events, ch_windows = chdb_peer(source, work / "chdb")
    assert bronze == duck_events == ch_events == total - invalid, (bronze, duck_events, ch_events, total)
    assert windows == duck_windows == ch_windows, (windows, duck_windows, ch_windows)
    return {
        "produce": produce.seconds,
        "stream": stream.seconds,
        "sequential": produce.seconds + stream.seconds,
        "overlapped": overlapped(source, work / "overlapped", running=False),
        "running": overlapped(source, work / "running", running=True),
        "duckdb": duck_seconds,
        "chdb": ch_seconds,
        "rss": (produce.peak_tree_rss, stream.peak_tree_rss, stream.peak_process_rss),
        "windows": windows,
    }


#: What :func:`run_once` times, in the order of the table's columns.
TIMED = ("produce", "stream", "sequential", "overlapped", "running", "duckdb", "chdb")


def _stored(run: Path, total: int, invalid: int, windows: int) -> tuple[str, ...]:
    """The storage table's row for the outputs of one :func:`run_once` under ``run``: bytes per event of the log and
    of each system's bronze, bytes per window of each system's windows."""
    lake, valid = run / "lakehouse", total - invalid
    return (
        f"{total:,}",
        f"{data_bytes(lake / keys.LOG_PREFIX) / total:.2f}",
        f"{data_bytes(lake / keys.table_prefix(Table.BRONZE_EVENTS)) / valid:.2f}",
        f"{data_bytes(run / 'duckdb' / 'bronze') / valid:.2f}",
        f"{data_bytes(run / 'chdb' / 'bronze') / valid:.2f}",
        f"{data_bytes(lake / keys.table_prefix(Table.METRIC_WINDOWS_1M)) / windows:.0f}",
        f"{(run / 'duckdb' / 'windows.parquet').stat().st_size / windows:.0f}",
        f"{(run / 'chdb' / 'windows.parquet').stat().st_size / windows:.0f}",
    )


def _seconds(runs: list[dict], name: str, total: int) -> str:
    """The median of ``name``'s seconds with its rate; with several runs, their range too."""
    values = [run[name] for run in runs]
    median = statistics.median(values)
    spread = f"; {min(values):.1f}-{max(values):.1f}" if len(values) > 1 else ""
    return f"{median:.1f} ({total / median / 1e6:.2f} M/s{spread})"


def _ratios(runs: list[dict], lake: str) -> str:
    """Peer seconds / lake seconds against DuckDB and chDB: the median of each run's own ratio (same run, same
    machine state), with the range when there are several runs."""
    cells = []
    for peer in ("duckdb", "chdb"):
        ratios = [run[peer] / run[lake] for run in runs]
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        cells.append(f"{statistics.median(ratios):.2f}x{spread}")
    return " / ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["500x10x240", "2500x10x480"])
    parser.add_argument(
        "--repeat", type=int, default=1, help="Runs of every system per size; the tables print medians and ranges."
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    rows, sizes = [], []
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
            runs = []
            for k in range(args.repeat):
                runs.append(run_once(source, work / f"run-{k}", total, invalid))
                if k == 0:  # what each system stored: the same in every run
                    sizes.append(_stored(work / "run-0", total, invalid, runs[0]["windows"]))
                shutil.rmtree(work / f"run-{k}")  # each run's lakes and outputs: gigabytes at 12 M events
            produce_rss, stream_rss, stream_process_rss = (
                max(values) for values in zip(*(r["rss"] for r in runs), strict=True)
            )
            rows.append(
                (
                    f"{total:,}" + (f" x {args.repeat} runs" if args.repeat > 1 else ""),
                    *(_seconds(runs, name, total) for name in TIMED),
                    _ratios(runs, "sequential"),
                    _ratios(runs, "overlapped"),
                    _ratios(runs, "running"),
                    f"{total / parse / 1e6:.2f}",
                    f"{mib(produce_rss)} / {mib(stream_rss)} ({mib(stream_process_rss)})",
                )
            )
    print_table(
        (
            "events",
            "lake produce s",
            "lake stream --once s",
            "lake sequential s",
            "lake overlapped s",
            "lake into a running stream s",
            "DuckDB s",
            "chDB s",
            "sequential vs DuckDB / chDB",
            "overlapped vs DuckDB / chDB",
            "running stream vs DuckDB / chDB",
            "pyarrow.json M/s",
            "peak RSS MiB produce / stream (largest process)",
        ),
        rows,
    )
    print()
    print_table(
        (
            "events",
            "lake log B/event",
            "lake bronze B/event",
            "DuckDB bronze",
            "chDB bronze",
            "lake windows B/window (sketch)",
            "DuckDB windows (no sketch)",
            "chDB windows (t-digest state)",
        ),
        sizes,
    )


if __name__ == "__main__":
    main()
