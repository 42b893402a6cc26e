"""Seeded fuzz of the gateway's OTLP, remote-write and line-protocol endpoints (a real process), then exact accounting.

Sixteen threads send 3,000 requests. Each request is numbered and carries
the token ``fz<number>x`` in a tag of every point, and valid points carry
unique ids as values, so what the lake holds can be traced back:

- *valid* bodies: every point stored once;
- *mixed* bodies: valid points plus hostile ones (NaN and infinite values,
  times in seconds, no server, empty or odd names, string fields, lines
  that do not parse, inconsistent histograms): the valid points stored once,
  every hostile one quarantined with a reason and its token in ``raw``, the
  answer counting them (OTLP ``partial_success``, remote-write and InfluxDB
  400);
- *broken* bodies: random bytes, truncated or bit-flipped protobuf,
  snappy that is not, a snappy length over the limit, gzip bombs, deeply
  nested OTLP JSON, wrong encodings: answered 400/413/415, never 5xx, and
  nothing of theirs counted as stored.

Then: no 5xx anywhere, the gateway alive and healthy with its RSS under
1 GiB, every stored valid point traced to a request answered with success,
exactly once.
"""

from __future__ import annotations

import gzip
import math
import random
import re
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import cramjam
import pytest
import requests
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest
from tests.app.gateway_process import fan_out, running_gateway
from tests.app.test_gateway import log_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUESTS = 3_000
THREADS = 16
MAX_BODY = 256 * 1024
T_MS = 1_763_600_000_000
PROTOCOLS = ("otlp", "otlp_json", "remote_write", "influx")
KINDS = {"valid": 40, "mixed": 30, "broken": 30}
HOSTILE = ("nan", "inf", "seconds", "no_server", "empty_name")
TOKEN = re.compile(r"fz\d{6}x")


@dataclass
class Ledger:
    """What the lake must hold, from the answers checked."""

    stored: dict[str, list[float]] = field(default_factory=dict)  # token -> ids of its valid points (success)
    rejected: dict[str, int] = field(default_factory=dict)  # token -> hostile points quarantined
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


@dataclass
class Point:
    server: str | None
    name: str
    ts: int
    value: float


def points_of(rng: random.Random, number: int, kind: str) -> tuple[list[Point], int]:
    """(points, hostile count): ids 1e6 * number + i as values of the valid ones."""
    points, hostile = [], 0
    for i in range(rng.randint(1, 30)):
        point = Point(
            f"host-{rng.randrange(50)}",
            rng.choice(["cpu.util", "node_load1", "Queue Depth", "a:b:c"]),
            T_MS + rng.randrange(600_000),
            float(1_000_000 * number + i),
        )
        if kind == "mixed" and rng.random() < 0.3:
            hostile += 1
            fault = rng.choice(HOSTILE)
            if fault == "nan":
                point.value = math.nan
            elif fault == "inf":
                point.value = -math.inf
            elif fault == "seconds":
                point.ts //= 1000
            elif fault == "no_server":
                point.server = None
            else:
                point.name = ""
        points.append(point)
    return points, hostile


def otlp_body(points: list[Point], token: str) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for point in points:  # one resource per point: the server is a resource attribute
        rm = request.resource_metrics.add()
        if point.server is not None:
            rm.resource.attributes.add(key="host.name").value.string_value = point.server
        metric = rm.scope_metrics.add().metrics.add(name=point.name)
        data = metric.gauge.data_points.add(time_unix_nano=point.ts * 1_000_000, as_double=point.value)
        data.attributes.add(key="fuzz").value.string_value = token
    return request


def remote_write_body(points: list[Point], token: str) -> bytes:
    request = WriteRequest()
    for point in points:
        series = request.timeseries.add()
        if point.name:
            series.labels.append(Label(name="__name__", value=point.name).SerializeToString())
        if point.server is not None:
            series.labels.append(Label(name="instance", value=point.server).SerializeToString())
        series.labels.append(Label(name="fuzz", value=token).SerializeToString())
        series.samples.add(value=point.value, timestamp=point.ts)
    return request.SerializeToString()


def influx_body(rng: random.Random, points: list[Point], token: str) -> tuple[bytes, int]:
    """Line protocol of ``points`` (one field each), plus extra hostile lines for mixed bodies; (body, extra)."""
    lines, extra = [], 0
    for point in points:
        measurement = (point.name or "").replace(" ", "\\ ").replace(",", "\\,") or ""
        host = f",host={point.server}" if point.server else ""
        value = repr(point.value) if math.isfinite(point.value) else ("NaN" if math.isnan(point.value) else "-inf")
        line = f"{measurement}{host},fuzz={token} value={value} {point.ts * 1_000_000}"
        if not point.name:  # an empty measurement does not parse: still one reject holding the line
            line = f",fuzz={token} value=1"
        lines.append(line)
    return "\n".join(lines).encode(), extra


def broken_body(rng: random.Random, protocol: str, valid: bytes) -> tuple[bytes, dict, set[int]]:
    """(body, extra headers, acceptable statuses) of a body no decoder can fully read."""
    how = rng.choice(["random", "truncate", "flip", "bomb", "bad_snappy", "huge_snappy", "nested", "encoding"])
    if how == "random":
        return rng.randbytes(rng.randrange(1, 2000)), {}, {400, 204, 200}
    if how == "truncate":
        return valid[: rng.randrange(1, max(2, len(valid)))], {}, {400, 204, 200}
    if how == "flip":
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), {}, {400, 204, 200}
    if how == "bomb":
        return gzip.compress(b"0" * (MAX_BODY * 8)), {"Content-Encoding": "gzip"}, {413, 415}
    if how == "bad_snappy" and protocol == "remote_write":
        return rng.randbytes(200), {}, {400}
    if how == "huge_snappy" and protocol == "remote_write":
        return b"\xff\xff\xff\x7f" + rng.randbytes(50), {}, {413}
    if how == "nested" and protocol == "otlp_json":
        return b'{"resourceMetrics":' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, {400}
    return valid, {"Content-Encoding": "br"}, {415}


def send(session, url: str, rng: random.Random, number: int, ledger: Ledger, lock: threading.Lock) -> None:
    protocol = rng.choice(PROTOCOLS)
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    token = f"fz{number:06d}x"
    points, hostile = points_of(rng, number, kind)
    headers: dict[str, str] = {}
    if protocol.startswith("otlp"):
        message = otlp_body(points, token)
        if protocol == "otlp_json":
            body, headers["Content-Type"] = json_format.MessageToJson(message).encode(), "application/json"
        else:
            body, headers["Content-Type"] = message.SerializeToString(), "application/x-protobuf"
        path = "/v1/metrics"
    elif protocol == "remote_write":
        body = remote_write_body(points, token)
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"}
        path = "/api/v1/write"
    else:
        body, _ = influx_body(rng, points, token)
        path = "/api/v2/write?precision=ns"
    allowed = {200} if protocol.startswith("otlp") else {204}
    if kind == "mixed" and hostile and protocol in ("remote_write", "influx"):
        allowed = {400}
    if kind == "broken":
        if protocol == "remote_write":
            body = bytes(cramjam.snappy.compress_raw(body)) if rng.random() < 0.3 else body
        body, extra, allowed = broken_body(rng, protocol, body)
        headers |= extra
        if protocol == "remote_write":  # garbage read as a snappy preamble may declare too many bytes
            allowed = allowed | {413}
    elif protocol == "remote_write":
        body = bytes(cramjam.snappy.compress_raw(body))
    if kind != "broken" and rng.random() < 0.2:
        if protocol == "remote_write":  # snappy only: gzip on top is an unreadable body, one reject
            kind, body, allowed = "broken", gzip.compress(body), {400, 413}
        else:
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    try:
        answer = session.post(url + path, data=body, headers=headers, timeout=60)
    except requests.RequestException as exc:
        with lock:
            ledger.failures.append(f"{token} {protocol} {kind}: {exc}")
        return
    with lock:
        ledger.statuses[answer.status_code] += 1
        if answer.status_code not in allowed:
            ledger.failures.append(
                f"{token} {protocol} {kind}: {answer.status_code} not in {allowed}: {answer.text[:200]}"
            )
            return
        if kind == "broken":
            return
        if protocol.startswith("otlp"):
            response = ExportMetricsServiceResponse()
            if protocol == "otlp_json":
                json_format.Parse(answer.text, response)
            else:
                response.ParseFromString(answer.content)
            if response.partial_success.rejected_data_points != hostile:
                ledger.failures.append(
                    f"{token}: rejected {response.partial_success.rejected_data_points} != {hostile}"
                )
        ledger.stored[token] = sorted(
            p.value for p in points if p.server and p.name and math.isfinite(p.value) and p.ts >= T_MS
        )
        ledger.rejected[token] = hostile


def fuzz_agent(url: str, seed: int, count: int, ledger: Ledger, lock: threading.Lock) -> None:
    rng = random.Random(seed)
    with requests.Session() as session:
        for i in range(count):
            send(session, url, rng, seed + i * THREADS, ledger, lock)


def test_three_thousand_hostile_protocol_requests_leave_an_exact_lake(tmp_path):
    env = {"LAKE_ROOT": str(tmp_path / "lake"), "LAKE_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY)}
    ledger, lock = Ledger(), threading.Lock()
    with running_gateway(env, "--linger-ms", "10") as gateway:
        fan_out(fuzz_agent, gateway.url, REQUESTS, THREADS, ledger, lock)
        assert gateway.alive() and requests.get(f"{gateway.url}/healthz", timeout=10).status_code == 200
        peak = gateway.peak_rss
    assert not ledger.failures, ledger.failures[:20]
    assert not [s for s in ledger.statuses if s >= 500], ledger.statuses
    assert peak < 1 << 30, f"gateway RSS peaked at {peak / 2**20:.0f} MiB"

    stored, rejected = defaultdict(list), Counter()
    for table in log_rows(tmp_path):
        for row in table.to_pylist():
            if row["reason"] is None:
                token = dict(row["tags"] or []).get("fuzz")
                if token in ledger.stored:
                    stored[token].append(row["value"])
            else:
                assert row["raw"], row
                found = TOKEN.search(row["raw"])
                if found and found.group() in ledger.rejected:
                    rejected[found.group()] += 1
    assert {t: sorted(v) for t, v in stored.items() if v} == {t: v for t, v in ledger.stored.items() if v}
    assert {t: n for t, n in rejected.items()} == {t: n for t, n in ledger.rejected.items() if n}
    print(f"statuses {dict(sorted(ledger.statuses.items()))}; peak RSS {peak / 2**20:.0f} MiB")
