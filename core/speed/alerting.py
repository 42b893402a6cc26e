"""The speed layer's alert step: when each server was last heard from, and the alert rules over the committed tables.

After a micro-batch has committed its windows and stored query results, it
commits two more tables (:mod:`metrics_lake.core.speed.micro_batch` calls the
functions here inside its exactly-once commits, each with the batch's log
positions):

1. ``last_seen``: the batch's newest append time per server, and per
   (metric, server) for the metrics absence rules watch (:func:`seen_rows`
   in each task, :func:`updated_last_seen` at commit). A metric an absence
   rule starts to watch is first filled from the last day of 1-minute
   windows (:func:`initial_last_seen`), so servers already silent are
   expected too.
2. ``alerts``: every alert rule evaluated once
   (:func:`metrics_lake.core.kernels.alert_evaluation.evaluate`), its transitions
   appended. The state carried from one evaluation to the next is what the
   table's transitions leave active (:class:`AlertLog`), so a batch replayed
   after a crash, or after the checkpoint was lost, continues from what was
   committed and records no transition twice.

**Clocks.** Threshold rules are evaluated at *evaluation steps*: every
multiple of ``LAKE_ALERT_EVALUATION_INTERVAL_SECONDS`` after the last step
evaluated (recorded in ``alerts`` with the transitions, :func:`threshold_clock_app_id`)
up to the stream's *event clock* (the watermark plus ``LAKE_WATERMARK_SECONDS``:
the newest event time, as the windows table records it) minus
``LAKE_ALERT_EVALUATION_DELAY_SECONDS``, each step seeing only windows that
ended by then (:mod:`metrics_lake.core.kernels.alert_steps`). The table is
then a function of the log: a catch-up over an hour records the hour's
transitions at their steps, as a batch per event would. The first steps of
a new lake start at its oldest stored query window (at most the absence
lookback back); a lake that evaluated alerts before steps existed starts at
its event clock.

Absence rules and the built-in ``LakeNoData`` are evaluated at the lake's
*append clock*, so an agent whose clock is off neither looks silent nor
makes others look so: the newest ``last_seen_at``, but no later than the
append time up to which every partition has been read (a batch catching up
on a backlog reads some partitions further than others, and a server whose
records wait unread is not silent), never moving back (the alerts table
records it, :func:`absence_clock_app_id`). When no record arrives at all,
no batch runs; the stream then evaluates them *idle* (:func:`evaluate_idle`):
once it has read every partition to its end, the clock advances to the wall
time at which it saw that end, so a whole fleet (or the gateway) going
silent fires every watched server's absence alert within ``FOR`` plus one
trigger, and ``LakeNoData`` after ``LAKE_NODATA_SECONDS``. Both clocks are
read from committed tables, so a replayed batch evaluates at the times it did.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Transaction

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.kernels.alert_evaluation import ActiveAlert, Transition, apply, evaluate, transitions_table
from metrics_lake.core.kernels.alert_rules import ABSENCE, DAY_S, THRESHOLD, AlertRule, no_data_rule
from metrics_lake.core.kernels.alert_steps import SeriesTimeline, evaluate_steps, evaluation_steps
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.core.kernels.windows import dictionary_codes, reduce_at
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.enrichment import expected_servers
from metrics_lake.core.speed.progress import CONSUMER, table_positions, window_start_bounds
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import LatestTables, ensure_table
from metrics_lake.core.tables.snapshots import (
    DataFile,
    days_between,
    read_data_file,
    read_data_files,
    snapshot_files,
    windowed_files,
)
from metrics_lake.lake_schemas.tables import ALERTS, LAST_SEEN, METRIC_WINDOWS_1M, QUERY_RESULTS, Table
from metrics_lake.lake_schemas.types import utc_dates

__all__ = [
    "SEEN",
    "AlertLog",
    "AlertEvaluation",
    "AlertOptions",
    "absence_clock_app_id",
    "absence_clock_ms",
    "append_clock_us",
    "evaluate_alerts",
    "event_clock_us",
    "initial_last_seen",
    "read_last_seen",
    "evaluate_idle",
    "seen_rows",
    "shared_alert_log",
    "steps_app_id",
    "threshold_clock_app_id",
    "threshold_timelines",
    "updated_last_seen",
    "watched_app_id",
    "watched_metrics",
]

log = logging.getLogger(__name__)

_US = 1_000_000
#: Below every time: "no row of this key" in :func:`_newest`'s tables.
_NONE = np.iinfo(np.int64).min
#: A micro-batch's view of ``last_seen`` rows: the table's columns without its partition column.
SEEN = pa.schema([LAST_SEEN.field(n) for n in ("server", "metric", "last_seen_at", "last_event_at")])


@dataclass(frozen=True)
class AlertOptions:
    """How the speed layer evaluates alert rules (seconds; the ``LAKE_ALERT_*`` and ``LAKE_NODATA_SECONDS``
    settings): ``evaluation_delay_s`` behind the event clock and ``evaluation_interval_s`` between steps
    (threshold rules), ``absence_lookback_s`` for which a silent server stays expected, ``nodata_s`` of no record
    at all before ``LakeNoData`` fires."""

    evaluation_delay_s: float = 0.0
    absence_lookback_s: int = DAY_S
    evaluation_interval_s: int = 60
    nodata_s: int = 60

    @classmethod
    def from_settings(cls, settings: LakeSettings) -> AlertOptions:
        """The options ``settings`` configure."""
        return cls(
            settings.alert_evaluation_delay_seconds,
            settings.alert_absence_lookback_seconds,
            settings.alert_evaluation_interval_seconds,
            settings.nodata_seconds,
        )


def watched_metrics(rules: list[AlertRule]) -> tuple[str, ...]:
    """The metrics absence rules watch, sorted, each once."""
    return tuple(sorted({r.metric for r in rules if r.kind == ABSENCE and r.metric}))


def seen_rows(events: pa.Table, watched: tuple[str, ...]) -> pa.Table:
    """:data:`SEEN` rows of bronze ``events``: per server (``metric`` null) and per (metric, server) of ``watched``
    metrics, the newest append time and event time.

    ``events``: columns ``server`` and ``metric`` (plain or dictionary-encoded
    strings), ``ingested_at`` and ``ts`` (timestamps, µs). Works on the
    strings' dictionary codes, a record batch at a time: the speed layer
    passes the rows as read from the log, whose segments carry a dictionary
    per column, so no server name is hashed (a 500,000-row chunk: 24 against
    8 ms, measured); the batches' rows are then merged by series.
    """
    if events.num_rows == 0:
        return SEEN.empty_table()
    events = events.select(["server", "metric", "ingested_at", "ts"])
    seen_at = events.column("ingested_at").cast(pa.int64()).to_numpy(zero_copy_only=False)
    event_at = events.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
    watched_names = pa.array(watched, pa.string())
    pieces: list[tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]] = []
    batches = events.to_batches()
    at = 0
    for batch in batches:
        seen, event = seen_at[at : at + batch.num_rows], event_at[at : at + batch.num_rows]
        at += batch.num_rows
        servers, server_names = dictionary_codes(batch.column("server"))
        held, newest_seen, newest_event = _newest(servers, len(server_names), seen, event)
        pieces.append((server_names.take(held), pa.nulls(len(held), pa.string()), newest_seen, newest_event))
        if not watched:
            continue
        metrics, metric_names = dictionary_codes(batch.column("metric"))
        is_watched = pc.is_in(metric_names, watched_names).to_numpy(zero_copy_only=False)
        watched_codes = np.flatnonzero(is_watched)
        if not len(watched_codes):
            continue
        # (server, watched metric) keys: the metric's place among the watched ones, so the key table stays small.
        place = np.cumsum(is_watched) - 1
        rows = np.flatnonzero(is_watched[metrics])
        width = len(watched_codes)
        keys = servers[rows].astype(np.int64) * width + place[metrics[rows]]
        held, newest_seen, newest_event = _newest(keys, len(server_names) * width, seen[rows], event[rows])
        pieces.append(
            (
                server_names.take(held // width),
                metric_names.take(watched_codes[held % width]),
                newest_seen,
                newest_event,
            )
        )
    rows = pa.table(
        {
            "server": pa.chunked_array([server for server, _, _, _ in pieces], pa.string()),
            "metric": pa.chunked_array([metric for _, metric, _, _ in pieces], pa.string()),
            "last_seen_at": pa.array(np.concatenate([seen for _, _, seen, _ in pieces])),
            "last_event_at": pa.array(np.concatenate([event for _, _, _, event in pieces])),
        }
    ).cast(SEEN)
    return _max_per_series(rows) if len(batches) > 1 else rows  # a series' rows of several batches: merged


def _newest(
    keys: np.ndarray, domain: int, seen_at: np.ndarray, event_at: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys present, their newest ``seen_at``, their newest ``event_at``), for ``keys`` in ``[0, domain)`` and a
    time (int64) per key."""
    newest_seen = reduce_at(np.maximum, _NONE, keys, domain, seen_at)
    newest_event = reduce_at(np.maximum, _NONE, keys, domain, event_at)
    held = np.flatnonzero(newest_seen != _NONE)
    return held, newest_seen[held], newest_event[held]


def _max_per_series(rows: pa.Table) -> pa.Table:
    merged = rows.group_by(["server", "metric"], use_threads=False).aggregate(
        [("last_seen_at", "max"), ("last_event_at", "max")]
    )
    return pa.table(
        {
            "server": merged.column("server"),
            "metric": merged.column("metric"),
            "last_seen_at": merged.column("last_seen_at_max"),
            "last_event_at": merged.column("last_event_at_max"),
        }
    ).cast(SEEN)


def updated_last_seen(
    existing: pa.Table, batch: pa.Table, initial: pa.Table, watched: tuple[str, ...], lookback_s: int
) -> pa.Table:
    """The ``last_seen`` table after a batch: ``existing`` rows, the ``batch``'s and ``initial`` ones merged by max
    per (server, metric); rows of metrics no longer ``watched`` dropped, and rows older than ``lookback_s``
    before the newest append time (the append clock)."""
    rows = pa.concat_tables([existing.select(SEEN.names).cast(SEEN), batch.cast(SEEN), initial.cast(SEEN)])
    metric = rows.column("metric")
    rows = rows.filter(pc.or_(pc.is_null(metric), pc.is_in(metric, pa.array(watched, pa.string()))))
    if rows.num_rows == 0:
        return LAST_SEEN.empty_table()
    rows = _max_per_series(rows)
    oldest = append_clock_us(rows) - lookback_s * _US
    rows = rows.filter(pc.greater_equal(pc.cast(rows.column("last_seen_at"), pa.int64()), oldest))
    rows = rows.sort_by([("server", "ascending"), ("metric", "ascending")])
    return rows.append_column("seen_date", utc_dates(rows.column("last_seen_at"))).cast(LAST_SEEN)


def initial_last_seen(store: Store, metrics: list[str], clock_us: int, lookback_s: int) -> pa.Table:
    """:data:`SEEN` rows of ``metrics`` from the 1-minute windows of the ``lookback_s`` before ``clock_us``: per
    server the end of its newest window (capped at the clock), for both times (an event-time stand-in for the
    append time the table keeps, used once when an absence rule starts to watch a metric)."""
    if not metrics:
        return SEEN.empty_table()
    lo = clock_us - lookback_s * _US
    windows = ensure_table(store, Table.METRIC_WINDOWS_1M)
    files = windowed_files(store, Table.METRIC_WINDOWS_1M, windows, days_between(lo, clock_us + 1), lo, clock_us)
    rows = read_data_files(store, files, METRIC_WINDOWS_1M, ["metric", "server", "window_start", "window_end"])
    start = pc.cast(rows.column("window_start"), pa.int64())
    rows = rows.filter(
        pc.and_(pc.is_in(rows.column("metric"), pa.array(metrics, pa.string())), pc.greater_equal(start, lo))
    )
    if rows.num_rows == 0:
        return SEEN.empty_table()
    newest = rows.group_by(["server", "metric"]).aggregate([("window_end", "max")])
    capped = pc.min_element_wise(pc.cast(newest.column("window_end_max"), pa.int64()), clock_us)
    at = pc.cast(capped, pa.int64()).cast(SEEN.field("last_seen_at").type)
    return pa.table(
        {"server": newest.column("server"), "metric": newest.column("metric"), "last_seen_at": at, "last_event_at": at}
    ).cast(SEEN)


def read_last_seen(store: Store, table: DeltaTable, files: list[DataFile] | None = None) -> pa.Table:
    """Every row of the ``last_seen`` snapshot ``table`` (schema :data:`SEEN`); ``files``: its active files, if the
    caller listed them already."""
    files = snapshot_files(store, Table.LAST_SEEN, table) if files is None else files
    return read_data_files(store, files, LAST_SEEN, SEEN.names)


def watched_app_id(metric: str) -> str:
    """The ``txn`` appId with which ``last_seen`` records that it holds ``metric``'s series (filled from windows)."""
    return f"{CONSUMER}/last-seen/{metric}"


def absence_clock_app_id(topic: str) -> str:
    """The ``txn`` appId under which ``alerts`` records the absence rules' clock (epoch ms) of ``topic``."""
    return f"{CONSUMER}/{topic}/absence-clock"


def absence_clock_ms(newest_us: int | None, read_through_ms: int | None, previous_ms: int | None) -> int | None:
    """The absence rules' clock (epoch ms; module docstring): the newest append time ``newest_us`` (µs), capped at
    ``read_through_ms``, never before ``previous_ms``; None before any record."""
    if newest_us is None:
        return previous_ms
    clock = newest_us // 1000 if read_through_ms is None else min(newest_us // 1000, read_through_ms)
    return clock if previous_ms is None else max(clock, previous_ms)


def append_clock_us(last_seen: pa.Table) -> int | None:
    """The lake's append clock (epoch µs): the newest ``last_seen_at``; None before any record."""
    if last_seen.num_rows == 0:
        return None
    return int(pc.max(pc.cast(last_seen.column("last_seen_at"), pa.int64())).as_py())


def steps_app_id(topic: str) -> str:
    """The ``txn`` appId with which ``alerts`` records that it evaluates threshold rules at evaluation steps."""
    return f"{CONSUMER}/{topic}/threshold-steps"


def threshold_clock_app_id(topic: str) -> str:
    """The ``txn`` appId under which ``alerts`` records the last evaluation step (epoch ms) of threshold rules."""
    return f"{CONSUMER}/{topic}/threshold-clock"


def threshold_timelines(
    store: Store,
    query_results: DeltaTable,
    rules: list[AlertRule],
    queries: dict[str, StoredQuery],
    first_us: int,
    last_us: int,
) -> dict[str, SeriesTimeline]:
    """Per threshold rule, its series over the steps ``first_us..last_us`` (epoch µs), read from the
    ``query_results`` snapshot: only files whose ``window_start`` statistics reach windows ending in
    ``(first_us - step, last_us]``. Rules sharing a query and aggregate share one timeline."""
    chosen = [r for r in rules if r.kind == THRESHOLD and r.query in queries]
    if not chosen:
        return {}
    used = {r.query: queries[r.query] for r in chosen}
    reach = max(q.duration_s + q.slide_s for q in used.values()) * _US
    lo, hi = first_us - reach, last_us
    files = windowed_files(store, Table.QUERY_RESULTS, query_results, days_between(lo, hi + 1), lo, hi)
    columns = ["query", "server", "window_start", "window_end", "aggregate", "value"]
    # Only the rows of the rules' queries and aggregates: a 30-minute backlog of 10,000 servers is millions of rows.
    wanted = pc.field("query").isin(pa.array(sorted(used), pa.string())) & pc.field("aggregate").isin(
        pa.array(sorted({r.aggregate for r in chosen}), pa.string())
    )
    filesystem, _ = store.arrow_fs()
    parts = [read_data_file(f, QUERY_RESULTS, filesystem, columns, ("query", "aggregate"), wanted) for f in files]
    rows = pa.concat_tables(parts) if parts else pa.schema([QUERY_RESULTS.field(c) for c in columns]).empty_table()
    by_query = {name: rows.filter(pc.equal(rows.column("query"), name)) for name in used}
    timelines: dict[tuple[str, str], SeriesTimeline] = {}
    for r in chosen:
        if (r.query, r.aggregate) not in timelines:
            timelines[(r.query, r.aggregate)] = SeriesTimeline(by_query[r.query], used[r.query], r.aggregate)
    return {r.name: timelines[(r.query, r.aggregate)] for r in chosen}


@dataclass
class AlertEvaluation:
    """What one evaluation decided: the ``transitions`` in order, and the clocks to record with them (``txn``
    actions of ``alerts``)."""

    transitions: list[Transition]
    clocks: list[Transaction]


def evaluate_alerts(
    store: Store,
    alerts: DeltaTable,
    query_results: DeltaTable | None,
    last_seen: pa.Table,
    rules: list[AlertRule],
    queries: list[StoredQuery],
    active: dict[str, ActiveAlert],
    *,
    topic: str,
    options: AlertOptions,
    event_clock: int | None,
    read_through_ms: int | None,
    observed_end_ms: int | None = None,
    expected: pa.Table | None = None,
) -> AlertEvaluation:
    """Evaluate every rule (module docstring, Clocks) from the state ``active`` the ``alerts`` snapshot leaves.

    Threshold rules at each step up to ``event_clock`` (epoch µs: the event
    clock minus the evaluation delay; None: none yet) over ``query_results``
    (None: no threshold step, as when idle); then absence rules and
    ``LakeNoData`` once at the append clock of ``last_seen`` (rows
    :data:`SEEN`), capped at ``read_through_ms``, or, when the caller saw
    every partition read to its end, at least ``observed_end_ms`` (epoch
    ms). ``expected``: the inventory's servers, as for
    :func:`~metrics_lake.core.kernels.alert_evaluation.evaluate`.
    """
    rules = [*rules, no_data_rule(options.nodata_s, topic)]
    clocks: list[Transaction] = []
    transitions: list[Transition] = []
    # A lake whose alerts evaluated before evaluation steps existed has an absence clock and no steps marker: its
    # steps start at its event clock. Any other starts at its oldest stored query window.
    upgraded = False
    if alerts.transaction_version(steps_app_id(topic)) is None:
        upgraded = alerts.transaction_version(absence_clock_app_id(topic)) is not None
        clocks.append(Transaction(steps_app_id(topic), 1))
    if query_results is not None and event_clock is not None:
        previous = alerts.transaction_version(threshold_clock_app_id(topic))
        first = None
        if previous is None:
            if not upgraded:
                first = window_start_bounds(query_results)[0]
            first = max(first if first is not None else event_clock, event_clock - options.absence_lookback_s * _US)
        steps = evaluation_steps(
            None if previous is None else previous * 1000, first, event_clock, options.evaluation_interval_s
        )
        if len(steps):
            by_name = {q.name: q for q in queries}
            timelines = {}
            if any(r.kind == THRESHOLD for r in rules):
                timelines = threshold_timelines(store, query_results, rules, by_name, int(steps[0]), int(steps[-1]))
            transitions, active = evaluate_steps(rules, active, steps, timelines)
            clocks.append(Transaction(threshold_clock_app_id(topic), int(steps[-1]) // 1000))
        elif previous is None:  # none due yet: record where the first one is, so the next batch starts there
            step_us = options.evaluation_interval_s * _US
            clocks.append(Transaction(threshold_clock_app_id(topic), (-(-first // step_us) - 1) * step_us // 1000))
    clock_ms = absence_clock_ms(
        append_clock_us(last_seen), read_through_ms, alerts.transaction_version(absence_clock_app_id(topic))
    )
    if observed_end_ms is not None and last_seen.num_rows:
        clock_ms = observed_end_ms if clock_ms is None else max(clock_ms, observed_end_ms)
    if clock_ms is not None:
        absent = evaluate(
            rules,
            active,
            threshold_at_us=None,
            threshold_values={},
            absence_at_us=clock_ms * 1000,
            last_seen=last_seen,
            lookback_s=options.absence_lookback_s,
            expected=expected,
        )
        transitions += absent
        clocks.append(Transaction(absence_clock_app_id(topic), clock_ms))
    return AlertEvaluation(transitions, clocks)


class AlertLog:
    """The ``alerts`` table of one lake read incrementally: its transitions and the alerts they leave active.

    :meth:`refresh` reads only the files added since the last call; a file
    that disappeared (compaction, retention) makes it read the table again
    from scratch. Transitions apply in commit order (``recorded_at``, then
    ``seq``; :func:`~metrics_lake.core.kernels.alert_evaluation.apply`).
    With ``keep_transitions=False`` it holds the active alerts and the names
    of the files read, not their rows (what the speed layer needs, for as
    long as it runs); :meth:`transitions` is then unavailable. Thread-safe.
    """

    def __init__(self, store: Store, *, keep_transitions: bool = True) -> None:
        self.store = store
        self.keep_transitions = keep_transitions
        self._files: dict[str, pa.Table | None] = {}
        self._active: dict[str, ActiveAlert] = {}
        self._lock = threading.Lock()

    def refresh(self, table: DeltaTable | None = None) -> dict[str, ActiveAlert]:
        """Catch up with ``table`` (default: the table's latest snapshot); returns the active alerts by fingerprint."""
        table = table if table is not None else ensure_table(self.store, Table.ALERTS)
        files = {f.relative: f for f in snapshot_files(self.store, Table.ALERTS, table)}
        with self._lock:
            if any(path not in files for path in self._files):
                self._files, self._active = {}, {}
            new = [f for path, f in files.items() if path not in self._files]
            if new:
                added = {f.relative: read_data_files(self.store, [f], ALERTS) for f in new}
                rows = pa.concat_tables(added.values()).sort_by([("recorded_at", "ascending"), ("seq", "ascending")])
                self._active = apply(self._active, rows)
                self._files.update(added if self.keep_transitions else dict.fromkeys(added))
            return dict(self._active)

    def transitions(self) -> pa.Table:
        """Every transition read so far, in commit order (call :meth:`refresh` first)."""
        if not self.keep_transitions:
            raise RuntimeError("this AlertLog keeps no transitions (keep_transitions=False)")  # programming error
        with self._lock:
            parts = list(self._files.values())
        if not parts:
            return ALERTS.empty_table()
        return pa.concat_tables(parts).sort_by([("recorded_at", "ascending"), ("seq", "ascending")])


_ALERT_LOGS: dict[str, AlertLog] = {}
_ALERT_LOGS_LOCK = threading.Lock()


def shared_alert_log(store: Store) -> AlertLog:
    """The process's :class:`AlertLog` of ``store``'s lake, kept from one evaluation to the next (one per root).

    It keeps the active alerts only, not every transition within the table's retention: the speed layer runs for
    months, and evaluating needs the state, not the history."""
    with _ALERT_LOGS_LOCK:
        if store.root not in _ALERT_LOGS:
            _ALERT_LOGS[store.root] = AlertLog(store, keep_transitions=False)
        return _ALERT_LOGS[store.root]


def forget_alert_logs() -> None:
    """Drop the kept :class:`AlertLog` objects: the next evaluation reads ``alerts`` anew (as a new process would)."""
    with _ALERT_LOGS_LOCK:
        _ALERT_LOGS.clear()


def evaluate_idle(
    store: Store,
    topic: str,
    rules: list[AlertRule],
    options: AlertOptions,
    now_ms: int,
    tables: LatestTables | None = None,
) -> int:
    """Evaluate absence rules and ``LakeNoData`` while no record arrives (module docstring, Clocks); returns the
    transitions recorded.

    Does nothing unless ``alerts`` holds every partition of ``topic`` up to
    its end: the clock then advances to ``now_ms`` (epoch ms, taken by the
    caller before it looked at the log's ends). Transitions are appended
    with the clock they were evaluated at; an evaluation that changes
    nothing commits nothing (no empty versions while a fleet is silent).
    """
    tables = tables or LatestTables()
    ends = end_offsets(SegmentLog(store), topic)
    if not ends:
        return 0
    held = table_positions(store, Table.ALERTS, topic, ends, tables)
    if any((held[p] or 0) < end for p, end in ends.items()):
        return 0  # records wait unread: the next batch evaluates with them
    recorded = 0

    def attempt() -> None:
        nonlocal recorded
        table = tables.latest(store, Table.ALERTS)
        evaluation = evaluate_alerts(
            store,
            table,
            None,
            read_last_seen(store, tables.latest(store, Table.LAST_SEEN)),
            rules,
            [],
            shared_alert_log(store).refresh(table),
            topic=topic,
            options=options,
            event_clock=None,
            read_through_ms=None,
            observed_end_ms=now_ms,
            expected=expected_servers(store),
        )
        if not evaluation.transitions:
            recorded = 0
            return
        rows = transitions_table(evaluation.transitions, dt.datetime.now(dt.UTC))
        commit_changes(
            table,
            Table.ALERTS,
            write_data_files(store, Table.ALERTS, rows),
            [],
            transactions=evaluation.clocks,
            operation="IDLE ALERTS",
        )
        recorded = rows.num_rows
        log.info(
            "alerts (no new records): %s", "; ".join(f"{t.state} {t.summary}" for t in evaluation.transitions[:20])
        )

    retry_on_conflict(attempt, Table.ALERTS)
    return recorded


def event_clock_us(watermark_ms: int | None, watermark_seconds: int, delay_seconds: float) -> int | None:
    """Threshold rules' evaluation time (epoch µs): the newest event time the windows hold, minus the delay."""
    if watermark_ms is None:
        return None
    return int((watermark_ms + watermark_seconds * 1000) * 1000 - delay_seconds * _US)
