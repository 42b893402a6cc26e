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

The steps: the plan (:mod:`~metrics_lake.core.speed.batch_plan`: every table's position and the chunks of the
log to read), the tasks' work on a chunk (:mod:`~metrics_lake.core.speed.chunk_processing`: bronze and
quarantine files, window states), and the driver's commits, one per table and each with its positions, in the
order of :data:`TABLE_COMMITS` (:mod:`metrics_lake.core.speed.table_commits`).

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

import time
from dataclasses import dataclass, field

from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.inventory import write_servers_table
from metrics_lake.core.kernels.alert_rules import AlertRule
from metrics_lake.core.kernels.cardinality import CardinalityLimits
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.speed.alerting import AlertOptions, watched_metrics
from metrics_lake.core.speed.batch_plan import BRONZE, QUARANTINE, WINDOWS, BatchPlan, plan_batch
from metrics_lake.core.speed.cardinality_gate import save_states
from metrics_lake.core.speed.chunk_processing import ChunkResult, process_partition
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.table_commits.alerts import AlertsCommit
from metrics_lake.core.speed.table_commits.batch import ProcessedBatch, TableCommit
from metrics_lake.core.speed.table_commits.last_seen import LastSeenCommit
from metrics_lake.core.speed.table_commits.log_files import LogFilesCommit
from metrics_lake.core.speed.table_commits.query_results import QueryResultsCommit
from metrics_lake.core.speed.table_commits.windows import WindowsCommit
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import LatestTables

__all__ = [
    "TABLE_COMMITS",
    "BatchOutcome",
    "commit_batch",
    "run_batch_in_process",
]

TABLE_COMMITS: tuple[TableCommit, ...] = (
    LogFilesCommit(BRONZE),
    LogFilesCommit(QUARANTINE),
    WindowsCommit(),
    QueryResultsCommit(),  # reads the windows just committed
    LastSeenCommit(),
    AlertsCommit(),  # reads the query results and last_seen just committed
)
"""A micro-batch's commits, one per table, in order: each later one reads what the earlier ones committed."""


@dataclass(frozen=True)
class BatchOutcome:
    """A committed micro-batch: records read, rows committed per table (``metric_windows_1m``'s: the windows
    written, also ``windows_written``), late events, seconds,
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
    rules to evaluate (default: the lake's config store,
    :mod:`metrics_lake.core.config_store`, read again for every batch, so an edit
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
    config_store = ConfigStore(store).current() if queries is None or rules is None else None
    batch = ProcessedBatch(
        store=store,
        tables=tables or LatestTables(),
        plan=plan,
        results=results,
        watermark_seconds=watermark_seconds,
        queries=config_store.queries() if queries is None else queries,
        rules=config_store.alert_rules() if rules is None else rules,
        alerting=alerting or AlertOptions(),
        open_windows=open_windows,
        stages=dict(stages or {}),
    )
    for result in results:  # before any table takes a decision the states hold (core/speed/cardinality_gate.py)
        for partition, states in result.limit_states.items():
            save_states(store, CONSUMER, plan.topic, partition, states)
    rows = {}
    for step in TABLE_COMMITS:
        rows[step.table] = step.commit(batch)
        batch.lap(step.table)
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
        windows_written=rows[WINDOWS],
        late_events=sum(r.counts.get("late", 0) for r in results),
        unknown_servers=sum(r.counts.get("unknown_servers", 0) for r in results),
        limited=limited,
        watermark_ms=plan.watermark_ms,
        seconds=time.monotonic() - started,
        stages=batch.stages,
    )


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
