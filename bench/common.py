"""What the benchmarks share: running a command while sampling the memory of its process tree, the simulator's events as JSON Lines.

Not a test: the benchmarks print figures beside peers run in the same
process, they assert nothing about speed.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

LAKE = str(Path(sys.executable).with_name("lake"))


def scratch_dir(prefix: str) -> Path:
    """A new temporary directory for a benchmark's lake, deleted when this process exits.

    A benchmark's lake holds up to gigabytes; set ``BENCH_KEEP_WORK=1`` to
    keep it for a look afterwards (its path is in the temporary directory,
    named ``<prefix>...``).
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if not os.environ.get("BENCH_KEEP_WORK"):
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@dataclass(frozen=True)
class Run:
    """A finished command: wall seconds, peak RSS (bytes) of the whole process tree and of its largest process."""

    seconds: float
    peak_tree_rss: int
    peak_process_rss: int
    stderr: str


def run_measured(args: list[str], env: dict[str, str], cwd: Path | None = None) -> Run:
    """Run ``args`` and sample the RSS of it and its descendants (Spark's JVM, Python workers) every 50 ms.

    Raises ``RuntimeError`` with the stderr tail if the command fails.
    """
    started = time.perf_counter()
    process = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks = [0, 0]
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(process.pid)
        while not done.is_set():
            try:
                processes = [root, *root.children(recursive=True)]
                sizes = []
                for p in processes:
                    try:
                        sizes.append(p.memory_info().rss)
                    except psutil.NoSuchProcess:
                        pass
                peaks[0] = max(peaks[0], sum(sizes))
                peaks[1] = max(peaks[1], max(sizes, default=0))
            except psutil.NoSuchProcess:
                return
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    done.set()
    sampler.join()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({process.returncode}):\n{stderr[-3000:]}")
    return Run(seconds, peaks[0], peaks[1], stderr)


def lake_env(workdir: Path, **extra: str) -> dict[str, str]:
    """An environment with a fresh local lake under ``workdir`` and nothing else of ``LAKE_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env.update(
        LAKE_ROOT=str(workdir / "lakehouse"),
        LAKE_CHECKPOINT_DIR=str(workdir / "checkpoints"),
        LAKE_SPARK_MASTER="local[2]",
        **extra,
    )
    return env


#: The broken lines :func:`write_jsonl` mixes in, one of each kind in turn.
BROKEN = (
    b'{"ts": 1763600000000, "server": "web-01", "metric": "CPU Usage %", "value": 1}',
    b'{"ts": "yesterday", "server": "web-01", "metric": "app.rpc.count", "value": 1}',
    b'{"server": "web-01", "metric": "app.rpc.count", "value": 1}',
    b"{truncated",
)


def duckdb_windows_sql(source: str) -> str:
    """DuckDB's peer of ``metric_windows_1m``: 1-minute windows per (metric, server) of ``source`` (a table or
    ``read_parquet(...)``), with count/sum/min/max/avg and approximate p50/p95/p99."""
    return f"""
        SELECT metric, server, time_bucket(INTERVAL 1 minute, ts) AS window_start,
               count(*) AS count, sum(value) AS sum, min(value) AS min, max(value) AS max, avg(value) AS avg,
               approx_quantile(value, 0.5) AS p50, approx_quantile(value, 0.95) AS p95,
               approx_quantile(value, 0.99) AS p99
        FROM {source} GROUP BY ALL"""


def chdb_windows_sql(source: str) -> str:
    """chDB's peer of ``metric_windows_1m``: 1-minute windows per (metric, server) of ``source`` (a table or
    ``file(...)``, ``ts`` a DateTime64) with count/sum/min/max/avg, p50/p95/p99 and, as the lake keeps, a mergeable
    sketch: ClickHouse's t-digest state (``quantilesTDigestState``), serialised to bytes (ClickHouse reads it back
    with ``CAST(sketch, 'AggregateFunction(quantilesTDigest(0.5, 0.95, 0.99), Float64)')`` and merges it)."""
    return f"""
        SELECT metric, server, window_start, count, sum, min, max, avg,
               q[1] AS p50, q[2] AS p95, q[3] AS p99, CAST(state AS String) AS sketch
        FROM (SELECT metric, server, toStartOfMinute(ts) AS window_start,
                     count() AS count, sum(value) AS sum, min(value) AS min, max(value) AS max, avg(value) AS avg,
                     quantilesTDigestState(0.5, 0.95, 0.99)(value) AS state, finalizeAggregation(state) AS q
              FROM {source} GROUP BY metric, server, window_start)"""


def chdb_session(workdir: Path):
    """A chDB (in-process ClickHouse) session in ``workdir``, limited to two threads like the lake's Spark."""
    from chdb import session  # imported here: the benchmarks that do not use it need not load ClickHouse

    chdb = session.Session(str(workdir))
    chdb.query("SET max_threads = 2")
    return chdb


def write_jsonl(events, path: Path, invalid_every: int = 0) -> int:
    """Write simulator events (a LOG_RECORD table) as contract JSON Lines; every ``invalid_every``-th line broken.

    Returns the number of invalid lines written. ``ts`` is epoch milliseconds.
    """
    ts = events.column("ts").cast("int64").to_pylist()
    server = events.column("server").to_pylist()
    metric = events.column("metric").to_pylist()
    value = events.column("value").to_pylist()
    tags = events.column("tags").to_pylist()
    broken = [line.decode() for line in BROKEN]
    invalid = 0
    with open(path, "w") as handle:
        for i, (a, b, c, d, e) in enumerate(zip(ts, server, metric, value, tags, strict=True)):
            if invalid_every and i % invalid_every == invalid_every - 1:
                handle.write(broken[invalid % len(broken)] + "\n")
                invalid += 1
            event = {"ts": a, "server": b, "metric": c, "value": d}
            if e:
                event["tags"] = dict(e)
            handle.write(json.dumps(event, separators=(",", ":")) + "\n")
    return invalid


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def data_bytes(path: Path) -> int:
    """Bytes of the files under ``path``, leaving out a Delta table's log (``_delta_log``)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "_delta_log" not in f.parts)


def mib(n: int) -> str:
    """Bytes as MiB with no decimals."""
    return f"{n / 2**20:,.0f}"


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print ``rows`` under ``header`` in aligned columns."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def run_batch_of_the_log(settings, store, open_windows, tables):
    """One in-process micro-batch of everything ``settings``' topic holds past the tables' positions, as the stream's
    driver runs it without Spark (:func:`metrics_lake.core.speed.micro_batch.run_batch_in_process`; ``open_windows``
    and ``tables`` kept from one batch to the next); returns its ``BatchOutcome``."""
    from metrics_lake.core.log.consumer import end_offsets
    from metrics_lake.core.log.log import SegmentLog
    from metrics_lake.core.speed.micro_batch import run_batch_in_process

    return run_batch_in_process(
        store,
        settings.topic,
        end_offsets(SegmentLog(store), settings.topic),
        watermark_seconds=settings.watermark_seconds,
        clock_skew_seconds=settings.quality_clock_skew_seconds,
        open_windows=open_windows,
        tables=tables,
    )
