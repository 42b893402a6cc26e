"""Alert rules: the grammar and its parser (their evaluation: :mod:`metrics_lake.core.kernels.alert_evaluation`).

Two kinds of rule, managed in the config store beside the stored queries
(:mod:`metrics_lake.core.config_store`)::

    <query>.<aggregate> <op> <number> [FOR <duration>] [LABELS k=v[,k=v...]]
    ABSENT <metric> [FROM <servers>] FOR <duration> [LABELS k=v[,k=v...]]

- **Threshold** rules compare a stored query's aggregate (its label in
  ``query_results``: ``p99``, ``p99.9``, ``avg``, ``count``...) with a number;
  ``<op>`` is one of ``> >= < <= == !=``. A ``PER SERVER`` query gives one
  alert per server (label ``server``); any other query one fleet-wide alert
  (its fleet row).
- **Absence** rules ("missing data is a signal"): a server that sent
  ``<metric>`` within the lookback (a day by default) and has sent nothing
  for ``<duration>`` fires for that server, resolved when data returns.
  ``<servers>`` as in stored queries: names and shell globs, ``*`` for all.
- ``<duration>``: ``<n>s``, ``<n>m``, ``<n>h`` or ``<n>d``; for threshold
  rules at most a day (omitted: 0, fire at once), for absence rules at least
  a second and shorter than the lookback. ``LABELS`` are added to every alert
  of the rule; names follow Prometheus (``[a-zA-Z_][a-zA-Z0-9_]*``), values
  are free text without ``,`` or spaces; ``alertname`` and ``server`` are set
  by the lake.

Keywords are case-insensitive. :func:`parse_rule` raises
:class:`~metrics_lake.lake_schemas.errors.AlertRuleError` naming the rule and
the clause.

**LakeNoData** (:func:`no_data_rule`): a built-in rule evaluated with the
absence rules, firing when the lake received no record at all for
``LAKE_NODATA_SECONDS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.lake_schemas.contract import METRIC_NAME
from metrics_lake.lake_schemas.errors import AlertRuleError

__all__ = [
    "ABSENCE",
    "DAY_S",
    "NO_DATA",
    "NO_DATA_RULE",
    "OPERATORS",
    "THRESHOLD",
    "AlertRule",
    "check_against_queries",
    "format_duration",
    "no_data_rule",
    "parse_rule",
]

THRESHOLD, ABSENCE, NO_DATA = "threshold", "absence", "nodata"
#: The built-in rule that fires when the lake received no record at all (:func:`no_data_rule`).
NO_DATA_RULE = "LakeNoData"
#: The comparison operators of threshold rules, as numpy ufuncs.
OPERATORS = {
    ">": np.greater,
    ">=": np.greater_equal,
    "<": np.less,
    "<=": np.less_equal,
    "==": np.equal,
    "!=": np.not_equal,
}
DAY_S = 86_400
_US = 1_000_000
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY_S}
_NAME = re.compile(r"[a-z0-9_]{1,64}")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_LABELS = {"alertname", "server"}
_TAIL = r"(?:\s+FOR\s+(?P<for>\S+))?(?:\s+LABELS\s+(?P<labels>\S+))?\s*$"
_THRESHOLD = re.compile(
    r"^\s*(?P<query>[^\s.]+)\.(?P<aggregate>\S+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<number>\S+)" + _TAIL,
    re.IGNORECASE,
)
_ABSENCE = re.compile(r"^\s*ABSENT\s+(?P<metric>\S+)(?:\s+FROM\s+(?P<servers>\S+))?" + _TAIL, re.IGNORECASE)
_AGGREGATE = re.compile(r"count|sum|min|max|avg|p[0-9]+(?:\.[0-9]+)?")


@dataclass(frozen=True)
class AlertRule:
    """A parsed alert rule (module docstring); ``for_s`` in seconds, ``labels`` sorted ``(name, value)`` pairs.

    Threshold rules set ``query``, ``aggregate``, ``op`` and ``threshold``;
    absence rules ``metric`` and ``servers``. ``revision``: the config store
    version at which the text was defined (0 for a file's).
    """

    name: str
    text: str
    kind: str
    for_s: int
    labels: tuple[tuple[str, str], ...] = ()
    query: str | None = None
    aggregate: str | None = None
    op: str | None = None
    threshold: float | None = None
    metric: str | None = None
    servers: tuple[str, ...] = ("*",)
    description: str = ""
    revision: int = 0

    def alert_labels(self, server: str | None) -> tuple[tuple[str, str], ...]:
        """The labels of this rule's alert for ``server`` (None: fleet-wide), sorted by name."""
        labels = dict(self.labels)
        labels["alertname"] = self.name
        if server is not None:
            labels["server"] = server
        return tuple(sorted(labels.items()))

    def condition(self) -> str:
        """The rule's condition in words, for summaries: ``fleet_rpc_latency_5m p99 > 250``."""
        if self.kind == ABSENCE:
            return f"no {self.metric} for {format_duration(self.for_s)}"
        return f"{self.query} {self.aggregate} {self.op} {self.threshold:g}"


def format_duration(seconds: float) -> str:
    """``2m 5s``, ``1h``, ``45s``: a duration for people (whole seconds)."""
    seconds = int(round(seconds))
    parts = []
    for unit, size in (("d", DAY_S), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return " ".join(parts)


def no_data_rule(seconds: int, topic: str) -> AlertRule:
    """The built-in ``LakeNoData`` rule: fires when no record at all was appended to ``topic`` for ``seconds``
    (``LAKE_NODATA_SECONDS``), judged on the absence rules' clock; labels ``severity=critical`` and ``topic``.

    A whole fleet, the network in front of it or the gateway going silent
    is one alert (Prometheus's ``up == 0`` for the whole scrape pool); an
    Alertmanager ``inhibit_rules`` entry muting per-server alerts while it
    fires makes such an outage page once (docs/alerts.md).
    """
    return AlertRule(
        NO_DATA_RULE,
        f"NO DATA FOR {format_duration(seconds)}",
        NO_DATA,
        seconds,
        (("severity", "critical"), ("topic", topic)),
        description=f"No record reached topic {topic!r}: agents, the network or the gateway are down.",
    )


def _seconds(name: str, text: str, *, low: int, high: int, limit: str) -> int:
    match = re.fullmatch(r"([0-9]+)([smhd])", text.lower())
    if not match:
        raise AlertRuleError(f"alert rule {name!r}: FOR {text!r} is not <n>s, <n>m, <n>h or <n>d")
    seconds = int(match[1]) * _UNITS[match[2]]
    if not low <= seconds <= high:
        raise AlertRuleError(f"alert rule {name!r}: FOR {text!r} must be {limit}")
    return seconds


def _labels(name: str, text: str | None) -> tuple[tuple[str, str], ...]:
    if not text:
        return ()
    labels = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_NAME.fullmatch(key) or not value or "=" in value:
            raise AlertRuleError(f"alert rule {name!r}: LABELS item {item!r} is not name=value")
        if key in _RESERVED_LABELS:
            raise AlertRuleError(f"alert rule {name!r}: LABELS may not set {key!r}; the lake sets it")
        if key in labels:
            raise AlertRuleError(f"alert rule {name!r}: LABELS names {key!r} twice")
        labels[key] = value
    return tuple(sorted(labels.items()))


def parse_rule(name: str, text: str, description: str = "", *, absence_lookback_s: int = DAY_S) -> AlertRule:
    """Parse one rule text (grammar in the module docstring); raises :class:`AlertRuleError` naming the clause.

    ``absence_lookback_s``: how long a silent server stays expected; an
    absence rule's ``FOR`` must be shorter. Whether a threshold rule's query
    exists and computes its aggregate is checked against the config store
    (:func:`check_against_queries`), not here.
    """
    if not _NAME.fullmatch(name):
        raise AlertRuleError(f"alert rule name {name!r} must match [a-z0-9_]{{1,64}}")
    absence = _ABSENCE.match(text)
    if absence:
        metric = absence["metric"]
        if not METRIC_NAME.fullmatch(metric):
            raise AlertRuleError(f"alert rule {name!r}: ABSENT {metric!r} is not a metric name ([a-z0-9_.]{{1,128}})")
        if absence["for"] is None:
            raise AlertRuleError(f"alert rule {name!r}: an ABSENT rule needs FOR <duration>: how long a silence fires")
        lookback = format_duration(absence_lookback_s)
        for_s = _seconds(
            name, absence["for"], low=1, high=absence_lookback_s - 1, limit=f"at least 1s and shorter than {lookback}"
        )
        servers = tuple(s for s in (absence["servers"] or "*").split(",") if s)
        return AlertRule(
            name,
            " ".join(text.split()),
            ABSENCE,
            for_s,
            _labels(name, absence["labels"]),
            metric=metric,
            servers=servers or ("*",),
            description=description,
        )
    if text.strip().upper().startswith("ABSENT"):
        raise AlertRuleError(
            f"alert rule {name!r}: expected 'ABSENT <metric> [FROM <servers>] FOR <duration> [LABELS k=v,...]', "
            f"got {text!r}"
        )
    threshold = _THRESHOLD.match(text)
    if not threshold:
        raise AlertRuleError(
            f"alert rule {name!r}: expected '<query>.<aggregate> <op> <number> [FOR <duration>] [LABELS k=v,...]' "
            f"or 'ABSENT <metric> ...', got {text!r}"
        )
    if not _NAME.fullmatch(threshold["query"]):
        raise AlertRuleError(f"alert rule {name!r}: {threshold['query']!r} is not a stored query name")
    aggregate = threshold["aggregate"].lower()
    if not _AGGREGATE.fullmatch(aggregate):
        raise AlertRuleError(
            f"alert rule {name!r}: aggregate {threshold['aggregate']!r} is not count, sum, min, max, avg or p<n>"
        )
    try:
        number = float(threshold["number"])
    except ValueError:
        raise AlertRuleError(f"alert rule {name!r}: {threshold['number']!r} is not a number") from None
    if not np.isfinite(number):
        raise AlertRuleError(f"alert rule {name!r}: the threshold {threshold['number']!r} must be finite")
    for_s = 0
    if threshold["for"] is not None:
        for_s = _seconds(name, threshold["for"], low=0, high=DAY_S, limit="at most 1d")
    return AlertRule(
        name,
        " ".join(text.split()),
        THRESHOLD,
        for_s,
        _labels(name, threshold["labels"]),
        query=threshold["query"],
        aggregate=aggregate,
        op=threshold["op"],
        threshold=number,
        description=description,
    )


def check_against_queries(rule: AlertRule, queries: dict[str, StoredQuery]) -> None:
    """Raise :class:`AlertRuleError` if a threshold rule names a stored query that is not in ``queries``, that is
    grouped ``BY`` labels (an alert's series is a server or the fleet) or that does not compute its aggregate
    (absence rules need none)."""
    if rule.kind != THRESHOLD:
        return
    query = queries.get(rule.query or "")
    if query is None:
        known = ", ".join(sorted(queries)) or "none"
        raise AlertRuleError(f"alert rule {rule.name!r}: unknown stored query {rule.query!r} (known: {known})")
    if query.group_by:
        raise AlertRuleError(
            f"alert rule {rule.name!r}: stored query {rule.query!r} is grouped BY {','.join(query.group_by)}; "
            "alert rules watch a fleet-wide or PER SERVER query (select the group in its FROM instead)"
        )
    labels = [a.label for a in query.aggregates]
    if rule.aggregate not in labels:
        raise AlertRuleError(
            f"alert rule {rule.name!r}: stored query {rule.query!r} computes {', '.join(labels)}, "
            f"not {rule.aggregate!r}"
        )
