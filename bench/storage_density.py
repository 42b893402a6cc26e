"""Benchmark: bytes per sample of real node_exporter series in the lake (log, bronze, windows) and in Prometheus's TSDB.

Scrapes a local ``prometheus-node-exporter`` (Debian's) ``--scrapes`` times,
``--interval`` seconds apart, and keeps every sample with a finite value:
one event per sample (``server`` the node, ``metric`` the series name as
the gateway maps Prometheus names, ``tags`` its labels, ``ts`` the scrape
time). Then, each on its own copy of
those samples:

- **lake**: ``lake produce --from-file`` and ``lake stream --once`` on a
  fresh local lake; bytes of the log's segments (with their index), of
  bronze's data files and of the 1-minute windows (``_delta_log`` left out);
- **Prometheus**: bronze exported as OpenMetrics text (every row once, by
  series and time), turned into TSDB blocks by ``promtool tsdb
  create-blocks-from openmetrics``; bytes of the blocks (chunks, index,
  meta, tombstones).

Prints bytes per sample for each, the ratio of log + bronze to Prometheus's
blocks, and the series and samples per series (a block's index is paid per
series: few samples per series make every store look worse). Run:
``python bench/storage_density.py [--scrapes 120 --interval 1]``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import pyarrow.compute as pc
import requests
from common import LAKE, data_bytes, free_port, lake_env, run_measured, scratch_dir
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from metrics_lake.app.gateway.protocols.metric_names import ORIGINAL_NAME_TAG, metric_name
from metrics_lake.core import keys
from metrics_lake.lake_schemas.tables import Table

SERVER = "node-1"


def scrape(scrapes: int, interval: float, out: Path) -> tuple[int, int]:
    """Scrape node_exporter ``scrapes`` times into ``out`` (contract JSON Lines); returns (samples, series)."""
    exporter = shutil.which("prometheus-node-exporter")
    if exporter is None:
        raise SystemExit("prometheus-node-exporter is needed: apt-get install prometheus-node-exporter")
    port = free_port()
    process = subprocess.Popen(
        [exporter, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}/metrics"
    samples, series = 0, set()
    try:
        for _ in range(100):  # up to 10 s for it to listen
            try:
                requests.get(url, timeout=1)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        with out.open("w") as handle:
            for i in range(scrapes):
                at = time.time()
                ts_ms = int(at * 1000)
                for family in text_string_to_metric_families(requests.get(url, timeout=10).text):
                    for sample in family.samples:
                        if not math.isfinite(sample.value):
                            continue  # NaN / ±Inf: the lake quarantines them; keep the samples both stores hold
                        name, original = metric_name(sample.name)  # as the gateway maps Prometheus names
                        tags = {**sample.labels, **({ORIGINAL_NAME_TAG: original} if original else {})}
                        event = {"ts": ts_ms, "server": SERVER, "metric": name, "value": sample.value}
                        if tags:
                            event["tags"] = tags
                        handle.write(json.dumps(event, separators=(",", ":")) + "\n")
                        samples += 1
                        series.add((sample.name, tuple(sorted(sample.labels.items()))))
                if i + 1 < scrapes:
                    time.sleep(max(0.0, interval - (time.time() - at)))
    finally:
        process.terminate()
        process.wait(10)
    return samples, len(series)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def export_openmetrics(bronze: Path, out: Path) -> int:
    """Write bronze's rows as OpenMetrics text (``instance`` = server, the tags as labels), grouped by series in
    time order as OpenMetrics requires; returns the samples written."""
    rows = DeltaTable(str(bronze)).to_pyarrow_table(columns=["ts", "server", "metric", "value", "tags"])
    ts_ms = pc.cast(rows.column("ts"), "int64").to_numpy() // 1000  # bronze ts: µs
    lines = []
    for ts, server, metric, value, tags in zip(
        ts_ms,
        rows.column("server").to_pylist(),
        rows.column("metric").to_pylist(),
        rows.column("value").to_pylist(),
        rows.column("tags").to_pylist(),
        strict=True,
    ):
        labels = {"instance": server, **dict(tags or [])}
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        lines.append((metric, text, int(ts), value))
    lines.sort()
    with out.open("w") as handle:
        for metric, text, ts, value in lines:
            handle.write(f"{metric}{{{text}}} {value!r} {ts / 1000:.3f}\n")
        handle.write("# EOF\n")
    return len(lines)


def main() -> None:
    """Scrape, load into the lake and into Prometheus blocks, print bytes per sample."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=120, help="scrapes of node_exporter (default 120)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    args = parser.parse_args()
    work = scratch_dir("bench-density-")
    source = work / "samples.jsonl"
    samples, series = scrape(args.scrapes, args.interval, source)
    env = lake_env(work)
    run_measured([LAKE, "produce", "--from-file", str(source)], env, cwd=work)
    run_measured([LAKE, "stream", "--once"], env, cwd=work)
    lake = work / "lakehouse"
    bronze = lake / keys.table_prefix(Table.BRONZE_EVENTS)
    windows_path = lake / keys.table_prefix(Table.METRIC_WINDOWS_1M)
    windows = DeltaTable(str(windows_path)).to_pyarrow_table(columns=["count"]).num_rows
    openmetrics = work / "bronze.om"
    exported = export_openmetrics(bronze, openmetrics)
    assert exported == samples, (exported, samples)  # bronze holds every scraped sample once
    blocks = work / "blocks"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(blocks)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    chunk_bytes = sum(f.stat().st_size for f in blocks.rglob("chunks/*"))
    block_bytes = data_bytes(blocks)
    log_bytes = data_bytes(lake / keys.LOG_PREFIX)
    bronze_bytes = data_bytes(bronze)
    print(
        f"node_exporter: {samples:,} samples of {series:,} series ({samples / series:.0f} per series), "
        f"{args.scrapes} scrapes {args.interval:g} s apart"
    )
    for name, size in (
        ("lake log (segments + index)", log_bytes),
        ("lake bronze", bronze_bytes),
        (f"lake windows ({windows:,})", data_bytes(windows_path)),
        ("Prometheus block (all files)", block_bytes),
        ("  of which chunks", chunk_bytes),
    ):
        print(f"  {name:32s} {size:>12,} B  {size / samples:6.2f} B/sample")
    print(f"lake log + bronze / Prometheus block: {(log_bytes + bronze_bytes) / block_bytes:.2f}x")


if __name__ == "__main__":
    main()
