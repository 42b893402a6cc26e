"""The front door (issue 26): tokens, scopes, server globs, rate limits, TLS and mTLS, with real clients."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from argon2 import PasswordHasher

from metrics_lake.agents.gateway_client import GatewaySender
from metrics_lake.app.auth import Authenticator, credential_of
from metrics_lake.app.http_server import TlsFiles, check_exposure
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.rate_limits import TokenBucket
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tokens import Scope, TokenStore, parse_token
from metrics_lake.infra.tls import write_ca, write_certificate
from metrics_lake.lake_schemas.errors import ConfigError, TokenError
from tests.app.test_gateway_http import events_of, ndjson, stored


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate; and a second CA (a stranger's)."""
    ca = write_ca(tmp_path / "pki", "test CA")
    server = write_certificate(ca, tmp_path / "pki", "server", ["127.0.0.1", "localhost"])
    client = write_certificate(ca, tmp_path / "pki", "client", ["agent-1"])
    other = write_ca(tmp_path / "other", "someone else's CA")
    stranger = write_certificate(other, tmp_path / "other", "client", ["intruder"])
    return {"ca": str(ca[0]), "server": server, "client": client, "stranger": stranger}


@pytest.fixture
def tokens(tmp_path):
    """Tokens of the test lake by role: write (all servers), web (write, web-*), read, admin, limited."""
    store = TokenStore(LocalStore(tmp_path / "lake"))
    made = {
        "write": store.create("agents", Scope.WRITE)[0],
        "web": store.create("web-agents", Scope.WRITE, servers="web-*")[0],
        "read": store.create("analysts", Scope.READ)[0],
        "admin": store.create("ops", Scope.ADMIN)[0],
        "limited": store.create("small", Scope.WRITE, tenant="acme", rate=10, burst=20)[0],
    }
    made["store"] = store
    return made


def wrong(token: str) -> str:
    """``token`` with the first character of its secret changed: well-formed, never the right one."""
    return token[:17] + ("B" if token[17] != "B" else "C") + token[18:]


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def post(url: str, events: list, ca: str, headers: dict | None = None) -> requests.Response:
    return requests.post(f"{url}/v1/events", data=ndjson(events), headers=headers or {}, verify=ca, timeout=30)


def test_the_credential_forms_each_client_sends():
    token = "mlk_abcdefghijkl_" + "A" * 43
    assert credential_of(f"Bearer {token}") == token
    assert credential_of(f"Token {token}") == token  # InfluxDB clients
    assert credential_of("Basic " + base64.b64encode(f"prometheus:{token}".encode()).decode()) == token
    assert credential_of(None, token) == token  # InfluxDB 1.x ?p=
    assert credential_of(None) is None
    for bad in ("Digest x", "Bearer", "Basic !!!", "Basic " + base64.b64encode(b"nopassword").decode(), "x" * 2000):
        with pytest.raises(TokenError) as refused:
            credential_of(bad)
        assert refused.value.status == 401


def test_a_token_bucket_admits_the_burst_then_the_rate_and_says_how_long_to_wait():
    now = [0.0]
    bucket = TokenBucket(10, 20, clock=lambda: now[0])
    assert bucket.take(20) == 0.0
    assert bucket.take(5) == pytest.approx(0.5)  # nothing taken: 5 units need 0.5 s at 10/s
    now[0] = 0.5
    assert bucket.take(5) == 0.0
    assert bucket.take(100) == pytest.approx(2.0)  # larger than the burst: waits for a full bucket
    now[0] = 2.5
    assert bucket.take(100) == 0.0 and bucket.level == -80  # passes when full, and leaves a debt of 8 s
    assert bucket.empty() == pytest.approx(8.1, abs=1e-6)  # until it holds one unit


def test_tokens_are_stored_only_as_hashes_and_revocation_is_recorded(tmp_path, tokens):
    text = (tmp_path / "lake" / "auth" / "tokens.json").read_text()
    records = {r["name"]: r for r in json.loads(text)["tokens"]}
    names = {"write": "agents", "web": "web-agents", "read": "analysts", "admin": "ops", "limited": "small"}
    for role, name in names.items():
        secret = parse_token(tokens[role])[1]
        assert secret not in text
        assert records[name]["hash"] == "$sha256$" + hashlib.sha256(secret.encode()).hexdigest()
    (revoked,) = tokens["store"].revoke("analysts")
    assert revoked.revoked_at is not None and revoked.revoked_by
    assert [r.name for r in tokens["store"].active()] == ["agents", "web-agents", "ops", "small"]


def test_tokens_hashed_with_argon2id_by_earlier_versions_still_work(tmp_path):
    """Records written before the SHA-256 scheme carry Argon2id hashes (OWASP's minimum: m=19 MiB, t=2, p=1)."""
    store = LocalStore(tmp_path / "lake")
    tokens = TokenStore(store)
    token, record = tokens.create("old-agents", Scope.WRITE)
    secret = parse_token(token)[1]
    legacy = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1).hash(secret)
    path = tmp_path / "lake" / "auth" / "tokens.json"  # as an earlier version wrote it
    path.write_text(path.read_text().replace(record.hash, legacy))
    (loaded,) = tokens.active()
    assert loaded.hash == legacy and loaded.argon2_hashed and not record.argon2_hashed
    assert TokenStore.verify(loaded, secret) and not TokenStore.verify(loaded, parse_token(wrong(token))[1])
    auth = Authenticator(LakeSettings(root=str(tmp_path / "lake")), store, refresh_seconds=3600)
    try:
        assert asyncio.run(auth.authenticate(token, "10.0.0.1", Scope.WRITE)).name == "old-agents"
        with pytest.raises(TokenError, match="wrong secret for token 'old-agents'"):
            asyncio.run(auth.authenticate(wrong(token), "10.0.0.1", Scope.WRITE))
        assert auth.authenticate_blocking(token, None, Scope.WRITE).name == "old-agents"
    finally:
        auth.close()


def test_a_lake_without_tls_and_tokens_refuses_to_face_the_network(pki):
    tls = TlsFiles.of(*pki["server"])
    assert check_exposure("the gateway", "127.0.0.1", None, False, False) is None
    assert check_exposure("the gateway", "0.0.0.0", tls, True, False) is None
    for missing_tls, has_tokens in ((None, True), (tls, False), (None, False)):
        with pytest.raises(ConfigError, match="will not listen on 0.0.0.0 without"):
            check_exposure("the gateway", "0.0.0.0", missing_tls, has_tokens, False)
    assert "WARNING" in check_exposure("the gateway", "0.0.0.0", None, False, True)
    with pytest.raises(ConfigError, match="--tls-cert"):
        TlsFiles.of(pki["server"][0], pki["client"][1])  # a key that is not the certificate's


def test_missing_wrong_and_other_scope_tokens_store_nothing(start_gateway, tmp_path, pki, tokens):
    url, gateway = start_gateway(tls=TlsFiles.of(*pki["server"]))
    ca = pki["ca"]
    refusals = [
        ({}, 401, "a token is required"),
        (bearer("nonsense"), 401, "malformed token"),
        (bearer(wrong(tokens["write"])), 401, "wrong secret for token 'agents'"),
        (bearer("mlk_aaaaaaaaaaaa_" + "B" * 43), 401, "unknown token"),
        (bearer(tokens["read"]), 403, "scope read; this needs write"),
        ({"Authorization": "Bearer " + "x" * 5000}, 401, "too long"),
    ]
    for headers, status, message in refusals:
        answer = post(url, events_of("web-1"), ca, headers)
        assert (answer.status_code, message in answer.json()["error"]) == (status, True), answer.text
        assert tokens["write"][17:] not in answer.text
    assert stored(tmp_path) == []
    accepted = post(url, events_of("web-1", "db-1"), ca, bearer(tokens["write"]))
    assert accepted.json() == {"accepted": 2}
    metrics = requests.get(f"{url}/metrics", headers=bearer(tokens["read"]), verify=ca).text
    assert requests.get(f"{url}/metrics", verify=ca).status_code == 401
    assert 'lake_gateway_token_events_total{outcome="accepted",token="agents"} 2.0' in metrics
    assert 'lake_auth_failures_total{reason="malformed"} 2.0' in metrics  # "nonsense" and "x" * 5000
    for role in ("write", "web", "read", "admin", "limited"):
        assert tokens[role][17:] not in metrics


def test_a_web_token_cannot_write_db_servers_events(start_gateway, tmp_path, pki, tokens):
    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"]))
    web = bearer(tokens["web"])
    mixed = post(url, events_of("web-1", "db-1", "web-2"), pki["ca"], web)
    assert mixed.status_code == 400 and mixed.json()["accepted"] == 2
    assert mixed.json()["errors"] == [
        {"index": 1, "reason": "forbidden_server: token 'web-agents' may write servers 'web-*', not 'db-1'"}
    ]
    only_db = post(url, events_of("db-2"), pki["ca"], web)
    assert only_db.status_code == 403 and "forbidden_server" in only_db.json()["error"]
    rows = stored(tmp_path)
    assert sorted(r["server"] for r in rows if r["reason"] is None) == ["web-1", "web-2"]
    quarantined = [r for r in rows if r["reason"] is not None]
    assert sorted(json.loads(r["raw"])["server"] for r in quarantined) == ["db-1", "db-2"]
    assert all(r["reason"].startswith("forbidden_server: ") for r in quarantined)
    inventory = requests.put(
        f"{url}/v1/inventory/db-1", json={"labels": {"dc": "eu"}}, headers=web, verify=pki["ca"], timeout=30
    )
    assert inventory.status_code == 403


def test_a_token_over_its_rate_gets_429_with_retry_after_and_nothing_stored(start_gateway, tmp_path, pki, tokens):
    url, gateway = start_gateway(tls=TlsFiles.of(*pki["server"]))
    now = [100.0]
    gateway.limits.clock = lambda: now[0]  # the buckets' clock: refills happen when the test says
    limited = bearer(tokens["limited"])  # 10 events/s, burst 20, tenant acme
    assert post(url, events_of(*(f"web-{i}" for i in range(20))), pki["ca"], limited).status_code == 200
    empty = post(url, events_of("db-x"), pki["ca"], limited)  # refused before its body is read: the bucket is empty
    assert empty.status_code == 429 and empty.headers["Retry-After"] == "1" and "retry in 0.1 s" in empty.text
    now[0] += 0.2  # 2 events refilled: 15 more are refused once counted
    over = post(url, events_of(*(f"db-{i}" for i in range(15))), pki["ca"], limited)
    assert over.status_code == 429 and over.headers["Retry-After"] == "2"  # 13 events short at 10/s: 1.3 s
    assert "15 events are over token 'small''s ingestion rate" in over.json()["error"]
    assert len(stored(tmp_path)) == 20
    now[0] += 1.4  # 16 events in the bucket
    assert post(url, events_of(*(f"db-{i}" for i in range(15))), pki["ca"], limited).status_code == 200
    assert len(stored(tmp_path)) == 35
    metrics = requests.get(f"{url}/metrics", headers=bearer(tokens["read"]), verify=pki["ca"]).text
    assert 'lake_gateway_token_events_total{outcome="limited",token="small"} 15.0' in metrics
    assert 'lake_gateway_token_requests_total{code="429",token="small"} 2.0' in metrics


def test_revocation_reaches_a_running_gateway_within_seconds(start_gateway, tmp_path, pki, tokens):
    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"]))
    write = bearer(tokens["write"])
    assert post(url, events_of("web-1"), pki["ca"], write).status_code == 200
    tokens["store"].revoke("agents")
    revoked_at = time.monotonic()
    while post(url, events_of("web-2"), pki["ca"], write).status_code == 200:
        assert time.monotonic() - revoked_at < 5, "a revoked token still writes after 5 s"
        time.sleep(0.1)
    answer = post(url, events_of("web-3"), pki["ca"], write)
    assert answer.status_code == 401 and "token 'agents' is revoked" in answer.json()["error"]
    assert {r["server"] for r in stored(tmp_path)} <= {"web-1", "web-2"}  # web-2 only if sent before the refresh


def test_mutual_tls_refuses_strangers_without_disturbing_other_connections(start_gateway, tmp_path, pki, tokens):
    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"], pki["ca"]))
    write = bearer(tokens["write"])
    good = requests.Session()
    good.cert = pki["client"]

    def send(server: str) -> int:
        return good.post(
            f"{url}/v1/events", data=ndjson(events_of(server)), headers=write, verify=pki["ca"]
        ).status_code

    assert send("web-1") == 200
    for cert in (None, pki["stranger"]):
        with pytest.raises(requests.exceptions.ConnectionError):  # TLS 1.3: the server aborts after the handshake
            requests.post(
                f"{url}/v1/events", data=ndjson(events_of("db-1")), headers=write, cert=cert, verify=pki["ca"]
            )
    # a plain-text client on the TLS port, while the good session keeps its connection
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(url.replace("https", "http") + "/v1/events", data=b"x", timeout=5)
    assert send("web-2") == 200
    assert sorted(r["server"] for r in stored(tmp_path)) == ["web-1", "web-2"]


def test_our_agent_sends_its_token_over_tls_and_keeps_batches_a_wrong_token_cannot_send(
    start_gateway, tmp_path, pki, tokens
):
    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"]))
    bad = GatewaySender(url, tmp_path / "wrong", token=wrong(tokens["write"]), ca=pki["ca"], backoff_cap=0.2)
    bad.send_payloads(events_of("db-9"))
    assert not bad.flush(timeout=2)
    bad.close(timeout=0)
    assert bad.pending_batches() == 1 and bad.stats.dead_lettered == 0  # kept for when the token is fixed
    assert stored(tmp_path) == []
    with GatewaySender(url, tmp_path / "good", token=tokens["web"], ca=pki["ca"]) as agent:
        agent.send_payloads(events_of("web-1", "web-2"))
        assert agent.flush(timeout=30)
    assert sorted(r["server"] for r in stored(tmp_path)) == ["web-1", "web-2"]


def test_the_opentelemetry_exporter_sends_headers_and_trusts_the_ca(start_gateway, tmp_path, pki, tokens, monkeypatch):
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
    from opentelemetry.sdk.resources import Resource

    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"]))
    # The exporter sets its requests Session's verify, which REQUESTS_CA_BUNDLE overrides (psf/requests#3829).
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    results = {}
    for name, token in (("wrong", tokens["read"]), ("right", tokens["write"])):
        reader = InMemoryMetricReader()
        provider = MeterProvider(resource=Resource.create({"host.name": f"otel-{name}"}), metric_readers=[reader])
        provider.get_meter("tests").create_counter("jobs.done").add(3)
        exporter = OTLPMetricExporter(
            endpoint=f"{url}/v1/metrics", headers={"authorization": f"Bearer {token}"}, certificate_file=pki["ca"]
        )
        results[name] = exporter.export(reader.get_metrics_data())
        exporter.shutdown()
        provider.shutdown()
    assert results == {"wrong": MetricExportResult.FAILURE, "right": MetricExportResult.SUCCESS}
    assert {(r["server"], r["value"]) for r in stored(tmp_path)} == {("otel-right", 3.0)}


def test_the_influxdb_client_sends_its_token(start_gateway, tmp_path, pki, tokens):
    from influxdb_client import InfluxDBClient
    from influxdb_client.client.write_api import SYNCHRONOUS
    from influxdb_client.rest import ApiException

    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"]))
    now = int(time.time())
    with InfluxDBClient(url=url, token=tokens["read"], org="lake", ssl_ca_cert=pki["ca"]) as client:
        with pytest.raises(ApiException) as refused:
            client.write_api(write_options=SYNCHRONOUS).write("metrics", record=f"cpu,host=db-1 idle=1 {now}000000000")
        assert refused.value.status == 403
    with InfluxDBClient(url=url, token=tokens["write"], org="lake", ssl_ca_cert=pki["ca"]) as client:
        client.write_api(write_options=SYNCHRONOUS).write("metrics", record=f"cpu,host=db-1 idle=1 {now}000000000")
    v1 = requests.post(
        f"{url}/write?db=x&u=u&p={tokens['write']}", data=f"cpu,host=db-2 idle=2 {now}000000000", verify=pki["ca"]
    )
    assert v1.status_code == 204
    assert sorted((r["server"], r["value"]) for r in stored(tmp_path)) == [("db-1", 1.0), ("db-2", 2.0)]


def test_fuzzed_credentials_store_exactly_the_accepted_requests(start_gateway, tmp_path, pki, tokens):
    """Random credentials (missing, garbled, huge, other scopes and tenants, revoked mid-stream) from four threads:
    every event of an accepted request is stored once, nothing of a refused one."""
    url, gateway = start_gateway(tls=TlsFiles.of(*pki["server"]))
    gateway.auth.failure_burst = 1e9  # one test address sends every request: no throttling here (tested below)
    rng = random.Random(26)
    good = {"write": tokens["write"], "web": tokens["web"], "admin": tokens["admin"]}
    garbage = [
        lambda: {},
        lambda: {"Authorization": ""},
        lambda: {"Authorization": "Bearer"},
        lambda: {"Authorization": rng.choice(["Bearer ", "Token ", "Basic "]) + "x" * rng.randint(1, 3000)},
        lambda: {"Authorization": "Bearer " + tokens["write"][: rng.randint(0, 59)]},
        lambda: bearer(tokens["read"]),
        lambda: {"Authorization": "Bearer " + tokens["write"].swapcase()},
        lambda: {"Authorization": bytes(rng.randrange(33, 127) for _ in range(40)).decode()},
    ]
    plan = []
    for i in range(240):
        if rng.random() < 0.5:
            role = rng.choice(list(good))
            servers = [f"web-{i}-{k}" for k in range(rng.randint(1, 5))]
            plan.append((i, bearer(good[role]), servers, role))
        else:
            plan.append((i, rng.choice(garbage)(), [f"db-{i}-0"], None))
    revoke_at = 160  # the admin token is revoked mid-stream: its later requests must be refused
    answers: dict[int, int] = {}

    revoked = threading.Event()

    def send(item):
        i, headers, servers, role = item
        if i == revoke_at:
            tokens["store"].revoke("ops")
            gateway.auth.refresh()  # the refresh thread's next tick, now (revocation latency is tested above)
            revoked.set()
        elif i > revoke_at:  # sent after the revocation (the other threads would otherwise race ahead of it)
            revoked.wait(60)
        answer = post(url, events_of(*servers), pki["ca"], headers)
        answers[i] = answer.status_code
        return answer

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, plan))
    expected = set()
    for i, _, servers, role in plan:
        status = answers[i]
        if role is None:
            assert status in (401, 403, 429), (i, status)
        elif status == 200:
            expected |= set(servers)
        else:
            assert role == "admin" and status == 401, (i, status)
    rows = stored(tmp_path)
    assert sorted(r["server"] for r in rows) == sorted(expected)  # each once, nothing of a refused request
    assert sum(1 for s in answers.values() if s == 200) > 60
    assert sum(1 for i, *_, role in plan if role == "admin" and answers[i] == 401) > 5  # refused once revoked
    assert all(r["reason"] is None for r in rows)
    metrics = requests.get(f"{url}/metrics", headers=bearer(tokens["read"]), verify=pki["ca"]).text
    assert not any(tokens[role][17:] in metrics for role in ("write", "web", "read", "admin"))


def test_the_dashboard_needs_a_read_token_and_a_read_token_cannot_edit(tmp_path, tokens):
    from starlette.testclient import TestClient

    from metrics_lake.app.dashboard import DashboardReader
    from metrics_lake.app.dashboard.server import build_app
    from metrics_lake.core.config import load_settings

    client = TestClient(build_app(DashboardReader(load_settings(root=str(tmp_path / "lake")))))
    assert client.get("/api/queries").status_code == 401
    page = client.get("/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login"
    assert client.get("/healthz").status_code == 200
    assert client.get("/api/queries", headers=bearer(tokens["read"])).status_code == 200
    assert client.get("/api/queries", headers=bearer(tokens["write"])).status_code == 403
    query = {"query": "FROM web-* SELECT cpu WINDOW 5m COMPUTE avg"}
    edit = client.put("/api/queries/web_cpu", json=query, headers=bearer(tokens["read"]))
    assert edit.status_code == 403 and "scope read; this needs admin" in edit.json()["error"]
    refused = client.post("/login", data={"token": wrong(tokens["read"])}, follow_redirects=False)
    assert refused.status_code == 401 and COOKIE_NAME not in refused.cookies
    signed_in = client.post("/login", data={"token": tokens["read"]}, follow_redirects=False)
    assert signed_in.status_code == 303 and "httponly" in signed_in.headers["set-cookie"].lower()
    assert tokens["read"] not in signed_in.headers["set-cookie"]
    assert client.get("/api/queries").status_code == 200  # the session cookie
    assert client.put("/api/queries/web_cpu", json=query).status_code == 401  # never a cookie for writes
    assert client.put("/api/queries/web_cpu", json=query, headers=bearer(tokens["admin"])).status_code == 201
    tokens["store"].revoke("analysts")
    client.app.auth.refresh()
    assert client.get("/api/queries").status_code == 401  # the revoked token's session ends with it


COOKIE_NAME = "lake_session"


def test_a_failing_address_is_throttled(start_gateway, pki, tokens):
    url, gateway = start_gateway(tls=TlsFiles.of(*pki["server"]))
    gateway.auth.failures.clock = lambda: 100.0  # no refill during the test, however slow the machine
    statuses = [post(url, events_of("web-1"), pki["ca"], bearer("mlk_bad")).status_code for _ in range(25)]
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
    throttled = post(url, events_of("web-1"), pki["ca"], bearer(tokens["write"]))  # the address, whatever it sends
    assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) >= 1


@pytest.mark.slow
def test_prometheus_remote_write_sends_its_authorization_over_tls(start_gateway, tmp_path, pki, tokens):
    """Debian's Prometheus, scraping itself, remote-writes through two queues: the right token lands its samples,
    a wrong one (its samples labelled via="wrong") gets 401s and lands nothing."""
    from tests.app.test_protocol_clients import PROMETHEUS, running_prometheus
    from tests.helpers import free_port_pair

    assert PROMETHEUS, "prometheus is needed (.ci/run installs it)"
    url, gateway = start_gateway(tls=TlsFiles.of(*pki["server"]))
    port, _ = free_port_pair()
    queue = "queue_config: {batch_send_deadline: 1s, max_samples_per_send: 2000, min_backoff: 100ms, max_backoff: 1s}"
    config = f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: self
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
remote_write:
  - url: {url}/api/v1/write
    authorization: {{credentials: "{tokens["write"]}"}}
    tls_config: {{ca_file: "{pki["ca"]}"}}
    {queue}
  - url: {url}/api/v1/write
    authorization: {{credentials: "{wrong(tokens["write"])}"}}
    tls_config: {{ca_file: "{pki["ca"]}"}}
    write_relabel_configs: [{{target_label: via, replacement: wrong}}]
    {queue}
"""
    with running_prometheus(config, tmp_path, port):
        deadline = time.monotonic() + 60
        while not any(r["server"] == f"127.0.0.1:{port}" for r in stored(tmp_path)):
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(1)
        time.sleep(3)  # a few more sends of both queues
    rows = stored(tmp_path)
    assert len(rows) > 100 and {r["reason"].split(":")[0] for r in rows if r["reason"]} <= {"non_finite_value"}
    assert not [r for r in rows if ("via", "wrong") in (r["tags"] or [])]
    metrics = requests.get(f"{url}/metrics", headers=bearer(tokens["read"]), verify=pki["ca"]).text
    assert 'lake_auth_failures_total{reason="wrong"}' in metrics
    assert "wrong secret for token 'agents'" in (tmp_path / "prometheus.log").read_text()  # Prometheus logs why


def test_the_tokens_commands_print_a_token_once_and_the_servers_refuse_the_network_without_protection(lake, pki):
    from tests.app.conftest import one_line

    created = lake("tokens", "create", "--name", "web-agents", "--scope", "write", "--servers", "web-*", "--rate", "50")
    token = created.stdout.strip()
    assert token.startswith("mlk_") and len(token) == 60 and "shown only now" in created.stderr
    listing = lake("tokens", "list")
    assert "web-agents" in listing.stdout and "50/s, burst 250" in listing.stdout and token[17:] not in listing.stdout
    duplicate = lake("tokens", "create", "--name", "web-agents", "--scope", "read", expect=2)
    assert "already named 'web-agents'" in one_line(duplicate)
    refused = lake("gateway", "--host", "0.0.0.0", "--port", "0", expect=2)
    assert "will not listen on 0.0.0.0 without TLS (--tls-cert/--tls-key)" in one_line(refused)
    tls = ["--tls-cert", str(pki["server"][0]), "--tls-key", str(pki["server"][1])]
    dashboard = lake("dashboard", "--host", "0.0.0.0", "--port", "0", "--tls-cert", str(pki["server"][0]), expect=2)
    assert "give both --tls-cert and --tls-key" in one_line(dashboard)
    lake("tokens", "revoke", "web-agents")
    assert "0 tokens (1 revoked or expired" in lake("tokens", "list").stderr
    no_tokens = lake("dashboard", "--host", "0.0.0.0", "--port", "0", *tls, expect=2)
    assert "without tokens (lake tokens create)" in one_line(no_tokens)


@pytest.mark.slow
def test_prometheus_retries_the_429s_of_a_full_gateway_buffer_and_every_sample_lands_once(
    start_gateway, tmp_path, pki, tokens
):
    """Overload with a real sender: Prometheus scrapes node_exporter every second and remote-writes over TLS with a
    token, eight shards of 50 samples at a time, to a gateway whose buffer holds one request (1 KiB): a request that
    arrives while another waits for its flush is answered 429 + ``Retry-After``. With ``retry_on_http_429`` (off by
    default in Prometheus 2.x) Prometheus backs off and sends it again; the log then holds every sample of Prometheus's
    own TSDB for the compared range exactly once (a 429 stores nothing, so a retry cannot duplicate)."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.app.test_protocol_clients import (
        NODE_EXPORTER,
        PROMETHEUS,
        node_samples,
        quiet_end_ms,
        running_prometheus,
        stored_node_samples,
    )
    from tests.helpers import free_port_pair

    assert PROMETHEUS and NODE_EXPORTER, "prometheus and prometheus-node-exporter are needed (.ci/run installs them)"
    url, _ = start_gateway(tls=TlsFiles.of(*pki["server"]), gateway_buffer_bytes=1024)
    exporter_port, prometheus_port = free_port_pair()
    instance = f"127.0.0.1:{exporter_port}"
    config = f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: node
    static_configs: [{{targets: ["{instance}"]}}]
remote_write:
  - url: {url}/api/v1/write
    authorization: {{credentials: "{tokens["write"]}"}}
    tls_config: {{ca_file: "{pki["ca"]}"}}
    queue_config: {{min_shards: 8, max_shards: 8, max_samples_per_send: 50, batch_send_deadline: 1s,
                    min_backoff: 50ms, max_backoff: 1s, retry_on_http_429: true}}
"""
    with running_prometheus(config, tmp_path, prometheus_port, exporter_port):
        time.sleep(20)
        end_ms, window = quiet_end_ms(prometheus_port, 2), 15
        expected, _ = node_samples(prometheus_port, end_ms, window)
        lo_ms, hi_ms = end_ms - window * 1000, end_ms
        wanted, deadline = sum(map(len, expected.values())), time.monotonic() + 90  # retries trail by the backoffs
        while sum(map(len, (found := stored_node_samples(stored(tmp_path), instance, lo_ms, hi_ms)).values())) < wanted:
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(1)
    assert len(expected) > 100
    assert found == expected  # each sample once: no retry doubled one
    metrics = requests.get(f"{url}/metrics", headers=bearer(tokens["read"]), verify=pki["ca"], timeout=10).text
    codes = {
        sample.labels["code"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "lake_gateway_token_requests_total" and sample.labels["token"] == "agents"
    }
    assert codes.get("429", 0) >= 5 and codes.get("204", 0) > 0, codes  # overloaded, and recovered from it
