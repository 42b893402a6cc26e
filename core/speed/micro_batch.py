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
:func:`plan_batch` and :func:`commit_batch` on the driver, :func:`process_chunk`
in the tasks.

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

**Window files.** Upserting windows rewrites the files holding the windows a
batch touched (one commit: remove the old files, add the new ones, record
positions). Rewritten rows are laid out so that later batches touch little:
windows that the new watermark has closed go to one *sealed* file per day
(never touched by the speed layer again), open windows to one file per
window (a large upsert runs on several threads, one shard of the series
each, and writes both kinds of file per shard:
:func:`_merge_and_write_windows`). A stream's driver keeps the rows of the
open-window files it committed last (:mod:`metrics_lake.core.speed.open_windows`)
and merges the next batch into them rather than reading them back, and the stored queries'
rows it took from each window file, so their evaluation reads a file at most
once; the table stays the truth: only files of the snapshot a batch plans
from are looked up.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Transaction

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.inventory import Inventory, write_servers_table
from metrics_lake.core.kernels.alert_rules import AlertRule, transitions_table
from metrics_lake.core.kernels.cardinality import CardinalityLimits, LimitState, refused_per_limit
from metrics_lake.core.kernels.stored_queries import (
    StoredQuery,
    affected_windows,
    query_rows,
    window_states,
)
from metrics_lake.core.kernels.windows import (
    WINDOW_STATE,
    aggregate_events,
    dictionary_codes,
    merge_into_rows,
    merge_states,
    presence,
    series_shards,
)
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import group_by_partition
from metrics_lake.core.registry import Registry
from metrics_lake.core.speed.alerting import (
    SEEN,
    AlertOptions,
    append_clock_us,
    evaluate_alerts,
    event_clock_us,
    initial_last_seen,
    read_last_seen,
    seen_rows,
    shared_alert_log,
    updated_last_seen,
    watched_app_id,
    watched_metrics,
)
from metrics_lake.core.speed.cardinality import LimitGate, save_states
from metrics_lake.core.speed.enrichment import Pin, expected_servers, labels_at, pin_inventory
from metrics_lake.core.speed.open_windows import OpenWindows, with_sources
from metrics_lake.core.speed.progress import (
    CONSUMER,
    POSITION_TABLES,
    WINDOW_SECONDS,
    backfill_revision_app_id,
    backfilled_through_app_id,
    live_revision_app_id,
    query_progress,
    table_positions,
    watermark_app_id,
    window_start_bounds,
)
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import (
    commit_changes,
    committed_offsets,
    offset_transactions,
    remove_action,
    retry_on_conflict,
)
from metrics_lake.core.tables.data_files import WrittenFile, write_data_files
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.core.tables.snapshots import (
    DataFile,
    days_between,
    read_data_file,
    read_data_files,
    snapshot_files,
    windowed_files,
)
from metrics_lake.lake_schemas.errors import ConcurrentWriterError
from metrics_lake.lake_schemas.log_records import with_dictionaries
from metrics_lake.lake_schemas.tables import BRONZE_EVENTS, METRIC_WINDOWS_1M, QUARANTINE_EVENTS, QUERY_RESULTS, Table
from metrics_lake.lake_schemas.types import utc_dates

__all__ = [
    "SPEED_TABLES",
    "BatchOutcome",
    "BatchPlan",
    "Chunk",
    "ChunkResult",
    "commit_batch",
    "configured_limits",
    "plan_batch",
    "process_chunk",
    "process_partition",
    "run_batch_in_process",
    "split_log_rows",
]

log = logging.getLogger(__name__)

BRONZE, QUARANTINE, WINDOWS, QUERIES, LAST_SEEN, ALERTS = (
    Table.BRONZE_EVENTS,
    Table.QUARANTINE_EVENTS,
    Table.METRIC_WINDOWS_1M,
    Table.QUERY_RESULTS,
    Table.LAST_SEEN,
    Table.ALERTS,
)
#: The tables a micro-batch writes with its log positions, in commit order (query results are evaluated from the
#: committed windows); it also folds the inventory into ``servers``.
SPEED_TABLES = POSITION_TABLES


def split_log_rows(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split log rows (:data:`~metrics_lake.lake_schemas.log_records.LOG_ROW`) into (bronze rows, quarantine rows).

    ``event_date`` is the UTC date of the event time; ``ingest_date`` the
    UTC date the record was appended to the log; ``labels`` null (the
    enrichment sets them: :func:`enrich`). Strings read as dictionaries
    (:func:`~metrics_lake.core.log.consumer.read_range`'s ``dictionaries``)
    stay so in the bronze rows; quarantine rows hold plain strings.
    """
    rejects = rows.num_rows - rows.column("reason").null_count
    if rejects == 0:  # most chunks: the valid rows are all of them, not a copy
        valid, bad = rows, rows.slice(0, 0)
    else:
        rejected = pc.is_valid(rows.column("reason"))
        valid, bad = rows.filter(pc.invert(rejected)), rows.filter(rejected)
    bronze = valid.append_column("event_date", utc_dates(valid.column("ts")))
    quarantine = bad.append_column("ingest_date", utc_dates(bad.column("ingested_at")))
    if "labels" not in bronze.column_names:  # set by the enrichment (process_chunk); null until then
        bronze = bronze.append_column("labels", pa.nulls(bronze.num_rows, BRONZE_EVENTS.field("labels").type))
    coded = pa.types.is_dictionary(rows.schema.field("server").type)
    return (
        bronze.select(BRONZE_EVENTS.names).cast(with_dictionaries(BRONZE_EVENTS) if coded else BRONZE_EVENTS),
        quarantine.select(QUARANTINE_EVENTS.names).cast(QUARANTINE_EVENTS),
    )


@dataclass(frozen=True)
class Chunk:
    """Offsets ``[start, end)`` of one log partition: one task's input."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class BatchPlan:
    """What one micro-batch does (see the module docstring).

    ``ends``: per partition, the next offset the batch reads up to;
    ``marks``: per table and partition, the next offset the table holds
    (where its records start); ``watermark_ms``: events older than this
    are left out of windows (``None`` before the first batch); ``chunks``:
    the ranges to read; ``watched``: the metrics absence rules watch (their
    per-series last-seen times are kept besides each server's);
    ``read_through_ms``: the append time up to which every partition is read
    once the batch is (the last record it reads of each partition it leaves
    records in; None when it reads every partition to the end): no server
    can look silent before it (:mod:`metrics_lake.core.speed.alerting`);
    ``pins``: which inventory version events are joined with from which
    offsets (:mod:`metrics_lake.core.speed.enrichment`); ``limits``: the
    cardinality limits an hour without a state starts with
    (:mod:`metrics_lake.core.speed.cardinality`); ``unread``: the partitions
    the batch leaves records in (their events bound the threshold rules'
    evaluation steps: :func:`threshold_clock_us`).
    """

    topic: str
    ends: dict[int, int]
    marks: dict[str, dict[int, int]]
    watermark_ms: int | None
    chunks: tuple[Chunk, ...]
    watched: tuple[str, ...] = ()
    read_through_ms: int | None = None
    pins: tuple[Pin, ...] = ()
    limits: CardinalityLimits = CardinalityLimits()
    unread: tuple[int, ...] = ()

    @property
    def records(self) -> int:
        """Log records the batch reads."""
        return sum(c.end - c.start for c in self.chunks)

    def partition_chunks(self) -> dict[int, list[Chunk]]:
        """The chunks of each partition, in offset order (one task processes them one after the other)."""
        chunks: dict[int, list[Chunk]] = {}
        for chunk in self.chunks:
            chunks.setdefault(chunk.partition, []).append(chunk)
        return chunks

    def advances(self, table: str) -> dict[int, int]:
        """The partitions whose position ``table`` moves forward in this batch, with their new positions."""
        return {p: end for p, end in self.ends.items() if end > self.marks[table][p]}


@dataclass
class ChunkResult:
    """What a task made of one chunk: data files written (not yet committed), window states, counts.

    ``event_time_max_ms``: newest event time of the chunk's valid events for
    the windows (clamped to append time plus the clock skew); ``counts``:
    rows per table, plus ``late`` (valid events older than the watermark);
    ``touched``: per metric, the 1-minute windows (start, epoch µs) of the
    events that ``query_results`` has not yet seen; ``seen``: the newest
    append and event time per server, and per series of a watched metric,
    of the events ``last_seen`` has not yet seen (:data:`~metrics_lake.core.speed.alerting.SEEN`);
    ``refused_by``: events of the chunk new to quarantine for a cardinality limit, per limit name;
    ``limit_states``: on a partition's last chunk, the partition's limit states (hour → state) as of its end;
    ``partition``: the log partition the chunk is of.
    """

    files: list[WrittenFile] = field(default_factory=list)
    states: pa.Table = field(default_factory=WINDOW_STATE.empty_table)
    event_time_max_ms: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    touched: dict[str, list[int]] = field(default_factory=dict)
    seen: pa.Table = field(default_factory=SEEN.empty_table)
    refused_by: dict[str, int] = field(default_factory=dict)
    limit_states: dict[int, dict[int, LimitState]] = field(default_factory=dict)
    partition: int | None = None


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


def configured_limits(settings: LakeSettings, partitions: int) -> CardinalityLimits:
    """The cardinality limits of ``settings`` (``LAKE_LIMIT_*``) as one of ``partitions`` partitions' share."""
    return CardinalityLimits.local(
        series_per_metric=settings.limit_series_per_metric,
        values_per_label=settings.limit_values_per_label,
        labels_per_event=settings.limit_labels_per_event,
        partitions=partitions,
    )


def plan_batch(
    store: Store,
    topic: str,
    ends: dict[int, int],
    *,
    watermark_seconds: int,
    chunk_records: int,
    watched: tuple[str, ...] | None = None,
    limits: CardinalityLimits | None = None,
    tables: LatestTables | None = None,
) -> BatchPlan:
    """Plan a micro-batch reading up to ``ends``: each table's position, the watermark, chunks of ``chunk_records``,
    the metrics absence rules watch (``watched``; default: the registry's rules'), the cardinality limits
    (default: none; :func:`configured_limits` gives the settings'). ``tables``: the tables a stream keeps open
    from one batch to the next (:class:`~metrics_lake.core.tables.delta.LatestTables`; default: opened for this
    call).

    A position below the log's start offset (retention removed records a
    table never got; ``lake consumers`` reports it) starts at the log start.
    """
    tables = tables or LatestTables()
    log_ = SegmentLog(store)
    indexes = {p: log_.index(topic, p) for p in ends}
    first = {p: index.start_offset for p, index in indexes.items()}
    marks: dict[str, dict[int, int]] = {}
    for name in SPEED_TABLES:
        committed = table_positions(store, name, topic, ends, tables)
        marks[name] = {}
        for p in ends:
            mark = committed[p] or 0
            if mark < first[p]:
                if committed[p] is not None:
                    log.warning(
                        "%s: records %d..%d of %s/%d were removed by retention before it read them",
                        name,
                        mark,
                        first[p],
                        topic,
                        p,
                    )
                mark = first[p]
            marks[name][p] = mark
    chunks = []
    for p, end in sorted(ends.items()):
        start = min(marks[name][p] for name in SPEED_TABLES)
        chunks += [Chunk(p, lo, min(lo + chunk_records, end)) for lo in range(start, end, chunk_records)]
    watermark = tables.latest(store, WINDOWS).transaction_version(watermark_app_id(topic))
    if watched is None:
        watched = watched_metrics(Registry(store).current().alert_rules())
    unread_partitions = tuple(p for p, end in sorted(ends.items()) if end < indexes[p].next_offset)
    behind = [indexes[p].appended_at(ends[p] - 1) for p in unread_partitions if ends[p] > 0]
    read_through = min((at for at in behind if at is not None), default=None)
    unread = {p: max(marks[name][p] for name in SPEED_TABLES) for p in ends}
    pins = pin_inventory(store, CONSUMER, topic, unread, Inventory(store).end_offset())
    return BatchPlan(
        topic,
        dict(ends),
        marks,
        watermark,
        tuple(chunks),
        watched,
        read_through,
        pins,
        limits or CardinalityLimits(),
        unread_partitions,
    )


def process_partition(store: Store, plan: BatchPlan, partition: int, *, clock_skew_seconds: int) -> list[ChunkResult]:
    """Process ``partition``'s chunks of ``plan`` one after the other (:func:`process_chunk`), judging their events
    against the cardinality limits in offset order; the last result carries the partition's limit states and the
    window states of all its chunks, merged.

    Merging here, in the task, rather than on the driver: a series' windows
    that straddle chunks are combined in parallel across tasks, and since
    producers partition by server the driver gets disjoint states it only
    concatenates.
    """
    gate = LimitGate(store, CONSUMER, plan.topic, partition, plan.limits)
    chunks = plan.partition_chunks().get(partition, [])
    results = [process_chunk(store, plan, chunk, clock_skew_seconds=clock_skew_seconds, gate=gate) for chunk in chunks]
    for result in results:
        result.partition = partition
    if results:
        results[-1].limit_states = {partition: dict(gate.states)}
    if len(results) > 1:  # chunks are in offset order: merge_states keeps the newest labels (the last row's)
        merged = merge_states(pa.concat_tables([r.states for r in results]))
        for result in results:
            result.states = WINDOW_STATE.empty_table()
        results[-1].states = merged
    return results


def process_chunk(
    store: Store, plan: BatchPlan, chunk: Chunk, *, clock_skew_seconds: int, gate: LimitGate
) -> ChunkResult:
    """Read one chunk and write what each table still needs of it: bronze and quarantine files, window states.

    ``gate``: the partition's cardinality limits, as of ``chunk.start``
    (:func:`process_partition` passes it from chunk to chunk: call that); events over a
    limit go to quarantine instead of bronze. Files are written but not
    committed (invisible until :func:`commit_batch`); a failed or retried
    task leaves only files that VACUUM removes.
    """
    # Repeated strings as the segments' dictionaries: the gate's codes for series and labels are their indices.
    rows = read_range(SegmentLog(store), plan.topic, chunk.partition, chunk.start, chunk.end, dictionaries=True)
    bronze, quarantine = split_log_rows(rows)
    refused_by: dict[str, int] = {}
    judged = gate.admit(bronze, chunk.start, chunk.end)
    # series: the rows' series codes, for the windows (or None).
    admitted, series = judged.admitted, judged.series
    if judged.refused.num_rows:
        quarantine = pa.concat_tables([quarantine, limited_rows(judged.refused, judged.reasons)])
        new = pc.greater_equal(judged.refused.column("offset"), plan.marks[QUARANTINE][chunk.partition])
        refused_by = refused_per_limit(judged.limits.filter(new))  # those quarantine does not hold yet
    # The same rows, in the same order, still with the segments' dictionaries: the Parquet writer takes them as they
    # are (write_data_files), faster than strings.
    bronze, known = enrich(store, plan.pins, chunk.partition, admitted)
    p = chunk.partition

    def first_new(table: str, data: pa.Table) -> int:
        # Rows are in offset order: the new ones are a slice (zero-copy, where a filter copies every label map).
        offsets = data.column("offset").to_numpy(zero_copy_only=False)
        return int(np.searchsorted(offsets, plan.marks[table][p], side="left"))

    def new_for(table: str, data: pa.Table) -> pa.Table:
        return data.slice(first_new(table, data))

    result = ChunkResult()
    bronze_new, quarantine_new = new_for(BRONZE, bronze), new_for(QUARANTINE, quarantine)
    result.files = write_data_files(store, BRONZE, bronze_new) + write_data_files(store, QUARANTINE, quarantine_new)
    start = first_new(WINDOWS, bronze)
    events, series = bronze.slice(start), None if series is None else series[start:]
    late = 0
    if events.num_rows:
        ts_ms = events.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False) // 1000
        appended_ms = events.column("ingested_at").cast(pa.int64()).to_numpy(zero_copy_only=False) // 1000
        result.event_time_max_ms = int(np.max(np.minimum(ts_ms, appended_ms + clock_skew_seconds * 1000)))
        if plan.watermark_ms is not None:
            on_time = ts_ms >= plan.watermark_ms
            late = int(np.count_nonzero(~on_time))
            if late:  # most chunks hold none: a filter would copy every column of every row for nothing
                events, series = events.filter(pa.array(on_time)), None if series is None else series[on_time]
        result.states = aggregate_events(events, WINDOW_SECONDS, series=series)
    unknown = ~known & (bronze.column("offset").to_numpy(zero_copy_only=False) >= plan.marks[BRONZE][p])
    result.counts = {
        BRONZE: bronze_new.num_rows,
        QUARANTINE: quarantine_new.num_rows,
        "late": late,
        "unknown_servers": int(np.count_nonzero(unknown)),
    }
    # The same rows as read, their strings still the segments' dictionaries (cheaper to group by).
    result.touched = _touched_minutes(admitted.slice(first_new(QUERIES, bronze)))
    result.seen = seen_rows(admitted.slice(first_new(LAST_SEEN, bronze)), plan.watched)
    result.refused_by = refused_by
    return result


def limited_rows(events: pa.Table, reasons: pa.Array) -> pa.Table:
    """Quarantine rows (:data:`~metrics_lake.lake_schemas.tables.QUARANTINE_EVENTS`) of valid bronze ``events`` a
    cardinality limit refused: ``raw`` is the event as the JSON contract's object (epoch-ms ``ts``), so it can be
    sent again once the limit allows; ``reasons`` one per event."""
    ts_ms = pc.cast(events.column("ts"), pa.int64()).to_numpy(zero_copy_only=False) // 1000  # bronze ts: µs
    raw = [
        json.dumps(
            {"ts": int(ts), "server": server, "metric": metric, "value": value, "tags": dict(tags or [])},
            separators=(",", ":"),
        )
        for ts, server, metric, value, tags in zip(
            ts_ms,
            events.column("server").to_pylist(),
            events.column("metric").to_pylist(),
            events.column("value").to_pylist(),
            events.column("tags").to_pylist(),
            strict=True,
        )
    ]
    rows = pa.table(
        {
            "topic": events.column("topic"),
            "partition": events.column("partition"),
            "offset": events.column("offset"),
            "raw": pa.array(raw, pa.string()),
            "reason": reasons,
            "ingested_at": events.column("ingested_at"),
            "ingest_date": utc_dates(events.column("ingested_at")),
        }
    )
    return rows.cast(QUARANTINE_EVENTS)


def enrich(store: Store, pins: tuple[Pin, ...], partition: int, bronze: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """``bronze`` rows of ``partition`` with their inventory ``labels`` as of their log position
    (:mod:`metrics_lake.core.speed.enrichment`), and which rows' servers the inventory holds (bool array)."""
    offsets = bronze.column("offset").to_numpy(zero_copy_only=False)
    labels, known = labels_at(store, pins, partition, offsets, bronze.column("server"))
    return bronze.set_column(bronze.schema.get_field_index("labels"), "labels", labels), known


def _touched_minutes(events: pa.Table) -> dict[str, list[int]]:
    """Per metric, the distinct 1-minute window starts (epoch µs, ascending) of ``events`` (columns ``ts`` timestamp
    and ``metric``, plain or dictionary-encoded strings).

    Works on the metric's dictionary codes: the speed layer passes the rows
    as read from the log, whose segments carry a dictionary per column, so
    no metric name is hashed (15 against 2 ms for 500,000 rows, measured).
    Codes and minutes are marked in a table of (code, minute) when that is
    small, as it is for a chunk of the log (a few minutes), else sorted.
    """
    if events.num_rows == 0:
        return {}
    minute_us = WINDOW_SECONDS * 1_000_000
    minutes = events.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False) // minute_us
    first, span = int(minutes.min()), int(minutes.max() - minutes.min()) + 1
    touched: dict[str, set[int]] = {}
    at = 0
    for chunk in events.column("metric").chunks:
        codes, dictionary = dictionary_codes(chunk)
        names = dictionary.to_pylist()
        keys = codes.astype(np.int64) * span + (minutes[at : at + len(chunk)] - first)
        at += len(chunk)
        present = presence(keys, len(names) * span)
        # None: a chunk spanning days of event time (a backfill): sorted instead of a table of every minute.
        distinct = np.unique(keys) if present is None else np.flatnonzero(present)
        for code, minute in zip((distinct // span).tolist(), (distinct % span).tolist(), strict=True):
            touched.setdefault(names[code], set()).add((first + minute) * minute_us)
    return {metric: sorted(starts) for metric, starts in touched.items()}


def _commit_with_positions(store: Store, tables: LatestTables, plan: BatchPlan, name: str, commit) -> bool:
    """Run ``commit(table, advances)`` for ``name`` on its latest snapshot, from ``tables``, if its positions are
    still the plan's. ``commit`` must not ask ``tables`` for ``name`` again: that would move the snapshot it plans
    on, and delta-rs would no longer see a concurrent commit as a conflict.

    Returns False (committing nothing) if the table already holds the
    batch's positions: an earlier attempt of this very batch committed.
    Raises :class:`ConcurrentWriterError` if another writer moved them.
    Retries when a concurrent commit of another kind (compaction) wins.
    """
    advances = plan.advances(name)
    if not advances:
        return False

    def attempt() -> bool:
        table = tables.latest(store, name)
        current = committed_offsets(table, CONSUMER, plan.topic, advances)
        if all((current[p] or 0) >= end for p, end in advances.items()):
            return False
        expected = {p: plan.marks[name][p] for p in advances}
        moved = {p: current[p] for p in advances if (current[p] or 0) > expected[p]}
        if moved:
            raise ConcurrentWriterError(
                f"{name}: another speed layer committed positions {moved} of topic {plan.topic!r} while this one "
                f"planned from {expected}; run one `lake stream` per topic"
            )
        commit(table, advances)
        return True

    return retry_on_conflict(attempt, name)


def _write_window_files(
    store: Store, rows: pa.Table, sealed_before_us: int | None, name: str = WINDOWS
) -> tuple[list[WrittenFile], dict[str, pa.Table]]:
    """Window rows of table ``name`` as files: closed windows (end <= ``sealed_before_us``) one file per day, open
    ones one per window start (of ``rows``: a shard's, when the caller splits them). Returns the files, and the
    rows of each open window's file by its Delta log path (what :class:`~metrics_lake.core.speed.open_windows.OpenWindows`
    keeps)."""
    if rows.num_rows == 0:
        return [], {}
    end_us = rows.column("window_end").cast(pa.int64()).to_numpy(zero_copy_only=False)
    sealed = end_us <= sealed_before_us if sealed_before_us is not None else np.zeros(rows.num_rows, bool)
    files = write_data_files(store, name, rows.filter(pa.array(sealed)))
    open_files = {}
    open_rows = rows.filter(pa.array(~sealed))
    if open_rows.num_rows:
        starts = open_rows.column("window_start").cast(pa.int64()).to_numpy(zero_copy_only=False)
        order = np.argsort(starts, kind="stable")
        if np.any(order[1:] < order[:-1]):  # most batches touch one minute: rows already in order, no copy
            open_rows, starts = open_rows.take(pa.array(order)), starts[order]
        bounds = np.flatnonzero(np.diff(starts)) + 1
        for lo, hi in zip([0, *bounds], [*bounds, len(starts)], strict=True):
            window = open_rows.slice(int(lo), int(hi - lo))
            (data_file,) = write_data_files(store, name, window)  # one window start: one day, one file
            files.append(data_file)
            open_files[data_file.path] = window
    return files, open_files


def _window_rows(store: Store, files: list[DataFile], open_windows: OpenWindows | None) -> list[pa.Table]:
    """The rows of windows-table ``files``: the kept ones (a table per file) if ``open_windows`` holds every file,
    else read (one table)."""
    kept = open_windows.rows_of(files) if open_windows is not None else None
    if kept:
        return kept
    return [read_data_files(store, files, METRIC_WINDOWS_1M)]


#: Rows (held and the batch's) an open-window upsert gives each thread at least; below twice that, one thread.
UPSERT_ROWS_PER_SHARD = 50_000
#: Threads an open-window upsert uses at most: the driver's cores. (Spark's executors are idle while a batch commits.)
UPSERT_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _merge_and_write_windows(
    store: Store, held: list[pa.Table], states: pa.Table, sealed_before_us: int | None
) -> tuple[list[WrittenFile], dict[str, pa.Table]]:
    """The batch's merged ``states`` upserted into the ``held`` window rows and written as files
    (:func:`_write_window_files`: the files, and the rows of each open-window file by its Delta log path).

    With many rows the series are split into shards (:func:`~metrics_lake.core.kernels.windows.series_shards`,
    at least :data:`UPSERT_ROWS_PER_SHARD` rows each, at most :data:`UPSERT_THREADS`), each merged and written on a
    thread of its own, so an open minute is then one file per shard (and a day's windows that this batch closes,
    one sealed file per shard). Why: at 200,000 series the upsert of a
    minute's last seconds takes 0.55–0.75 s on one core (merge 0.4 s, Parquet encoding 0.3 s), nearly all of it in
    numpy and Arrow code that releases the GIL; on two threads 0.36–0.54 s (in process, one-second batches of
    ``FleetSimulator(servers=2000, metrics=100)``). The stable hash puts a series in the same shard every batch, so
    the files the stream kept from the last batch are each one shard and are merged without being split.
    """
    rows = sum(table.num_rows for table in held) + states.num_rows
    shards = max(1, min(UPSERT_THREADS, rows // UPSERT_ROWS_PER_SHARD))
    updated_at = dt.datetime.now(dt.UTC)  # one clock for every shard's touched rows

    def upsert(parts: list[pa.Table], shard_states: pa.Table) -> tuple[list[WrittenFile], dict[str, pa.Table]]:
        existing = pa.concat_tables(parts) if parts else METRIC_WINDOWS_1M.empty_table()
        merged = merge_into_rows(existing, shard_states, WINDOW_SECONDS, updated_at)
        return _write_window_files(store, merged, sealed_before_us)

    if shards == 1:
        return upsert(held, states)
    held_shards: list[list[pa.Table]] = [[] for _ in range(shards)]
    for table in held:  # a file this stream kept from the last batch is one shard already: not copied
        split = group_by_partition(table, series_shards(table.column("metric"), table.column("server"), shards))
        for shard, part in split.items():
            held_shards[shard].append(part)
    state_shards = group_by_partition(states, series_shards(states.column("metric"), states.column("server"), shards))
    with ThreadPoolExecutor(shards, thread_name_prefix="windows-upsert") as pool:
        outcomes = list(
            pool.map(
                lambda shard: upsert(held_shards[shard], state_shards.get(shard, states.slice(0, 0))), range(shards)
            )
        )
    return [f for files, _ in outcomes for f in files], {k: v for _, kept in outcomes for k, v in kept.items()}


def _upsert_windows(
    store: Store,
    tables: LatestTables,
    plan: BatchPlan,
    states: pa.Table,
    watermark: int | None,
    open_windows: OpenWindows | None,
) -> int:
    """Merge the batch's window states into ``metric_windows_1m`` with its positions; returns windows written.

    The rows of the files the states may touch, taken from ``open_windows`` if it holds every one of them, else
    read (:mod:`metrics_lake.core.speed.open_windows`), get the states merged in
    (:func:`~metrics_lake.core.kernels.windows.merge_into_rows`); ``open_windows`` then keeps the open-window files
    this commit wrote.
    """
    written = 0
    sealed_before_us = None if watermark is None else watermark * 1000
    transactions = []
    if watermark is not None and watermark != plan.watermark_ms:
        transactions.append(Transaction(watermark_app_id(plan.topic), watermark, int(time.time() * 1000)))

    def commit(table, advances: dict[int, int]) -> None:
        nonlocal written
        removes, files, open_files = [], [], {}
        if states.num_rows:
            start_us = states.column("window_start").cast(pa.int64())
            lo, hi = pc.min(start_us).as_py(), pc.max(start_us).as_py()
            days = sorted({d.isoformat() for d in pc.unique(utc_dates(states.column("window_start"))).to_pylist()})
            candidates = windowed_files(store, WINDOWS, table, days, lo, hi)
            held = _window_rows(store, candidates, open_windows)
            files, open_files = _merge_and_write_windows(store, held, states, sealed_before_us)
            removes = [remove_action(f) for f in candidates]
            written = states.num_rows  # merged states: one per window the batch touched
        commit_changes(
            table,
            WINDOWS,
            files,
            removes,
            transactions=offset_transactions(CONSUMER, plan.topic, advances) + transactions,
            operation="STREAMING WINDOWS",
        )
        if open_windows is not None and states.num_rows:
            open_windows.remember(open_files)

    return written if _commit_with_positions(store, tables, plan, WINDOWS, commit) else 0


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
    for result in results:  # before any table takes a decision the states hold (metrics_lake.core.speed.cardinality)
        for partition, states in result.limit_states.items():
            save_states(store, CONSUMER, plan.topic, partition, states)
    rows = {}
    for name in (BRONZE, QUARANTINE):
        files = [f for r in results for f in r.files if f.table == name]
        committed = _commit_with_positions(
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
    written = _upsert_windows(store, tables, plan, states, watermark, open_windows)
    timed(WINDOWS)
    touched: dict[str, set[int]] = {}
    for result in results:
        for metric, minutes in result.touched.items():
            touched.setdefault(metric, set()).update(minutes)
    rows[QUERIES] = _upsert_query_results(store, tables, plan, touched, queries, watermark, open_windows)
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

    return written if _commit_with_positions(store, tables, plan, LAST_SEEN, commit) else 0


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

    return recorded if _commit_with_positions(store, tables, plan, ALERTS, commit) else 0


def _upsert_query_results(
    store: Store,
    tables: LatestTables,
    plan: BatchPlan,
    touched: dict[str, set[int]],
    queries: list[StoredQuery],
    watermark: int | None,
    open_windows: OpenWindows | None = None,
) -> int:
    """Evaluate again every stored query window holding a ``touched`` minute and replace its rows; returns rows.

    The windows are read from ``metric_windows_1m`` as committed (this
    batch's states included; files ``open_windows`` keeps are not read
    again), so the rows are those the nightly evaluation would compute from
    the same windows.

    A query whose registry revision ``query_results`` does not hold yet (new
    or changed since the last batch) is *adopted*: every window of it ending
    after a cutoff is evaluated and every row of it ending after the cutoff
    replaced, and the revision recorded (``txn``, same commit). The cutoff is
    where the backfill of this revision stopped if it ran first, else the
    watermark; the backfill (:mod:`metrics_lake.core.maintenance.query_backfill`)
    replaces the closed windows up to its own watermark, so together they
    cover every retained window without a gap, whichever runs first.
    """
    written = 0
    affected = {
        q.name: affected_windows(q, np.array(sorted(touched[q.metric]), np.int64))
        for q in queries
        if q.metric in touched
    }
    affected = {name: starts for name, starts in affected.items() if len(starts)}
    by_name = {q.name: q for q in queries}
    if open_windows is not None:
        open_windows.forget_queries_except(by_name)

    def commit(table, advances: dict[int, int]) -> None:
        nonlocal written
        files, removes, transactions = [], [], []
        starts = dict(affected)
        cutoffs: dict[str, int | None] = {}  # adopted query -> rows ending after this (epoch µs) are replaced
        for query in queries:
            live = table.transaction_version(live_revision_app_id(query.name))  # one lookup per query and batch
            if live is not None and live >= query.revision:
                continue
            progress = query_progress(table, query.name)
            if progress.backfilled_revision == query.revision and progress.backfilled_through_ms is not None:
                cutoffs[query.name] = progress.backfilled_through_ms * 1000
            else:  # before the first watermark no window was closed: adopting evaluates every window there is
                cutoffs[query.name] = None if plan.watermark_ms is None or watermark is None else watermark * 1000
            transactions.append(Transaction(live_revision_app_id(query.name), query.revision))
            if cutoffs[query.name] is None:  # no window is closed yet: adopting covers all, nothing to backfill
                transactions += [
                    Transaction(backfill_revision_app_id(query.name), query.revision),
                    Transaction(backfilled_through_app_id(query.name), 0),
                ]
            adopted = _windows_after(store, tables, query, cutoffs[query.name])
            if len(adopted):
                starts[query.name] = np.union1d(starts.get(query.name, np.zeros(0, np.int64)), adopted)
        if starts or cutoffs:
            chosen = [by_name[name] for name in starts]
            results = QUERY_RESULTS.empty_table()
            if chosen:
                lo = min(int(s[0]) for s in starts.values())
                hi = max(int(s[-1]) + by_name[name].duration_s * 1_000_000 for name, s in starts.items())
                windows = _windows_between(store, tables, {q.metric for q in chosen}, lo, hi, open_windows=open_windows)
                merge = open_windows.merged_minutes if open_windows is not None else None
                states = pa.concat_tables([window_states(windows, q, starts[q.name], merge) for q in chosen])
                results = query_rows(merge_states(states), chosen, None, dt.datetime.now(dt.UTC))
            replaced = pa.table(
                {
                    "query": pa.array([n for n, s in starts.items() for _ in s], pa.string()),
                    "window_start": pa.array(
                        np.concatenate([np.zeros(0, np.int64), *starts.values()]), pa.int64()
                    ).cast(QUERY_RESULTS.field("window_start").type),
                }
            )
            # Only files holding a replaced row are rewritten: files of closed windows (and of other queries)
            # often overlap the range by their statistics but stay as they are.
            rewritten, kept = [], []
            for candidate in _result_files(store, table, starts, cutoffs, by_name):
                keys = read_data_files(store, [candidate], QUERY_RESULTS, ["query", "window_start", "window_end"])
                if not _replaced_mask(keys, replaced, cutoffs).any():
                    continue
                existing = read_data_files(store, [candidate], QUERY_RESULTS)
                rewritten.append(candidate)
                kept.append(existing.filter(pa.array(~_replaced_mask(existing, replaced, cutoffs))))
            rows = pa.concat_tables([*(k.select(QUERY_RESULTS.names) for k in kept), results])
            files, _ = _write_window_files(store, rows, None if watermark is None else watermark * 1000, name=QUERIES)
            removes = [remove_action(f) for f in rewritten]
            written = results.num_rows
        commit_changes(
            table,
            QUERIES,
            files,
            removes,
            transactions=offset_transactions(CONSUMER, plan.topic, advances) + transactions,
            operation="STREAMING QUERIES",
        )

    return written if _commit_with_positions(store, tables, plan, QUERIES, commit) else 0


def _windows_after(store: Store, tables: LatestTables, query: StoredQuery, cutoff_us: int | None) -> np.ndarray:
    """Starts (epoch µs, sorted) of ``query``'s windows ending after ``cutoff_us`` (None: all) that hold a minute
    of the committed windows table."""
    table = tables.latest(store, WINDOWS)
    oldest, newest = window_start_bounds(table)
    if newest is None:
        return np.zeros(0, np.int64)
    lo = oldest if cutoff_us is None else max(oldest, cutoff_us - query.duration_s * 1_000_000)
    if newest < lo:
        return np.zeros(0, np.int64)
    # Only the minutes: reading the window states (sketches) here cost most of a first batch's query results.
    windows = _windows_between(store, tables, {query.metric}, lo, newest + 1, columns=["metric", "window_start"])
    minutes = np.unique(pc.cast(windows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False))
    starts = affected_windows(query, minutes)
    return starts if cutoff_us is None else starts[starts + query.duration_s * 1_000_000 > cutoff_us]


def _result_files(store: Store, table, starts: dict, cutoffs: dict, by_name: dict) -> list:
    """Files of ``query_results`` that may hold a row to replace: by ``window_start`` statistics, of a replaced
    window, or ending after an adopted query's cutoff (a query's old text may have had windows up to a day)."""
    oldest, newest = window_start_bounds(table)
    if newest is None:
        return []
    lows = [int(s[0]) for s in starts.values() if len(s)]
    lows += [oldest if cut is None else cut - 86_400_000_000 for cut in cutoffs.values()]
    if not lows:
        return []
    lo = max(min(lows), oldest)
    hi = max([newest, *(int(s[-1]) for s in starts.values() if len(s))])
    if hi < lo:
        return []
    return windowed_files(store, QUERIES, table, days_between(lo, hi + 1), lo, hi)


def _replaced_mask(rows: pa.Table, replaced: pa.Table, cutoffs: dict[str, int | None]) -> np.ndarray:
    """Which ``query_results`` rows a batch replaces: a re-evaluated ``(query, window_start)``, or a row of an
    adopted query ending after its cutoff."""
    start = pc.cast(rows.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
    keys = pa.table({"query": rows.column("query"), "window_start": pa.array(start), "i": np.arange(rows.num_rows)})
    wanted = pa.table(
        {"query": replaced.column("query"), "window_start": pc.cast(replaced.column("window_start"), pa.int64())}
    )
    mask = np.zeros(rows.num_rows, bool)
    hit = keys.join(wanted, ["query", "window_start"], join_type="left semi").column("i").to_numpy()
    mask[hit] = True
    if cutoffs:
        names = rows.column("query").to_numpy(zero_copy_only=False)
        end = pc.cast(rows.column("window_end"), pa.int64()).to_numpy(zero_copy_only=False)
        for name, cut in cutoffs.items():
            mask |= (names == name) & (end > (-1 if cut is None else cut))
    return mask


def _windows_between(
    store: Store,
    tables: LatestTables,
    metrics: set[str],
    lo_us: int,
    hi_us: int,
    columns: list[str] | None = None,
    open_windows: OpenWindows | None = None,
) -> pa.Table:
    """Window states of ``metrics`` with ``lo_us <= window_start < hi_us`` from the committed windows table.

    ``columns``: those to read, ``metric`` and ``window_start`` among them
    (default: every column of :data:`WINDOW_STATE`). A file's rows of
    ``metrics`` come from ``open_windows`` if it keeps them, else from the
    file with the metric filter pushed into the Parquet reader; ``open_windows``
    then keeps what this call took from each file
    (:mod:`metrics_lake.core.speed.open_windows`), and the rows carry its
    :data:`~metrics_lake.core.speed.open_windows.SOURCE` column (each row's file).
    """
    table = tables.latest(store, WINDOWS)
    candidates = windowed_files(store, WINDOWS, table, days_between(lo_us, hi_us), lo_us, hi_us - 1)
    names = tuple(columns or WINDOW_STATE.names)
    wanted = frozenset(metrics)
    target = pa.schema([METRIC_WINDOWS_1M.field(c) for c in names])
    filesystem, _ = store.arrow_fs()
    of_metrics = pc.field("metric").isin(pa.array(sorted(wanted), pa.string()))
    selections = {}
    for data_file in candidates:
        kept = open_windows.selection_of(data_file, wanted, names) if open_windows is not None else None
        if kept is None:
            kept = read_data_file(data_file, METRIC_WINDOWS_1M, filesystem, list(names), rows=of_metrics)
        selections[data_file.relative] = kept.cast(target)
    if open_windows is not None:
        open_windows.keep_selections(wanted, names, selections)
    if not selections:
        rows = target.empty_table()
    else:  # which file each row came from: the stream reuses minutes merged from the same files before
        rows = with_sources(selections) if open_windows is not None else pa.concat_tables(selections.values())
    start = pc.cast(rows.column("window_start"), pa.int64())
    return rows.filter(pc.and_(pc.greater_equal(start, lo_us), pc.less(start, hi_us)))


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
    ``limits`` as for :func:`plan_batch`.
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
