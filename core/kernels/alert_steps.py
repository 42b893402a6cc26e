"""Threshold rules evaluated at evaluation steps, as Prometheus evaluates rule groups every ``evaluation_interval``.

A step is a multiple of the evaluation interval (epoch-aligned, like
Prometheus's group offsets with no jitter). Between two micro-batches the
speed layer evaluates every step from the one after the previous evaluation
up to its event clock, in order (:func:`evaluation_steps`,
:func:`evaluate_steps`); the ``FOR`` state machine advances per step and each
transition carries its step as its time. At step ``T`` a series' value is
that of its newest query window ending at or before ``T`` and after
``T - slide`` (:class:`SeriesTimeline`): a window is only read once it has
ended, so with events arriving in time order it is final, and what a step
sees does not depend on how the log was cut into batches. That makes the
``alerts`` table a function of the log and the rules: one batch, one batch
per event, a replay or a lost checkpoint give the same transitions.

A series without such a window has no value at ``T`` (Prometheus's
staleness): its condition does not hold.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.alert_evaluation import (
    RESOLVED,
    ActiveAlert,
    SeriesValues,
    Transition,
    evaluate,
    series_rows,
)
from metrics_lake.core.kernels.alert_rules import OPERATORS, THRESHOLD, AlertRule
from metrics_lake.core.kernels.stored_queries import StoredQuery

__all__ = ["SeriesTimeline", "advance", "evaluate_steps", "evaluation_steps"]

_US = 1_000_000


def evaluation_steps(
    previous_us: int | None, first_us: int | None, clock_us: int | None, interval_s: int
) -> np.ndarray:
    """The steps to evaluate (epoch µs, ascending int64): multiples of ``interval_s`` seconds after ``previous_us``
    (the last step evaluated; None: none yet, then from the first multiple at or after ``first_us``) up to and
    including ``clock_us``. Empty when ``clock_us`` is None or no step is due."""
    if clock_us is None or interval_s <= 0:
        return np.zeros(0, np.int64)
    step = interval_s * _US
    if previous_us is not None:
        start = (previous_us // step + 1) * step
    elif first_us is not None:
        start = -(-first_us // step) * step
    else:
        start = clock_us // step * step
    if start > clock_us:
        return np.zeros(0, np.int64)
    return np.arange(start, clock_us + 1, step, dtype=np.int64)


class SeriesTimeline:
    """One threshold rule's series over many windows: each step's values without re-scanning the rows.

    ``rows``: ``query_results`` rows (columns ``query, server, window_start,
    window_end, aggregate, value``; other queries' rows are ignored) of
    ``query``; ``aggregate``: the label the rule compares. :meth:`at` is
    the module docstring's value at a step.
    """

    def __init__(self, rows: pa.Table, query: StoredQuery, aggregate: str) -> None:
        rows = series_rows(rows, query, aggregate)
        self.per_server = query.per_server
        self.slide_us = query.slide_s * _US
        ends = pc.cast(rows.column("window_end"), pa.int64()).to_numpy(zero_copy_only=False)
        order = np.argsort(ends, kind="stable")
        self.ends = ends[order]
        self.starts = pc.cast(rows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)[order]
        self.values = rows.column("value").to_numpy(zero_copy_only=False).astype(np.float64)[order]
        encoded = pc.dictionary_encode(pc.fill_null(rows.column("server"), "")).combine_chunks()
        self.codes = encoded.indices.to_numpy(zero_copy_only=False)[order]
        self.names = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
        self._range_at: int | None = None
        self._range: tuple[float, float] | None = None

    def may_hold(self, rule: AlertRule, at_us: int) -> bool:
        """Whether any window step ``at_us`` may read meets ``rule``'s condition: a quick test against the window
        values' range in that step (cached per step), exact for every operator but ``==`` and ``!=``, where it only
        says whether there is any window at all."""
        if self._range_at != at_us:
            lo, hi = self._step_rows(at_us)
            values = self.values[lo:hi]
            self._range = (float(values.min()), float(values.max())) if len(values) else None
            self._range_at = at_us
        if self._range is None:
            return False
        low, high = self._range
        if rule.op in (">", ">="):
            return bool(OPERATORS[rule.op](high, rule.threshold))
        if rule.op in ("<", "<="):
            return bool(OPERATORS[rule.op](low, rule.threshold))
        return True

    def _step_rows(self, at_us: int) -> tuple[int, int]:
        """The rows (``lo:hi``, in end order) of the windows step ``at_us`` may read: ending in ``(at_us - slide, at_us]``."""
        lo = int(np.searchsorted(self.ends, at_us - self.slide_us, side="right"))
        return lo, int(np.searchsorted(self.ends, at_us, side="right"))

    def at(self, at_us: int) -> SeriesValues:
        """Each series' value at step ``at_us`` (epoch µs): its newest window ending in ``(at_us - slide, at_us]``."""
        lo, hi = self._step_rows(at_us)
        if lo >= hi:
            return SeriesValues.empty()
        codes = self.codes[lo:hi]
        # The rows are in end order: a series' last row in the slice is its newest window.
        _, last_reversed = np.unique(codes[::-1], return_index=True)
        chosen = lo + (hi - lo - 1 - last_reversed)
        servers = self.names[self.codes[chosen]]
        return SeriesValues(
            [s or None for s in servers] if self.per_server else [None] * len(chosen),
            self.values[chosen],
            self.starts[chosen],
            self.ends[chosen],
        )


def advance(active: dict[str, ActiveAlert], transitions: list[Transition]) -> dict[str, ActiveAlert]:
    """``active`` after ``transitions`` (in order), as a new dict: what
    :func:`~metrics_lake.core.kernels.alert_evaluation.apply` makes of their ``alerts`` rows."""
    result = dict(active)
    for t in transitions:
        if t.state == RESOLVED:
            result.pop(t.fingerprint, None)
        else:
            result[t.fingerprint] = ActiveAlert(
                t.rule.name, t.fingerprint, t.server, t.labels, t.state, t.active_since_us, t.at_us, t.value
            )
    return result


def evaluate_steps(
    rules: list[AlertRule],
    active: dict[str, ActiveAlert],
    steps: np.ndarray,
    timelines: dict[str, SeriesTimeline],
) -> tuple[list[Transition], dict[str, ActiveAlert]]:
    """Evaluate the threshold ``rules`` at each of ``steps`` in order; returns the transitions and the active alerts
    after the last step.

    ``timelines``: per threshold rule name, its series
    (:class:`SeriesTimeline`); a rule without one has no series (its alerts
    resolve). Absence rules are not evaluated here (they run on the append
    clock), but alerts of rules no longer in ``rules`` are resolved at the
    first step, as :func:`~metrics_lake.core.kernels.alert_evaluation.evaluate` does.
    A rule with no active alert whose condition holds for no window of a
    step is skipped at that step (nothing can change for it): over a
    backlog most rules are quiet most of the time.
    """
    transitions: list[Transition] = []
    threshold = [r for r in rules if r.kind == THRESHOLD]
    others = [r for r in rules if r.kind != THRESHOLD]
    for i, step in enumerate(steps):
        at = int(step)
        seen: dict[int, SeriesValues] = {}
        values: dict[str, SeriesValues] = {}
        with_alerts = {a.rule for a in active.values()}
        due = []
        for rule in threshold:
            timeline = timelines.get(rule.name)
            if timeline is None:
                due.append(rule)
                continue
            if rule.name not in with_alerts and not timeline.may_hold(rule, at):
                continue
            due.append(rule)
            key = id(timeline)
            if key not in seen:
                seen[key] = timeline.at(at)
            values[rule.name] = seen[key]
        # The first step also resolves the alerts of removed rules: it gets every rule.
        chosen = rules if i == 0 else [*due, *others]
        done = evaluate(
            chosen, active, threshold_at_us=at, threshold_values=values, absence_at_us=None, last_seen=_NO_ROWS
        )
        transitions += done
        active = advance(active, done)
    return transitions, active


_NO_ROWS = pa.table({"server": pa.array([], pa.string()), "metric": pa.array([], pa.string())})
