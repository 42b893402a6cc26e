"""The dashboard's JSON API over a lake with known events: exact values, errors, resolution and the cache."""

from __future__ import annotations

import dataclasses
import random

import pytest
from starlette.testclient import TestClient

from metrics_lake.app.dashboard import DashboardReader, build_app
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from tests.helpers import expected_query_results

HOUR_MS = 3_600_000
START_MS = 1_750_000_000_000 - 1_750_000_000_000 % HOUR_MS  # 2025-06-15 15:00 UTC
QUERIES = [
    parse_query("hopping", "FROM * SELECT m.lat WINDOW 5m EVERY 1m COMPUTE count, max, percentile(99)"),
    parse_query("per_server", "FROM web-* SELECT m.lat WINDOW 15m COMPUTE count, sum PER SERVER"),
]


class Clock:
    """A settable clock (epoch seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_events(seed: int, lo_ms: int, hi_ms: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "ts": rng.randrange(lo_ms, hi_ms),
            "server": rng.choice(["web-1", "web-2", "web-3", "db-1"]),
            "metric": "m.lat",
            "value": round(rng.uniform(1, 500), 2),
        }
        for _ in range(n)
    ]


def ingest(store, log, events: list[dict], queries=QUERIES) -> None:
    with Producer(log, "metrics", partitions=2) as producer:
        producer.send_payloads(events)
    # Every event counts (a huge watermark), so late ones change old windows: what the cache test needs.
    run_batch_in_process(
        store,
        "metrics",
        end_offsets(log, "metrics"),
        watermark_seconds=10**9,
        clock_skew_seconds=10**9,
        queries=queries,
    )


@pytest.fixture
def lake(settings, store, log):
    events = make_events(1, START_MS, START_MS + 2 * HOUR_MS, 3000)
    ingest(store, log, events)
    clock = Clock(START_MS / 1000 + 3 * 3600)
    reader = DashboardReader(settings, QUERIES, clock=clock, cache_ttl_seconds=300, refresh_seconds=0)
    return TestClient(build_app(reader)), reader, clock, events


def points(answer: dict, server, aggregate) -> dict[int, float]:
    [series] = [s for s in answer["series"] if s["server"] == server and s["aggregate"] == aggregate]
    return dict(map(tuple, series["points"]))


def test_series_at_the_query_step_are_the_stored_query_values(lake):
    client, _, _, events = lake
    expected = expected_query_results(events, QUERIES)
    answer = client.get("/api/queries/hopping/series", params={"from": START_MS, "to": START_MS + HOUR_MS}).json()
    assert answer["step"] == 60 and (answer["from"], answer["to"]) == (START_MS, START_MS + HOUR_MS)
    counts = points(answer, None, "count")
    assert len(counts) == 60
    assert counts == {
        k[2]: v
        for k, v in expected.items()
        if k[0] == "hopping" and k[3] == "count" and k[2] < START_MS + HOUR_MS and k[2] >= START_MS
    }
    maxima = points(answer, None, "max")
    assert maxima == {
        k[2]: v
        for k, v in expected.items()
        if k[0] == "hopping" and k[3] == "max" and START_MS <= k[2] < START_MS + HOUR_MS
    }


def test_a_per_server_query_shows_its_top_servers_and_the_fleet(lake):
    client, _, _, events = lake
    answer = client.get(
        "/api/queries/per_server/series",
        params={"from": "2025-06-15T15:00:00Z", "to": "2025-06-15T17:00:00Z", "top": 2},
    ).json()
    assert answer["step"] == 900
    servers = {s["server"] for s in answer["series"]}
    assert None in servers and len(servers - {None}) == 2 and servers <= {None, "web-1", "web-2", "web-3"}
    own = expected_query_results(events, QUERIES)
    fleet = expected_query_results(events, [dataclasses.replace(QUERIES[1], per_server=False)])
    for server in servers - {None}:
        assert points(answer, server, "sum") == pytest.approx(
            {k[2]: v for k, v in own.items() if k[1] == server and k[3] == "sum"}, rel=1e-12
        )
    assert points(answer, None, "count") == {k[2]: v for k, v in fleet.items() if k[3] == "count"}
    assert len(points(answer, None, "count")) == 8


def test_a_long_range_is_rolled_up_to_tumbling_windows_of_a_coarser_step(lake):
    client, _, _, events = lake
    day = {"from": START_MS - 22 * HOUR_MS, "to": START_MS + 2 * HOUR_MS}
    assert client.get("/api/queries/hopping/series", params=day).json()["step"] == 60  # 1,440 points: still fine
    week = client.get(
        "/api/queries/hopping/series", params={"from": START_MS - 166 * HOUR_MS, "to": START_MS + 2 * HOUR_MS}
    )
    answer = week.json()
    assert answer["step"] == 900
    tumbling = dataclasses.replace(QUERIES[0], duration_s=900, slide_s=900)
    expected = expected_query_results(events, [tumbling])
    assert points(answer, None, "count") == {k[2]: v for k, v in expected.items() if k[3] == "count"}
    assert points(answer, None, "max") == {k[2]: v for k, v in expected.items() if k[3] == "max"}
    assert all(len(s["points"]) <= 1500 for s in answer["series"])
    explicit = client.get("/api/queries/hopping/series", params={**day, "step": 3600}).json()
    assert explicit["step"] == 3600 and len(points(explicit, None, "count")) == 2


@pytest.mark.parametrize(
    ("params", "parameter"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2025-06-15T10:00:00"}, "to"),  # no time zone
        ({"from": START_MS + HOUR_MS, "to": START_MS}, "from"),  # inverted
        ({"from": START_MS, "to": START_MS + HOUR_MS, "step": 30}, "step"),  # finer than the query
        ({"from": START_MS, "to": START_MS + HOUR_MS, "step": 90}, "step"),  # not whole minutes
        ({"top": "many"}, "top"),
    ],
)
def test_a_malformed_request_is_a_400_naming_the_parameter(lake, params, parameter):
    client = lake[0]
    answer = client.get("/api/queries/hopping/series", params=params)
    assert answer.status_code == 400 and answer.json()["parameter"] == parameter


def test_an_unknown_query_is_a_404_and_the_listing_names_every_query(lake):
    client = lake[0]
    missing = client.get("/api/queries/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    listing = client.get("/api/queries").json()
    assert [q["name"] for q in listing["queries"]] == ["hopping", "per_server"]
    assert listing["queries"][0]["step_seconds"] == 60 and listing["queries"][1]["per_server"]


def test_closed_windows_are_cached_until_the_entry_expires_recent_ones_never(lake, store, log):
    client, reader, clock, events = lake
    window = {"from": START_MS, "to": START_MS + HOUR_MS}
    before = points(client.get("/api/queries/hopping/series", params=window).json(), None, "count")
    late = [{"ts": START_MS + 30_000, "server": "web-1", "metric": "m.lat", "value": 1.0}]
    ingest(store, log, late)  # changes windows that ended hours before the (test) clock
    cached = points(client.get("/api/queries/hopping/series", params=window).json(), None, "count")
    assert cached == before and reader.cache_hits > 0
    clock.now += 301  # the entries expire
    fresh = points(client.get("/api/queries/hopping/series", params=window).json(), None, "count")
    assert fresh[START_MS] == before[START_MS] + 1
    assert fresh == {
        k[2]: v
        for k, v in expected_query_results(events + late, QUERIES).items()
        if k[0] == "hopping" and k[3] == "count" and START_MS <= k[2] < START_MS + HOUR_MS
    }

    clock.now = START_MS / 1000 + 2 * 3600 + 300  # the last hour of data is now recent: never cached
    recent = {"from": START_MS + HOUR_MS, "to": START_MS + 2 * HOUR_MS}
    first = points(client.get("/api/queries/hopping/series", params=recent).json(), None, "count")
    newest = START_MS + 2 * HOUR_MS - 60_000
    ingest(store, log, [{"ts": newest + 1000, "server": "db-1", "metric": "m.lat", "value": 2.0}])
    again = points(client.get("/api/queries/hopping/series", params=recent).json(), None, "count")
    assert again[newest] == first[newest] + 1


def test_health_reports_freshness_and_the_pipeline_its_consumers_and_quarantine(lake, store, log):
    client, _, clock, _ = lake
    health = client.get("/api/health").json()
    assert health["newest_window_end"] == START_MS + 2 * HOUR_MS
    assert health["lag_seconds"] == pytest.approx(3600, abs=1) and health["stale"] and health["status"] == "stale"
    clock.now = START_MS / 1000 + 2 * 3600 + 60
    assert client.get("/api/health").json()["status"] == "ok"
    with Producer(log, "metrics", partitions=2) as producer:
        producer.send_payloads(['{"ts": 1, "server": "a", "metric": "m", "value": 1}', "{oops"])
    pipeline = client.get("/api/pipeline", params={"from": START_MS}).json()
    assert pipeline["consumers"]["groups"] == [{"group": "speed-layer (metrics)", "lag": 2}]
    assert pipeline["quality"] is None


def test_grouped_queries_and_the_label_filter(settings, store, log):
    """A ``BY`` query's series are its groups with their labels; ``select`` keeps the matching groups and the
    servers whose inventory labels match; a malformed one is a 400 naming ``select``."""
    from metrics_lake.core.inventory import Change, Inventory

    Inventory(store).append([Change("web-1", {"role": "web"}), Change("db-1", {"role": "db"})])
    events = make_events(2, START_MS, START_MS + HOUR_MS, 1500)
    for event in events:  # the agents' own tag: web servers are the front tier
        event["tags"] = {"tier": "front" if event["server"].startswith("web") else "back"}
    grouped = parse_query("by_tier", "FROM * SELECT m.lat WINDOW 15m COMPUTE count, max BY tier")
    ingest(store, log, events, [grouped])
    reader = DashboardReader(settings, [grouped], clock=Clock(START_MS / 1000 + 2 * 3600), refresh_seconds=0)
    client = TestClient(build_app(reader))
    span = {"from": START_MS, "to": START_MS + HOUR_MS}

    answer = client.get("/api/queries/by_tier/series", params=span).json()
    assert {(s["server"], tuple(s["labels"].items()), s["aggregate"]) for s in answer["series"]} == {
        (None, (("tier", tier),), aggregate) for tier in ("front", "back") for aggregate in ("count", "max")
    }
    for series in answer["series"]:
        tier = series["labels"]["tier"]
        mine = [e for e in events if e["tags"]["tier"] == tier]
        window = {}
        for e in mine:
            window.setdefault(e["ts"] - (e["ts"] - START_MS) % 900_000, []).append(e["value"])
        want = {t: (len(v) if series["aggregate"] == "count" else max(v)) for t, v in window.items()}
        assert dict(map(tuple, series["points"])) == want
    front = client.get("/api/queries/by_tier/series", params={**span, "select": "tier=front"}).json()
    assert {s["labels"]["tier"] for s in front["series"]} == {"front"}

    servers = client.get("/api/servers", params={"select": "role=web"}).json()["servers"]
    assert [(s["server"], s["labels"]) for s in servers] == [("web-1", {"role": "web"})]
    assert {s["server"] for s in client.get("/api/servers").json()["servers"]} == {"web-1", "web-2", "web-3", "db-1"}
    bad = client.get("/api/servers", params={"select": "role=web,9x=1"})
    assert bad.status_code == 400 and bad.json()["parameter"] == "select" and "9x" in bad.json()["error"]


def test_a_kept_table_is_refreshed_only_when_another_commit_exists(settings, store, monkeypatch):
    """As the stream's kept tables (tests/core/tables/test_delta.py): a refresh that would find nothing new, a
    listing of the whole Delta log on a local lake, is not made."""
    from metrics_lake.core.tables.delta import ensure_table
    from metrics_lake.lake_schemas.tables import Table
    from tests.core.tables.test_delta import _append

    ensure_table(store, Table.BRONZE_EVENTS)
    reader = DashboardReader(settings, [], refresh_seconds=0)
    kept = reader.table(Table.BRONZE_EVENTS)
    refreshed_from, refresh = [], kept.update_incremental
    monkeypatch.setattr(kept, "update_incremental", lambda: (refreshed_from.append(kept.version()), refresh())[1])

    assert reader.table(Table.BRONZE_EVENTS) is kept and refreshed_from == []
    _append(store, 1)
    assert reader.table(Table.BRONZE_EVENTS).version() == 1 and refreshed_from == [0]
    assert reader.table(Table.BRONZE_EVENTS).version() == 1 and refreshed_from == [0]


def test_a_kept_query_results_follows_the_stored_queries_progress_commit_by_commit(settings, store):
    """The panel asks ``query_results`` for a query's progress (three ``txn`` versions) on every request: the kept
    table follows the commits instead of asking delta-rs each time, and its answers are those of a table opened
    afresh."""
    from deltalake import Transaction

    from metrics_lake.core.speed.progress import live_revision_app_id, query_progress
    from metrics_lake.core.tables.app_transactions import FollowedTable
    from metrics_lake.core.tables.commits import commit_changes
    from metrics_lake.core.tables.delta import ensure_table, open_table
    from metrics_lake.lake_schemas.tables import Table

    ensure_table(store, Table.QUERY_RESULTS)
    query = parse_query("web_p99", "FROM web-* SELECT m.lat WINDOW 5m COMPUTE percentile(99)")
    query = dataclasses.replace(query, revision=1)
    reader = DashboardReader(settings, [query], refresh_seconds=0)
    assert isinstance(reader.table(Table.QUERY_RESULTS), FollowedTable)
    assert reader.query_status(query) == {"revision": 1, "live": False, "backfilled": False}
    for revision in (1, 2):  # the stream adopts revision 1, then 2, in six commits each (a checkpoint between)
        for _ in range(6):
            commit_changes(
                open_table(store, Table.QUERY_RESULTS),
                Table.QUERY_RESULTS,
                [],
                [],
                transactions=[Transaction(live_revision_app_id(query.name), revision)],
                operation="WRITE",
            )
        kept = reader.table(Table.QUERY_RESULTS)
        assert query_progress(kept, query.name) == query_progress(open_table(store, Table.QUERY_RESULTS), query.name)
        assert query_progress(kept, query.name).live_revision == revision
    assert reader.query_status(query)["live"] is False  # revision 1 is no longer the one evaluated
    assert reader.query_status(dataclasses.replace(query, revision=2))["live"] is True
