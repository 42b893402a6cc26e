"""Real clients write through the gateway's protocols; after ``stream --once`` the tables hold exactly what they sent.

- the OpenTelemetry Python SDK (OTLP/HTTP protobuf exporter, cumulative and
  delta temporality, explicit and exponential histograms);
- InfluxDB's Python client (line protocol v2, and its v1 ``/write``);
- Prometheus itself (Debian's ``prometheus``) scraping ``node_exporter``
  every second and remote-writing to the gateway; its own HTTP API is the
  reference for the samples.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import random
import shutil
import subprocess
import time
from collections import defaultdict

import pytest
import requests

from metrics_lake.core.kernels.sketch import RELATIVE_ERROR
from metrics_lake.core.kernels.windows import QUANTILES
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.jobs.stream_metrics import run_stream
from tests.helpers import free_port_pair

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def ms(timestamp: dt.datetime) -> int:
    return int(timestamp.timestamp() * 1000)


def bronze(store) -> list[dict]:
    return open_table(store, "bronze_events").to_pyarrow_table().to_pylist()


def quarantine(store) -> list[dict]:
    return open_table(store, "quarantine_events").to_pyarrow_table().to_pylist()


def windows(store, metric: str, server: str) -> list[dict]:
    rows = open_table(store, "metric_windows_1m").to_pyarrow_table().to_pylist()
    return [r for r in rows if r["metric"] == metric and r["server"] == server]


def by_series(rows: list[dict], server: str) -> dict[tuple, list[tuple[int, float]]]:
    """(metric, tags without the SDK's resource attributes) -> [(ts ms, value)] in time order, for one server."""
    series = defaultdict(list)
    for row in rows:
        if row["server"] == server:
            tags = tuple(
                sorted((k, v) for k, v in (row["tags"] or []) if not k.startswith(("telemetry.", "service.", "host.")))
            )
            series[(row["metric"], tags)].append((ms(row["ts"]), row["value"]))
    return {key: sorted(points) for key, points in series.items()}


# --- OpenTelemetry SDK --------------------------------------------------------------------------------------------

BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]


def explicit_bound(exact: float, low: float, high: float) -> float:
    """The documented bound for an explicit-bucket histogram's percentile: half the (clipped) bucket + the sketch's."""
    edges = [-math.inf, *BOUNDS, math.inf]
    i = next(i for i in range(1, len(edges)) if exact <= edges[i])
    lo, hi = max(edges[i - 1], low), min(edges[i], high)
    return (hi - lo) / 2 + RELATIVE_ERROR * hi


def check_percentiles(store, metric: str, server: str, exports: list[tuple[int, list[float]]], bound) -> None:
    """Each window's p50/p95/p99 against the exact observations of the exports stamped in it."""
    observed = windows(store, metric, server)
    assert observed, metric
    for window in observed:
        start = ms(window["window_start"])
        values = sorted(v for ts, batch in exports if start <= ts < start + 60_000 for v in batch)
        assert window["count"] == len(values), metric
        for column, q in QUANTILES:
            exact = values[math.floor(q * (len(values) - 1))]
            assert abs(window[column] - exact) <= bound(exact) * (1 + 1e-9), (metric, column, window[column], exact)


def test_the_opentelemetry_sdk_exports_and_the_tables_hold_exactly_its_values(spark, settings, store, start_gateway):
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        InMemoryMetricReader,
        PeriodicExportingMetricReader,
    )
    from opentelemetry.sdk.metrics.view import (
        ExplicitBucketHistogramAggregation,
        ExponentialBucketHistogramAggregation,
        View,
    )
    from opentelemetry.sdk.resources import Resource

    url, _ = start_gateway()
    rng = random.Random(14)
    latencies = [rng.lognormvariate(-3, 1.2) for _ in range(300)]
    first, second = latencies[:200], latencies[200:]
    views = [
        View(instrument_name="rpc.duration", aggregation=ExplicitBucketHistogramAggregation(boundaries=BOUNDS)),
        View(instrument_name="rpc.duration.exp", aggregation=ExponentialBucketHistogramAggregation(max_size=160)),
    ]

    def provider(host: str, delta: bool) -> tuple[MeterProvider, InMemoryMetricReader]:
        temporality = {Counter: AggregationTemporality.DELTA, Histogram: AggregationTemporality.DELTA} if delta else {}
        exporter = OTLPMetricExporter(endpoint=f"{url}/v1/metrics", timeout=30, preferred_temporality=temporality)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)  # exports on flush only
        memory = InMemoryMetricReader(preferred_temporality=temporality)  # sees the same aggregation (the scale)
        resource = Resource.create({"host.name": host, "service.name": "checkout"})
        return MeterProvider(resource=resource, metric_readers=[reader, memory], views=views), memory

    cumulative, memory = provider("otel-cumulative", delta=False)
    meter = cumulative.get_meter("tests")
    requests_total = meter.create_counter("rpc.requests")
    meter.create_observable_gauge("system.memory.utilization", callbacks=[lambda _: [Observation(0.42)]])
    duration, duration_exp = meter.create_histogram("rpc.duration"), meter.create_histogram("rpc.duration.exp")
    delta, _ = provider("otel-delta", delta=True)
    jobs, waits = (
        delta.get_meter("tests").create_counter("jobs.done"),
        delta.get_meter("tests").create_histogram("rpc.duration"),
    )

    def record(counts: list[tuple[int, str]], observations: list[float], done: int, wait: float) -> None:
        for count, route in counts:
            requests_total.add(count, {"route": route})
        for value in observations:
            duration.record(value)
            duration_exp.record(value)
        jobs.add(done)
        waits.record(wait)

    record([(3, "/a"), (4, "/a"), (10, "/b")], first, 5, 0.02)
    assert cumulative.force_flush() and delta.force_flush()

    def exponential_scale() -> int:
        data = memory.get_metrics_data()
        return next(
            p.scale
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "rpc.duration.exp"
            for p in m.data.data_points
        )

    scales = [exponential_scale()]
    record([(5, "/a")], second, 2, 0.3)
    scales.append(exponential_scale())  # the SDK may have downscaled as the range grew: the coarser one bounds
    cumulative.shutdown()  # the second and last export
    delta.shutdown()

    run_stream(spark, settings, once=True)

    rows = bronze(store)
    got = by_series(rows, "otel-cumulative")
    values = {key: [v for _, v in points] for key, points in got.items()}
    assert values[("rpc.requests", (("route", "/a"),))] == [7.0, 12.0]
    assert values[("rpc.requests", (("route", "/b"),))] == [10.0, 10.0]
    assert values[("system.memory.utilization", ())] == [0.42, 0.42]
    for name in ("rpc.duration", "rpc.duration.exp"):
        assert values[(f"{name}.count", ())] == [200.0, 300.0]
        assert [round(v, 9) for v in values[(f"{name}.sum", ())]] == [
            round(math.fsum(first), 9),
            round(math.fsum(latencies), 9),
        ]
        assert len(values[(name, ())]) == 300  # each observation once: the second export added only the new 100
    stamps = [ts for ts, _ in got[("rpc.duration.count", ())]]
    exports = [(stamps[0], first), (stamps[1], second)]
    low, high = min(latencies), max(latencies)
    check_percentiles(store, "rpc.duration", "otel-cumulative", exports, lambda x: explicit_bound(x, low, high))
    base = 2 ** (2 ** -min(scales))
    source_error = (base - 1) / (base + 1)
    relative = source_error + RELATIVE_ERROR + source_error * RELATIVE_ERROR
    check_percentiles(store, "rpc.duration.exp", "otel-cumulative", exports, lambda x: relative * x)

    deltas = {key: [v for _, v in points] for key, points in by_series(rows, "otel-delta").items()}
    assert deltas[("jobs.done", ())] == [5.0, 7.0]  # delta sums stored as running totals
    assert deltas[("rpc.duration.count", ())] == [1.0, 2.0]
    assert sorted(deltas[("rpc.duration", ())]) == [0.02, 0.3]  # one observation per bucket: min = max = it
    assert not quarantine(store)


# --- InfluxDB client ----------------------------------------------------------------------------------------------


def test_the_influxdb_client_writes_and_the_tables_hold_exactly_its_points(spark, settings, store, start_gateway):
    from influxdb_client import InfluxDBClient, Point, WritePrecision
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException

    url, _ = start_gateway()
    now = int(time.time() * 1000) // 1000 * 1000
    with InfluxDBClient(url=url, token="unused", org="lake") as client:
        write = client.write_api(write_options=SYNCHRONOUS)
        points = [
            Point("cpu")
            .tag("host", "db-1")
            .tag("cpu", "cpu0")
            .field("usage_idle", 97.5)
            .field("usage_user", 2)
            .time(now, WritePrecision.MS),
            Point("disk io")
            .tag("host", "db-1")
            .tag("device", "sda,1")
            .field("reads", 1234)
            .time(now + 1000, WritePrecision.MS),
            Point("net").tag("host", "db-2").field("up", True).time(now + 2000, WritePrecision.MS),
        ]
        write.write(bucket="metrics", record=points, write_precision=WritePrecision.MS)
        write.write(
            bucket="metrics", record=f"mem,host=db-2 used_percent=61.25 {now // 1000}", write_precision=WritePrecision.S
        )
        with pytest.raises(ApiException) as refused:
            write.write(
                bucket="metrics",
                record=[f'syslog,host=db-1 message="disk full",severity=3i {now}'],
                write_precision=WritePrecision.MS,
            )
        assert refused.value.status == 400
    assert (
        requests.post(f"{url}/write?db=telegraf&precision=ms", data=f"load,host=db-3 avg1=0.5 {now}").status_code == 204
    )

    run_stream(spark, settings, once=True)

    got = sorted(
        (r["server"], r["metric"], ms(r["ts"]) - now, r["value"], tuple(sorted(r["tags"] or []))) for r in bronze(store)
    )
    assert got == sorted(
        [
            ("db-1", "cpu.usage_idle", 0, 97.5, (("cpu", "cpu0"), ("host", "db-1"))),
            ("db-1", "cpu.usage_user", 0, 2.0, (("cpu", "cpu0"), ("host", "db-1"))),
            (
                "db-1",
                "disk_io.reads",
                1000,
                1234.0,
                (("device", "sda,1"), ("host", "db-1"), ("original_name", "disk io.reads")),
            ),
            ("db-2", "net.up", 2000, 1.0, (("host", "db-2"),)),
            ("db-2", "mem.used_percent", 0, 61.25, (("host", "db-2"),)),
            ("db-1", "syslog.severity", 0, 3.0, (("host", "db-1"),)),  # the valid field of the refused line is kept
            ("db-3", "load.avg1", 0, 0.5, (("host", "db-3"),)),
        ]
    )
    (reject,) = quarantine(store)
    assert reject["reason"].startswith("wrong_type") and 'message="disk full"' in reject["raw"]


# --- Prometheus ---------------------------------------------------------------------------------------------------

PROMETHEUS, NODE_EXPORTER = shutil.which("prometheus"), shutil.which("prometheus-node-exporter")
SCRAPE_SECONDS = 30


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def running_prometheus(config: str, tmp_path, port: int, exporter_port: int | None = None):
    """Debian's Prometheus with the YAML ``config`` on ``127.0.0.1:port`` (and node_exporter on ``exporter_port``),
    ready when entered; both are stopped on exit. Logs: ``prometheus.log`` and ``exporter.log`` in ``tmp_path``."""
    (tmp_path / "prometheus.yml").write_text(config)
    with contextlib.ExitStack() as stack:
        processes = []
        if exporter_port is not None:
            exporter_log = stack.enter_context((tmp_path / "exporter.log").open("w"))
            processes.append(
                subprocess.Popen(
                    [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{exporter_port}"],
                    stdout=exporter_log,
                    stderr=subprocess.STDOUT,
                )
            )
        log = stack.enter_context((tmp_path / "prometheus.log").open("w"))
        command = [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        try:
            if exporter_port is not None:
                wait_http(f"http://127.0.0.1:{exporter_port}/metrics")
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            yield
        finally:
            for process in reversed(processes):
                process.terminate()
            for process in reversed(processes):
                process.wait(60)


def quiet_end_ms(prometheus_port: int, seconds_before: int) -> int:
    """An end for :func:`node_samples` (epoch ms): ``seconds_before`` s before node_exporter's last scrape, and
    half a scrape interval (1 s) from every scrape. Prometheus turns a query's ``time`` into milliseconds through
    floats (``parseTime``: ``math.Round(ns*1000) / 1000``, then truncated to nanoseconds), so its range can end a
    millisecond off ours: a sample on the edge would be in one and not the other."""
    answer = requests.get(
        f"http://127.0.0.1:{prometheus_port}/api/v1/query", params={"query": "node_load1[5s]"}, timeout=30
    )
    answer.raise_for_status()
    last = max(round(float(t) * 1000) for t, _ in answer.json()["data"]["result"][0]["values"])
    return last - seconds_before * 1000 + 500


def node_samples(prometheus_port: int, end_ms: int, window: int) -> tuple[dict, int]:
    """Every raw sample of every ``node_*`` series in ``(end_ms - window s, end_ms]`` (epoch ms) from Prometheus's
    HTTP API: ``{(name, sorted label pairs without __name__): [(ts ms, value)]}`` without NaNs, and the NaN samples
    left out. Take ``end_ms`` from :func:`quiet_end_ms`, so that no sample is near the range's edges."""
    answer = requests.get(
        f"http://127.0.0.1:{prometheus_port}/api/v1/query",
        params={"query": f'{{__name__=~"node_.+"}}[{window}s]', "time": f"{end_ms // 1000}.{end_ms % 1000:03d}"},
        timeout=30,
    )
    answer.raise_for_status()
    expected, nan_samples = {}, 0
    for series in answer.json()["data"]["result"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        samples = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
        nan_samples += sum(math.isnan(v) for _, v in samples)
        finite = [(t, v) for t, v in samples if not math.isnan(v)]
        if finite:
            expected[(name, tuple(sorted(labels.items())))] = finite
    return expected, nan_samples


def stored_node_samples(rows: list[dict], instance: str, lo_ms: int, hi_ms: int) -> dict:
    """The valid ``node_*`` samples of ``instance`` in ``(lo_ms, hi_ms]`` among log or bronze ``rows``, keyed and
    sorted as :func:`node_samples` keys Prometheus's (the original name, labels without ``original_name``)."""
    stored = defaultdict(list)
    for row in rows:
        if row["server"] == instance and row.get("reason") is None and lo_ms < ms(row["ts"]) <= hi_ms:
            tags = dict(row["tags"] or [])
            name = tags.pop("original_name", row["metric"])
            if name.startswith("node_"):  # node_exporter's go_*, process_* and promhttp_* are not in the reference
                stored[(name, tuple(sorted(tags.items())))].append((ms(row["ts"]), row["value"]))
    return {key: sorted(points) for key, points in stored.items()}


@pytest.mark.slow
def test_prometheus_remote_write_lands_node_exporter_series_matching_prometheus_own_api(
    spark, settings, store, start_gateway, tmp_path
):
    assert PROMETHEUS and NODE_EXPORTER, "prometheus and prometheus-node-exporter are needed (.ci/run installs them)"
    url, _ = start_gateway()
    exporter_port, prometheus_port = free_port_pair()
    config = f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: node
    static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
remote_write:
  - url: {url}/api/v1/write
    queue_config: {{batch_send_deadline: 1s, max_samples_per_send: 2000}}
"""
    with running_prometheus(config, tmp_path, prometheus_port, exporter_port):
        time.sleep(SCRAPE_SECONDS)
        end_ms = quiet_end_ms(prometheus_port, 10)  # remote-written (1 s send deadline) well before we stop
        end, window = end_ms / 1000, SCRAPE_SECONDS - 15
        # The reference: every raw sample of every node_* series in (end - window, end], from Prometheus's HTTP API.
        expected, nan_samples = node_samples(prometheus_port, end_ms, window)
        # query_range agrees on the series (one step per scrape): the same names come back.
        ranged = requests.get(
            f"http://127.0.0.1:{prometheus_port}/api/v1/query_range",
            params={"query": "node_load1", "start": end - window, "end": end, "step": 1},
        )
        assert ranged.json()["data"]["result"][0]["metric"]["instance"] == f"127.0.0.1:{exporter_port}"

    run_stream(spark, settings, once=True)

    instance = f"127.0.0.1:{exporter_port}"
    stored = stored_node_samples(bronze(store), instance, end_ms - window * 1000, end_ms)
    assert len(expected) > 100  # node_exporter exposes hundreds of node_* series
    assert sum(len(v) for v in expected.values()) >= len(expected) * (window - 3)  # about one sample a second
    assert stored == expected
    nans = [r for r in quarantine(store) if r["reason"].startswith("non_finite_value") and instance in r["raw"]]
    assert len(nans) >= nan_samples  # NaN samples are quarantined (more may fall outside the compared range)
