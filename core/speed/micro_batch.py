"""The speed layer's work on one micro-batch, whatever schedules it: plan, process chunks, commit.

A micro-batch reads the log up to ``ends`` (per partition, the next offset)
into six tables: ``bronze_events`` (valid events), ``quarantine_events``
(rejects, with their reasons), ``metric_windows_1m`` (1-minute window
states), ``query_results`` (the stored queries, live: every query window
holding a minute the batch touched is evaluated again from the windows
table and replaced, so late events within the watermark update it too),
``last_seen`` (when each server was last heard from) and ``alerts`` (the
alert rules evaluated over the committed query results and ``last_seen``:
:mod:`metrics_lake.core.speed.alerting`). :mod:`metrics_lake.spark.jobs.stream_metrics` runs it on Spark:
:func:`~metrics_lake.core.speed.batch_plan.plan_batch` and :func:`commit_batch` on the driver,
:func:`~metrics_lake.core.speed.chunk_processing.process_partition` in the tasks.

The steps, one module each: the plan (:mod:`~metrics_lake.core.speed.batch_plan`: every table's position and the
chunks of the log to read), the tasks' work on a chunk (:mod:`~metrics_lake.core.speed.chunk_processing`: bronze and
quarantine files, window states), and the driver's commits, each table's with its positions
(:mod:`~metrics_lake.core.speed.position_commits`): the windows
(:mod:`~metrics_lake.core.speed.window_upserts`), the stored queries' results
(:mod:`~metrics_lake.core.speed.live_queries`), and, here, bronze, quarantine, ``last_seen`` and ``alerts``
(:func:`commit_batch`).

**Exactly once, held by the tables.** Each table records the log position
it holds, per partition, as a Delta ``txn`` action committed in the same
version as its data (:func:`metrics_lake.core.tables.commits.offset_transactions`).
A batch reads every table's position first and processes, for each table,
only the records from that position up to ``ends``; it then commits data and
new positions atomically. So whatever the engine's checkpoint says — lost,
older, or from another lake — no record enters a table twice or is skipped:
a batch replayed after a crash finds its positions committed and commits
nothing, a batch after a lost checkpoint starts where the tables are. The
tables commit separately (Delta has no multi-table transactions); one
that a crash left behind simply catches up in the next batch. A query window
is evaluated from the windows table as committed, so evaluating it again
(a replayed batch) gives the same rows: ``query_results`` is exact as long
as it is evaluated after every batch of windows it depends on, which its own
positions guarantee.

**Watermark.** Windows leave out events older than the *watermark*: the
newest event time the windows hold minus ``watermark_seconds`` (Spark's
``withWatermark`` semantics), never moving back. The windows table records
it in the same commit as a ``txn`` action too, so a replayed batch uses the
watermark it used the first time, and maintenance knows which days the
speed layer may still rewrite (:mod:`metrics_lake.core.speed.progress` reads
both back for everyone else). An event's time
counts for the watermark only up to its append time plus a clock skew, so one
event from an agent with a clock in the year 2099 cannot close every window.
Late events are in bronze; the nightly recompute counts them.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import Transaction

from metrics_lake.core.inventory import write_servers_table
from metrics_lake.core.kernels.alert_evaluation import transitions_table
from metrics_lake.core.kernels.alert_rules import AlertRule
from metrics_lake.core.kernels.cardinality import CardinalityLimits
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states
from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.registry import Registry
from metrics_lake.core.speed.alerting import (
    SEEN,
    AlertOptions,
    append_clock_us,
    evaluate_alerts,
    event_clock_us,
    initial_last_seen,
    read_last_seen,
    shared_alert_log,
    updated_last_seen,
    watched_app_id,
    watched_metrics,
)
from metrics_lake.core.speed.batch_plan import (
    ALERTS,
    BRONZE,
    LAST_SEEN,
    QUARANTINE,
    QUERIES,
    WINDOWS,
    BatchPlan,
    plan_batch,
)
from metrics_lake.core.speed.cardinality_gate import save_states
from metrics_lake.core.speed.chunk_processing import ChunkResult, process_partition
from metrics_lake.core.speed.enrichment import expected_servers
from metrics_lake.core.speed.live_queries import upsert_query_results
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.position_commits import commit_with_positions
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.window_upserts import upsert_windows
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, offset_transactions, remove_action
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.core.tables.snapshots import snapshot_files

__all__ = [
    "BatchOutcome",
    "commit_batch",
    "run_batch_in_process",
    "threshold_clock_us",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchOutcome:
    """A committed micro-batch: records read, rows committed per table, windows written, late events, seconds,
    events new to bronze whose server the inventory does not hold (kept, with empty labels), and events new to
    quarantine for a cardinality limit, per limit name (``limited``).

    A table that already held the batch's positions (a replayed batch) counts 0 rows. ``stages``: wall seconds of
    each step, in order: what the caller measured before the commit (``plan``, ``tasks``) and each table's commit
    (by table name; ``windows merge`` is the states' merge before the windows' commit).
    """

    records: int
    rows: dict[str, int]
    windows_written: int
    late_events: int
    watermark_ms: int | None
    seconds: float
    unknown_servers: int = 0
    limited: dict[str, int] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)


def commit_batch(
    store: Store,
    plan: BatchPlan,
    results: list[ChunkResult],
    *,
    watermark_seconds: int,
    started: float | None = None,
    queries: list[StoredQuery] | None = None,
    rules: list[AlertRule] | None = None,
    alerting: AlertOptions | None = None,
    stages: dict[str, float] | None = None,
    open_windows: OpenWindows | None = None,
    tables: LatestTables | None = None,
) -> BatchOutcome:
    """Commit a processed batch: bronze, quarantine, windows, query results, last seen, alerts; each with its new
    positions. ``stages``: seconds the caller spent before (planning, tasks), reported first in the outcome's.

    ``queries`` and ``rules``: the stored queries to keep live and the alert
    rules to evaluate (default: the lake's registry,
    :mod:`metrics_lake.core.registry`, read again for every batch, so an edit
    takes effect on the next one); ``alerting``: the evaluation delay and
    absence lookback (default :class:`~metrics_lake.core.speed.alerting.AlertOptions`);
    ``open_windows``: the rows of the open windows this stream committed last,
    read instead of their files and updated (:mod:`metrics_lake.core.speed.open_windows`;
    ``None``: always read the files); ``tables``: the tables the stream keeps
    open from one batch to the next (:class:`~metrics_lake.core.tables.delta.LatestTables`;
    default: opened for this call). Also records the batch's end as consumer
    group ``speed-layer`` (what ``lake consumers`` shows). Raises
    :class:`ConcurrentWriterError` if another stream moved a table's positions
    meanwhile (see the module docstring).
    """
    started = started or time.monotonic()
    stages = dict(stages or {})
    lap = time.monotonic()

    def timed(stage: str) -> None:
        nonlocal lap
        now = time.monotonic()
        stages[stage] = now - lap
        lap = now

    alerting = alerting or AlertOptions()
    tables = tables or LatestTables()
    registry = Registry(store).current() if queries is None or rules is None else None
    queries = registry.queries() if queries is None else queries
    rules = registry.alert_rules() if rules is None else rules
    for (
        result
    ) in results:  # before any table takes a decision the states hold (metrics_lake.core.speed.cardinality_gate)
        for partition, states in result.limit_states.items():
            save_states(store, CONSUMER, plan.topic, partition, states)
    rows = {}
    for name in (BRONZE, QUARANTINE):
        files = [f for r in results for f in r.files if f.table == name]
        committed = commit_with_positions(
            store,
            tables,
            plan,
            name,
            lambda table, advances, name=name, files=files: commit_changes(
                table,
                name,
                files,
                [],
                transactions=offset_transactions(CONSUMER, plan.topic, advances),
                operation="STREAMING UPDATE",
            ),
        )
        rows[name] = sum(r.counts.get(name, 0) for r in results) if committed else 0
        timed(name)
    times = [r.event_time_max_ms for r in results if r.event_time_max_ms is not None]
    candidates = [max(times) - watermark_seconds * 1000] if times else []
    watermark = max([*candidates, *([plan.watermark_ms] if plan.watermark_ms is not None else [])], default=None)
    states = merge_states(pa.concat_tables([r.states for r in results])) if results else WINDOW_STATE.empty_table()
    timed("windows merge")
    written = upsert_windows(store, tables, plan, states, watermark, open_windows)
    timed(WINDOWS)
    touched: dict[str, set[int]] = {}
    for result in results:
        for metric, minutes in result.touched.items():
            touched.setdefault(metric, set()).update(minutes)
    rows[QUERIES] = upsert_query_results(store, tables, plan, touched, queries, watermark, open_windows)
    timed(QUERIES)
    seen = pa.concat_tables([r.seen for r in results]) if results else SEEN.empty_table()
    rows[LAST_SEEN] = _upsert_last_seen(store, tables, plan, seen, rules, alerting.absence_lookback_s)
    timed(LAST_SEEN)
    clock = threshold_clock_us(plan, results, watermark, watermark_seconds, alerting.evaluation_delay_s)
    rows[ALERTS] = _commit_alerts(store, tables, plan, rules, queries, clock, alerting)
    timed(ALERTS)
    if plan.pins:
        write_servers_table(store)  # the inventory's current state, for SQL and the dashboard
    if plan.ends:
        commit_offsets(store, CONSUMER, plan.topic, plan.ends)
    limited: dict[str, int] = {}
    if rows[QUARANTINE]:
        for result in results:
            for limit, count in result.refused_by.items():
                limited[limit] = limited.get(limit, 0) + count
    return BatchOutcome(
        records=plan.records,
        rows=rows,
        windows_written=written,
        late_events=sum(r.counts.get("late", 0) for r in results),
        unknown_servers=sum(r.counts.get("unknown_servers", 0) for r in results),
        limited=limited,
        watermark_ms=plan.watermark_ms,
        seconds=time.monotonic() - started,
        stages=stages,
    )


def threshold_clock_us(
    plan: BatchPlan, results: list[ChunkResult], watermark_ms: int | None, watermark_seconds: int, delay_s: float
) -> int | None:
    """How far threshold rules may step after this batch (epoch µs; None: no step this batch).

    The event clock minus the delay (:func:`~metrics_lake.core.speed.alerting.event_clock_us`) when the batch
    reads every partition to its end. Else no later than the oldest of the newest event times it read in the
    partitions it leaves records in: a window is final only once every partition's events before its end are
    read, and a batch catching up unevenly must not evaluate a window another partition still adds to. None when
    it read nothing of one of those (a later batch reads on).
    """
    clock = event_clock_us(watermark_ms, watermark_seconds, delay_s)
    if clock is None or not plan.unread:
        return clock
    newest: dict[int, int] = {}
    for r in results:
        if r.partition is not None and r.event_time_max_ms is not None:
            newest[r.partition] = max(newest.get(r.partition, r.event_time_max_ms), r.event_time_max_ms)
    if any(p not in newest for p in plan.unread):
        return None
    return min(clock, int((min(newest[p] for p in plan.unread) - delay_s * 1000) * 1000))


def _upsert_last_seen(
    store: Store, tables: LatestTables, plan: BatchPlan, seen: pa.Table, rules: list[AlertRule], lookback_s: int
) -> int:
    """Rewrite ``last_seen`` with the batch's newest times merged in (and a newly watched metric's first rows from
    the windows), with its positions; returns the rows it now holds."""
    watched = watched_metrics(rules)
    written = 0

    def commit(table, advances: dict[int, int]) -> None:
        nonlocal written
        old_files = snapshot_files(store, LAST_SEEN, table)
        existing = read_last_seen(store, table, old_files)
        new_metrics = [m for m in watched if table.transaction_version(watched_app_id(m)) is None]
        clock = append_clock_us(pa.concat_tables([existing.cast(SEEN), seen.cast(SEEN)]))
        initial = SEEN.empty_table()
        if new_metrics and clock is not None:
            initial = initial_last_seen(store, new_metrics, clock, lookback_s)
        rows = updated_last_seen(existing, seen, initial, watched, lookback_s)
        commit_changes(
            table,
            LAST_SEEN,
            write_data_files(store, LAST_SEEN, rows),
            [remove_action(f) for f in old_files],
            transactions=offset_transactions(CONSUMER, plan.topic, advances)
            + [Transaction(watched_app_id(m), 1) for m in new_metrics],
            operation="STREAMING LAST SEEN",
        )
        written = rows.num_rows

    return written if commit_with_positions(store, tables, plan, LAST_SEEN, commit) else 0


def _commit_alerts(
    store: Store,
    tables: LatestTables,
    plan: BatchPlan,
    rules: list[AlertRule],
    queries: list[StoredQuery],
    event_clock: int | None,
    options: AlertOptions,
) -> int:
    """Evaluate every alert rule on the committed tables (threshold rules at each evaluation step up to
    ``event_clock``, epoch µs) and append the transitions to ``alerts`` with the batch's positions and clocks
    (:func:`~metrics_lake.core.speed.alerting.evaluate_alerts`); returns the transitions recorded."""
    alert_log = shared_alert_log(store)
    recorded = 0

    def commit(table, advances: dict[int, int]) -> None:
        nonlocal recorded
        active = alert_log.refresh(table)  # what the committed transitions leave active: the state to go on from
        evaluation = evaluate_alerts(
            store,
            table,
            tables.latest(store, QUERIES),
            read_last_seen(store, tables.latest(store, LAST_SEEN)),
            rules,
            queries,
            active,
            topic=plan.topic,
            options=options,
            event_clock=event_clock,
            read_through_ms=plan.read_through_ms,
            expected=expected_servers(store),
        )
        rows = transitions_table(evaluation.transitions, dt.datetime.now(dt.UTC))
        commit_changes(
            table,
            ALERTS,
            write_data_files(store, ALERTS, rows),
            [],
            transactions=offset_transactions(CONSUMER, plan.topic, advances) + evaluation.clocks,
            operation="STREAMING ALERTS",
        )
        recorded = rows.num_rows
        if recorded:
            log.info("alerts: %s", "; ".join(f"{t.state} {t.summary}" for t in evaluation.transitions[:20]))

    return recorded if commit_with_positions(store, tables, plan, ALERTS, commit) else 0


def run_batch_in_process(
    store: Store,
    topic: str,
    ends: dict[int, int],
    *,
    watermark_seconds: int,
    clock_skew_seconds: int,
    chunk_records: int = 500_000,
    queries: list[StoredQuery] | None = None,
    rules: list[AlertRule] | None = None,
    alerting: AlertOptions | None = None,
    limits: CardinalityLimits | None = None,
    open_windows: OpenWindows | None = None,
    tables: LatestTables | None = None,
) -> BatchOutcome | None:
    """Plan, process (partition after partition, in this process) and commit one batch; ``None`` if nothing to do.

    The same steps the Spark job runs, without Spark: for tests, tools and
    the benchmarks' "library without Spark" peer. ``queries``, ``rules``,
    ``alerting``, ``open_windows`` and ``tables`` as for :func:`commit_batch`;
    ``limits`` as for :func:`~metrics_lake.core.speed.batch_plan.plan_batch`.
    """
    started = time.monotonic()
    tables = tables or LatestTables()
    plan = plan_batch(
        store,
        topic,
        ends,
        watermark_seconds=watermark_seconds,
        chunk_records=chunk_records,
        watched=None if rules is None else watched_metrics(rules),
        limits=limits,
        tables=tables,
    )
    if not plan.chunks:
        return None
    results = [
        result
        for partition in plan.partition_chunks()
        for result in process_partition(store, plan, partition, clock_skew_seconds=clock_skew_seconds)
    ]
    return commit_batch(
        store,
        plan,
        results,
        watermark_seconds=watermark_seconds,
        started=started,
        queries=queries,
        rules=rules,
        alerting=alerting,
        open_windows=open_windows,
        tables=tables,
    )
