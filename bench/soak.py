"""Soak: the lake's long-running processes together for a long time, with continuous compaction, checked every few
minutes for growth.

Runs on a fresh local lake, all on this machine:

- ``lake gateway`` (default options), with agents posting the simulator's
  events through it as JSON at ``--rate`` events/s (in this process, one
  request a second per 10,000 events, the timestamps the wall clock's);
- ``lake stream --trigger 1 --metrics-port P`` (Spark local[2]), compacting
  its tables continuously (``LAKE_COMPACTION_*`` defaults);
- ``lake dashboard``, whose first stored query's panel is fetched every 10 s.

Every ``--report-minutes`` it prints a row: minutes run, RSS of the gateway,
the stream (its driver, and the whole tree: JVM and Python workers) and the
dashboard at that moment, the lowest and highest RSS of the driver over the
period (sampled every 2 s: it saws between its batches' and compaction's
peaks and the trims after them, so one sample says little of a trend) and
of the gateway,
active files per speed table (the stream's ``/metrics``), the
windows lag p99 of the period (seconds since the moment the log held as many
records as ``metric_windows_1m`` does, sampled every 2 s), the dashboard
panel's latency and a warm analyst query's (the last 15 minutes of
``metric_windows_1m`` aggregated per metric, with deltalake and pyarrow in
this process: the same snapshot every reader sees), and what the driver's
allocators hold (its ``lake_process_*`` gauges: glibc malloc's bytes in use
and kept free, pyarrow's pool; the times it gave free memory back so far):
data held, against memory kept for reuse; and the stream's mean batch
seconds over the period, followed by a line of each step's mean seconds per
batch (``lake_stream_batch_stage_seconds_total``): which step a slower
stream spends its time in. At the end the agents
stop, the stream catches up, and bronze must hold every acknowledged event
exactly once (positions unique, count equal).

The issue's targets compare each figure with its value at minute 10: RSS
within +10 %, files per table per day bounded, lag and query latency within
+10 %. Run: ``python bench/soak.py [--rate 40000] [--minutes 120]
[--report-minutes 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import requests
from common import LAKE, free_port, lake_env, mib, scratch_dir
from deltalake import DeltaTable

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core import keys
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.tables.commits import committed_offsets
from metrics_lake.lake_schemas.tables import Table

METRICS_PER_SERVER = 10
CYCLE_S = 60  # seconds of simulated load generated once, sent again with times moved on
TABLES = (Table.BRONZE_EVENTS, Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS, Table.LAST_SEEN, Table.ALERTS)


def wait_url(url: str, timeout: float = 180) -> None:
    """Until ``url`` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


class Agents:
    """Posts ``rate`` events/s to the gateway, in real time; counts what the gateway acknowledged."""

    def __init__(self, url: str, rate: int) -> None:
        servers = max(rate // METRICS_PER_SERVER, 1)
        table = FleetSimulator(
            servers=servers, metrics=METRICS_PER_SERVER, seconds=CYCLE_S, seed=7, start_ms=0
        ).generate()
        self.url = f"{url}/v1/events"
        seconds = pc.divide(table.column("ts").cast(pa.int64()), 1000).cast(pa.int64()).to_numpy()
        rows = table.select(["server", "metric", "value"]).to_pylist()
        self.per_second: list[list[dict]] = [[] for _ in range(CYCLE_S)]
        for second, row in zip(seconds, rows, strict=True):
            self.per_second[int(second) % CYCLE_S].append(row)
        self.acked = 0
        self.failed = 0
        self.timeline: list[tuple[float, int]] = []  # (monotonic, events acknowledged so far)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        """Post each second's events (in requests of 10,000) until :attr:`stop`."""
        session = requests.Session()
        started = time.monotonic()
        second = 0
        while not self.stop.wait(max(0.0, started + second - time.monotonic())):
            now_ms = int(time.time() * 1000)
            events = [{**row, "ts": now_ms} for row in self.per_second[second % CYCLE_S]]
            for at in range(0, len(events), 10_000):
                body = json.dumps(events[at : at + 10_000])
                try:
                    answer = session.post(self.url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
                    if answer.status_code == 200:
                        self.acked += len(events[at : at + 10_000])
                    else:
                        self.failed += 1
                except requests.RequestException:
                    self.failed += 1
            self.timeline.append((time.monotonic(), self.acked))
            second += 1


def windows_records(root, partitions: int) -> int:
    """Records ``metric_windows_1m`` holds: the sum of its committed positions."""
    path = root / keys.table_prefix(Table.METRIC_WINDOWS_1M)
    if not (path / "_delta_log").exists():
        return 0
    marks = committed_offsets(DeltaTable(str(path)), CONSUMER, "metrics", range(partitions))
    return sum(m or 0 for m in marks.values())


def analyst_query(root) -> float:
    """Seconds of a warm analyst query: the last 15 minutes of windows, per metric, on the latest snapshot."""
    started = time.perf_counter()
    table = DeltaTable(str(root / keys.table_prefix(Table.METRIC_WINDOWS_1M)))
    since = pa.scalar(int((time.time() - 900) * 1_000_000), pa.timestamp("us", "UTC"))
    data = table.to_pyarrow_dataset().to_table(
        columns=["metric", "count", "max"], filter=pc.field("window_start") >= since
    )
    data.group_by("metric").aggregate([("count", "sum"), ("max", "max")])
    return time.perf_counter() - started


def rss(pid: int, tree: bool = False) -> int:
    """Resident bytes of ``pid`` (and its descendants with ``tree``); 0 if gone."""
    try:
        process = psutil.Process(pid)
        members = [process, *process.children(recursive=True)] if tree else [process]
        return sum(m.memory_info().rss for m in members if m.is_running())
    except psutil.Error:
        return 0


def bronze_positions(root) -> tuple[int, int]:
    """(rows, distinct log positions) of ``bronze_events``, counted one data file at a time: a per-partition count
    of each offset (numpy ``bincount``), so 2 hours at 40,000 events/s (288 M rows) take a few GiB. Reading them whole
    into Python lists took the harness past 23 GiB (OOM-killed, 2026-11-28)."""
    table = DeltaTable(str(root / keys.table_prefix(Table.BRONZE_EVENTS)))
    counts: dict[int, np.ndarray] = {}
    rows = 0
    for batch in table.to_pyarrow_dataset().to_batches(columns=["partition", "offset"]):
        rows += batch.num_rows
        partitions = batch.column("partition").to_numpy()
        offsets = batch.column("offset").to_numpy()
        for partition in np.unique(partitions):
            of_partition = offsets[partitions == partition]
            low = int(of_partition.min())
            seen = np.bincount(of_partition - low)  # a data file holds a narrow range of offsets
            known = counts.get(int(partition), np.zeros(0, np.int32))
            if len(known) < low + len(seen):  # grown by doubling: amortised, not a copy per batch
                grown = np.zeros(max(low + len(seen), 2 * len(known)), np.int32)
                grown[: len(known)] = known
                known = grown
            known[low : low + len(seen)] += seen.astype(np.int32)
            counts[int(partition)] = known
    return rows, sum(int(np.count_nonzero(c)) for c in counts.values())


def low_high(samples: list[int]) -> str:
    """``lowest-highest`` of RSS samples (bytes), in MiB."""
    return f"{mib(min(samples))}-{mib(max(samples))}"


def active_files(text: str) -> dict[str, int]:
    """``lake_table_active_files`` per table, from the stream's ``/metrics`` text."""
    return {
        m[1]: int(float(m[2])) for m in re.finditer(r'^lake_table_active_files\{table="(\w+)"\} (\S+)$', text, re.M)
    }


def batch_seconds(text: str) -> dict[str, float]:
    """From the stream's ``/metrics`` text: the batches so far (``batches``), their total seconds (``total``) and
    the seconds spent in each of their steps (by step name): counters, so two scrapes give a period's means."""
    spent = {
        "batches": gauge(text, "lake_stream_batch_seconds_count"),
        "total": gauge(text, "lake_stream_batch_seconds_sum"),
    }
    for found in re.finditer(r'^lake_stream_batch_stage_seconds_total\{stage="([^"]+)"\} (\S+)$', text, re.M):
        spent[found[1]] = float(found[2])
    return spent


def per_batch(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Mean seconds per batch of each counter of :func:`batch_seconds` between two scrapes (``total``: the whole
    batch); empty if no batch ran between them."""
    batches = now["batches"] - before.get("batches", 0.0)
    if not batches > 0:
        return {}
    return {name: (value - before.get(name, 0.0)) / batches for name, value in now.items() if name != "batches"}


def gauge(text: str, name: str) -> float:
    """The value of unlabelled gauge ``name`` in a ``/metrics`` text (NaN if absent)."""
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found[1]) if found else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=40_000)
    parser.add_argument("--minutes", type=float, default=120)
    parser.add_argument("--report-minutes", type=float, default=5)
    args = parser.parse_args()
    work = scratch_dir("lake-soak-")
    gateway_port, stream_port, dashboard_port = free_port(), free_port(), free_port()
    env = lake_env(work, LAKE_TRIGGER_SECONDS="1", LAKE_SHUFFLE_PARTITIONS="2")
    root = work / "lakehouse"
    logs = {name: open(work / f"{name}.log", "wb") for name in ("gateway", "stream", "dashboard")}  # noqa: SIM115
    gateway = subprocess.Popen(
        [LAKE, "gateway", "--port", str(gateway_port)], env=env, stdout=logs["gateway"], stderr=subprocess.STDOUT
    )
    wait_url(f"http://127.0.0.1:{gateway_port}/healthz")
    agents = Agents(f"http://127.0.0.1:{gateway_port}", args.rate)
    agents.thread.start()
    stream = subprocess.Popen(
        [LAKE, "stream", "--metrics-port", str(stream_port)],
        env=env,
        stdout=logs["stream"],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    dashboard = subprocess.Popen(
        [LAKE, "dashboard", "--port", str(dashboard_port)], env=env, stdout=logs["dashboard"], stderr=subprocess.STDOUT
    )
    metrics_url = f"http://127.0.0.1:{stream_port}/metrics"
    dash = f"http://127.0.0.1:{dashboard_port}"
    try:
        wait_url(metrics_url)
        wait_url(f"{dash}/api/health")
    except RuntimeError as failed:  # nothing left running; the logs say why
        agents.stop.set()
        for process in (gateway, stream, dashboard):
            process.kill()
        tails = {name: (work / f"{name}.log").read_text(errors="replace")[-800:] for name in logs}
        raise SystemExit(f"soak: {failed}; the processes' last output: {tails}") from None
    panel = f"{dash}/api/queries/{requests.get(f'{dash}/api/queries', timeout=10).json()['queries'][0]['name']}/series"
    started = time.monotonic()
    lags: list[float] = []
    panel_seconds: list[float] = []
    driver_rss: list[int] = []
    gateway_rss: list[int] = []
    next_panel = next_report = started
    spent_before: dict[str, float] = {}
    print(
        f"{'min':>5} {'gateway':>9} {'driver':>9} {'stream tree':>12} {'dashboard':>10} "
        + " ".join(f"{t[:12]:>12}" for t in TABLES)
        + f" {'lag p99 s':>10} {'panel s':>8} {'query s':>8} {'acked ev/s':>11} {'driver min-max':>15}"
        + f" {'malloc used':>12} {'malloc free':>12} {'arrow':>6} {'releases':>9} {'gateway min-max':>16} {'batch s':>8}",
        flush=True,
    )
    try:
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(2)
            now = time.monotonic()
            counted = windows_records(root, 4)
            times = [t for t, _ in agents.timeline]
            counts = [c for _, c in agents.timeline]
            reached = int(np.searchsorted(counts, counted, side="right"))
            lags.append(0.0 if reached >= len(times) else now - times[reached])
            driver_rss.append(rss(stream.pid))
            gateway_rss.append(rss(gateway.pid))
            if now >= next_panel:
                t0 = time.perf_counter()
                requests.get(panel, timeout=60)
                panel_seconds.append(time.perf_counter() - t0)
                next_panel = now + 10
            if now >= next_report + args.report_minutes * 60:
                next_report = now
                scraped = requests.get(metrics_url, timeout=5).text
                files = active_files(scraped)
                malloc_used, malloc_free, arrow = (
                    gauge(scraped, f"lake_process_{name}_bytes")
                    for name in ("malloc_in_use", "malloc_free", "arrow_allocated")
                )
                releases = gauge(scraped, "lake_process_malloc_releases_total")
                spent = batch_seconds(scraped)
                means, spent_before = per_batch(spent, spent_before), spent
                minutes = (now - started) / 60
                rate = agents.acked / max(now - started, 1e-9)
                print(
                    f"{minutes:>5.0f} {mib(rss(gateway.pid)):>9} {mib(rss(stream.pid)):>9} "
                    f"{mib(rss(stream.pid, tree=True)):>12} {mib(rss(dashboard.pid)):>10} "
                    + " ".join(f"{files.get(str(t), 0):>12,}" for t in TABLES)
                    + f" {np.percentile(lags, 99):>10.1f} {np.median(panel_seconds):>8.3f} {analyst_query(root):>8.3f}"
                    f" {rate:>11,.0f} {low_high(driver_rss):>15}"
                    f" {malloc_used / 2**20:>12,.0f} {malloc_free / 2**20:>12,.0f} {arrow / 2**20:>6,.0f}"
                    f" {releases:>9,.0f} {low_high(gateway_rss):>16} {means.get('total', float('nan')):>8.3f}",
                    flush=True,
                )
                steps = ", ".join(f"{name} {seconds:.3f}" for name, seconds in means.items() if name != "total")
                print(f"{'':>5} batch steps, mean s: {steps}", flush=True)
                lags, panel_seconds, driver_rss, gateway_rss = [], [], [], []
    finally:
        agents.stop.set()
        agents.thread.join(60)
        print(f"agents stopped: {agents.acked:,} events acknowledged, {agents.failed} failed requests", flush=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and windows_records(root, 4) < agents.acked:
            time.sleep(1)
        stream.send_signal(signal.SIGTERM)
        stream.wait(120)
        for process in (gateway, dashboard):
            process.terminate()
            process.wait(60)
        for handle in logs.values():
            handle.close()
    rows, distinct = bronze_positions(root)
    twice = rows - distinct
    print(
        f"bronze: {rows:,} rows, {distinct:,} positions, {twice} rows of a position seen before; "
        f"acknowledged {agents.acked:,} events ({agents.failed} failed requests): "
        + ("EXACT" if twice == 0 and rows == agents.acked else "NOT EXACT")
    )
    print(f"logs under {work} ({', '.join(sorted(logs))}.log); pid {os.getpid()}")


if __name__ == "__main__":
    main()
