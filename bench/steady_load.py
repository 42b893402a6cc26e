"""Benchmark: windows lag under steady load, ``lake stream --trigger 1`` against the same speed layer without Spark.

For each rate (events/s; one sample per series per second, so the rate is
also the number of series, as in the design brief's fleet), this process
produces simulator events in real time for ``--seconds`` into a fresh local
lake (the library producer, segments rolled every 250 ms) while the speed
layer runs:

- **lake**: ``lake stream --trigger 1`` as its own process (Spark local[2]);
- **peer**: the same speed layer (:func:`metrics_lake.core.speed.micro_batch.run_batch_in_process`)
  in this process on a 1-second trigger, without Spark.

Every 0.5 s it reads how many records ``metric_windows_1m`` and
``query_results`` hold (the sum of each table's committed log positions) and
turns that into *lag*: the seconds since the moment that many records had
been produced. For ``query_results`` that is the stored queries' evaluation
lag: how long after its events are produced a query window shows them.
Reported: lag p50/p99/max over the ``--seconds`` that follow a warm-up of
:data:`WARM_UP_SECONDS` (the load runs for both), the rate actually
produced, the peak RSS of the stream's process tree, and for the lake the
median seconds of each step of a batch (``lake --verbose stream``'s
stages: planning, Spark tasks, each table's commit). A batch's
windows upsert grows over each wall-clock minute (the open minute's windows
gain buckets), so a measured span of whole minutes (the default, 60 s) weighs
every second of the minute once, wherever the run starts. With
``--compaction-cost`` the peer is instead ``lake stream`` with continuous
compaction off, so the difference is what compaction costs; with
``--peer-set LAKE_X=value`` (repeatable), ``lake stream`` with those
settings. Run: ``python bench/steady_load.py [--rates 50000 100000 200000]
[--seconds 60] [--compaction-cost] [--peer-set LAKE_X=value]``.
"""

from __future__ import annotations

import argparse
import bisect
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
from common import LAKE, lake_env, mib
from deltalake import DeltaTable

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.core.arrow_memory import use_system_allocator
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.commits import committed_offsets
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.lake_schemas.tables import Table

METRICS_PER_SERVER = 100

#: Seconds of load before lag is measured: Spark's first batches, and the tables' first files.
WARM_UP_SECONDS = 15


TABLES = (Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS)


def table_records(root: Path, partitions: int, table: str) -> int:
    """Records ``table`` holds: the sum of its committed positions (0 before it exists)."""
    path = root / keys.table_prefix(table)
    if not (path / "_delta_log").exists():
        return 0
    marks = committed_offsets(DeltaTable(str(path)), CONSUMER, "metrics", range(partitions))
    return sum(m or 0 for m in marks.values())


def produce_in_real_time(settings, rate: int, seconds: int, timeline: list, ready: threading.Event) -> None:
    """Produce ``rate`` events/s for ``seconds``; append (time, records handed over) to ``timeline`` each second."""
    servers = max(rate // METRICS_PER_SERVER, 1)
    simulator = FleetSimulator(
        servers=servers, metrics=METRICS_PER_SERVER, seconds=seconds, seed=1, start_ms=int(time.time() * 1000) + 3000
    )
    batches = list(simulator.second_batches())  # generated before the clock starts
    ready.wait()
    produced = 0
    with producer_for(settings, linger_ms=250) as producer:
        started = time.monotonic()
        for offset, batch in batches:
            time.sleep(max(0.0, started + offset - time.monotonic()))
            producer.send(batch)
            produced += batch.num_rows
            timeline.append((time.monotonic(), produced))
    timeline.append((time.monotonic(), produced))


def measure(root: Path, settings, rate: int, seconds: int, start_consumer, stop_consumer) -> dict:
    """Run one load: produce for a warm-up and then ``seconds`` while sampling the tables; returns the lag
    percentiles of those ``seconds`` and the produced rate."""
    timeline: list[tuple[float, int]] = []
    ready = threading.Event()
    producer = threading.Thread(
        target=produce_in_real_time, args=(settings, rate, WARM_UP_SECONDS + seconds, timeline, ready)
    )
    producer.start()
    start_consumer()
    ready.set()
    samples: dict[str, list] = {table: [] for table in TABLES}

    def behind() -> bool:
        return bool(timeline) and min(table_records(root, settings.partitions, t) for t in TABLES) < timeline[-1][1]

    while producer.is_alive() or behind():
        time.sleep(0.5)
        now = time.monotonic()
        if timeline:
            times = [t for t, _ in timeline]
            counts = [c for _, c in timeline]
            for table in TABLES:
                counted = table_records(root, settings.partitions, table)
                reached = bisect.bisect_right(counts, counted)  # first second whose cumulative count exceeds it
                samples[table].append((now, 0.0 if reached >= len(times) else now - times[reached]))
        if timeline and now > timeline[-1][0] + 120:
            break  # far behind: stop waiting
    stop_consumer()
    producer.join()
    begin = timeline[0][0]
    result = {"produced": timeline[-1][1] / max(timeline[-1][0] - begin, 1e-9)}
    for table in TABLES:
        lags = np.array([lag for at, lag in samples[table] if at > begin + WARM_UP_SECONDS] or [np.nan])
        result[table] = {
            "p50": float(np.percentile(lags, 50)),
            "p99": float(np.percentile(lags, 99)),
            "max": float(lags.max()),
        }
    return result


#: The setting ``--compaction-cost`` gives the peer: continuous compaction off.
COMPACTION_OFF = "LAKE_COMPACTION_INTERVAL_SECONDS=0"


def run_lake(rate: int, seconds: int, settings: dict[str, str] | None = None) -> dict:
    """``lake stream --trigger 1`` at ``rate`` (module docstring); ``settings``: ``LAKE_*`` variables it runs with
    (``LAKE_COMPACTION_INTERVAL_SECONDS=0``: continuous compaction off, to measure what it costs)."""
    with tempfile.TemporaryDirectory(prefix="lake-steady-") as tmp:
        work = Path(tmp)
        env = lake_env(work, LAKE_TRIGGER_SECONDS="1", LAKE_SEGMENT_ROLL_MS="250") | (settings or {})
        settings = load_settings(root=env["LAKE_ROOT"], checkpoint_dir=env["LAKE_CHECKPOINT_DIR"])
        SegmentLog(LocalStore(settings.root)).ensure_topic(settings.topic, settings.partitions)
        process: list[subprocess.Popen] = []
        peak = [0]
        done = threading.Event()

        def sample_rss() -> None:
            while not done.is_set():
                try:
                    root = psutil.Process(process[0].pid)
                    tree = [root, *root.children(recursive=True)]
                    peak[0] = max(peak[0], sum(p.memory_info().rss for p in tree if p.is_running()))
                except psutil.Error:
                    pass
                done.wait(0.5)

        log = work / "stream.log"  # a file, not a pipe: nothing drains a pipe while the load runs

        def start() -> None:
            process.append(
                subprocess.Popen(
                    [LAKE, "--verbose", "stream"], env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=log.open("w")
                )
            )
            threading.Thread(target=sample_rss, daemon=True).start()
            deadline = time.monotonic() + 180  # wait for Spark to be up: the first (empty) tables exist
            while not (work / "lakehouse" / keys.table_key(Table.METRIC_WINDOWS_1M, "_delta_log")).exists():
                if time.monotonic() > deadline or process[0].poll() is not None:
                    raise RuntimeError(log.read_text()[-3000:])
                time.sleep(0.2)
            time.sleep(3)  # the query's first (empty) batches

        def stop() -> None:
            done.set()
            process[0].terminate()
            process[0].wait(60)

        result = measure(Path(settings.root), settings, rate, seconds, start, stop)
        result["rss"] = peak[0]
        result["stages"] = median_stages(log.read_text())
        return result


def median_stages(log: str) -> dict[str, float]:
    """Median seconds of each step of the batches that read records, from ``lake --verbose stream``'s
    ``stages (s): plan 0.01, tasks 0.52, ...`` lines (the batches of the warm-up left out, at about one a second)."""
    batches = [
        dict(
            (name, float(value)) for name, value in (step.rsplit(" ", 1) for step in line.split(": ", 1)[1].split(", "))
        )
        for line in log.splitlines()
        if line.strip().startswith("stages (s):")
    ]
    batches = batches[WARM_UP_SECONDS:]
    return {name: float(np.median([b.get(name, 0.0) for b in batches])) for name in (batches[0] if batches else {})}


def run_peer(rate: int, seconds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lake-steady-peer-") as tmp:
        settings = load_settings(root=f"{tmp}/lakehouse", checkpoint_dir=f"{tmp}/ck")
        store = LocalStore(settings.root)
        SegmentLog(store).ensure_topic(settings.topic, settings.partitions)
        stop_flag = threading.Event()
        open_windows, tables = OpenWindows(), LatestTables()  # as the stream's driver keeps them

        def loop() -> None:
            while not stop_flag.is_set():
                started = time.monotonic()
                ends = end_offsets(SegmentLog(store), settings.topic)
                run_batch_in_process(
                    store,
                    settings.topic,
                    ends,
                    watermark_seconds=settings.watermark_seconds,
                    clock_skew_seconds=settings.quality_clock_skew_seconds,
                    open_windows=open_windows,
                    tables=tables,
                )
                stop_flag.wait(max(0.0, 1.0 - (time.monotonic() - started)))

        worker = threading.Thread(target=loop)
        result = measure(
            Path(settings.root), settings, rate, seconds, worker.start, lambda: (stop_flag.set(), worker.join())
        )
        result["rss"] = psutil.Process().memory_info().rss
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", type=int, default=[50_000, 100_000, 200_000])
    parser.add_argument("--seconds", type=int, default=60, help="seconds measured after the warm-up (whole minutes)")
    parser.add_argument(
        "--compaction-cost",
        action="store_true",
        help="the peer is the same lake stream with continuous compaction off (what compaction costs)",
    )
    parser.add_argument(
        "--peer-set",
        action="append",
        default=[],
        metavar="LAKE_X=value",
        help="the peer is the same lake stream with this setting (repeatable): what the setting changes",
    )
    args = parser.parse_args()
    use_system_allocator()  # the peer allocates as the lake's processes do (metrics_lake.core.arrow_memory)
    print(
        f"{'target ev/s':>12} {'runner':<28} {'produced ev/s':>14} {'table':<18} {'lag p50 s':>10} {'p99 s':>7} "
        f"{'max s':>7} {'peak RSS MiB':>13}"
    )
    peer = ("peer: same code, no Spark", run_peer)
    if args.compaction_cost:
        args.peer_set.append(COMPACTION_OFF)
    if args.peer_set:
        changed = dict(setting.split("=", 1) for setting in args.peer_set)
        name = "peer: no compaction" if args.peer_set == [COMPACTION_OFF] else "peer: " + " ".join(args.peer_set)
        peer = (name, lambda rate, seconds: run_lake(rate, seconds, changed))
    for rate in args.rates:
        for name, run in (("lake stream --trigger 1", run_lake), peer):
            r = run(rate, args.seconds)
            for table in TABLES:
                lag = r[table]
                print(
                    f"{rate:>12,} {name:<28} {r['produced']:>14,.0f} {table:<18} {lag['p50']:>10.1f} "
                    f"{lag['p99']:>7.1f} {lag['max']:>7.1f} {mib(r['rss']):>13}",
                    flush=True,
                )
            if r.get("stages"):
                steps = ", ".join(f"{step} {seconds:.2f}" for step, seconds in r["stages"].items())
                print(f"{'':>12} {'  median batch (s):':<28} {steps}", flush=True)


if __name__ == "__main__":
    main()
