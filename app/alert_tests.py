"""``lake alerts test FILE.yaml``: unit tests of alert rules, the lake's ``promtool test rules``.

A test file (YAML) holds the stored queries and alert rules under test, as
``lake queries add`` and ``lake alerts add`` take them, and test groups, each
with input series and the alerts expected at given evaluation times::

    evaluation_interval: 1m            # optional; default LAKE_ALERT_EVALUATION_INTERVAL_SECONDS
    queries:
      cpu_max: FROM * SELECT host.cpu.utilization WINDOW 1m COMPUTE max PER SERVER
    rules:
      hot: cpu_max.max > 100 FOR 1m LABELS severity=page
      quiet: ABSENT host.cpu.utilization FROM web-* FOR 2m
    tests:
      - name: web-1 runs hot       # optional
        interval: 1m               # between two values of a series; default: evaluation_interval
        input_series:
          - server: web-1
            metric: host.cpu.utilization
            values: "50 50 150x5 _x3"
        alert_rule_test:
          - eval_time: 4m
            alertname: hot
            exp_alerts:
              - labels: {server: web-1, severity: page}
                state: firing      # optional: firing (default) or pending

``values`` use Prometheus's expanding notation: ``a`` one value, ``_`` a
missing one (no event), ``a+bxn`` / ``a-bxn`` the n+1 values ``a, a±b, …,
a±n·b``, ``axn`` n+1 times ``a``, ``_xn`` n missing values. The i-th value is
an event at ``i × interval`` after the group's start (time 0, taken as
2026-01-01T00:00:00Z). ``exp_alerts`` lists every alert of ``alertname``
active at ``eval_time`` (an empty list: none); ``labels`` are the alert's
labels other than ``alertname``.

How it runs: each group gets a lake of its own in a temporary folder. Its
series go to the log in one append, with one more event at the end of the
input (server ``lake-alerts-test``, metric ``lake.alerts_test.clock``, which
no rule of the file may use) so that the event clock reaches the input's
end; one speed-layer batch (the same code as ``lake stream``:
:func:`~metrics_lake.core.speed.micro_batch.run_batch_in_process`) then
evaluates the threshold rules at every evaluation step, and since the
``alerts`` table does not depend on batching, one batch is what a live
stream would have recorded. The state at ``eval_time`` is what the
transitions up to it leave. Absence rules and ``LakeNoData`` are about
append times, which a file cannot set: they are evaluated by the same
kernel (:func:`~metrics_lake.core.kernels.alert_evaluation.evaluate`) at every
step, with each series' samples taken as appended at their event times.

Outcome (:func:`run_test_file`): per expectation a pass or a diff; the CLI
exits 1 when any differs. A file that is not such a document (unknown key,
unknown rule, malformed notation, ``eval_time`` outside the input) raises
:class:`~metrics_lake.lake_schemas.errors.InputError` naming the file, line
and field.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from metrics_lake.core.kernels.alert_evaluation import ActiveAlert, apply, epoch_us, evaluate
from metrics_lake.core.kernels.alert_rules import (
    ABSENCE,
    DAY_S,
    NO_DATA_RULE,
    THRESHOLD,
    AlertRule,
    check_against_queries,
    no_data_rule,
    parse_rule,
)
from metrics_lake.core.kernels.alert_steps import advance, evaluation_steps
from metrics_lake.core.kernels.stored_queries import StoredQuery, parse_query
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.alerting import AlertOptions, forget_alert_logs
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.delta import table_dataset
from metrics_lake.lake_schemas.errors import InputError, LakeError
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.lake_schemas.types import UTC_US

__all__ = ["CLOCK_METRIC", "CLOCK_SERVER", "Mismatch", "TestReport", "expand_values", "run_test_file"]

#: Time 0 of every test group (a fixed, recent day: retention and clock checks treat it as any other).
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
#: The event that moves the event clock to the end of a group's input.
CLOCK_SERVER, CLOCK_METRIC = "lake-alerts-test", "lake.alerts_test.clock"
TOPIC = "metrics"
_US = 1_000_000
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": DAY_S}
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_EXPANDING = re.compile(rf"(?P<a>{_NUMBER})(?:(?P<op>[-+])(?P<b>{_NUMBER}))?x(?P<n>\d+)")
_MISSING_RUN = re.compile(r"_x(?P<n>\d+)")
_STATES = ("firing", "pending")


@dataclass(frozen=True)
class Mismatch:
    """An expectation that did not hold: where it is and both alert lists (``(labels, state)`` pairs, sorted)."""

    where: str
    expected: list[tuple[tuple[tuple[str, str], ...], str]]
    got: list[tuple[tuple[tuple[str, str], ...], str]]


@dataclass
class TestReport:
    """What a test file gave: expectations checked and those that did not hold."""

    file: str
    checked: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)


class _Loader(yaml.SafeLoader):
    """A YAML loader whose mappings remember their line (key ``__line__``), for messages that point at it."""


def _mapping_with_line(loader: _Loader, node: yaml.MappingNode) -> dict:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    mapping["__lines__"] = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
    return mapping


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_line)


class _File:
    """The file's name, for messages: ``FILE:LINE: field: what is wrong``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, node: dict | None, where: str, what: str) -> InputError:
        """The error for field ``where`` (dotted; its last part a key of ``node``), at that key's line if known."""
        line = None
        if isinstance(node, dict):
            line = node.get("__lines__", {}).get(where.rsplit(".", 1)[-1], node.get("__line__"))
        return InputError(f"{self.path}{'' if line is None else f':{line}'}: {where}: {what}")


def _duration_s(text, source: _File, node: dict, where: str) -> float:
    """Seconds of a Prometheus duration (``90s``, ``1m``, ``1h30m``) or a bare number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool) and text >= 0:
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        raise source.error(node, where, f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def expand_values(text: str) -> list[float | None]:
    """Prometheus's expanding notation (module docstring) as a list of values, None for a missing one.

    Raises :class:`InputError` naming the first token that is not notation.
    """
    values: list[float | None] = []
    for token in str(text).split():
        if token in ("_", "stale"):
            values.append(None)
        elif match := _MISSING_RUN.fullmatch(token):
            values += [None] * int(match["n"])
        elif match := _EXPANDING.fullmatch(token):
            a, n = float(match["a"]), int(match["n"])
            b = float(match["b"] or 0) * (-1 if match["op"] == "-" else 1)
            values += [a + i * b for i in range(n + 1)]
        elif re.fullmatch(_NUMBER, token):
            values.append(float(token))
        else:
            raise InputError(f"{token!r} is not a number, _, a+bxn, a-bxn, axn or _xn")
    return values


def _read(path: Path) -> dict:
    source = _File(path)
    try:
        doc = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{line}: not YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(doc, dict):
        raise source.error(None, "document", "a test file is a mapping with rules and tests")
    known = {"evaluation_interval", "queries", "rules", "tests", "__line__", "__lines__"}
    for key in doc:
        if key not in known:
            raise source.error(doc, str(key), "unknown key (evaluation_interval, queries, rules, tests)")
    return doc


@dataclass
class _Definitions:
    queries: dict[str, StoredQuery]
    rules: list[AlertRule]
    interval_s: int


def _definitions(doc: dict, source: _File, default_interval_s: int) -> _Definitions:
    queries: dict[str, StoredQuery] = {}
    for name, text in _named(doc, "queries", source):
        try:
            queries[name] = parse_query(name, str(text))
        except LakeError as exc:
            raise source.error(doc.get("queries"), f"queries.{name}", str(exc)) from None
    rules: list[AlertRule] = []
    for name, text in _named(doc, "rules", source):
        try:
            rule = parse_rule(name, str(text))
            check_against_queries(rule, queries)
        except LakeError as exc:
            raise source.error(doc.get("rules"), f"rules.{name}", str(exc)) from None
        if rule.kind == ABSENCE and rule.metric == CLOCK_METRIC:
            raise source.error(doc.get("rules"), f"rules.{name}", f"{CLOCK_METRIC} is the test harness's own metric")
        rules.append(rule)
    if not rules:
        raise source.error(doc, "rules", "no rule to test")
    interval = doc.get("evaluation_interval")
    interval_s = default_interval_s if interval is None else _duration_s(interval, source, doc, "evaluation_interval")
    if interval_s < 1 or interval_s != int(interval_s):
        raise source.error(doc, "evaluation_interval", "must be a whole number of seconds, at least 1s")
    return _Definitions(queries, rules, int(interval_s))


def _named(doc: dict, key: str, source: _File) -> list[tuple[str, object]]:
    items = doc.get(key) or {}
    if not isinstance(items, dict):
        raise source.error(doc, key, "a mapping of name: text")
    return [(str(name), text) for name, text in items.items() if name not in ("__line__", "__lines__")]


@dataclass
class _Series:
    server: str
    metric: str
    values: list[float | None]


def _group_series(group: dict, source: _File, where: str) -> list[_Series]:
    series = group.get("input_series")
    if not isinstance(series, list) or not series:
        raise source.error(group, f"{where}.input_series", "a list of {server, metric, values}")
    out = []
    for i, item in enumerate(series):
        at = f"{where}.input_series[{i}]"
        if not isinstance(item, dict):
            raise source.error(group, at, "a mapping with server, metric and values")
        for key in ("server", "metric", "values"):
            if key not in item:
                raise source.error(item, f"{at}.{key}", "missing")
        if item["server"] == CLOCK_SERVER:
            raise source.error(item, f"{at}.server", f"{CLOCK_SERVER} is the test harness's own server")
        try:
            values = expand_values(item["values"])
        except InputError as exc:
            raise source.error(item, f"{at}.values", str(exc)) from None
        if not values:
            raise source.error(item, f"{at}.values", "no value")
        out.append(_Series(str(item["server"]), str(item["metric"]), values))
    return out


@dataclass
class _Expectation:
    where: str
    node: dict
    eval_us: int
    alertname: str
    alerts: list[tuple[tuple[tuple[str, str], ...], str]]


def _expectations(group: dict, source: _File, where: str, rules: list[AlertRule], end_us: int) -> list[_Expectation]:
    cases = group.get("alert_rule_test") or []
    if not isinstance(cases, list):
        raise source.error(group, f"{where}.alert_rule_test", "a list of {eval_time, alertname, exp_alerts}")
    names = {r.name for r in rules} | {NO_DATA_RULE}
    out = []
    for i, case in enumerate(cases):
        at = f"{where}.alert_rule_test[{i}]"
        if not isinstance(case, dict) or "eval_time" not in case or "alertname" not in case:
            raise source.error(case if isinstance(case, dict) else group, at, "needs eval_time and alertname")
        eval_us = int(_duration_s(case["eval_time"], source, case, f"{at}.eval_time") * _US)
        if eval_us > end_us:
            raise source.error(
                case,
                f"{at}.eval_time",
                f"{case['eval_time']} is after the input's last value ({end_us / _US:g}s): nothing is known there",
            )
        name = str(case["alertname"])
        if name not in names:
            raise source.error(case, f"{at}.alertname", f"unknown rule {name!r} (rules: {', '.join(sorted(names))})")
        alerts = []
        for j, alert in enumerate(case.get("exp_alerts") or []):
            if not isinstance(alert, dict):
                raise source.error(case, f"{at}.exp_alerts[{j}]", "a mapping with labels and state")
            labels = alert.get("labels") or {}
            if not isinstance(labels, dict):
                raise source.error(alert, f"{at}.exp_alerts[{j}].labels", "a mapping of label: value")
            state = str(alert.get("state", "firing"))
            if state not in _STATES:
                raise source.error(alert, f"{at}.exp_alerts[{j}].state", f"{state!r} is not firing or pending")
            pairs = tuple(sorted((str(k), str(v)) for k, v in labels.items() if k not in ("__line__", "__lines__")))
            alerts.append((pairs, state))
        out.append(_Expectation(f"{at} (eval_time {case['eval_time']}, {name})", case, eval_us, name, sorted(alerts)))
    return out


def _events(series: list[_Series], interval_s: float, start_us: int) -> tuple[list[dict], int]:
    """The series as events (epoch ms), and the input's end (epoch µs)."""
    events = []
    last = max(len(s.values) for s in series) - 1
    for s in series:
        for i, value in enumerate(s.values):
            if value is not None:
                ts_ms = (start_us + int(i * interval_s * _US)) // 1000
                events.append({"ts": ts_ms, "server": s.server, "metric": s.metric, "value": value})
    end_us = start_us + int(last * interval_s * _US)
    return sorted(events, key=lambda e: e["ts"]), end_us


@contextlib.contextmanager
def _quiet_speed_layer() -> Iterator[None]:
    """The speed layer's own ``alerts: …`` log lines would read as the test's output: warnings only, meanwhile."""
    speed_log = logging.getLogger("metrics_lake.core.speed")
    level = speed_log.level
    speed_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        speed_log.setLevel(level)


def _threshold_transitions(events: list[dict], end_us: int, defs: _Definitions) -> pa.Table:
    """The ``alerts`` rows the speed layer records for the threshold rules over ``events``, in commit order."""
    rules = [r for r in defs.rules if r.kind == THRESHOLD]
    with _quiet_speed_layer(), tempfile.TemporaryDirectory(prefix="lake-alerts-test-") as root:
        store = LocalStore(root)
        clock = {"ts": end_us // 1000, "server": CLOCK_SERVER, "metric": CLOCK_METRIC, "value": 0.0}
        with Producer(SegmentLog(store), TOPIC, partitions=1) as producer:
            producer.send_payloads([*events, clock])
        forget_alert_logs()
        run_batch_in_process(
            store,
            TOPIC,
            {0: len(events) + 1},
            watermark_seconds=60,
            clock_skew_seconds=DAY_S * 3650,  # the input's times are not the wall clock's
            queries=list(defs.queries.values()),
            rules=rules,
            alerting=AlertOptions(evaluation_interval_s=defs.interval_s, absence_lookback_s=DAY_S * 3650),
        )
        rows = table_dataset(store, Table.ALERTS).to_table()
        forget_alert_logs()
    rows = rows.filter(pc.is_in(rows.column("rule"), pa.array([r.name for r in rules], pa.string())))
    return rows.sort_by([("recorded_at", "ascending"), ("seq", "ascending")])


def _absence_states(
    series: list[_Series], defs: _Definitions, start_us: int, end_us: int, interval_s: float, nodata_s: int
) -> list[tuple[int, dict[str, ActiveAlert]]]:
    """Per evaluation step (epoch µs), the absence and ``LakeNoData`` alerts active after it."""
    rules = [r for r in defs.rules if r.kind == ABSENCE] + [no_data_rule(nodata_s, TOPIC)]
    samples = sorted(
        (start_us + int(i * interval_s * _US), s.server, s.metric)
        for s in series
        for i, v in enumerate(s.values)
        if v is not None
    )
    active: dict[str, ActiveAlert] = {}
    states: list[tuple[int, dict[str, ActiveAlert]]] = []
    watched = {r.metric for r in rules if r.kind == ABSENCE}
    for step in evaluation_steps(None, start_us, end_us, defs.interval_s):
        newest: dict[tuple[str, str | None], int] = {}
        for at, server, metric in samples:
            if at > step:
                break
            newest[(server, None)] = at
            if metric in watched:
                newest[(server, metric)] = at
        if not newest:
            states.append((int(step), dict(active)))
            continue
        seen = pa.table(
            {
                "server": pa.array([k[0] for k in newest], pa.string()),
                "metric": pa.array([k[1] for k in newest], pa.string()),
                "last_seen_at": pa.array(list(newest.values()), pa.int64()).cast(UTC_US),
            }
        )
        moves = evaluate(
            rules,
            active,
            threshold_at_us=None,
            threshold_values={},
            absence_at_us=int(step),
            last_seen=seen,
            lookback_s=DAY_S,
        )
        active = advance(active, moves)
        states.append((int(step), dict(active)))
    return states


def _alerts_of(active: dict[str, ActiveAlert], name: str) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    return sorted(
        (tuple((k, v) for k, v in a.labels if k != "alertname"), a.state) for a in active.values() if a.rule == name
    )


def run_test_file(path: Path, *, default_interval_s: int = 60, nodata_s: int = 60) -> TestReport:
    """Run every test group of the file at ``path`` (module docstring); raises :class:`InputError` for a bad file.

    ``default_interval_s``: the evaluation interval when the file sets none; ``nodata_s``: ``LakeNoData``'s
    silence (``LAKE_ALERT_EVALUATION_INTERVAL_SECONDS`` and ``LAKE_NODATA_SECONDS`` of the CLI's settings).
    """
    source = _File(path)
    doc = _read(path)
    defs = _definitions(doc, source, default_interval_s)
    groups = doc.get("tests")
    if not isinstance(groups, list) or not groups:
        raise source.error(doc, "tests", "a list of test groups with input_series and alert_rule_test")
    report = TestReport(str(path))
    start_us = epoch_us(START)
    for g, group in enumerate(groups):
        where = f"tests[{g}]" + (f" ({group['name']})" if isinstance(group, dict) and group.get("name") else "")
        if not isinstance(group, dict):
            raise source.error(doc, where, "a mapping with input_series and alert_rule_test")
        interval = group.get("interval")
        interval_s = defs.interval_s if interval is None else _duration_s(interval, source, group, f"{where}.interval")
        if interval_s <= 0:
            raise source.error(group, f"{where}.interval", "must be longer than 0s")
        series = _group_series(group, source, where)
        events, end_us = _events(series, interval_s, start_us)
        cases = _expectations(group, source, where, defs.rules, end_us - start_us)
        for case in cases:
            case.eval_us += start_us
        threshold_rows = _threshold_transitions(events, end_us, defs)
        absence = _absence_states(series, defs, start_us, end_us, interval_s, nodata_s)
        for case in cases:
            upto = threshold_rows.filter(pc.less_equal(pc.cast(threshold_rows.column("at"), pa.int64()), case.eval_us))
            active = apply({}, upto)
            before = [state for at, state in absence if at <= case.eval_us]
            if before:
                active = {**active, **before[-1]}
            got = _alerts_of(active, case.alertname)
            report.checked += 1
            if got != case.alerts:
                report.mismatches.append(Mismatch(case.where, case.alerts, got))
    return report
