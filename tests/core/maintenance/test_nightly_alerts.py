"""The nightly evaluation: episodes in a day's final query results that the live evaluation missed, recorded once."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from metrics_lake.core.config_store import ALERT, Change, ConfigStore
from metrics_lake.core.kernels.alert_evaluation import Transition, transitions_table
from metrics_lake.core.kernels.alert_rules import parse_rule
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.maintenance.nightly_alerts import episodes, evaluate_alerts_for_day
from metrics_lake.core.tables.commits import commit_changes
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table, open_table
from metrics_lake.lake_schemas.tables import QUERY_RESULTS, Table

DAY = dt.date(2026, 11, 20)
MIDNIGHT = int(dt.datetime.combine(DAY, dt.time(), dt.UTC).timestamp()) * 1_000_000
MIN = 60_000_000
QUERY = "FROM * SELECT app.lat WINDOW 1m COMPUTE max PER SERVER"


def results(values: dict[str, list[float]]) -> pa.Table:
    """query_results rows of query 'lat' for each server: one value per minute from midnight (None: no window)."""
    rows = [
        (server, MIDNIGHT + i * MIN, value)
        for server, series in values.items()
        for i, value in enumerate(series)
        if value is not None
    ]
    start = pa.array([r[1] for r in rows], pa.int64()).cast(pa.timestamp("us", "UTC"))
    return pa.table(
        {
            "query": ["lat"] * len(rows),
            "metric": ["app.lat"] * len(rows),
            "server": [r[0] for r in rows],
            "window_start": start,
            "window_end": pa.array([r[1] + MIN for r in rows], pa.int64()).cast(pa.timestamp("us", "UTC")),
            "aggregate": ["max"] * len(rows),
            "value": [float(r[2]) for r in rows],
            "computed_at": pa.array([dt.datetime.now(dt.UTC)] * len(rows), pa.timestamp("us", "UTC")),
            "event_date": pa.array([DAY] * len(rows), pa.date32()),
            "labels": pa.nulls(len(rows), QUERY_RESULTS.field("labels").type),
        }
    ).cast(QUERY_RESULTS)


def test_episodes_are_runs_of_consecutive_windows_long_enough_to_fire():
    rule = parse_rule("hot", "lat.max > 10 FOR 2m")
    rows = results({"a": [11, 12, 5, 11, 11, 11, None, 11, 11], "b": [11, None, 11]})
    found = episodes(rows, rule, parse_query("lat", QUERY))
    # a: minutes 0-1 (2 min: fires), 3-5 (3 min), 7-8 (2 min); b: never two consecutive minutes
    assert [(e.server, (e.start_us - MIDNIGHT) // MIN, (e.end_us - MIDNIGHT) // MIN) for e in found] == [
        ("a", 0, 2),
        ("a", 3, 6),
        ("a", 7, 9),
    ]
    assert found[0].value == 12 and (found[0].window_start_us - MIDNIGHT) // MIN == 1


def test_the_nightly_run_records_the_episodes_live_missed_once(store):
    config_store = ConfigStore(store)
    config_store.ensure_seeded()
    config_store.apply([Change("put", "lat", QUERY), Change("put", "hot", "lat.max > 10 FOR 2m", kind=ALERT)])
    table = ensure_table(store, Table.QUERY_RESULTS)
    rows = results({"a": [11, 12, 5, 5, 11, 11, 11], "b": [20, 20, 20]})
    commit_changes(
        table,
        Table.QUERY_RESULTS,
        write_data_files(store, Table.QUERY_RESULTS, rows),
        [],
        transactions=[],
        operation="TEST",
    )
    rule = config_store.current().rules["hot"].rule()
    labels = rule.alert_labels("a")
    live = [  # the live evaluation saw a's first episode (minutes 0-2) fire, and resolve at minute 3
        Transition(rule, "a", labels, "firing", "pending", MIDNIGHT + 2 * MIN, MIDNIGHT, 12.0, None, None, "live"),
        Transition(rule, "a", labels, "resolved", "firing", MIDNIGHT + 3 * MIN, MIDNIGHT, 5.0, None, None, "live"),
    ]
    alerts = ensure_table(store, Table.ALERTS)
    live_rows = transitions_table(live, dt.datetime.now(dt.UTC))
    commit_changes(
        alerts, Table.ALERTS, write_data_files(store, Table.ALERTS, live_rows), [], transactions=[], operation="TEST"
    )

    done = evaluate_alerts_for_day(store, DAY)
    assert (done.episodes, done.rows, done.skipped) == (2, 4, False)  # a's second episode and b's were missed
    recorded = (
        open_table(store, Table.ALERTS).to_pyarrow_table().sort_by([("server", "ascending"), ("at", "ascending")])
    )
    nightly = [r for r in recorded.to_pylist() if r["source"] == "nightly"]
    assert [(r["server"], r["state"], (int(r["at"].timestamp() * 1e6) - MIDNIGHT) // MIN) for r in nightly] == [
        ("a", "firing", 6),  # the run started at minute 4, fires after FOR (2m)
        ("a", "resolved", 7),
        ("b", "firing", 2),
        ("b", "resolved", 3),
    ]
    assert all("found by the nightly evaluation" in r["summary"] for r in nightly)
    again = evaluate_alerts_for_day(store, DAY)
    assert again.skipped and again.rows == 0
    assert open_table(store, Table.ALERTS).to_pyarrow_table().num_rows == 6
