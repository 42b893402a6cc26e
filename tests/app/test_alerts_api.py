"""`/api/alerts`, `/api/alerts/{name}` and `/api/servers`: alert rules through HTTP (admin only), the active alerts
and every server's status, from a lake whose speed layer raised real alerts."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.dashboard import DashboardReader
from metrics_lake.app.dashboard.server import build_app
from metrics_lake.core.config import load_settings
from metrics_lake.core.config_store import ALERT, Change, ConfigStore
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.micro_batch import run_batch_in_process

TOKEN = "s3cret-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NOW_MS = int(time.time() * 1000) // 60_000 * 60_000 - 600_000


@pytest.fixture
def client(tmp_path):
    settings = load_settings(root=str(tmp_path / "lake"), admin_token=TOKEN)
    return TestClient(build_app(DashboardReader(settings, refresh_seconds=0)))


def test_put_get_delete_a_rule_with_the_admin_token(client):
    rule = "fleet_rpc_latency_5m.p99 > 300 FOR 5m LABELS severity=page"
    assert client.put("/api/alerts/slow", json={"rule": rule}).status_code == 401
    created = client.put("/api/alerts/slow", json={"rule": rule, "description": "slow"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["rule"], body["kind"], body["for_seconds"], body["labels"]) == (
        rule,
        "threshold",
        300,
        {"severity": "page"},
    )
    assert body["changed_by"] == "api:testclient" and body["active"] == [] and created.headers["etag"] == '"1"'
    listed = client.get("/api/alerts").json()
    assert "slow" in [r["name"] for r in listed["rules"]] and listed["active"] == []
    changed = client.put(
        "/api/alerts/slow", json={"rule": rule.replace("300", "400")}, headers={**ADMIN, "If-Match": '"1"'}
    )
    assert changed.status_code == 200 and changed.json()["revision"] == 2 and changed.json()["description"] == "slow"
    assert [h["change"] for h in client.get("/api/alerts/slow").json()["history"]][-1].startswith("+ alert slow:")
    assert client.delete("/api/alerts/slow", headers=ADMIN).status_code == 204
    assert client.get("/api/alerts/slow").status_code == 404
    assert client.get("/api/queries/slow").status_code == 404  # rules and queries keep their own names


@pytest.mark.parametrize(
    ("body", "clause"),
    [
        ({"rule": "nope.p99 > 1"}, "unknown stored query 'nope'"),
        ({"rule": "fleet_cpu_hourly.p50 > 1"}, "computes avg, max, p99, not 'p50'"),
        ({"rule": "ABSENT cpu"}, "needs FOR <duration>"),
        ({"rule": "x.avg > 1 LABELS server=a"}, "LABELS may not set 'server'"),
        ({"query": "x.avg > 1"}, '{"rule"'),
    ],
)
def test_a_bad_rule_is_a_400_naming_the_clause_and_nothing_is_applied(client, body, clause):
    answer = client.put("/api/alerts/bad", json=body, headers=ADMIN)
    assert answer.status_code == 400 and clause in answer.json()["error"]
    assert client.get("/api/alerts").json()["config_version"] == 0


def test_removing_a_query_a_rule_uses_is_a_400_naming_the_rule(client):
    answer = client.delete("/api/queries/fleet_rpc_latency_5m", headers=ADMIN)
    assert answer.status_code == 400 and answer.json()["parameter"] == "rule"
    assert "alert rule 'rpc_latency_p99_high'" in answer.json()["error"]


def test_active_alerts_and_server_statuses(tmp_path):
    settings = load_settings(root=str(tmp_path / "lake"), admin_token=TOKEN)
    reader = DashboardReader(settings, refresh_seconds=0)
    ConfigStore(reader.store).apply(
        [Change("put", "quiet", "ABSENT host.cpu.utilization FROM sim-*,db-9 FOR 1s LABELS severity=info", kind=ALERT)]
    )
    log = SegmentLog(reader.store)

    def batch(servers: int, seed: int) -> None:
        sim = FleetSimulator(servers=servers, metrics=2, seconds=30, seed=seed, start_ms=NOW_MS + seed * 30_000)
        with Producer(log, settings.topic, partitions=2) as producer:
            producer.send(sim.generate())
        run_batch_in_process(
            reader.store, settings.topic, end_offsets(log, settings.topic), watermark_seconds=60, clock_skew_seconds=300
        )

    batch(3, 0)
    time.sleep(1.2)
    batch(2, 1)  # sim-0002 goes silent
    client = TestClient(build_app(reader))
    alerts = client.get("/api/alerts").json()
    (active,) = alerts["active"]
    assert (active["rule"], active["server"], active["state"]) == ("quiet", "sim-0002", "firing")
    assert active["labels"] == {"alertname": "quiet", "server": "sim-0002", "severity": "info"}
    assert active["summary"].startswith("no host.cpu.utilization from sim-0002 for ")
    assert [(r["name"], r["firing"]) for r in alerts["rules"] if r["name"] == "quiet"] == [("quiet", 1)]
    assert [(t["rule"], t["server"], t["state"]) for t in alerts["recent"]] == [("quiet", "sim-0002", "firing")]
    statuses = {s["server"]: s for s in client.get("/api/servers").json()["servers"]}
    assert {name: s["status"] for name, s in statuses.items()} == {
        "sim-0000": "up",
        "sim-0001": "up",
        "sim-0002": "silent",
        "db-9": "never seen",  # named by the rule, never heard from
    }
    assert statuses["sim-0002"]["alerts"] == ["quiet"] and statuses["sim-0002"]["silent_seconds"] >= 1
    assert statuses["db-9"]["last_seen_at"] is None
    page = client.get("/").text
    assert "drawAlerts" in page and "drawServers" in page
