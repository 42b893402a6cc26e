"""``lake replay``: re-read a range of the log and run it through the bronze path again.

A range is given per partition as offsets ``[start, end)``, or as event
times, which the partition index turns into a conservative offset range
(:meth:`metrics_lake.core.log.index.PartitionIndex.offset_for_time`), after which rows
are filtered to ``from_time <= ts < to_time`` exactly.

The rows go through the speed layer's own functions
(:func:`metrics_lake.core.speed.chunk_processing.split_log_rows`, its cardinality limits as it judged those
positions (:mod:`metrics_lake.core.speed.cardinality_gate`), the inventory labels the
speed layer pinned for those positions (:mod:`metrics_lake.core.speed.enrichment`), then data files and one
Delta commit per table and chunk). Idempotence comes from the log position:
before writing, every row whose ``(topic, partition, offset)`` is already in
the target table is dropped (a left anti join on the offsets of the chunk's
partition), so replaying a range that
is already ingested commits nothing and leaves every table at its version.
Into a new table (``into``), the range's valid events are written to a
table created with the ``bronze_events`` schema.

Windows are not touched: a replay that adds missing rows to bronze is
followed by the nightly recompute of those days, which rebuilds windows
from bronze.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.cardinality import CardinalityLimits
from metrics_lake.core.keys import check_name
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.cardinality_gate import LimitGate
from metrics_lake.core.speed.chunk_processing import enrich, limited_rows, split_log_rows
from metrics_lake.core.speed.enrichment import read_pins
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table, table_dataset
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.tables import TABLES, Table

BRONZE, QUARANTINE = Table.BRONZE_EVENTS, Table.QUARANTINE_EVENTS
CHUNK_RECORDS = 500_000
POSITION = ["topic", "partition", "offset"]


@dataclass(frozen=True)
class ReplayRange:
    """Offsets ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int


@dataclass
class ReplayStats:
    """What a replay read and wrote: records read, rows written per table, rows skipped as already present."""

    read: int = 0
    written: dict[str, int] = field(default_factory=dict)
    already_present: int = 0
    commits: int = 0


def replay_ranges(
    log: SegmentLog,
    topic: str,
    *,
    from_offset: int | None = None,
    to_offset: int | None = None,
    from_time_ms: int | None = None,
    to_time_ms: int | None = None,
    partitions: list[int] | None = None,
) -> list[ReplayRange]:
    """Per-partition offset ranges for the bounds given (offsets win over times; unset = the whole log).

    Offsets are clamped to what the log retains; empty ranges are dropped.
    """
    ranges = []
    for p in partitions if partitions is not None else range(log.partitions(topic)):
        index = log.index(topic, p)
        start = index.start_offset
        if from_offset is not None:
            start = max(start, from_offset)
        elif from_time_ms is not None:
            start = max(start, index.offset_for_time(from_time_ms))
        end = index.next_offset
        if to_offset is not None:
            end = min(end, to_offset)
        elif to_time_ms is not None:  # the last segment that can hold an event before to_time_ms
            candidates = [s.end_offset for s in index.segments if s.min_ts is not None and s.min_ts < to_time_ms]
            end = min(end, max(candidates, default=start))
        if end > start:
            ranges.append(ReplayRange(p, start, end))
    return ranges


def _existing_positions(store: Store, table: str, topic: str, part: ReplayRange) -> pa.Table:
    """Positions of ``part`` that ``table`` (which exists) already holds."""
    offset = pc.field("offset")
    where = (pc.field("topic") == topic) & (pc.field("partition") == part.partition)
    where &= (offset >= part.start) & (offset < part.end)
    return table_dataset(store, table).to_table(columns=POSITION, filter=where)


def _missing(rows: pa.Table, existing: pa.Table) -> pa.Table:
    """Rows of one (topic, partition) chunk whose offset is not in ``existing`` (a left anti join on offset)."""
    if existing.num_rows == 0 or rows.num_rows == 0:
        return rows
    return rows.filter(pc.invert(pc.is_in(rows.column("offset"), value_set=existing.column("offset"))))


def _time_filter(rows: pa.Table, from_time_ms: int | None, to_time_ms: int | None) -> pa.Table:
    if from_time_ms is None and to_time_ms is None:
        return rows
    ts = rows.column("ts").cast(pa.int64())  # null for rejects: kept by offset only
    keep = pc.is_null(ts)
    inside = pa.array([True] * rows.num_rows)
    if from_time_ms is not None:
        inside = pc.and_(inside, pc.greater_equal(ts, from_time_ms))
    if to_time_ms is not None:
        inside = pc.and_(inside, pc.less(ts, to_time_ms))
    return rows.filter(pc.or_(keep, pc.fill_null(inside, False)))


def replay(
    log: SegmentLog,
    topic: str,
    ranges: list[ReplayRange],
    *,
    into: str | None = None,
    from_time_ms: int | None = None,
    to_time_ms: int | None = None,
    progress: Callable[[ReplayRange, int], None] | None = None,
    limits: CardinalityLimits | None = None,
) -> ReplayStats:
    """Replay ``ranges`` of ``topic`` into bronze/quarantine, or into the new table ``into``.

    Events go where the speed layer put them: an hour the speed layer judged
    keeps its limits; ``limits`` are those of an hour it did not (default
    none: :func:`~metrics_lake.core.speed.batch_plan.configured_limits` gives the settings').
    ``progress(range, records_done)`` is called after every chunk. Returns
    what was read and written. Raises :class:`~metrics_lake.lake_schemas.errors.InputError` if ``into`` is a
    declared table other than ``bronze_events`` (replay writes bronze rows).
    """
    store = log.store
    if into is not None:
        check_name("--into", into)
    if into is not None and into in TABLES and into != BRONZE:
        raise InputError(f"--into {into}: replay writes bronze rows; name a new table or {BRONZE}")
    targets = {BRONZE: into or BRONZE}
    if into is None:
        targets[QUARANTINE] = QUARANTINE
    for table in targets.values():
        ensure_table(store, table, like=BRONZE if table == into else None)
    app_id = f"replay-{uuid.uuid4().hex}"
    pins = read_pins(store, CONSUMER, topic)  # the labels the speed layer joined (or will join) these events with
    stats = ReplayStats(written={t: 0 for t in targets.values()})
    for part in ranges:
        gate = LimitGate(store, CONSUMER, topic, part.partition, limits or CardinalityLimits())
        for lo in range(part.start, part.end, CHUNK_RECORDS):
            chunk = ReplayRange(part.partition, lo, min(lo + CHUNK_RECORDS, part.end))
            every = read_range(log, topic, part.partition, chunk.start, chunk.end)
            judged = gate.admit(split_log_rows(every)[0], chunk.start, chunk.end)  # limits count every event
            rows = _time_filter(every, from_time_ms, to_time_ms)
            stats.read += rows.num_rows
            bronze, quarantine = split_log_rows(rows)
            refused = judged.refused.column("offset")
            replayed = pc.is_in(refused, value_set=bronze.column("offset"))
            bronze = bronze.filter(pc.invert(pc.is_in(bronze.column("offset"), value_set=refused)))
            limited = limited_rows(judged.refused.filter(replayed), judged.reasons.filter(replayed))
            quarantine = pa.concat_tables([quarantine, limited])
            bronze, _ = enrich(store, pins, part.partition, bronze)
            for kind, data in ((BRONZE, bronze), (QUARANTINE, quarantine)):
                if kind not in targets:
                    continue
                table = targets[kind]
                missing = _missing(data, _existing_positions(store, table, topic, chunk))
                stats.already_present += data.num_rows - missing.num_rows
                if missing.num_rows == 0:
                    continue
                files = write_data_files(store, table, missing)
                commit_files(store, table, [f.add_action() for f in files], app_id=app_id, batch_id=stats.commits)
                stats.commits += 1
                stats.written[table] += missing.num_rows
            if progress is not None:
                progress(part, chunk.end - part.start)
    return stats
