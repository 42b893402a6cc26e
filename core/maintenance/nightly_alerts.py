"""The nightly evaluation of threshold rules over a day's final stored query results: episodes the live one missed.

The speed layer evaluates every rule after each micro-batch, on windows that
may still change: an event later than the watermark never reaches the live
windows, and the nightly run (recompute, then ``lake queries --date``)
replaces the day's ``query_results`` with the complete data. This module
then evaluates each threshold rule over every window of that day, as the
batch layer's view of what should have fired:

- per series, a run of consecutive windows (one ``EVERY`` step apart) whose
  value meets the condition is an *episode*; it would have fired if the run
  covers at least ``FOR`` (from the first window's start to the last one's
  start plus a step);
- an episode that no live firing overlaps (the live alert fired no later
  than a step after the episode ended, and resolved no earlier than it
  began) was missed, and is appended as a firing and a resolved transition
  with ``source = 'nightly'`` and the episode's bounds. They record the past:
  they change no live state and are not sent to Alertmanager.

Absence rules are left to the live evaluation: they are about when the lake
received data, which a day's final windows cannot tell. A day is evaluated
once (a ``txn`` action ``nightly/alerts/<day>`` in the same commit); running
it again changes nothing.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Transaction

from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.kernels.alert_evaluation import (
    FIRING,
    INACTIVE,
    RESOLVED,
    Transition,
    epoch_us,
    series_rows,
    transitions_table,
)
from metrics_lake.core.kernels.alert_rules import OPERATORS, THRESHOLD, AlertRule, format_duration
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.core.speed.alerting import AlertLog
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.core.tables.snapshots import read_data_files, snapshot_files
from metrics_lake.lake_schemas.tables import QUERY_RESULTS, Table

__all__ = ["NightlyAlerts", "episodes", "evaluate_alerts_for_day", "nightly_app_id"]

_US = 1_000_000


@dataclass(frozen=True)
class NightlyAlerts:
    """One day's nightly evaluation: episodes found that the live evaluation missed, transitions appended, whether
    the day had been evaluated already (nothing done), seconds taken."""

    day: dt.date
    episodes: int
    rows: int
    skipped: bool
    seconds: float


@dataclass(frozen=True)
class Episode:
    """A run of windows of one series meeting a rule's condition, long enough to fire (times in epoch µs)."""

    rule: AlertRule
    server: str | None
    start_us: int
    end_us: int
    value: float
    window_start_us: int
    window_end_us: int


def nightly_app_id(day: dt.date) -> str:
    """The ``txn`` appId with which ``alerts`` records that ``day`` was evaluated nightly."""
    return f"nightly/alerts/{day.isoformat()}"


def episodes(rows: pa.Table, rule: AlertRule, query: StoredQuery) -> list[Episode]:
    """The episodes (module docstring) of ``rule`` in ``query_results`` rows of ``query`` (columns ``query, server,
    window_start, window_end, aggregate, value``)."""
    rows = series_rows(rows, query, rule.aggregate)
    found = []
    step_us = query.slide_s * _US
    rows = rows.sort_by([("server", "ascending"), ("window_start", "ascending")])
    servers = rows.column("server").to_pylist()
    starts = pc.cast(rows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
    ends = pc.cast(rows.column("window_end"), pa.int64()).to_numpy(zero_copy_only=False)
    values = rows.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
    holds = OPERATORS[rule.op](values, rule.threshold)
    run: list[int] = []
    for i in range(len(servers) + 1):
        continues = (
            i < len(servers)
            and holds[i]
            and run
            and servers[i] == servers[run[-1]]
            and starts[i] == starts[run[-1]] + step_us
        )
        if continues:
            run.append(i)
            continue
        if run and starts[run[-1]] + step_us - starts[run[0]] >= rule.for_s * _US:
            extreme = run[int(np.argmax(values[run]))] if rule.op in (">", ">=") else run[int(np.argmin(values[run]))]
            found.append(
                Episode(
                    rule,
                    servers[run[0]],
                    int(starts[run[0]]),
                    int(ends[run[-1]]),
                    float(values[extreme]),
                    int(starts[extreme]),
                    int(ends[extreme]),
                )
            )
        run = [i] if i < len(servers) and holds[i] else []
    return found


def _missed(episode: Episode, firings: list[tuple[int, int]], step_us: int) -> bool:
    return not any(fired <= episode.end_us + step_us and resolved >= episode.start_us for fired, resolved in firings)


def _live_firings(alert_log: AlertLog) -> dict[tuple[str, str | None], list[tuple[int, int]]]:
    """Per (rule, server), the live firing intervals ``(fired at, resolved at)`` in epoch µs (open: far future)."""
    rows = alert_log.transitions()
    rows = rows.filter(pc.equal(rows.column("source"), "live"))
    intervals: dict[tuple[str, str | None], list[tuple[int, int]]] = {}
    opened: dict[str, tuple[tuple[str, str | None], int]] = {}
    for row in rows.select(["rule", "server", "fingerprint", "state", "previous_state", "at"]).to_pylist():
        at = epoch_us(row["at"])
        if row["state"] == FIRING:
            opened[row["fingerprint"]] = ((row["rule"], row["server"]), at)
        elif row["state"] == RESOLVED and row["previous_state"] == FIRING and row["fingerprint"] in opened:
            key, fired = opened.pop(row["fingerprint"])
            intervals.setdefault(key, []).append((fired, at))
    for key, fired in opened.values():
        intervals.setdefault(key, []).append((fired, 2**62))
    return intervals


def evaluate_alerts_for_day(store: Store, day: dt.date, rules: list[AlertRule] | None = None) -> NightlyAlerts:
    """Evaluate the threshold ``rules`` (default: the config store's) over ``day``'s ``query_results`` and append the
    episodes the live evaluation missed to ``alerts`` in one commit (module docstring).

    Run it after the day's stored queries were evaluated (``lake queries
    --date``). Raises ``CommitFailedError`` if a concurrent commit keeps
    winning.
    """
    started = time.monotonic()
    version = ConfigStore(store).current()
    rules = version.alert_rules() if rules is None else rules
    queries = {q.name: q for q in version.queries()}
    chosen = [r for r in rules if r.kind == THRESHOLD and r.query in queries]
    found: list[Episode] = []

    def commit() -> tuple[int, bool]:
        alerts = ensure_table(store, Table.ALERTS)
        if alerts.transaction_version(nightly_app_id(day)) is not None:
            return 0, True
        results = ensure_table(store, Table.QUERY_RESULTS)
        files = snapshot_files(store, Table.QUERY_RESULTS, results, ("event_date", day.isoformat()))
        columns = ["query", "server", "window_start", "window_end", "aggregate", "value"]
        rows = read_data_files(store, files, QUERY_RESULTS, columns)
        alert_log = AlertLog(store)
        alert_log.refresh(alerts)
        firings = _live_firings(alert_log)
        found.clear()
        for rule in chosen:
            query = queries[rule.query]
            for episode in episodes(rows, rule, query):
                if _missed(episode, firings.get((rule.name, episode.server), []), query.slide_s * _US):
                    found.append(episode)
        transitions = []
        for e in found:
            labels = e.rule.alert_labels(e.server)
            where = "" if e.server is None else f" on {e.server}"
            held = format_duration((e.end_us - e.start_us) / _US)
            what = f"{e.rule.query} {e.rule.aggregate} = {e.value:.6g} {e.rule.op} {e.rule.threshold:g}{where}"
            note = "found by the nightly evaluation (late data): the live evaluation missed it"
            fired_at = e.start_us + e.rule.for_s * _US
            window = (e.window_start_us, e.window_end_us)
            common = dict(rule=e.rule, server=e.server, labels=labels, active_since_us=e.start_us, value=e.value)
            transitions += [
                Transition(
                    **common,
                    state=FIRING,
                    previous_state=INACTIVE,
                    at_us=fired_at,
                    window_start_us=window[0],
                    window_end_us=window[1],
                    summary=f"{what} for {held}; {note}",
                    source="nightly",
                ),
                Transition(
                    **common,
                    state=RESOLVED,
                    previous_state=FIRING,
                    at_us=max(e.end_us, fired_at),
                    window_start_us=window[0],
                    window_end_us=window[1],
                    summary=f"{what}: the episode ended; {note}",
                    source="nightly",
                ),
            ]
        table = transitions_table(transitions, dt.datetime.now(dt.UTC))
        commit_changes(
            alerts,
            Table.ALERTS,
            write_data_files(store, Table.ALERTS, table),
            [],
            transactions=[Transaction(nightly_app_id(day), 1, int(time.time() * 1000))],
            operation="NIGHTLY ALERTS",
        )
        return table.num_rows, False

    rows, skipped = retry_on_conflict(commit, f"{Table.ALERTS} nightly evaluation of {day}")
    return NightlyAlerts(day, 0 if skipped else len(found), rows, skipped, time.monotonic() - started)
