"""The gateway's other protocols, decoder by decoder and over HTTP: OTLP, remote-write, InfluxDB line protocol."""

from __future__ import annotations

import base64
import gzip
import json
import math
import struct

import cramjam
import pytest
import requests
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from metrics_lake.app.gateway.protocols import influx, otlp, remote_write
from metrics_lake.app.gateway.protocols.histograms import (
    MAX_SAMPLES_PER_POINT,
    downsample,
    explicit_representatives,
    exponential_value,
)
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest
from metrics_lake.app.gateway.protocols.series_catalog import RecentSeries, SeriesCatalog
from metrics_lake.app.gateway.protocols.temporality import SeriesMemory
from metrics_lake.core.kernels.sketch import RELATIVE_ERROR
from metrics_lake.lake_schemas.contract import PROTOCOL_REASON_CODES
from tests.app.test_gateway_http import stored

T_MS = 1_763_600_000_000
T_NS = T_MS * 1_000_000
CUMULATIVE = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = pb.AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def valid(decoded) -> list[dict]:
    return [r for r in decoded.records.to_pylist() if r["reason"] is None]


def reasons(decoded) -> list[str]:
    return [r["reason"].split(":")[0] for r in decoded.records.to_pylist() if r["reason"]]


# --- OTLP ---------------------------------------------------------------------------------------------------------


def otlp_request(*metrics: pb.Metric, resource: dict | None = None) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    for key, value in (resource if resource is not None else {"host.name": "web-1", "service.name": "api"}).items():
        rm.resource.attributes.add(key=key).value.string_value = value
    rm.scope_metrics.add().metrics.extend(metrics)
    return request


def gauge(name: str, *values: float, attributes: dict | None = None, flags: int = 0) -> pb.Metric:
    metric = pb.Metric(name=name)
    for i, value in enumerate(values):
        point = metric.gauge.data_points.add(time_unix_nano=T_NS + i * 1_000_000_000, as_double=value, flags=flags)
        for key, text in (attributes or {}).items():
            point.attributes.add(key=key).value.string_value = text
    return metric


def counter(name: str, value: int, temporality: int, start_ns: int = T_NS - 10**9) -> pb.Metric:
    metric = pb.Metric(name=name)
    metric.sum.aggregation_temporality = temporality
    metric.sum.is_monotonic = True
    metric.sum.data_points.add(start_time_unix_nano=start_ns, time_unix_nano=T_NS, as_int=value)
    return metric


def histogram(name, bounds, counts, temporality=CUMULATIVE, start_ns=0, low=None, high=None, total=None):
    metric = pb.Metric(name=name)
    metric.histogram.aggregation_temporality = temporality
    point = metric.histogram.data_points.add(
        start_time_unix_nano=start_ns, time_unix_nano=T_NS, count=sum(counts), explicit_bounds=bounds
    )
    point.bucket_counts.extend(counts)
    if total is not None:
        point.sum = total
    if low is not None:
        point.min, point.max = low, high
    return metric


def decode_otlp(request, memory=None, json_encoding=False):
    memory = SeriesMemory(started_ns=0) if memory is None else memory
    if json_encoding:
        return otlp.decode(json_format.MessageToJson(request).encode(), "application/json", memory)
    return otlp.decode(request.SerializeToString(), "application/x-protobuf", memory)


def test_otlp_decoded_on_a_shared_catalog_across_requests_and_threads_gives_what_it_gives_without():
    """OTLP registers its series in a catalog kept across requests (restarted every 3 series here): the records
    are those of a decode without one, for gauges with and without point attributes, summaries and bad points."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(61)
    resources = [{"host.name": "web-1"}, {"host.name": "web-2", "service.name": "api"}, {"service.name": ""}]

    def request(i: int) -> bytes:
        metrics = []
        for name in rng.sample(["cpu", "mem", "", "job:rate5m"], rng.randint(1, 4)):
            attributes = rng.choice([None, {"cpu": str(rng.randint(0, 2))}])
            values = [rng.choice([0.5, float(i), math.nan, -1.0]) for _ in range(rng.randint(1, 3))]
            metrics.append(gauge(name, *values, attributes=attributes))
        return otlp_request(*metrics, resource=rng.choice(resources)).SerializeToString()

    bodies = [request(i) for i in range(200)]
    recent = RecentSeries(limit=3)
    with ThreadPoolExecutor(4) as threads:
        shared = list(threads.map(lambda b: otlp.decode(b, otlp.PROTOBUF_TYPE, SeriesMemory(), recent), bodies))
    for got, body in zip(shared, bodies, strict=True):
        alone = otlp.decode(body, otlp.PROTOBUF_TYPE, SeriesMemory())
        assert got.records.equals(alone.records) and got.skipped == alone.skipped
    rows = [r for d in shared for r in d.records.to_pylist()]
    assert {r["metric"] for r in rows if r["reason"] is None} == {"cpu", "mem", "job_rate5m"}
    assert {r["reason"].split(":")[0] for r in rows if r["reason"]} == {
        "bad_metric_name",
        "missing_field",
        "non_finite_value",
    }


def random_any_value(rng, value) -> None:
    """Set ``value`` (an ``AnyValue``) to a random kind, or leave it empty."""
    kind = rng.choice(["string", "string", "int", "double", "bool", "bytes", "array", "kvlist", "empty"])
    if kind == "string":
        value.string_value = rng.choice(["web-1", "", "é€", "0"])
    elif kind == "int":
        value.int_value = rng.choice([0, -1, 2**63 - 1])
    elif kind == "double":
        value.double_value = rng.choice([0.5, -0.0, math.inf])
    elif kind == "bool":
        value.bool_value = rng.random() < 0.5
    elif kind == "bytes":
        value.bytes_value = rng.randbytes(3)
    elif kind == "array":
        value.array_value.values.add().string_value = "a"
    elif kind == "kvlist":
        value.kvlist_value.values.add(key="k").value.int_value = 1


def random_attributes(rng, attributes, keys) -> None:
    for _ in range(rng.choice([0, 0, 1, 2])):
        random_any_value(rng, attributes.add(key=rng.choice(keys)).value)


def random_number_points(rng, points) -> None:
    for _ in range(rng.choice([0, 1, 2, 3])):
        point = points.add(time_unix_nano=rng.choice([0, T_NS, T_NS + 10**9, 2**64 - 1, rng.randint(0, 2**62)]))
        kind = rng.choice(["double", "double", "int", "none"])
        if kind == "double":
            point.as_double = rng.choice([0.0, 1.5, -2.0, math.nan, math.inf, rng.random()])
        elif kind == "int":
            point.as_int = rng.choice([0, 7, -(2**63), 2**53 + 1])
        point.flags = rng.choice([0, 0, 0, 1, 2])
        random_attributes(rng, point.attributes, ["cpu", "state", "host.name"])
        if rng.random() < 0.2:
            point.exemplars.add(as_double=1.0, trace_id=b"0123456789abcdef")


def random_metric(rng, metric) -> None:
    """A metric of any kind OTLP has (or none), with any of the names the naming rule treats differently."""
    metric.name = rng.choice(["cpu", "mem", "mem", "", "job:rate5m", "Weird Name"])
    if rng.random() < 0.3:
        metric.description, metric.unit = "what it measures", "By"
    kind = rng.choice(["gauge", "gauge", "sum", "sum", "histogram", "exponential", "summary", "none"])
    if kind == "gauge":
        random_number_points(rng, metric.gauge.data_points)
    elif kind == "sum":
        metric.sum.aggregation_temporality = rng.choice([CUMULATIVE, CUMULATIVE, DELTA, 0])
        metric.sum.is_monotonic = rng.random() < 0.5
        random_number_points(rng, metric.sum.data_points)
        if not metric.sum.data_points:
            metric.sum.SetInParent()
    elif kind == "histogram":
        metric.histogram.aggregation_temporality = rng.choice([CUMULATIVE, DELTA])
        counts = [rng.randint(0, 3) for _ in range(3)]
        point = metric.histogram.data_points.add(time_unix_nano=T_NS, count=sum(counts), explicit_bounds=[1.0, 5.0])
        point.bucket_counts.extend(counts)
    elif kind == "exponential":
        metric.exponential_histogram.aggregation_temporality = DELTA
        point = metric.exponential_histogram.data_points.add(time_unix_nano=T_NS, count=3, scale=2, zero_count=1)
        point.positive.offset, point.positive.bucket_counts[:] = 1, [2]
    elif kind == "summary":
        point = metric.summary.data_points.add(time_unix_nano=T_NS, count=4, sum=10.0)
        point.quantile_values.add(quantile=0.5, value=2.0)


def wire_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: tag, varint length, payload."""
    size, varint = len(payload), b""
    while True:
        byte, size = size & 0x7F, size >> 7
        varint += bytes([byte | (0x80 if size else 0)])
        if not size:
            return bytes([number << 3 | 2]) + varint + payload


def spliced(rng, first: bytes, second: bytes) -> bytes:
    """Two messages' bytes as one (protobuf merges them: singular fields and oneofs from the second, repeated
    fields appended), or the first alone."""
    return first + second if rng.random() < 0.3 else first


def random_otlp_request(rng) -> bytes:
    """An ExportMetricsServiceRequest of random resources, scopes and metrics of every kind, built on the wire so
    that some messages arrive as two spliced together: a resource, a metric (a gauge and a sum in one), a point
    (with both an ``as_double`` and an ``as_int``)."""
    keys = ["host.name", "service.instance.id", "service.name", "region"]
    body = b""
    for _ in range(rng.randint(0, 3)):
        resources = [pb.ResourceMetrics() for _ in range(2)]
        for resource_metrics in resources:
            random_attributes(rng, resource_metrics.resource.attributes, keys)
        resource = spliced(rng, *(r.resource.SerializeToString() for r in resources))
        scopes = b""
        for _ in range(rng.randint(0, 2)):
            scope = pb.ScopeMetrics(scope={"name": "otelcol", "version": "1"}) if rng.random() < 0.3 else None
            metrics = scope.SerializeToString() if scope else b""
            for _ in range(rng.randint(0, 6)):
                pair = [pb.Metric() for _ in range(2)]
                for metric in pair:
                    random_metric(rng, metric)
                if rng.random() < 0.1:  # one gauge point holding two
                    one, two = (pb.NumberDataPoint(time_unix_nano=T_NS, **{k: 1}) for k in ("as_double", "as_int"))
                    point = wire_field(1, one.SerializeToString() + two.SerializeToString())
                    metrics += wire_field(2, wire_field(1, b"cpu") + wire_field(5, point))
                    continue
                metrics += wire_field(2, spliced(rng, *(metric.SerializeToString() for metric in pair)))
            scopes += wire_field(2, metrics)
        body += wire_field(1, (wire_field(1, resource) if resource else b"") + scopes)
    return body


def test_otlp_decodes_the_same_records_through_columns_or_upbs_messages(monkeypatch):
    """Gauges and cumulative sums go in as columns parsed by ptars; every other metric through upb's messages. The
    records (in body order), skipped points and rejects are those of walking upb's messages for every metric: 800
    random requests of every kind of metric, attribute and value, and 8,000 corrupted ones upb still reads, decoded
    in turn on one catalog and one series memory (delta sums keep running totals across requests)."""
    import random

    rng = random.Random(2026)
    bodies = []
    for _ in range(800):
        body = random_otlp_request(rng)
        for candidate in [body, *(mutated(rng, body) for _ in range(10))]:
            try:
                ExportMetricsServiceRequest.FromString(candidate)
            except DecodeError:
                continue
            bodies.append(candidate)
    through_columns, memory, recent, by_columns = [], SeriesMemory(started_ns=0), RecentSeries(), 0
    for body in bodies:
        by_columns += otlp.number_columns(body) is not None
        through_columns.append(otlp.decode(body, otlp.PROTOBUF_TYPE, memory, recent))
    monkeypatch.setattr(otlp, "number_columns", lambda body: None)
    memory, recent = SeriesMemory(started_ns=0), RecentSeries()
    for body, got in zip(bodies, through_columns, strict=True):
        want = otlp.decode(body, otlp.PROTOBUF_TYPE, memory, recent)
        assert got.records.equals(want.records) and got.skipped == want.skipped, body
    rows = [r for d in through_columns for r in d.records.to_pylist()]
    assert by_columns > len(bodies) * 0.9 and len(bodies) > 2_000
    assert sum(d.skipped for d in through_columns) > 100 and len(rows) > 5_000
    assert {r["reason"].split(":")[0] for r in rows if r["reason"]} >= {
        "bad_metric_name",
        "missing_field",
        "non_finite_value",
        "unsupported",
    }


@pytest.mark.parametrize("json_encoding", [False, True], ids=["protobuf", "json"])
def test_otlp_gauges_take_server_and_tags_from_resource_and_point(json_encoding):
    request = otlp_request(gauge("system.cpu.utilization", 0.25, 0.5, attributes={"cpu": "0", "service.name": "x"}))
    rows = valid(decode_otlp(request, json_encoding=json_encoding))
    assert [(r["server"], r["metric"], r["value"], int(r["ts"].timestamp() * 1000)) for r in rows] == [
        ("web-1", "system.cpu.utilization", 0.25, T_MS),
        ("web-1", "system.cpu.utilization", 0.5, T_MS + 1000),
    ]
    # resource attributes, then the point's; a point attribute wins over a resource one of the same key
    assert dict(rows[0]["tags"]) == {"host.name": "web-1", "service.name": "x", "cpu": "0"}


@pytest.mark.parametrize(
    ("resource", "server"),
    [
        ({"host.name": "h", "service.instance.id": "i", "service.name": "s"}, "h"),
        ({"service.instance.id": "i", "service.name": "s"}, "i"),
        ({"service.name": "s"}, "s"),
    ],
)
def test_otlp_server_comes_from_host_name_then_instance_id_then_service_name(resource, server):
    (row,) = valid(decode_otlp(otlp_request(gauge("up", 1), resource=resource)))
    assert row["server"] == server


def test_otlp_points_without_a_server_or_name_are_quarantined_and_flagged_points_skipped():
    decoded = decode_otlp(otlp_request(gauge("up", 1), resource={"region": "eu"}))
    assert reasons(decoded) == ["missing_field"]
    assert reasons(decode_otlp(otlp_request(gauge("", 1)))) == ["bad_metric_name"]
    flagged = decode_otlp(otlp_request(gauge("up", 1, 2, flags=pb.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK)))
    assert (decoded.records.num_rows, flagged.records.num_rows, flagged.skipped) == (1, 0, 2)


def test_otlp_names_follow_the_naming_rule_with_the_original_kept():
    (row,) = valid(decode_otlp(otlp_request(gauge("Queue Depth", 3))))
    assert row["metric"] == "queue_depth" and dict(row["tags"])["original_name"] == "Queue Depth"


def test_otlp_cumulative_sums_pass_through_and_delta_sums_become_running_totals():
    memory = SeriesMemory(started_ns=0)
    first = valid(decode_otlp(otlp_request(counter("rpc.count", 7, CUMULATIVE), counter("jobs", 5, DELTA)), memory))
    second = valid(decode_otlp(otlp_request(counter("rpc.count", 9, CUMULATIVE), counter("jobs", 2, DELTA)), memory))
    assert [(r["metric"], r["value"]) for r in first + second] == [
        ("rpc.count", 7.0),
        ("jobs", 5.0),
        ("rpc.count", 9.0),
        ("jobs", 7.0),
    ]
    unspecified = counter("jobs", 1, pb.AggregationTemporality.AGGREGATION_TEMPORALITY_UNSPECIFIED)
    assert reasons(decode_otlp(otlp_request(unspecified))) == ["unsupported"]


def test_otlp_histograms_store_new_observations_at_representatives_and_exact_count_and_sum():
    memory = SeriesMemory(started_ns=T_NS - 10**9)
    bounds = [1.0, 2.0, 4.0]
    first = decode_otlp(
        otlp_request(histogram("lat", bounds, [1, 2, 0, 1], start_ns=T_NS, low=0.5, high=6.0, total=9.5)), memory
    )
    samples = sorted(r["value"] for r in valid(first) if r["metric"] == "lat")
    assert samples == [0.75, 1.5, 1.5, 5.0]  # (0.5,1] (1,2] (1,2] (4,6]: midpoints, the open ends closed by min/max
    companions = {r["metric"]: r["value"] for r in valid(first) if r["metric"] != "lat"}
    assert companions == {"lat.count": 4.0, "lat.sum": 9.5}
    # The next cumulative point: only what is new since the previous one.
    second = decode_otlp(
        otlp_request(histogram("lat", bounds, [1, 3, 1, 1], start_ns=T_NS, low=0.5, high=6.0, total=15.0)), memory
    )
    assert sorted(r["value"] for r in valid(second) if r["metric"] == "lat") == [1.5, 3.0]
    # A restart (new start time): everything counts again.
    third = decode_otlp(
        otlp_request(histogram("lat", bounds, [0, 1, 0, 0], start_ns=T_NS + 5, low=1.5, high=1.5, total=1.5)), memory
    )
    assert [r["value"] for r in valid(third) if r["metric"] == "lat"] == [1.5]


def test_a_cumulative_histogram_that_started_before_the_gateway_only_sets_the_baseline():
    memory = SeriesMemory(started_ns=T_NS)
    first = decode_otlp(otlp_request(histogram("lat", [1.0], [5, 5], start_ns=T_NS - 10**12)), memory)
    assert [r["metric"] for r in valid(first)] == ["lat.count"] and first.skipped == 0
    second = decode_otlp(otlp_request(histogram("lat", [1.0], [5, 6], start_ns=T_NS - 10**12)), memory)
    assert sorted(r["value"] for r in valid(second) if r["metric"] == "lat") == [1.0]


def test_delta_histograms_are_expanded_directly_and_their_count_accumulates():
    memory = SeriesMemory(started_ns=0)
    for counts in ([2, 0], [1, 1]):
        decoded = decode_otlp(
            otlp_request(histogram("lat", [1.0], counts, temporality=DELTA, low=0.0, high=3.0)), memory
        )
    rows = valid(decoded)
    assert sorted(r["value"] for r in rows if r["metric"] == "lat") == [0.5, 2.0]
    assert [r["value"] for r in rows if r["metric"] == "lat.count"] == [4.0]


def test_inconsistent_histograms_are_quarantined_with_the_point():
    bad = histogram("lat", [1.0, 2.0], [1, 1])  # 2 counts for 2 bounds
    assert reasons(decode_otlp(otlp_request(bad))) == ["invalid_payload"]
    unsorted = histogram("lat", [2.0, 1.0], [1, 1, 1])
    assert reasons(decode_otlp(otlp_request(unsorted))) == ["invalid_payload"]


def test_exponential_histograms_use_ddsketch_representatives_within_the_source_scale_bound():
    metric = pb.Metric(name="lat")
    metric.exponential_histogram.aggregation_temporality = DELTA
    point = metric.exponential_histogram.data_points.add(time_unix_nano=T_NS, scale=3, count=4, zero_count=1)
    point.positive.offset = 10
    point.positive.bucket_counts.extend([2, 0, 1])
    decoded = decode_otlp(otlp_request(metric))
    samples = sorted(r["value"] for r in valid(decoded) if r["metric"] == "lat")
    base = 2 ** (2**-3)
    assert samples[0] == 0.0 and len(samples) == 4
    for value, index in zip(samples[1:], [10, 10, 12], strict=True):
        low, high = base**index, base ** (index + 1)
        assert low < value <= high
        assert max(value - low, high - value) <= (base - 1) / (base + 1) * value * (1 + 1e-12) * 2
    point.scale = 99
    assert reasons(decode_otlp(otlp_request(metric))) == ["invalid_payload"]


def test_summaries_become_quantile_tagged_events():
    metric = pb.Metric(name="rpc.latency")
    point = metric.summary.data_points.add(time_unix_nano=T_NS, count=10, sum=55.0)
    point.quantile_values.add(quantile=0.5, value=5.0)
    point.quantile_values.add(quantile=0.99, value=9.9)
    rows = valid(decode_otlp(otlp_request(metric)))
    assert [(r["metric"], dict(r["tags"]).get("quantile"), r["value"]) for r in rows] == [
        ("rpc.latency", "0.5", 5.0),
        ("rpc.latency", "0.99", 9.9),
        ("rpc.latency.count", None, 10.0),
        ("rpc.latency.sum", None, 55.0),
    ]


@pytest.mark.parametrize("body", [b"\xff\x00garbage", b"\x0a\xff\xff\xff\xff\x0f"], ids=["garbage", "truncated"])
def test_an_undecodable_otlp_body_is_one_invalid_payload_reject_holding_it(body):
    decoded = otlp.decode(body, "application/x-protobuf", SeriesMemory())
    (row,) = decoded.records.to_pylist()
    assert row["reason"].startswith("invalid_payload") and base64.b64decode(row["raw"]) == body
    assert decoded.unreadable


def test_histogram_helpers():
    assert explicit_representatives([1.0, 2.0], None, None) == [1.0, 1.5, 2.0]
    assert explicit_representatives([], 1.0, 3.0) == [2.0]
    assert downsample([5, 5]) == [5, 5]
    scaled = downsample([3 * MAX_SAMPLES_PER_POINT, MAX_SAMPLES_PER_POINT, 1])
    assert sum(scaled) == MAX_SAMPLES_PER_POINT and scaled[:2] == [7500, 2500]
    assert abs(exponential_value(6, 0) - 1.0) <= RELATIVE_ERROR * 1.0 * 2  # bucket (1, 2**(1/64)]


def test_a_huge_histogram_point_is_capped_at_the_sample_limit():
    decoded = decode_otlp(otlp_request(histogram("lat", [1.0], [10**9, 10**9], temporality=DELTA, low=0, high=2)))
    rows = valid(decoded)
    assert sum(r["metric"] == "lat" for r in rows) == MAX_SAMPLES_PER_POINT
    assert [r["value"] for r in rows if r["metric"] == "lat.count"] == [2e9]


# --- remote-write -----------------------------------------------------------------------------------------------


def write_request(*series: tuple[dict, list[tuple[float, int]]]) -> bytes:
    request = WriteRequest()
    for labels, samples in series:
        ts = request.timeseries.add()
        for name, value in labels.items():
            ts.labels.append(Label(name=name, value=value).SerializeToString())
        for value, ms in samples:
            ts.samples.add(value=value, timestamp=ms)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


STALE_NAN = struct.unpack("<d", struct.pack("<Q", remote_write.STALE_NAN_BITS))[0]


def test_remote_write_maps_labels_skips_stale_markers_and_quarantines_other_nans():
    labels = {"__name__": "node_load1", "instance": "10.0.0.1:9100", "job": "node"}
    body = write_request(
        (labels, [(0.5, T_MS), (STALE_NAN, T_MS + 1000), (math.nan, T_MS + 2000), (0.7, T_MS + 3000)]),
        ({"__name__": "job:rate5m:sum", "instance": "a"}, [(1.0, T_MS)]),
        ({"__name__": "up"}, [(1.0, T_MS)]),
    )
    decoded = remote_write.decode(body, 1 << 20)
    rows = valid(decoded)
    assert [(r["server"], r["metric"], r["value"]) for r in rows] == [
        ("10.0.0.1:9100", "node_load1", 0.5),
        ("10.0.0.1:9100", "node_load1", 0.7),
        ("a", "job_rate5m_sum", 1.0),
    ]
    assert dict(rows[0]["tags"]) == {"instance": "10.0.0.1:9100", "job": "node"}
    assert dict(rows[2]["tags"])["original_name"] == "job:rate5m:sum"
    assert decoded.skipped == 1 and reasons(decoded) == ["non_finite_value", "missing_field"]


def test_remote_write_native_histograms_are_unsupported_and_garbage_is_one_reject():
    request = WriteRequest()
    series = request.timeseries.add()
    series.labels.append(Label(name="__name__", value="rpc_seconds").SerializeToString())
    series.labels.append(Label(name="instance", value="a").SerializeToString())
    series.histograms.append(b"\x08\x01")
    decoded = remote_write.decode(bytes(cramjam.snappy.compress_raw(request.SerializeToString())), 1 << 20)
    assert reasons(decoded) == ["unsupported"]
    not_utf8 = WriteRequest()
    not_utf8.timeseries.add().labels.append(b"\x0a\x02\xff\xfe")  # Label.name = 2 bytes that are not UTF-8
    bodies = [b"not snappy at all", bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff"))]
    for body in [*bodies, bytes(cramjam.snappy.compress_raw(not_utf8.SerializeToString()))]:
        garbage = remote_write.decode(body, 1 << 20)
        assert reasons(garbage) == ["invalid_payload"] and garbage.unreadable
    assert set(PROTOCOL_REASON_CODES) == {"invalid_payload", "unsupported"}  # both produced above


def test_a_remote_write_body_declaring_too_many_bytes_is_refused_before_decompressing():
    body = write_request(({"__name__": "x", "instance": "a"}, [(1.0, T_MS)] * 100))
    with pytest.raises(remote_write.SnappyTooLarge):
        remote_write.decode(body, 64)


@pytest.mark.parametrize("limit", [3, 10_000], ids=["restarting", "kept"])
def test_one_decoder_across_requests_and_threads_gives_what_a_fresh_decoder_gives(limit):
    """A decoder keeps the series of earlier requests in a catalog, started again past SERIES_CACHE series (3
    here, so it restarts often, or never): neither reuse, nor the restart, nor the catalog combining its chunks
    once no new series come, nor threads sharing it change any record."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa

    pool = [
        {"__name__": "node_load1", "instance": "a", "job": "node"},
        {"__name__": "node_load1", "instance": "b", "job": "node"},
        {"__name__": "job:rate5m:sum", "instance": "a"},
        {"__name__": "up"},  # no instance: missing_field
        {"__name__": "bad name!", "instance": "c"},  # stored as bad_name_
        {"instance": "d"},  # no metric name: missing_field
        {"__name__": "rpc_seconds", "instance": "a", "le": "0.5"},
    ]
    rng = random.Random(59)

    def body(i: int) -> bytes:
        request = WriteRequest()
        for labels in rng.sample(pool, rng.randint(1, len(pool))):
            series = request.timeseries.add()
            for name, value in labels.items():
                series.labels.append(Label(name=name, value=value).SerializeToString())
            for k in range(rng.randint(0, 3)):
                value = rng.choice([1.5, -2.0, 0.0, math.nan, STALE_NAN, float(i)])
                series.samples.add(value=value, timestamp=T_MS + 1000 * k)
            if rng.random() < 0.2:
                series.histograms.append(b"\x08\x01")
        return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))

    bodies = [body(i) for i in range(300)]
    shared = remote_write.Decoder(RecentSeries(limit=limit))
    with ThreadPoolExecutor(4) as threads:
        decoded = list(threads.map(lambda b: shared.decode(b, 1 << 20), bodies))
    for got, sent in zip(decoded, bodies, strict=True):
        fresh = remote_write.decode(sent, 1 << 20)
        assert got.records.equals(fresh.records) and got.skipped == fresh.skipped
    rows = pa.concat_tables(d.records for d in decoded).to_pylist()
    valid_metrics = {"node_load1", "job_rate5m_sum", "bad_name_", "rpc_seconds"}
    assert {r["metric"] for r in rows if r["reason"] is None} == valid_metrics
    assert {r["reason"].split(":")[0] for r in rows if r["reason"]} == {
        "missing_field",
        "non_finite_value",
        "unsupported",
    }
    histogram_reasons = {r["reason"] for r in rows if (r["reason"] or "").startswith("unsupported")}
    assert histogram_reasons <= {f"unsupported: a native histogram of {m!r}" for m in [*valid_metrics, "up", None]}
    assert len(histogram_reasons) >= 4


def random_write_request(rng) -> bytes:
    """An uncompressed WriteRequest of random series: labels of any length (a label over 127 bytes has a 0xff or
    other high byte in its length), samples of any value and time (zero values and times are left out of the wire
    format by proto3), native histograms, exemplars and metadata."""
    request = WriteRequest()
    for _ in range(rng.randint(0, 12)):
        series = request.timeseries.add()
        for _ in range(rng.randint(0, 4)):
            name = rng.choice(["__name__", "instance", "job", "le", "x" * rng.randint(1, 300)])
            value = "".join(rng.choice("aZ9:_.é€ ") for _ in range(rng.choice([0, 1, 5, 130, 260])))
            series.labels.append(Label(name=name, value=value).SerializeToString())
        for _ in range(rng.randint(0, 5)):
            value = rng.choice([0.0, -0.0, 1.5, -1e300, 5e-324, math.nan, math.inf, STALE_NAN, rng.random()])
            stamp = rng.choice([0, 1, -1, T_MS, -(2**63), 2**63 - 1, rng.randint(-(10**15), 10**15)])
            series.samples.add(value=value, timestamp=stamp)
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            series.histograms.append(rng.randbytes(rng.randint(0, 9)))
        if rng.random() < 0.2:
            series.exemplars.append(rng.randbytes(5))
    if rng.random() < 0.2:
        request.metadata.append(b"\x08\x01")
    return request.SerializeToString()


def mutated(rng, payload: bytes) -> bytes:
    """``payload`` with a few bits flipped, cut short or with bytes inserted."""
    body = bytearray(payload)
    kind = rng.choice(["flip", "cut", "insert"])
    if kind == "flip" and body:
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
    elif kind == "cut":
        body = body[: rng.randrange(len(body) + 1)]
    else:
        at = rng.randrange(len(body) + 1)
        body[at:at] = rng.randbytes(rng.randint(1, 4))
    return bytes(body)


def test_remote_write_columns_from_ptars_equal_upbs_messages_for_random_and_mutated_requests():
    """The gateway takes a request's samples as columns parsed by ptars from what protobuf's own parser (upb) read;
    for every body upb reads, ptars gives exactly what walking upb's messages gives, or refuses it (then the
    messages are walked). 600 random requests and 6,000 corrupted ones."""
    import random

    import numpy as np

    rng = random.Random(5959)
    compared = refused = 0
    for _ in range(600):
        payload = random_write_request(rng)
        for body in [payload, *(mutated(rng, payload) for _ in range(10))]:
            try:
                request = WriteRequest.FromString(body)
            except DecodeError:
                continue
            columns = remote_write._sample_columns(body)
            if columns is None:
                refused += 1
                continue
            labels, counts, histograms, ts, value = columns
            want = remote_write._message_samples(request)
            assert labels.cast(want[0].type).equals(want[0]) and histograms.cast(want[2].type).equals(want[2])
            assert counts.to_pylist() == want[1].to_pylist()
            assert np.array_equal(ts, want[3]) and np.array_equal(value.view(np.uint64), want[4].view(np.uint64))
            compared += 1
    assert compared > 1_000 and refused < compared // 20


def test_remote_write_decodes_the_same_records_through_ptars_or_upbs_messages(monkeypatch):
    """Records, stale markers skipped and native histograms' rejects (at their place among the points) are the same
    whichever parser gave the samples; label lists that join to the same bytes ([A, B] and one label holding A+B,
    which decodes as B) stay different series."""
    import random

    rng = random.Random(61)
    one, two = (Label(name=n, value=v).SerializeToString() for n, v in (("__name__", "up"), ("instance", "a")))
    request = WriteRequest()
    for labels in ([one, two], [one + two]):
        series = request.timeseries.add()
        series.labels.extend(labels)
        series.samples.add(value=1.0, timestamp=T_MS)
    bodies = [request.SerializeToString(), *(random_write_request(rng) for _ in range(300))]
    through_ptars = [remote_write.decode(bytes(cramjam.snappy.compress_raw(b)), 1 << 20) for b in bodies]
    monkeypatch.setattr(remote_write, "_sample_columns", lambda payload: None)
    for body, got in zip(bodies, through_ptars, strict=True):
        want = remote_write.decode(bytes(cramjam.snappy.compress_raw(body)), 1 << 20)
        assert got.records.equals(want.records) and got.skipped == want.skipped
    first = through_ptars[0].records.to_pylist()  # the second series' labels decode as instance="a" alone
    assert [(r["metric"], (r["reason"] or "").split(":")[0]) for r in first] == [("up", ""), (None, "missing_field")]
    assert sum(d.skipped for d in through_ptars) > 0 and any(d.rejected for d in through_ptars)


# --- InfluxDB line protocol -------------------------------------------------------------------------------------


def test_line_protocol_escaping_per_the_reference():
    body = (
        b'my\\ measurement,host=web\\,1,tag\\ key=tag\\=value f\\=ield=1.5,str="say \\"hi\\"" 1763600000000000000\n'
        b"# a comment\n"
        b"\n"
        b'cpu,host=a,quote="x" usage_idle=99i,usage_user=0.5,up=true 1763600000000000000\r\n'
    )
    decoded = influx.decode(body)
    rows = valid(decoded)
    assert [(r["server"], r["metric"], r["value"]) for r in rows] == [
        ("web,1", "my_measurement.f_ield", 1.5),
        ("a", "cpu.usage_idle", 99.0),
        ("a", "cpu.usage_user", 0.5),
        ("a", "cpu.up", 1.0),
    ]
    assert dict(rows[0]["tags"]) == {"host": "web,1", "tag key": "tag=value", "original_name": "my measurement.f=ield"}
    assert dict(rows[1]["tags"]) == {"host": "a", "quote": '"x"'}
    assert reasons(decoded) == ["wrong_type"]  # the string field, quarantined with its line
    (reject,) = [r for r in decoded.records.to_pylist() if r["reason"]]
    assert reject["raw"].startswith("my\\ measurement")


def test_a_catalog_combines_its_chunks_once_no_new_series_come():
    """Series added request by request sit in one chunk per conversion; the first look without new series
    combines them into one, with the same values, and later additions still append."""
    catalog = SeriesCatalog()
    for i in range(3):
        catalog.id_of(("key", i), lambda key: (f"s{key[1]}", "cpu", (("job", "node"),)))
        chunked = catalog.columns()
    assert chunked[0].num_chunks == 3
    combined = catalog.columns()
    assert [c.num_chunks for c in combined[:3]] == [1, 1, 1]
    assert all(a.equals(b) for a, b in zip(chunked[:3], combined[:3], strict=True))
    assert (chunked[3] == combined[3]).all()
    catalog.id_of("new", lambda key: ("s9", "mem", ()))
    assert catalog.columns()[0].to_pylist() == ["s0", "s1", "s2", "s9"]
    assert catalog.series(3) == ("s9", "mem", ())


def test_line_protocol_decoded_on_a_shared_catalog_gives_what_it_gives_without():
    """Line protocol registers its series in a catalog kept across requests (restarted every 3 series): the
    records, rejects with their lines among them, are those of a decode without one."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(62)
    lines = [
        "cpu,host=a usage_user=0.5,usage_system=1i {t}",
        "cpu,host=b,core=1 usage_user={v} {t}",
        "mem,host=a used=3i {t}",
        "mem used=1 {t}",  # no host: missing_field
        'disk,host=a state="full" {t}',  # a string field: wrong_type
        "m,host=a v= {t}",  # malformed: invalid_payload
    ]
    bodies = [
        "\n".join(rng.choice(lines).format(t=T_NS + i, v=float(i)) for _ in range(rng.randint(1, 6))).encode()
        for i in range(200)
    ]
    recent = RecentSeries(limit=3)
    with ThreadPoolExecutor(4) as threads:
        shared = list(threads.map(lambda b: influx.decode(b, now_ms=T_MS, recent=recent), bodies))
    for got, body in zip(shared, bodies, strict=True):
        assert got.records.equals(influx.decode(body, now_ms=T_MS).records)
    rows = [r for d in shared for r in d.records.to_pylist()]
    assert {r["reason"].split(":")[0] for r in rows if r["reason"]} == {
        "invalid_payload",
        "missing_field",
        "wrong_type",
    }


@pytest.mark.parametrize(
    ("precision", "stamp"),
    [("ns", 1763600000123456789), ("us", 1763600000123456), ("ms", 1763600000123), ("s", 1763600000), ("h", 489888)],
)
def test_line_protocol_precisions(precision, stamp):
    (row,) = valid(influx.decode(f"m,host=a v=1 {stamp}".encode(), influx.precision_divisor(precision)))
    expected = stamp * influx.PRECISIONS[precision] // 1_000_000
    assert int(row["ts"].timestamp() * 1000) == expected


@pytest.mark.parametrize(
    "line",
    [
        b"m,host=a",  # no fields
        b"m,host=a v=1 12 extra",
        b"m,host=a v=",
        b"m,host=a v=abc",
        b'm,host=a v="open',
        b"m,host v=1",
        b"m,host=a v=1 1.5",
        b"m,host=a v=99999999999999999999999i",
        b",host=a v=1",
        b"m,host=a\xff v=1",
    ],
)
def test_malformed_lines_are_invalid_payload_rejects_holding_the_line(line):
    decoded = influx.decode(line + b"\nok,host=a v=2 1763600000000000000")
    assert reasons(decoded) == ["invalid_payload"]
    assert [r["value"] for r in valid(decoded)] == [2.0]  # the next line is not affected


def test_lines_without_a_host_or_timestamp():
    decoded = influx.decode(b"m,server=s1 v=1\nm v=2", now_ms=T_MS)
    assert [(r["server"], int(r["ts"].timestamp() * 1000)) for r in valid(decoded)] == [("s1", T_MS)]
    assert reasons(decoded) == ["missing_field"]


# --- over HTTP --------------------------------------------------------------------------------------------------


def test_each_endpoint_answers_in_its_protocol(start_gateway, tmp_path):
    url, _ = start_gateway()
    good = otlp_request(gauge("up", 1.0)).SerializeToString()
    answer = requests.post(f"{url}/v1/metrics", data=good, headers={"Content-Type": "application/x-protobuf"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-protobuf"
    assert not ExportMetricsServiceResponse.FromString(answer.content).HasField("partial_success")

    partial = otlp_request(gauge("up", 1.0, math.inf)).SerializeToString()
    answer = requests.post(
        f"{url}/v1/metrics",
        data=gzip.compress(partial),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
    )
    response = ExportMetricsServiceResponse.FromString(answer.content)
    assert answer.status_code == 200 and response.partial_success.rejected_data_points == 1
    assert "non_finite_value" in response.partial_success.error_message

    json_body = json_format.MessageToJson(otlp_request(gauge("up", 2.0)))
    answer = requests.post(f"{url}/v1/metrics", data=json_body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == {}

    answer = requests.post(
        f"{url}/v1/metrics", data=b"\xff garbage", headers={"Content-Type": "application/x-protobuf"}
    )
    assert answer.status_code == 400 and "ExportMetricsServiceRequest" in Status.FromString(answer.content).message

    rw = write_request(({"__name__": "node_load1", "instance": "a"}, [(0.25, T_MS)]))
    headers = {
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    assert requests.post(f"{url}/api/v1/write", data=rw, headers=headers).status_code == 204
    nan = write_request(({"__name__": "node_load1", "instance": "a"}, [(math.inf, T_MS)]))
    answer = requests.post(f"{url}/api/v1/write", data=nan, headers=headers)
    assert answer.status_code == 400 and "non_finite_value" in answer.text
    v2 = headers | {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"}
    assert requests.post(f"{url}/api/v1/write", data=rw, headers=v2).status_code == 415

    line = b"cpu,host=a usage=1 1763600000000"
    assert requests.post(f"{url}/api/v2/write?org=o&bucket=b&precision=ms", data=line).status_code == 204
    answer = requests.post(f"{url}/api/v2/write?precision=ms", data=line + b'\ncpu,host=a s="x" 1763600000000')
    assert answer.status_code == 400 and answer.json()["code"] == "invalid"
    assert "partial write" in answer.json()["message"]
    answer = requests.post(f"{url}/api/v2/write?precision=fortnight", data=line)
    assert answer.status_code == 400 and "precision" in answer.json()["message"]
    assert requests.post(f"{url}/write?db=x&precision=ms", data=line).status_code == 204

    rows = stored(tmp_path)
    values = sorted((r["metric"], r["value"]) for r in rows if r["reason"] is None)
    assert values == [
        ("cpu.usage", 1.0),
        ("cpu.usage", 1.0),
        ("cpu.usage", 1.0),
        ("node_load1", 0.25),
        ("up", 1.0),
        ("up", 1.0),
        ("up", 2.0),
    ]
    assert sorted(r["reason"].split(":")[0] for r in rows if r["reason"]) == [
        "invalid_payload",
        "non_finite_value",
        "non_finite_value",
        "wrong_type",
    ]


def test_skipped_points_are_counted_in_the_metrics(start_gateway):
    url, gateway = start_gateway()
    stale = write_request(({"__name__": "x", "instance": "a"}, [(STALE_NAN, T_MS), (1.0, T_MS)]))
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
    assert requests.post(f"{url}/api/v1/write", data=stale, headers=headers).status_code == 204
    text = requests.get(f"{url}/metrics").text
    assert 'lake_gateway_points_skipped_total{protocol="remote_write"} 1.0' in text
    assert json.loads(requests.get(f"{url}/healthz").text)["partitions"]


def test_the_committed_remote_write_code_is_what_protoc_generates_from_remote_proto(tmp_path):
    from pathlib import Path

    from grpc_tools import protoc

    folder = Path(remote_write.__file__).parent / "prompb"
    assert protoc.main(["protoc", f"-I{folder}", f"--python_out={tmp_path}", str(folder / "remote.proto")]) == 0
    assert (tmp_path / "remote_pb2.py").read_text() == (folder / "remote_pb2.py").read_text()


def test_a_metric_rejected_whole_counts_each_of_its_points():
    empty = gauge("", 1.0, 2.0, 3.0)
    decoded = decode_otlp(otlp_request(empty))
    assert reasons(decoded) == ["bad_metric_name"] * 3
    raws = [json.loads(r["raw"]) for r in decoded.records.to_pylist()]
    assert [r["point"]["asDouble"] for r in raws] == [1.0, 2.0, 3.0]


def test_a_histogram_with_nan_or_crossed_min_and_max_is_one_invalid_payload_reject():
    for low, high in ((math.nan, 1.0), (3.0, 1.0)):
        bad = histogram("lat", [1.0], [1, 1], temporality=DELTA, low=low, high=high)
        assert reasons(decode_otlp(otlp_request(bad))) == ["invalid_payload"]
