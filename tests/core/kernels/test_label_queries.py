"""Tag-aware stored queries: label selectors and BY groups against an independent computation over the events."""

import datetime as dt
import fnmatch

import numpy as np
import pyarrow as pa
import pytest

from metrics_lake.core.kernels import sketch
from metrics_lake.core.kernels.alert_rules import check_against_queries, parse_rule
from metrics_lake.core.kernels.selectors import LabelMatcher, parse_selector
from metrics_lake.core.kernels.stored_queries import parse_query, query_rows, query_states
from metrics_lake.core.kernels.windows import aggregate_events, merge_states, overlay_labels
from metrics_lake.lake_schemas.errors import AlertRuleError, StoredQueryError
from metrics_lake.lake_schemas.types import TAGS

DAY = dt.date(2026, 3, 4)
START_MS = int(dt.datetime(2026, 3, 4, tzinfo=dt.UTC).timestamp() * 1000)
DCS = ("eu-west", "eu-north", "us-east")


def _fleet(seed: int = 3, servers: int = 24, events: int = 6_000):
    """Events of a fleet whose servers have inventory labels (some lack ``team``) and a ``region`` tag."""
    rng = np.random.default_rng(seed)
    inventory = {}
    for i in range(servers):
        labels = {"dc": DCS[i % 3], "role": "web" if i % 2 else "db"}
        if i % 4:
            labels["team"] = "payments" if i % 3 else "search"
        inventory[f"srv-{i:02d}"] = labels
    names = sorted(inventory)
    server = rng.integers(0, servers, events)
    ts = START_MS + rng.integers(0, 20 * 60_000, events)
    value = rng.lognormal(2.0, 0.7, events)
    table = pa.table(
        {
            "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("ms", "UTC")),
            "server": pa.array([names[s] for s in server]),
            "metric": pa.array(["app.rpc.latency_ms"] * events),
            "value": value,
            "offset": np.arange(events, dtype=np.int64),
            "tags": pa.array([[("region", "r" + names[s][-1])] for s in server], TAGS),
            "labels": pa.array([sorted(inventory[names[s]].items()) for s in server], TAGS),
        }
    )
    return table, inventory


def _rows(events: pa.Table, text: str) -> list[dict]:
    query = parse_query("q", text)
    states = merge_states(query_states(aggregate_events(events, 60), query, DAY))
    return query_rows(states, [query], DAY, dt.datetime(2026, 3, 5, tzinfo=dt.UTC)).to_pylist()


def test_group_by_labels_equals_an_independent_computation():
    events, inventory = _fleet()
    rows = _rows(
        events,
        "FROM role=web,dc=eu-* SELECT app.rpc.latency_ms WINDOW 5m COMPUTE count, sum, max, percentile(99) BY dc",
    )
    expected: dict[tuple, list[float]] = {}
    for server, ts, value in zip(
        events.column("server").to_pylist(),
        events.column("ts").cast(pa.int64()).to_pylist(),
        events.column("value").to_pylist(),
        strict=True,
    ):
        labels = inventory[server]
        if labels["role"] == "web" and fnmatch.fnmatchcase(labels["dc"], "eu-*"):
            window = (ts - START_MS) // 300_000
            expected.setdefault((labels["dc"], window), []).append(value)
    got = {
        (dict(r["labels"])["dc"], (int(r["window_start"].timestamp() * 1000) - START_MS) // 300_000, r["aggregate"]): r
        for r in rows
    }
    assert len(got) == len(rows) == 4 * len(expected)  # one row per group, window and aggregate
    for (dc, window), values in expected.items():
        assert got[(dc, window, "count")]["value"] == len(values)
        assert got[(dc, window, "sum")]["value"] == pytest.approx(sum(values))
        assert got[(dc, window, "max")]["value"] == max(values)
        exact = sorted(values)[int(0.99 * (len(values) - 1))]  # the sketch's rank (sketch module docstring)
        assert abs(got[(dc, window, "p99")]["value"] - exact) <= sketch.RELATIVE_ERROR * exact
        assert got[(dc, window, "count")]["server"] is None


def test_missing_labels_group_together_and_are_left_out_of_the_row():
    events, inventory = _fleet()
    rows = [r for r in _rows(events, "FROM * SELECT app.rpc.latency_ms WINDOW 20m COMPUTE count BY team,role")]
    counts = {tuple(sorted(dict(r["labels"]).items())): r["value"] for r in rows}
    expected: dict[tuple, int] = {}
    for server in events.column("server").to_pylist():
        labels = inventory[server]
        key = tuple(sorted((k, v) for k, v in labels.items() if k in ("team", "role")))
        expected[key] = expected.get(key, 0) + 1
    assert counts == expected
    assert (("role", "db"),) in counts  # servers without a team form their own group


def test_tags_group_and_filter_like_labels():
    events, inventory = _fleet()
    rows = _rows(events, "FROM region=r1,team!=search SELECT app.rpc.latency_ms WINDOW 20m COMPUTE count PER SERVER")
    per_server = {r["server"]: r["value"] for r in rows if r["server"] is not None}
    servers = events.column("server").to_pylist()
    expected = {s: servers.count(s) for s in set(servers) if s.endswith("1") and inventory[s].get("team") != "search"}
    assert per_server == expected
    assert all(dict(r["labels"])["region"] == "r1" for r in rows if r["server"] is not None)
    fleet = [r for r in rows if r["server"] is None]
    assert [r["value"] for r in fleet] == [sum(expected.values())] and fleet[0]["labels"] is None


def test_a_label_nobody_has_selects_nothing():
    events, _ = _fleet()
    assert _rows(events, "FROM rack=r7 SELECT app.rpc.latency_ms WINDOW 5m COMPUTE count") == []
    everything = _rows(events, "FROM rack= SELECT app.rpc.latency_ms WINDOW 20m COMPUTE count")
    assert [r["value"] for r in everything] == [events.num_rows]


def test_inventory_labels_win_over_tags_of_the_same_name():
    tags = pa.array([[("dc", "from-agent"), ("region", "r1")], None, [("a", "1")]], TAGS)
    labels = pa.array([[("dc", "eu-west")], [("role", "web")], None], TAGS)
    assert overlay_labels(tags, labels).to_pylist() == [
        [("dc", "eu-west"), ("region", "r1")],
        [("role", "web")],
        [("a", "1")],
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM dc=eu,1x=y SELECT m WINDOW 5m COMPUTE max", "label name '1x'"),
        ("FROM dc!eu SELECT m WINDOW 5m COMPUTE max", "neither a server glob"),
        ("FROM * SELECT m WINDOW 5m COMPUTE max BY server", "PER SERVER, not BY server"),
        ("FROM * SELECT m WINDOW 5m COMPUTE max BY dc,dc", "names a label twice"),
        ("FROM * SELECT m WINDOW 5m COMPUTE max BY dc-x", "is not a label name"),
    ],
)
def test_malformed_selectors_and_groups_are_named(text, message):
    with pytest.raises(StoredQueryError, match="stored query 'q'") as error:
        parse_query("q", text)
    assert message in str(error.value)


def test_selector_items():
    selector = parse_selector("web-*,server=db-1,dc=eu-*,team!=")
    assert selector.servers == ("web-*", "db-1")
    assert selector.matchers == (LabelMatcher("dc", "eu-*"), LabelMatcher("team", "", negated=True))
    assert parse_selector("*").everything and not selector.everything


def test_alert_rules_refuse_grouped_queries():
    query = parse_query("by_dc", "FROM * SELECT m WINDOW 5m COMPUTE max BY dc")
    rule = parse_rule("hot", "by_dc.max > 90 FOR 5m")
    with pytest.raises(AlertRuleError, match="grouped BY dc"):
        check_against_queries(rule, {"by_dc": query})
