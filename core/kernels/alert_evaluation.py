"""Alert rules evaluated: a state machine per alert over Arrow columns, and the ``alerts`` table's rows.

**Evaluation** (:func:`evaluate`) follows Prometheus's alerting rules
(``rules/alerting.go``): an alert whose condition holds becomes *pending*
with ``active_since`` the evaluation time, and *firing* once the condition
has held for ``FOR`` (at once when ``FOR`` is 0); one whose condition stops
holding is *resolved*. An absence alert goes straight to firing, its
``active_since`` being the moment the silence reached ``FOR`` (last seen +
``FOR``). What the evaluator carries from one evaluation to the next is the
set of :class:`ActiveAlert`, keyed by fingerprint; every change of it is one
:class:`Transition`, a row of the ``alerts`` table, so the state of any
evaluation can be rebuilt from the table (:func:`apply`).

A series' **value at an evaluation step T** (threshold rules): its newest
query window ending at or before T and after T minus the query's step
(:class:`~metrics_lake.core.kernels.alert_steps.SeriesTimeline`); without
one, the series has no value and its condition does not hold (Prometheus's
staleness). Threshold rules are evaluated at every step of the evaluation
interval (:mod:`metrics_lake.core.kernels.alert_steps`). The rules
themselves, their grammar and parser: :mod:`metrics_lake.core.kernels.alert_rules`.

Fingerprints are Alertmanager's: FNV-1a 64 over the labels sorted by name,
each name and value followed by the byte 0xff (``prometheus/common``
``model.LabelSet.Fingerprint``), printed as 16 hex digits, so the lake's and
Alertmanager's API name an alert alike.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.alert_rules import DAY_S, NO_DATA, OPERATORS, THRESHOLD, AlertRule, format_duration
from metrics_lake.core.kernels.selectors import server_pattern
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.lake_schemas.tables import ALERTS
from metrics_lake.lake_schemas.types import UTC_US, utc_dates

__all__ = [
    "FIRING",
    "INACTIVE",
    "PENDING",
    "RESOLVED",
    "ActiveAlert",
    "SeriesValues",
    "Transition",
    "apply",
    "epoch_us",
    "evaluate",
    "fingerprint",
    "series_rows",
    "transitions_table",
]

_US = 1_000_000


PENDING, FIRING, RESOLVED, INACTIVE = "pending", "firing", "resolved", "inactive"


@functools.lru_cache(maxsize=1 << 16)
def fingerprint(labels: tuple[tuple[str, str], ...]) -> str:
    """Alertmanager's fingerprint of a label set (module docstring): 16 lower-case hex digits.

    Cached: a catch-up evaluates the same alerts at every step, and the hash is a loop over bytes in Python.
    """
    value = 14695981039346656037  # FNV-1a 64 offset basis
    for name, label in sorted(labels):
        for part in (name, label):
            for byte in part.encode() + b"\xff":
                value = ((value ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


@dataclass(frozen=True)
class ActiveAlert:
    """An alert that is pending or firing, as its latest transition left it (times in epoch µs)."""

    rule: str
    fingerprint: str
    server: str | None
    labels: tuple[tuple[str, str], ...]
    state: str
    active_since_us: int
    since_us: int
    value: float | None = None


@dataclass(frozen=True)
class Transition:
    """One change of an alert's state: a row of the ``alerts`` table (columns there; times in epoch µs).

    ``value``: the aggregate (threshold) or the seconds of silence (absence)
    at ``at_us``; ``threshold``: the rule's number, or its ``FOR`` in seconds
    for absence; ``window_start_us``/``window_end_us``: the query window
    whose value decided (threshold), or the last time the server was seen
    and None (absence).
    """

    rule: AlertRule
    server: str | None
    labels: tuple[tuple[str, str], ...]
    state: str
    previous_state: str
    at_us: int
    active_since_us: int
    value: float | None
    window_start_us: int | None
    window_end_us: int | None
    summary: str
    source: str = "live"

    @property
    def fingerprint(self) -> str:
        """The alert's fingerprint (its labels')."""
        return fingerprint(self.labels)

    @property
    def id(self) -> str:
        """Unique per transition: ``<fingerprint>-<state>-<at µs>`` (one transition per alert per evaluation)."""
        return f"{self.fingerprint}-{self.state}-{self.at_us}"


@dataclass
class SeriesValues:
    """Per series of one threshold rule: ``servers`` (None for the fleet), ``values``, window bounds (epoch µs)."""

    servers: list[str | None]
    values: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def empty(cls) -> SeriesValues:
        """No series at all."""
        return cls([], np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))


def series_rows(rows: pa.Table, query: StoredQuery, aggregate: str) -> pa.Table:
    """The ``query_results`` rows of ``query``'s ``aggregate`` that a rule watches: a ``PER SERVER`` query's server
    rows (its fleet rows left out), any other query's fleet rows."""
    keep = pc.and_(pc.equal(rows.column("query"), query.name), pc.equal(rows.column("aggregate"), aggregate))
    servers = rows.column("server")
    return rows.filter(pc.and_(keep, pc.is_valid(servers) if query.per_server else pc.is_null(servers)))


def evaluate(
    rules: list[AlertRule],
    active: dict[str, ActiveAlert],
    *,
    threshold_at_us: int | None,
    threshold_values: dict[str, SeriesValues],
    absence_at_us: int | None,
    last_seen: pa.Table,
    lookback_s: int = DAY_S,
    expected: pa.Table | None = None,
) -> list[Transition]:
    """Evaluate ``rules`` once; returns the transitions from ``active`` (by fingerprint, :func:`apply` builds it).

    ``threshold_at_us``: the evaluation time of threshold rules (an
    evaluation step, :mod:`metrics_lake.core.kernels.alert_steps`; None: they
    are not evaluated and keep their state); ``threshold_values``: per rule name,
    its series' values at that time (:meth:`~metrics_lake.core.kernels.alert_steps.SeriesTimeline.at`);
    ``absence_at_us``: the evaluation time of absence rules (the lake's
    append clock; absence rules and ``LakeNoData`` are evaluated only with
    it); ``last_seen``: rows ``(server, metric, last_seen_at)``
    of the ``last_seen`` table; ``expected``: the servers the inventory
    holds (``server``, ``since`` epoch µs: when its record was appended),
    which absence rules expect to report whether or not ``last_seen`` knows
    them (a server that never reported is silent since ``since``). Alerts in
    ``active`` whose rule is gone, whose labels changed or whose series no
    longer holds are resolved.

    The work per rule is vectorised over its series; only series whose
    condition holds, and alerts already active, are looked at one by one
    (1,000 rules over 10,000 servers: ``bench/alerts.py``).
    """
    by_rule: dict[str, dict[str | None, ActiveAlert]] = {}
    for alert in active.values():
        by_rule.setdefault(alert.rule, {})[alert.server] = alert
    silent_rows: dict[str, pa.Table] | None = None
    transitions: list[Transition] = []
    for rule in rules:
        mine = by_rule.pop(rule.name, {})
        if rule.kind == THRESHOLD:
            if threshold_at_us is not None:  # else no event clock yet: the rule keeps its state
                series = threshold_values.get(rule.name, SeriesValues.empty())
                transitions += _threshold(rule, series, mine, threshold_at_us)
        elif absence_at_us is not None and rule.kind == NO_DATA:
            transitions += _no_data(rule, last_seen, mine, absence_at_us)
        elif absence_at_us is not None:
            if silent_rows is None:  # grouped once for every absence rule
                silent_rows = _by_metric(last_seen)
            rows = silent_rows.get(rule.metric)
            transitions += _absence(rule, rows, mine, absence_at_us, lookback_s, expected)
    clock = max(threshold_at_us or 0, absence_at_us or 0)
    for name, leftovers in sorted(by_rule.items()):  # alerts of removed rules
        for alert in leftovers.values():
            gone = AlertRule(name, "", THRESHOLD, 0)
            where = "" if alert.server is None else f" on {alert.server}"
            transitions.append(
                _resolved(gone, alert, max(clock, alert.since_us), None, (None, None), f"{name}{where}: rule removed")
            )
    return transitions


def _resolved(
    rule: AlertRule, alert: ActiveAlert, at_us: int, value: float | None, window: tuple, summary: str
) -> Transition:
    """The transition resolving ``alert`` (its own labels: those it fired with)."""
    return Transition(
        rule,
        alert.server,
        alert.labels,
        RESOLVED,
        alert.state,
        at_us,
        alert.active_since_us,
        value,
        window[0],
        window[1],
        summary,
    )


def _holds(
    rule: AlertRule,
    server: str | None,
    previous: ActiveAlert | None,
    at_us: int,
    *,
    state_for,
    value: float,
    window: tuple[int | None, int | None],
    summary,
    new_since: int | None = None,
) -> list[Transition]:
    """The transitions of a series whose condition holds: none if its alert already is in the state it is due,
    else the new state (after resolving an alert of the rule's former labels). ``state_for(active since)`` gives
    the state due; a new alert is active since ``new_since`` (default: now); ``summary(active since)`` its text."""
    labels = rule.alert_labels(server)
    transitions = []
    if previous is not None and previous.labels != labels:
        where = "" if server is None else f" on {server}"
        transitions.append(
            _resolved(rule, previous, at_us, value, window, f"{rule.name}{where}: rule changed (new labels)")
        )
        previous = None
    since = (at_us if new_since is None else new_since) if previous is None else previous.active_since_us
    state = state_for(since)
    if previous is None or previous.state != state:
        before = INACTIVE if previous is None else previous.state
        transitions.append(
            Transition(rule, server, labels, state, before, at_us, since, value, window[0], window[1], summary(since))
        )
    return transitions


def _threshold(
    rule: AlertRule, series: SeriesValues, mine: dict[str | None, ActiveAlert], at_us: int
) -> list[Transition]:
    holds = OPERATORS[rule.op](series.values, rule.threshold) if len(series.values) else np.zeros(0, bool)
    transitions: list[Transition] = []
    handled = set()
    for i in np.flatnonzero(holds):
        server, value = series.servers[i], float(series.values[i])
        handled.add(server)
        where = "" if server is None else f" on {server}"

        def summary(since: int, server=server, value=value, where=where) -> str:
            held = at_us - since
            lasted = f" for {format_duration(held / _US)}" if rule.for_s and held >= rule.for_s * _US else ""
            return f"{rule.query} {rule.aggregate} = {value:.6g} {rule.op} {rule.threshold:g}{where}{lasted}"

        transitions += _holds(
            rule,
            server,
            mine.get(server),
            at_us,
            state_for=lambda since: FIRING if at_us - since >= rule.for_s * _US else PENDING,
            value=value,
            window=(int(series.starts[i]), int(series.ends[i])),
            summary=summary,
        )
    left = {server: alert for server, alert in mine.items() if server not in handled}
    if left:  # the rule's alerts whose series no longer holds: resolved with the value that cleared it
        index = {server: i for i, server in enumerate(series.servers)}
        for server, alert in sorted(left.items(), key=lambda item: item[0] or ""):
            where = "" if server is None else f" on {server}"
            i = index.get(server)
            if i is None:
                transitions.append(
                    _resolved(
                        rule, alert, at_us, None, (None, None), f"{rule.name}{where}: no value (the series stopped)"
                    )
                )
                continue
            value = float(series.values[i])
            transitions.append(
                _resolved(
                    rule,
                    alert,
                    at_us,
                    value,
                    (int(series.starts[i]), int(series.ends[i])),
                    f"{rule.query} {rule.aggregate} = {value:.6g}, no longer {rule.op} {rule.threshold:g}{where}",
                )
            )
    return transitions


def _no_data(rule: AlertRule, last_seen: pa.Table, mine: dict[str | None, ActiveAlert], at_us: int) -> list[Transition]:
    """The built-in rule's transitions (:func:`~metrics_lake.core.kernels.alert_rules.no_data_rule`): firing once the newest append time in ``last_seen``
    is ``FOR`` or more before ``at_us``; nothing before the first record."""
    if last_seen.num_rows == 0:
        return []
    last = int(pc.max(pc.cast(last_seen.column("last_seen_at"), pa.int64())).as_py())
    silence = (at_us - last) / _US
    when = dt.datetime.fromtimestamp(last / _US, dt.UTC)
    if at_us - last >= rule.for_s * _US:
        return _holds(
            rule,
            None,
            mine.get(None),
            at_us,
            state_for=lambda since: FIRING,
            value=silence,
            window=(last, None),
            summary=lambda since: (
                f"no record at all for {format_duration(silence)} (the last one appended {when:%Y-%m-%d %H:%M:%S}Z)"
            ),
            new_since=last + rule.for_s * _US,
        )
    previous = mine.get(None)
    if previous is None:
        return []
    return [_resolved(rule, previous, at_us, silence, (last, None), f"records again (appended {when:%H:%M:%S}Z)")]


def _by_metric(last_seen: pa.Table) -> dict[str, pa.Table]:
    """``last_seen`` rows of watched series (metric not null) by metric."""
    rows = last_seen.filter(pc.is_valid(last_seen.column("metric")))
    if rows.num_rows == 0:
        return {}
    rows = rows.sort_by([("metric", "ascending")])
    metrics = rows.column("metric").to_numpy(zero_copy_only=False)
    bounds = np.flatnonzero(metrics[1:] != metrics[:-1]) + 1
    starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [len(metrics)]])
    return {str(metrics[a]): rows.slice(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True)}


def _absence(
    rule: AlertRule,
    rows: pa.Table | None,
    mine: dict[str | None, ActiveAlert],
    at_us: int,
    lookback_s: int,
    inventory: pa.Table | None = None,
) -> list[Transition]:
    transitions: list[Transition] = []
    servers, seen_us = np.zeros(0, object), np.zeros(0, np.int64)
    pattern = server_pattern(rule.servers)
    if rows is not None:
        if pattern is not None:
            rows = rows.filter(pc.match_substring_regex(rows.column("server"), pattern))
        servers = rows.column("server").to_numpy(zero_copy_only=False)
        seen_us = pc.cast(rows.column("last_seen_at"), pa.int64()).to_numpy(zero_copy_only=False)
    expected = seen_us >= at_us - lookback_s * _US
    unseen = np.zeros(len(servers), bool)  # held by the inventory, not seen within the lookback
    if inventory is not None and inventory.num_rows:
        if pattern is not None:
            inventory = inventory.filter(pc.match_substring_regex(inventory.column("server"), pattern))
        recent = pa.array(servers[expected].astype(str) if expected.any() else [], pa.string())
        missing = inventory.filter(pc.invert(pc.is_in(inventory.column("server"), value_set=recent)))
        known = ~np.isin(servers, missing.column("server").to_numpy(zero_copy_only=False))
        servers, seen_us = servers[known], seen_us[known]
        servers = np.concatenate([servers, missing.column("server").to_numpy(zero_copy_only=False)])
        seen_us = np.concatenate([seen_us, pc.cast(missing.column("since"), pa.int64()).to_numpy(zero_copy_only=False)])
        unseen = np.concatenate([np.zeros(int(known.sum()), bool), np.ones(missing.num_rows, bool)])
        expected = (seen_us >= at_us - lookback_s * _US) | unseen
    silent = expected & (at_us - seen_us >= rule.for_s * _US)
    handled = set()
    for i in np.flatnonzero(silent):
        server, last = str(servers[i]), int(seen_us[i])
        handled.add(server)
        silence = (at_us - last) / _US
        when = dt.datetime.fromtimestamp(last / _US, dt.UTC)
        transitions += _holds(
            rule,
            server,
            mine.get(server),
            at_us,
            state_for=lambda since: FIRING,
            value=silence,
            window=(last, None),
            summary=lambda since, server=server, silence=silence, when=when, new=bool(unseen[i]): (
                f"no {rule.metric} from {server} since it joined the inventory at {when:%Y-%m-%d %H:%M:%S}Z "
                f"({format_duration(silence)} ago), nor within the lookback"
                if new
                else f"no {rule.metric} from {server} for {format_duration(silence)} "
                f"(last seen {when:%Y-%m-%d %H:%M:%S}Z)"
            ),
            new_since=last + rule.for_s * _US,  # the moment the silence reached FOR
        )
    left = {server: alert for server, alert in mine.items() if server not in handled}
    if left:
        index = {str(server): i for i, server in enumerate(servers)}
        for server, alert in sorted(left.items(), key=lambda item: item[0] or ""):
            i = index.get(server)
            if i is None or not expected[i]:
                why = f"{rule.name} on {server}: silent for over {format_duration(lookback_s)}: no longer expected"
                transitions.append(_resolved(rule, alert, at_us, None, (None, None), why))
                continue
            last = int(seen_us[i])
            seen = dt.datetime.fromtimestamp(last / _US, dt.UTC)
            transitions.append(
                _resolved(
                    rule,
                    alert,
                    at_us,
                    (at_us - last) / _US,
                    (last, None),
                    f"{rule.metric} from {server} again (seen {seen:%H:%M:%S}Z)",
                )
            )
    return transitions


def apply(active: dict[str, ActiveAlert], transitions: pa.Table) -> dict[str, ActiveAlert]:
    """``active`` after the ``alerts`` rows ``transitions`` (in commit order), as a new dict.

    Rows of the nightly evaluation (``source`` other than ``live``) record
    the past and change nothing here.
    """
    result = dict(active)
    if transitions.num_rows == 0:
        return result
    columns = ["rule", "fingerprint", "server", "labels", "state", "active_since", "at", "value", "source"]
    for row in transitions.select(columns).to_pylist():
        if row["source"] != "live":
            continue
        if row["state"] == RESOLVED:
            result.pop(row["fingerprint"], None)
            continue
        result[row["fingerprint"]] = ActiveAlert(
            row["rule"],
            row["fingerprint"],
            row["server"],
            tuple(sorted(row["labels"])),
            row["state"],
            epoch_us(row["active_since"]),
            epoch_us(row["at"]),
            row["value"],
        )
    return result


def epoch_us(moment: dt.datetime) -> int:
    """``moment`` (timezone-aware) in whole epoch microseconds, exactly (no float rounding)."""
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def transitions_table(transitions: list[Transition], recorded_at: dt.datetime) -> pa.Table:
    """``alerts`` rows (schema :data:`~metrics_lake.lake_schemas.tables.ALERTS`) of ``transitions``, in order."""
    if not transitions:
        return ALERTS.empty_table()

    def times(values) -> pa.Array:
        return pa.array(values, pa.int64()).cast(UTC_US)

    at = times([t.at_us for t in transitions])
    table = pa.table(
        {
            "rule": [t.rule.name for t in transitions],
            "kind": [t.rule.kind for t in transitions],
            "server": pa.array([t.server for t in transitions], pa.string()),
            "fingerprint": [t.fingerprint for t in transitions],
            "labels": pa.array([list(t.labels) for t in transitions], ALERTS.field("labels").type),
            "state": [t.state for t in transitions],
            "previous_state": [t.previous_state for t in transitions],
            "at": at,
            "active_since": times([t.active_since_us for t in transitions]),
            "value": pa.array([t.value for t in transitions], pa.float64()),
            "threshold": pa.array(
                [t.rule.threshold if t.rule.kind == THRESHOLD else float(t.rule.for_s) for t in transitions],
                pa.float64(),
            ),
            "window_start": times([t.window_start_us for t in transitions]),
            "window_end": times([t.window_end_us for t in transitions]),
            "summary": [t.summary for t in transitions],
            "rule_text": [t.rule.text for t in transitions],
            "rule_revision": pa.array([t.rule.revision for t in transitions], pa.int64()),
            "source": [t.source for t in transitions],
            "id": [t.id for t in transitions],
            "seq": pa.array(range(len(transitions)), pa.int32()),
            "recorded_at": pa.array([recorded_at] * len(transitions), UTC_US),
            "event_date": utc_dates(at),
        }
    )
    return table.select(ALERTS.names).cast(ALERTS)
