"""Benchmark: Prometheus remote-write and OTLP into ``lake gateway``, beside Prometheus's own receiver, same requests.

Each sender owns ``--series`` series (``instance`` = its own servers, ``job``
= ``bench``) and sends ``--requests`` requests back to back, one in flight,
each holding every series with ``--samples`` samples (timestamps in order,
100 ms apart, starting ten minutes ago), as a Prometheus or an Alloy with
one shard does. The bodies are encoded before the clock starts:

- **remote-write**: a snappy-compressed ``WriteRequest`` (what Prometheus
  sends), POSTed to ``/api/v1/write`` of ``lake gateway`` (a fresh lake, its
  defaults) and of Debian's ``prometheus --web.enable-remote-write-receiver``
  (head and WAL on a scratch folder);
- **OTLP**: an ``ExportMetricsServiceRequest`` (protobuf, a resource per
  server and a gauge per metric), POSTed to the gateway's ``/v1/metrics``,
  and to Prometheus's ``/api/v1/otlp/v1/metrics`` when the installed version
  has the ``otlp-write-receiver`` feature (2.47 and later; the line says so
  otherwise).

Per receiver, protocol and sender count (``--senders``, default 1, 4 and
32): samples/s over the wall time of the whole run, the p50/p99 of a
request's POST-to-answer time, the receiver's CPU (cores busy on average,
and CPU microseconds per sample, its child processes included), then the
lake ÷ Prometheus ratio, and for OTLP the gateway's rate ÷ its remote-write
rate at the same sender count (when both ran). Every request must be answered 2xx. The lake's
answer means durable in its log; Prometheus's, in its head and WAL (not
fsynced per request).

With ``--profile DIR``, py-spy samples the gateway during each of its runs
(collapsed stacks, ``DIR/<protocol>-<senders>.txt``), only the thread
holding the GIL (``--gil``): where its Python time goes. Sampling every
thread would count those waiting for the GIL as busy too.

Run: ``python bench/ingest_protocols.py [--senders 1,4,32] [--series 1000] [--samples 2] [--samples-total 1280000]
[--protocols remote-write,OTLP] [--set LAKE_X=value] [--linger-ms N] [--profile DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

import cramjam
import numpy as np
import psutil
import requests
from common import LAKE, free_port, print_table, scratch_dir
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest

METRICS = 10  # a sender's series are its servers x these metrics
REMOTE_WRITE_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
OTLP_HEADERS = {"Content-Type": "application/x-protobuf"}


def series_names(sender: int, series: int) -> list[tuple[str, str]]:
    """(server, metric) of a sender's series: its own servers, ``METRICS`` metrics each."""
    return [(f"s{sender}-h{i // METRICS:04d}", f"bench_metric_{i % METRICS}") for i in range(series)]


def remote_write_body(names: list[tuple[str, str]], start_ms: int, samples: int, seed: int) -> bytes:
    """One snappy ``WriteRequest``: every series with ``samples`` samples from ``start_ms``, 100 ms apart."""
    rng = np.random.default_rng(seed)
    request = WriteRequest()
    for server, metric in names:
        series = request.timeseries.add()
        for name, value in (("__name__", metric), ("instance", server), ("job", "bench")):
            series.labels.append(Label(name=name, value=value).SerializeToString())
        for k in range(samples):
            series.samples.add(value=float(rng.integers(0, 1000)), timestamp=start_ms + 100 * k)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def otlp_body(names: list[tuple[str, str]], start_ms: int, samples: int, seed: int) -> bytes:
    """The same points as an ``ExportMetricsServiceRequest``: a resource per server, a gauge per metric."""
    rng = np.random.default_rng(seed)
    request = ExportMetricsServiceRequest()
    by_server: dict[str, list[str]] = {}
    for server, metric in names:
        by_server.setdefault(server, []).append(metric)
    for server, metrics in by_server.items():
        resource = request.resource_metrics.add()
        resource.resource.attributes.add(key="service.instance.id").value.string_value = server
        resource.resource.attributes.add(key="service.name").value.string_value = "bench"
        scope = resource.scope_metrics.add()
        for metric in metrics:
            gauge = scope.metrics.add(name=metric).gauge
            for k in range(samples):
                gauge.data_points.add(
                    time_unix_nano=(start_ms + 100 * k) * 1_000_000, as_double=float(rng.integers(0, 1000))
                )
    return request.SerializeToString()


def bodies_for(protocol: str, senders: int, requests_each: int, series: int, samples: int) -> list[list[bytes]]:
    """Per sender, its requests' bodies, timestamps moving forward request by request."""
    encode = remote_write_body if protocol == "remote-write" else otlp_body
    start = int(time.time() * 1000) - 600_000
    return [
        [
            encode(series_names(s, series), start + r * samples * 100, samples, seed=s * 100_003 + r)
            for r in range(requests_each)
        ]
        for s in range(senders)
    ]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` and its children have used so far."""
    process = psutil.Process(pid)
    processes = [process, *process.children(recursive=True)]
    return sum(times.user + times.system for times in (p.cpu_times() for p in processes))


def drive(url: str, headers: dict[str, str], bodies: list[list[bytes]], pid: int) -> tuple[float, list[float], float]:
    """Every sender on its thread, one request in flight each; (wall seconds, answer times in s, CPU seconds the
    receiver ``pid`` used meanwhile). Raises on a non-2xx."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def sender(own: list[bytes]) -> None:
        session = requests.Session()
        mine = []
        try:
            for body in own:
                sent = time.perf_counter()
                answer = session.post(url, data=body, headers=headers, timeout=60)
                mine.append(time.perf_counter() - sent)
                if answer.status_code // 100 != 2:
                    raise RuntimeError(f"{answer.status_code}: {answer.text[:200]}")
        except Exception as exc:  # noqa: BLE001 - reported after the threads end
            failures.append(str(exc))
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=sender, args=(own,)) for own in bodies]
    cpu_before = cpu_seconds(pid)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{url}: {len(failures)} senders failed, e.g. {failures[0]}")
    return wall, latencies, cpu_seconds(pid) - cpu_before


def wait_ready(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{url} exited; see {log}")
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(url, timeout=1).ok:
                return
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready in 120 s; see {log}")


@contextlib.contextmanager
def lake_gateway(work: Path, settings: dict[str, str], linger_ms: int | None = None):
    """``lake gateway`` on a fresh lake, defaults but ``settings`` (``LAKE_*`` variables) and ``--linger-ms``
    if given; yields (URL, PID)."""
    port = free_port()
    lake = work / f"lake-{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")} | {"LAKE_ROOT": str(lake)} | settings
    log = work / f"gateway-{port}.log"
    linger = ["--linger-ms", str(linger_ms)] if linger_ms else []
    process = subprocess.Popen([LAKE, "gateway", "--port", str(port), *linger], env=env, stderr=open(log, "wb"))
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", process, log)
        yield f"http://127.0.0.1:{port}", process.pid
        segments, size = segment_stats(f"http://127.0.0.1:{port}")
        print(
            f"  lake gateway wrote {segments:,.0f} segments, {size / max(segments, 1) / 1024:,.0f} KiB each", flush=True
        )
    finally:
        process.terminate()
        process.wait(60)


def segment_stats(url: str) -> tuple[float, float]:
    """(segments written, their bytes) from the gateway's ``/metrics``."""
    values = {}
    for family in text_string_to_metric_families(requests.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            values[sample.name] = sample.value
    return values["lake_gateway_segment_bytes_count"], values["lake_gateway_segment_bytes_sum"]


@contextlib.contextmanager
def profiled(pid: int, folder: Path | None, name: str):
    """py-spy sampling process ``pid`` for the block into ``folder/name.txt`` (collapsed stacks); nothing if None."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        # --subprocesses: any process the gateway starts, too
        ["py-spy", "record", "--pid", str(pid), "--subprocesses", "--gil", "--format", "raw", "--rate", "200"]
        + ["--output", f"{folder / name}.txt"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes what it sampled
        spy.wait(60)


def prometheus_features() -> tuple[str, bool]:
    """The installed Prometheus's version, and whether it has the OTLP receiver (2.47+)."""
    text = subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout
    version = text.split()[2] if len(text.split()) > 2 else "?"
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2]) if version != "?" else (0, 0)
    return version, (major, minor) >= (2, 47)


@contextlib.contextmanager
def prometheus_receiver(work: Path, otlp: bool):
    """``prometheus --web.enable-remote-write-receiver`` (and the OTLP receiver if ``otlp``), no scrapes; yields
    (URL, PID)."""
    port = free_port()
    folder = work / f"prometheus-{port}"
    folder.mkdir()
    (folder / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    log = folder / "prometheus.log"
    args = [
        "prometheus",
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
        *(["--enable-feature=otlp-write-receiver"] if otlp else []),
    ]
    process = subprocess.Popen(args, stderr=open(log, "wb"))
    try:
        wait_ready(f"http://127.0.0.1:{port}/-/ready", process, log)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--senders", default="1,4,32", help="comma-separated sender counts")
    parser.add_argument("--series", type=int, default=1000, help="series per sender (each in every request)")
    parser.add_argument("--samples", type=int, default=2, help="samples per series per request")
    parser.add_argument("--samples-total", type=int, default=1_280_000, help="samples per run (all senders)")
    parser.add_argument("--profile", type=Path, help="py-spy the gateway's runs into this folder")
    parser.add_argument("--set", action="append", default=[], help="a LAKE_X=value setting of the gateway (repeatable)")
    parser.add_argument("--protocols", default="remote-write,OTLP", help="comma-separated: remote-write, OTLP")
    parser.add_argument("--linger-ms", type=int, help="the gateway's --linger-ms (default: its own)")
    args = parser.parse_args()
    work = scratch_dir("bench-ingest-")
    version, has_otlp = prometheus_features()
    per_request = args.series * args.samples
    print(
        f"{args.series:,} series x {args.samples} samples per request ({per_request:,} samples), "
        f"{args.samples_total:,} samples per run; Prometheus {version}; {os.cpu_count()} cores\n",
        flush=True,
    )
    rows, lake_rates = [], {}  # lake_rates: (protocol, senders) -> the gateway's samples/s
    for protocol in args.protocols.split(","):
        for senders in (int(n) for n in args.senders.split(",")):
            requests_each = max(1, args.samples_total // (senders * per_request))
            bodies = bodies_for(protocol, senders, requests_each, args.series, args.samples)
            total = senders * requests_each * per_request
            measured = {}
            with lake_gateway(work, dict(s.split("=", 1) for s in args.set), args.linger_ms) as (url, pid):
                path, headers = ("/api/v1/write", REMOTE_WRITE_HEADERS)
                if protocol == "OTLP":
                    path, headers = ("/v1/metrics", OTLP_HEADERS)
                with profiled(pid, args.profile, f"{protocol}-{senders}"):
                    measured["lake"] = drive(url + path, headers, bodies, pid)
            if protocol == "remote-write" or has_otlp:
                with prometheus_receiver(work, otlp=protocol == "OTLP") as (url, pid):
                    path = "/api/v1/write" if protocol == "remote-write" else "/api/v1/otlp/v1/metrics"
                    measured["prometheus"] = drive(url + path, headers, bodies, pid)
            rates = {name: total / wall for name, (wall, _, _) in measured.items()}
            lake_rates[protocol, senders] = rates["lake"]
            written = lake_rates.get(("remote-write", senders))
            vs_remote_write = f"{rates['lake'] / written:.2f}x" if protocol == "OTLP" and written else ""
            for name, (wall, latencies, cpu) in measured.items():
                p50, p99 = np.percentile(np.array(latencies) * 1000, [50, 99])
                ratio = (
                    f"{rates['lake'] / rates['prometheus']:.2f}x" if "prometheus" in rates and name == "lake" else ""
                )
                cores, per_sample = f"{cpu / wall:.2f}", f"{cpu / total * 1e6:.2f}"
                rows.append(
                    (protocol, str(senders), name, f"{rates[name]:,.0f}", f"{p50:.1f}", f"{p99:.1f}")
                    + (cores, per_sample, ratio, vs_remote_write if name == "lake" else "")
                )
            if protocol == "OTLP" and not has_otlp:
                rows.append((protocol, str(senders), "prometheus", f"(no OTLP receiver in {version})", *[""] * 6))
            print(f"{protocol} x {senders}: done", flush=True)
    print()
    print_table(
        ("protocol", "senders", "receiver", "samples/s", "ack p50 ms", "ack p99 ms")
        + ("receiver cores", "CPU µs/sample", "lake / Prometheus", "lake OTLP / remote-write"),
        rows,
    )


if __name__ == "__main__":
    main()
