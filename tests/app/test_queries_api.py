"""`GET/PUT/DELETE /api/queries/{name}`: the config store through HTTP, writes only with the admin token."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from metrics_lake.app.dashboard import DashboardReader
from metrics_lake.app.dashboard.server import build_app
from metrics_lake.core.config import load_settings
from metrics_lake.core.config_store import ConfigStore

TOKEN = "s3cret-admin-token"
LAT = "FROM web-* SELECT app.rpc.latency_ms WINDOW 5m COMPUTE percentile(99), count"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(tmp_path):
    settings = load_settings(root=str(tmp_path / "lake"), admin_token=TOKEN)
    return TestClient(build_app(DashboardReader(settings, refresh_seconds=0)))


def test_put_get_delete_with_the_admin_token(client, tmp_path):
    created = client.put("/api/queries/web_p99", json={"query": LAT, "description": "web p99"}, headers=ADMIN)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["query"] == LAT and body["revision"] == 1 and body["live"] is False and body["backfilled"] is False
    assert body["changed_by"] == "api:testclient" and created.headers["etag"] == '"1"'
    listing = client.get("/api/queries").json()
    assert "web_p99" in [q["name"] for q in listing["queries"]] and listing["config_version"] == 1
    changed = client.put(
        "/api/queries/web_p99", json={"query": LAT.replace("99", "95")}, headers={**ADMIN, "If-Match": '"1"'}
    )
    assert changed.status_code == 200 and changed.json()["revision"] == 2
    assert changed.json()["description"] == "web p99"  # kept when the body leaves it out
    assert [h["version"] for h in client.get("/api/queries/web_p99").json()["history"]] == [1, 2]
    stale = client.put("/api/queries/web_p99", json={"query": LAT}, headers={**ADMIN, "If-Match": '"1"'})
    assert stale.status_code == 412 and "nothing was applied" in stale.json()["error"]
    assert client.delete("/api/queries/web_p99", headers=ADMIN).status_code == 204
    assert client.get("/api/queries/web_p99").status_code == 404
    assert client.delete("/api/queries/web_p99", headers=ADMIN).status_code == 404
    assert ConfigStore(DashboardReader(load_settings(root=str(tmp_path / "lake"))).store).current().version == 3


@pytest.mark.parametrize(
    ("body", "clause"),
    [
        ({"query": "FROM * SELECT m WINDOW 5m COMPUTE percentile(0)"}, "percentile(0)"),
        ({"query": "FROM * SELECT m WINDOW 25h COMPUTE avg"}, "WINDOW '25h'"),
        ({"query": "SELECT m"}, "expected 'FROM"),
        ({"text": LAT}, '{"query"'),
    ],
)
def test_a_bad_query_is_a_400_naming_the_clause(client, body, clause):
    answer = client.put("/api/queries/bad", json=body, headers=ADMIN)
    assert answer.status_code == 400 and clause in answer.json()["error"]
    assert client.get("/api/queries").json()["config_version"] == 0  # nothing applied


def test_writes_need_the_admin_token_and_a_lake_without_one_refuses_them(client, tmp_path):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        answer = client.put("/api/queries/web_p99", json={"query": LAT}, headers=headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
    assert client.delete("/api/queries/fleet_cpu_hourly").status_code == 401
    open_lake = TestClient(build_app(DashboardReader(load_settings(root=str(tmp_path / "lake")))))
    refused = open_lake.put("/api/queries/web_p99", json={"query": LAT}, headers=ADMIN)
    assert refused.status_code == 403 and "LAKE_ADMIN_TOKEN" in refused.json()["error"]
    assert client.get("/api/queries").json()["config_version"] == 0
