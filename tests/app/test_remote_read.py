"""Prometheus remote-read over the lake (``POST /api/v1/read``): raw samples from bronze, the windows beyond
bronze's retention, every matcher type on names, servers, tags and inventory labels, and errors in plain text.
Debian's Prometheus answering PromQL through it: ``tests/integration/test_promql.py``."""

from __future__ import annotations

import cramjam
import pytest
from starlette.testclient import TestClient

from metrics_lake.app.dashboard import DashboardReader, build_app
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, LabelMatcher, ReadRequest, ReadResponse
from metrics_lake.core.inventory import Change, Inventory
from tests.app.test_dashboard import HOUR_MS, START_MS, Clock, ingest, make_events

OPS = {"=": LabelMatcher.EQ, "!=": LabelMatcher.NEQ, "=~": LabelMatcher.RE, "!~": LabelMatcher.NRE}


def read(client, matchers: list[tuple[str, str, str]], lo: int = START_MS, hi: int = START_MS + HOUR_MS):
    """{labels (sorted tuple): [(ms, value), ...]} of one remote-read query, or the error response."""
    request = ReadRequest()
    query = request.queries.add(start_timestamp_ms=lo, end_timestamp_ms=hi)
    for name, op, value in matchers:
        query.matchers.add(type=OPS[op], name=name, value=value)
    answer = client.post(
        "/api/v1/read",
        content=bytes(cramjam.snappy.compress_raw(request.SerializeToString())),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
    )
    if answer.status_code != 200:
        return answer
    assert answer.headers["content-encoding"] == "snappy"
    (result,) = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(answer.content))).results
    series = {}
    for ts in result.timeseries:
        labels = tuple((lab.name, lab.value) for lab in map(Label.FromString, ts.labels))
        series[labels] = [(s.timestamp, s.value) for s in ts.samples]
    return series


@pytest.fixture
def lake(settings, store, log):
    Inventory(store).append([Change("web-1", {"role": "web", "dc": "eu"}), Change("db-1", {"role": "db"})])
    events = make_events(3, START_MS, START_MS + HOUR_MS, 2000)
    for event in events:
        event["tags"] = {"tier": "front" if event["server"].startswith("web") else "back"}
    ingest(store, log, events, [])
    return settings, events


def client_at(settings, now_ms: int) -> TestClient:
    return TestClient(build_app(DashboardReader(settings, [], clock=Clock(now_ms / 1000), refresh_seconds=0)))


def test_raw_samples_come_from_bronze_with_server_tags_and_inventory_labels(lake):
    settings, events = lake
    client = client_at(settings, START_MS + 2 * HOUR_MS)
    series = read(client, [("__name__", "=", "m_lat"), ("server", "=", "web-1")])
    labels = (("__name__", "m_lat"), ("dc", "eu"), ("role", "web"), ("server", "web-1"), ("tier", "front"))
    assert list(series) == [labels]
    assert series[labels] == sorted((e["ts"], e["value"]) for e in events if e["server"] == "web-1")


@pytest.mark.parametrize(
    ("matchers", "servers"),
    [
        ([("role", "=~", "w.b|d.")], {"web-1", "db-1"}),
        ([("role", "!=", "web")], {"web-2", "web-3", "db-1"}),  # a label a series lacks is empty
        ([("tier", "=", "front"), ("server", "!~", "web-[12]")], {"web-3"}),
        ([("server", "=~", "db-.*|web-2")], {"web-2", "db-1"}),
        ([("dc", "=", "mars")], set()),  # an unknown value selects nothing
    ],
)
def test_matchers_on_servers_tags_and_inventory_labels(lake, matchers, servers):
    settings, events = lake
    series = read(client_at(settings, START_MS + 2 * HOUR_MS), [("__name__", "=~", "m_l.t"), *matchers])
    got = {dict(labels)["server"]: samples for labels, samples in series.items()}
    assert set(got) == servers
    for server, samples in got.items():
        assert len(samples) == sum(1 for e in events if e["server"] == server)


def test_beyond_bronze_retention_the_windows_serve_avg_and_the_other_aggregates(lake):
    settings, events = lake
    client = client_at(settings, START_MS + 30 * 24 * HOUR_MS)  # bronze's days are past its retention
    minutes: dict[int, list[float]] = {}
    for e in events:
        if e["server"] == "db-1":
            minutes.setdefault(e["ts"] - e["ts"] % 60_000, []).append(e["value"])
    (avg,) = read(client, [("__name__", "=", "m_lat"), ("server", "=", "db-1")]).values()
    assert [t for t, _ in avg] == sorted(minutes)
    assert all(v == pytest.approx(sum(minutes[t]) / len(minutes[t]), rel=1e-12) for t, v in avg)
    (high,) = read(client, [("__name__", "=", "m_lat:max"), ("server", "=", "db-1")]).values()
    assert high == [(t, max(minutes[t])) for t in sorted(minutes)]
    counts = read(client, [("__name__", "=", "m_lat:count")])
    assert sum(v for samples in counts.values() for _, v in samples) == len(events)


@pytest.mark.parametrize(
    ("matchers", "message"),
    [
        ([("__name__", "=~", "m_(lat")], "bad regular expression"),
        ([("server", "=", "web-1")], "needs a __name__ matcher"),
        ([("__name__", "=~", ".*")], "needs a __name__ matcher"),
    ],
)
def test_bad_requests_get_a_plain_400(lake, matchers, message):
    settings, _ = lake
    answer = read(client_at(settings, START_MS + 2 * HOUR_MS), matchers)
    assert answer.status_code == 400 and message in answer.text


def test_a_body_that_is_not_a_snappy_read_request_is_a_400(lake):
    settings, _ = lake
    answer = client_at(settings, START_MS).post("/api/v1/read", content=b"not snappy")
    assert answer.status_code == 400 and "snappy-compressed prometheus.ReadRequest" in answer.text


def test_a_remote_written_series_is_served_under_its_original_name(settings, store, log):
    """The gateway stores ``job:rate5m:sum`` as metric ``job_rate5m_sum`` with the original in a tag: remote-read
    gives the original back as ``__name__`` (and not as a label), from bronze and from the windows."""
    sample = {"ts": START_MS + 1234, "server": "web-1", "metric": "job_rate5m_sum", "value": 7.0}
    sample["tags"] = {"original_name": "job:rate5m:sum", "job": "api"}
    ingest(store, log, [sample], [])
    for now_ms, name, value in (
        (START_MS + HOUR_MS, "job:rate5m:sum", 7.0),  # raw, from bronze
        (START_MS + 30 * 24 * HOUR_MS, "job:rate5m:sum:count", 1.0),  # beyond bronze: the windows
    ):
        series = read(client_at(settings, now_ms), [("__name__", "=", name)])
        labels = (("__name__", name), ("job", "api"), ("server", "web-1"))
        assert series == {labels: [(START_MS + (1234 if value == 7.0 else 0), value)]}
