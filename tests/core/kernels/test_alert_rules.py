"""Alert rules: what parses, the error each mistake gets, each series' value at T, and the state machine."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from metrics_lake.core.kernels.alert_evaluation import SeriesValues, apply, evaluate, fingerprint, transitions_table
from metrics_lake.core.kernels.alert_rules import check_against_queries, format_duration, parse_rule
from metrics_lake.core.kernels.alert_steps import SeriesTimeline, evaluation_steps
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.lake_schemas.errors import AlertRuleError
from metrics_lake.lake_schemas.tables import ALERTS

S = 1_000_000  # µs per second
T0 = 1_763_600_400 * S  # a minute boundary


def test_parses_threshold_and_absence_rules():
    hot = parse_rule("hot", "fleet_rpc_latency_5m.p99.9 >= 2.5e2 for 3m labels severity=page,team=web")
    assert (hot.kind, hot.query, hot.aggregate, hot.op, hot.threshold, hot.for_s) == (
        "threshold",
        "fleet_rpc_latency_5m",
        "p99.9",
        ">=",
        250.0,
        180,
    )
    assert hot.labels == (("severity", "page"), ("team", "web"))
    assert hot.alert_labels("web-1") == (
        ("alertname", "hot"),
        ("server", "web-1"),
        ("severity", "page"),
        ("team", "web"),
    )
    quiet = parse_rule("quiet", "ABSENT agent.heartbeat FROM web-*,db-1 FOR 90s")
    assert (quiet.kind, quiet.metric, quiet.servers, quiet.for_s, quiet.labels) == (
        "absence",
        "agent.heartbeat",
        ("web-*", "db-1"),
        90,
        (),
    )
    assert parse_rule("now", "q.avg<0").for_s == 0  # FOR omitted: fire at once
    assert parse_rule("x", "  q.count   !=  3  ").text == "q.count != 3"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("q.p99 => 3", "expected '<query>.<aggregate> <op> <number>"),
        ("q.median > 3", "aggregate 'median' is not count, sum, min, max, avg or p<n>"),
        ("q.p99 > lots", "'lots' is not a number"),
        ("q.p99 > nan", "must be finite"),
        ("q.p99 > 3 FOR 2d", "FOR '2d' must be at most 1d"),
        ("q.p99 > 3 FOR 5 minutes", "expected '<query>"),
        ("q.p99 > 3 FOR 5x", "FOR '5x' is not <n>s, <n>m, <n>h or <n>d"),
        ("q.p99 > 3 LABELS severity", "LABELS item 'severity' is not name=value"),
        ("q.p99 > 3 LABELS server=a", "LABELS may not set 'server'"),
        ("q.p99 > 3 LABELS a=1,a=2", "LABELS names 'a' twice"),
        ("Bad-Query.p99 > 3", "'Bad-Query' is not a stored query name"),
        ("ABSENT cpu", "needs FOR <duration>"),
        ("ABSENT Bad-Metric FOR 1m", "is not a metric name"),
        ("ABSENT cpu FOR 1d", "FOR '1d' must be at least 1s and shorter than 1d"),
        ("ABSENT cpu FOR 0s", "at least 1s"),
        ("ABSENT FOR 1m", "expected 'ABSENT <metric>"),
    ],
)
def test_mistakes_are_named(text, words):
    with pytest.raises(AlertRuleError, match="alert rule 'r'") as error:
        parse_rule("r", text)
    assert words in str(error.value)


def test_a_threshold_rule_must_name_a_query_computing_its_aggregate():
    queries = {"lat": parse_query("lat", "FROM * SELECT m WINDOW 5m COMPUTE percentile(99), count")}
    check_against_queries(parse_rule("ok", "lat.p99 > 1"), queries)
    check_against_queries(parse_rule("absent", "ABSENT m FOR 1m"), {})  # needs no query
    with pytest.raises(AlertRuleError, match=r"unknown stored query 'cpu' \(known: lat\)"):
        check_against_queries(parse_rule("r", "cpu.avg > 1"), queries)
    with pytest.raises(AlertRuleError, match="'lat' computes p99, count, not 'p95'"):
        check_against_queries(parse_rule("r", "lat.p95 > 1"), queries)


def test_fingerprints_are_alertmanagers():
    # Alertmanager 0.25 (Debian's) answered this fingerprint for these labels on its API v2 (and the integration
    # test checks it against a running one): FNV-1a 64 over sorted names and values, each followed by 0xff.
    labels = (("alertname", "quiet"), ("server", "sim-0002"), ("severity", "info"))
    assert fingerprint(labels) == "c0e49fcdc5996a7e"
    assert fingerprint(tuple(reversed(labels))) == fingerprint(labels)
    assert format_duration(125) == "2m 5s" and format_duration(3600) == "1h" and format_duration(0) == "0s"


def _results(query, rows):
    """query_results rows: (server, start s, end s, aggregate, value)."""
    return pa.table(
        {
            "query": [query.name] * len(rows),
            "server": pa.array([r[0] for r in rows], pa.string()),
            "window_start": pa.array([T0 + r[1] * S for r in rows], pa.int64()).cast(pa.timestamp("us", "UTC")),
            "window_end": pa.array([T0 + r[2] * S for r in rows], pa.int64()).cast(pa.timestamp("us", "UTC")),
            "aggregate": [r[3] for r in rows],
            "value": pa.array([float(r[4]) for r in rows]),
        }
    )


def test_a_series_value_at_a_step_is_its_newest_window_that_ended_by_then_within_one_slide():
    hopping = parse_query("hop", "FROM * SELECT m WINDOW 5m EVERY 1m COMPUTE max PER SERVER")
    rows = _results(
        hopping,
        [
            ("a", -240, 60, "max", 1),  # still open at T0+30s: not seen
            ("a", -300, 0, "max", 2),  # ended at T0, within a slide: chosen
            ("a", -360, -60, "max", 3),  # older
            ("b", -360, -60, "max", 9),  # ended over a slide before the step: stale
            ("c", -270, 30, "max", 5),  # ends exactly at the step: seen
            (None, -300, 0, "max", 7),  # the fleet row: not a per-server series
            ("a", -300, 0, "avg", 8),  # another aggregate
        ],
    )
    values = SeriesTimeline(rows, hopping, "max").at(T0 + 30 * S)
    assert dict(zip(values.servers, values.values.tolist(), strict=True)) == {"a": 2.0, "c": 5.0}
    assert SeriesTimeline(rows, hopping, "max").at(T0 - 10 * 60 * S).values.tolist() == []
    tumbling = parse_query("tum", "FROM * SELECT m WINDOW 5m COMPUTE avg")
    fleet = SeriesTimeline(
        _results(tumbling, [(None, 0, 300, "avg", 4), (None, -300, 0, "avg", 3)]), tumbling, "avg"
    ).at(T0 + 300 * S)
    assert fleet.servers == [None] and fleet.values.tolist() == [4.0] and fleet.starts.tolist() == [T0]


def test_evaluation_steps_are_epoch_aligned_multiples_after_the_previous_one_up_to_the_clock():
    m = 60 * S
    assert evaluation_steps(None, None, None, 60).tolist() == []
    assert evaluation_steps(None, None, 10 * m + 5, 60).tolist() == [10 * m]  # no history: the clock's step
    assert evaluation_steps(None, 7 * m + 1, 10 * m, 60).tolist() == [8 * m, 9 * m, 10 * m]
    assert evaluation_steps(8 * m, 2 * m, 10 * m - 1, 60).tolist() == [9 * m]
    assert evaluation_steps(10 * m, None, 10 * m + 59 * S, 60).tolist() == []
    assert evaluation_steps(0, None, 30 * S, 15).tolist() == [15 * S, 30 * S]


def _values(at_s, **servers) -> SeriesValues:
    names = list(servers)
    return SeriesValues(
        names,
        np.array([servers[n] for n in names], float),
        np.full(len(names), T0 + (at_s - at_s % 60) * S),
        np.full(len(names), T0 + (at_s - at_s % 60 + 60) * S),
    )


def _step(rules, active, at_s, values=None, last_seen=None, absence_at_s=None):
    empty = pa.table({"server": pa.array([], pa.string()), "metric": pa.array([], pa.string())})
    seen = last_seen if last_seen is not None else empty.append_column("last_seen_at", pa.array([], pa.timestamp("us")))
    transitions = evaluate(
        rules,
        active,
        threshold_at_us=None if at_s is None else T0 + at_s * S,
        threshold_values=values or {},
        absence_at_us=None if absence_at_s is None else T0 + absence_at_s * S,
        last_seen=seen,
    )
    rows = transitions_table(transitions, dt.datetime.now(dt.UTC))
    return apply(active, rows), [(t.server, t.previous_state, t.state) for t in transitions], rows


def test_threshold_alerts_pend_fire_after_for_and_resolve_like_prometheus():
    rule = parse_rule("hot", "q.max > 10 FOR 2m LABELS severity=page")
    active = {}
    active, moves, _ = _step([rule], active, 0, {"hot": _values(0, a=11, b=5)})
    assert moves == [("a", "inactive", "pending")]
    active, moves, _ = _step([rule], active, 60, {"hot": _values(60, a=12, b=11)})
    assert moves == [("b", "inactive", "pending")]  # a still pending: 1m of 2m held
    active, moves, rows = _step([rule], active, 120, {"hot": _values(120, a=13, b=4)})
    assert sorted(moves) == [("a", "pending", "firing"), ("b", "pending", "resolved")]
    firing = rows.filter(pa.compute.equal(rows.column("state"), "firing")).to_pylist()[0]
    assert firing["active_since"] == dt.datetime.fromtimestamp(T0 / S, dt.UTC)  # pending since the first crossing
    assert firing["value"] == 13 and firing["labels"] == [("alertname", "hot"), ("server", "a"), ("severity", "page")]
    assert firing["summary"] == "q max = 13 > 10 on a for 2m"
    active, moves, _ = _step([rule], active, 180, {"hot": _values(180, a=14)})
    assert moves == []  # still firing: no transition
    active, moves, _ = _step([rule], active, None)  # no event clock yet (no watermark): the state is kept
    assert moves == [] and list(active.values())[0].state == "firing"
    active, moves, _ = _step([rule], active, 240, {"hot": _values(240)})  # the series stopped: no value
    assert moves == [("a", "firing", "resolved")] and active == {}


def test_changed_labels_and_removed_rules_resolve_what_they_raised():
    rule = parse_rule("hot", "q.max > 10")  # FOR 0: fires at once
    active, moves, _ = _step([rule], {}, 0, {"hot": _values(0, a=11)})
    assert moves == [("a", "inactive", "firing")]
    relabelled = parse_rule("hot", "q.max > 10 LABELS severity=page")
    active, moves, rows = _step([relabelled], active, 60, {"hot": _values(60, a=11)})
    assert sorted(moves) == [("a", "firing", "resolved"), ("a", "inactive", "firing")]
    assert rows.column("summary").to_pylist()[0] == "hot on a: rule changed (new labels)"  # resolved first
    active, moves, rows = _step([], active, 120)
    assert moves == [("a", "firing", "resolved")] and rows.column("summary").to_pylist() == ["hot on a: rule removed"]
    assert active == {}


def _seen(**servers) -> pa.Table:
    names = list(servers)
    return pa.table(
        {
            "server": names,
            "metric": ["cpu"] * len(names),
            "last_seen_at": pa.array([T0 + servers[n] * S for n in names], pa.int64()).cast(pa.timestamp("us", "UTC")),
        }
    )


def test_absence_fires_when_a_silence_reaches_for_and_resolves_when_data_returns():
    rule = parse_rule("quiet", "ABSENT cpu FROM web-* FOR 30s")
    active, moves, _ = _step([rule], {}, None, last_seen=_seen(**{"web-1": 0, "web-2": 25, "db-1": 0}), absence_at_s=29)
    assert moves == []  # web-1 silent 29 s; db-1 not watched
    active, moves, rows = _step(
        [rule], active, None, last_seen=_seen(**{"web-1": 0, "web-2": 55, "db-1": 0}), absence_at_s=60
    )
    assert moves == [("web-1", "inactive", "firing")]
    row = rows.to_pylist()[0]
    assert row["active_since"] == dt.datetime.fromtimestamp(T0 / S + 30, dt.UTC)  # last seen + FOR
    assert row["value"] == 60 and row["threshold"] == 30 and row["window_start"].timestamp() == T0 / S
    active, moves, _ = _step([rule], active, None, last_seen=_seen(**{"web-1": 70, "web-2": 70}), absence_at_s=71)
    assert moves == [("web-1", "firing", "resolved")]
    # A server silent for longer than the lookback (a day) is no longer expected: its alert resolves.
    active, _, _ = _step([rule], {}, None, last_seen=_seen(**{"web-1": 0, "web-2": 3600}), absence_at_s=3600)
    active, moves, rows = _step([rule], active, None, last_seen=_seen(**{"web-1": 0}), absence_at_s=86_401)
    assert moves == [("web-1", "firing", "resolved")] and "no longer expected" in rows.to_pylist()[0]["summary"]


def test_transition_rows_fit_the_table_and_rebuild_the_state():
    rule = parse_rule("hot", "q.max > 10 FOR 1m")
    active, _, first = _step([rule], {}, 0, {"hot": _values(0, a=11, b=12)})
    active, _, second = _step([rule], active, 60, {"hot": _values(60, a=11, b=1)})
    assert first.schema.equals(ALERTS) and len(set(first.column("id").to_pylist())) == 2
    assert apply(apply({}, first), second) == active
    assert [(a.server, a.state) for a in active.values()] == [("a", "firing")]
