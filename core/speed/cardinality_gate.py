"""Cardinality limits in the speed layer: each partition's admitted keys per limit hour, kept, found and rebuilt.

The rules are :mod:`metrics_lake.core.kernels.cardinality`'s: per partition and
limit hour, the first ``n`` series of a metric and values of a tag name in log
order are admitted; events over a limit go to ``quarantine_events`` with
reason ``cardinality_limit``. A :class:`LimitGate` applies them to one
partition's valid events, chunk after chunk in offset order (the speed layer
processes a partition's chunks in one task for this), carrying each hour's
:class:`~metrics_lake.core.kernels.cardinality.LimitState`.

**Where a state comes from.** Since an event's fate depends only on the log
before it, a state is a cache of the log, never a source of truth:

1. this process's memory (the stream's previous batch left it here);
2. the state object ``log/_consumers/<group>/<topic>.limits/<partition>/<hour>.arrow``
   (:func:`metrics_lake.core.keys.limit_state_key`): the hour's admitted keys,
   each with its first offset, the offset it covers to and the hour's limits.
   The speed layer replaces it at the end of each batch, *before* committing
   any table (:func:`save_states`), so a table never holds a decision the
   state does not: a batch replayed after a crash cuts it back to its own
   start (:meth:`~metrics_lake.core.kernels.cardinality.LimitState.as_of`);
3. the log itself: with no state object, or one covering less than needed
   (deleted, or written by a batch that crashed before it), the hour is
   rebuilt by judging the records of that partition and hour from the hour's
   first offset (:meth:`~metrics_lake.core.log.index.PartitionIndex.first_appended_at_or_after`).

So a lost checkpoint, a crash at any point or lost state objects refuse
exactly the same events again. An hour is judged by the limits in force when
its state was first made (recorded in the object): a changed limit applies
from the next hour. States of hours older than :data:`KEEP_HOURS` are deleted
when a partition starts a new hour.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core import keys
from metrics_lake.core.kernels.cardinality import (
    KEYS,
    LIMIT_HOUR_US,
    SERIES,
    Admission,
    CardinalityLimits,
    LimitState,
    admit,
    limit_hours,
)
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.progress import window_start_bounds
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import open_table
from metrics_lake.core.tables.snapshots import days_between, read_data_files, windowed_files
from metrics_lake.lake_schemas.errors import AccessDeniedError
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M, Table

__all__ = ["KEEP_HOURS", "GateResult", "LimitGate", "SeriesReport", "load_state", "save_states", "series_report"]

log = logging.getLogger(__name__)

#: Limit hours whose states are kept (older ones are rebuilt from the log if a replay needs them).
KEEP_HOURS = 24
#: States kept in memory per process (partitions × hours a stream works on at once, with room).
CACHED_STATES = 256
#: Records read at a time when an hour is rebuilt from the log.
REBUILD_RECORDS = 500_000

_CACHE: OrderedDict[tuple, LimitState] = OrderedDict()


@dataclass(frozen=True)
class GateResult:
    """One chunk through a :class:`LimitGate`: the ``admitted`` and ``refused`` rows (same columns as the input),
    and for each refused row its ``reason`` and the name of the limit (``limits``), string arrays; ``series``: the
    admitted rows' :func:`~metrics_lake.core.kernels.windows.series_codes` (int64 per row), if the series limit
    computed them (it does for a chunk within one limit hour), else None."""

    admitted: pa.Table
    refused: pa.Table
    reasons: pa.Array
    limits: pa.Array
    series: np.ndarray | None = None


class LimitGate:
    """The cardinality limits of one partition, applied chunk after chunk in offset order.

    ``limits``: those of an hour that has no state yet (an existing hour
    keeps its own). ``group`` names whose reading the states belong to (the
    speed layer's consumer group). Call :meth:`admit` with contiguous chunks;
    :attr:`states` holds every hour's state as of the last chunk's end, for
    :func:`save_states`.
    """

    def __init__(self, store: Store, group: str, topic: str, partition: int, limits: CardinalityLimits) -> None:
        self.store, self.group, self.topic, self.partition, self.limits = store, group, topic, partition, limits
        self.states: dict[int, LimitState] = {}

    def admit(self, events: pa.Table, start: int, end: int) -> GateResult:
        """Judge the valid ``events`` of offsets ``[start, end)`` (bronze rows: ``offset``, ``ingested_at``,
        ``metric``, ``server``, ``tags``, in offset order); returns the :class:`GateResult`."""
        hours = limit_hours(events.column("ingested_at"))
        refused = np.zeros(events.num_rows, bool)
        judged: list[tuple[np.ndarray, Admission]] = []  # (rows, their admission) per hour
        # A chunk's records nearly always share one hour: a min and a max instead of np.unique's sort (7-8 ms per
        # 500,000 records).
        for hour in hours[:1] if len(hours) and hours.min() == hours.max() else np.unique(hours):
            rows = np.flatnonzero(hours == hour)
            state = self._state(int(hour), start)
            admission = admit(state, events if len(rows) == events.num_rows else events.take(pa.array(rows)))
            state.add(admission.keys, end)
            refused[rows] = admission.refused
            judged.append((rows, admission))
            _remember(self._cache_key(int(hour)), state)
        for state in self.states.values():
            state.covered_to = max(state.covered_to, end)  # no record of that hour in the chunk: nothing new
        # The series codes cover the chunk when it is within one hour, judged by one admission (the usual case).
        series = judged[0][1].series if len(judged) == 1 else None
        if not refused.any():  # the usual case: no copy of the events
            no_reasons = pa.array([], pa.string())
            return GateResult(events, events.slice(0, 0), no_reasons, no_reasons, series)
        # The refused rows' reasons in row order: each hour's, placed by row number.
        refused_rows = np.concatenate([rows[admission.refused] for rows, admission in judged])
        order = pa.array(np.argsort(refused_rows, kind="stable"))
        refusals = [pa.array(a.refused) for _, a in judged]
        return GateResult(
            events.filter(pa.array(~refused)),
            events.filter(pa.array(refused)),
            pa.concat_arrays([a.reasons.filter(r) for (_, a), r in zip(judged, refusals, strict=True)]).take(order),
            pa.concat_arrays([a.limits.filter(r) for (_, a), r in zip(judged, refusals, strict=True)]).take(order),
            None if series is None else series[~refused],
        )

    def _cache_key(self, hour: int) -> tuple:
        return (self.store.root, self.group, self.topic, self.partition, hour)

    def _state(self, hour: int, offset: int) -> LimitState:
        """The hour's state as of ``offset``: this gate's, else cached, else stored, else rebuilt from the log."""
        if hour in self.states and self.states[hour].covered_to == offset:
            return self.states[hour]
        cached = _CACHE.get(self._cache_key(hour))
        if cached is not None and cached.covered_to >= offset:
            state = cached.as_of(offset)
        else:
            state = load_state(self.store, self.group, self.topic, self.partition, hour)
            if state is not None and state.covered_to > offset:
                state = state.as_of(offset)
            state = self._rebuilt(hour, state, offset)
        self.states[hour] = state
        return state

    def _rebuilt(self, hour: int, state: LimitState | None, offset: int) -> LimitState:
        """``state`` (None: none stored) brought forward to ``offset`` by judging the log's records of ``hour``."""
        index = SegmentLog(self.store).index(self.topic, self.partition)
        first = index.first_appended_at_or_after(hour // 1000)
        if state is None:
            state = LimitState(self.limits, KEYS.empty_table(), first)
        start = max(state.covered_to, first, index.start_offset)
        if start >= offset or not state.limits.enabled:  # nothing of the hour before, or nothing to judge
            state.covered_to = offset
            return state
        log.warning(
            "cardinality limits: rebuilding the state of %s/%d for the hour from %s from the log, offsets [%d, %d)",
            self.topic,
            self.partition,
            np.datetime64(hour, "us"),
            start,
            offset,
        )
        for lo in range(start, offset, REBUILD_RECORDS):
            hi = min(lo + REBUILD_RECORDS, offset)
            rows = read_range(SegmentLog(self.store), self.topic, self.partition, lo, hi)
            valid = rows.filter(pc.is_null(rows.column("reason")))  # the events the speed layer judges
            events = valid.filter(pa.array(limit_hours(valid.column("ingested_at")) == hour))
            state.add(admit(state, events).keys, hi)
        state.covered_to = offset
        return state


def _remember(key: tuple, state: LimitState) -> None:
    _CACHE[key] = state
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHED_STATES:
        _CACHE.popitem(last=False)


def load_state(store: Store, group: str, topic: str, partition: int, hour: int) -> LimitState | None:
    """The stored state of ``partition``'s limit ``hour`` (epoch µs), or None if there is none."""
    key = keys.limit_state_key(group, topic, partition, hour)
    try:
        with store.open_arrow(key) as source:
            reader = pa.ipc.open_file(source)
            table = reader.read_all()
    except FileNotFoundError:
        return None
    meta = table.schema.metadata or {}
    state = LimitState(CardinalityLimits.from_json(meta[b"limits"]), table.cast(KEYS), json.loads(meta[b"covered_to"]))
    return state


def save_states(store: Store, group: str, topic: str, partition: int, states: dict[int, LimitState]) -> None:
    """Replace the stored states of ``partition``'s hours with ``states`` (hour → state as of a batch's end); when
    a new hour starts, delete the states of hours older than :data:`KEEP_HOURS` before it."""
    prefix = keys.limit_states_prefix(group, topic, partition)
    for hour, state in states.items():
        key = keys.limit_state_key(group, topic, partition, hour)
        is_new = not store.exists(key)
        meta = {b"limits": state.limits.to_json().encode(), b"covered_to": str(state.covered_to).encode()}
        table = state.keys.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
            writer.write_table(table)
        store.replace(key, sink.getvalue())
        if is_new:
            oldest = hour - KEEP_HOURS * LIMIT_HOUR_US
            for name in store.list(prefix):
                stem = name.removesuffix(".arrow")
                if stem.isdigit() and int(stem) < oldest:
                    store.delete(f"{prefix}/{stem}.arrow")


@dataclass(frozen=True)
class SeriesReport:
    """A metric's series as ``lake series`` shows them.

    ``series``: one row per server that reported the metric in ``[lo_us,
    hi_us)`` of ``metric_windows_1m`` (columns ``server``, ``labels``: its
    newest window's labels); ``admitted``: per partition, the series the
    speed layer admitted in the newest limit hour it has a state of, with
    that hour (epoch µs) and its limits (None if this identity may not read
    the log's consumer groups).
    """

    metric: str
    lo_us: int | None
    hi_us: int | None
    series: pa.Table
    admitted: dict[int, tuple[int, int, CardinalityLimits]] | None


def series_report(store: Store, group: str, topic: str, metric: str, hours: float) -> SeriesReport:
    """The series of ``metric`` over the last ``hours`` of its windows (up to the table's newest window) and the
    limit states of ``topic``'s partitions (:class:`SeriesReport`)."""
    table = open_table(store, Table.METRIC_WINDOWS_1M)
    _, newest = window_start_bounds(table)
    series = pa.table(
        {"server": pa.array([], pa.string()), "labels": pa.array([], METRIC_WINDOWS_1M.field("labels").type)}
    )
    lo = hi = None
    if newest is not None:
        hi = newest + 60_000_000
        lo = hi - int(hours * LIMIT_HOUR_US)
        files = windowed_files(store, Table.METRIC_WINDOWS_1M, table, days_between(lo, hi), lo, hi)
        rows = read_data_files(store, files, METRIC_WINDOWS_1M, ["metric", "server", "window_start", "labels"])
        start = pc.cast(rows.column("window_start"), pa.int64())
        rows = rows.filter(
            pc.and_(pc.equal(rows.column("metric"), metric), pc.and_(pc.greater_equal(start, lo), pc.less(start, hi)))
        )
        if rows.num_rows:  # each server's newest window
            rows = rows.sort_by([("server", "ascending"), ("window_start", "descending")])
            server = rows.column("server").to_numpy(zero_copy_only=False)
            first = np.r_[True, server[1:] != server[:-1]]
            series = rows.filter(pa.array(first)).select(["server", "labels"])
    admitted: dict | None = {}
    try:
        for partition in range(SegmentLog(store).partitions(topic)):
            names = [n for n in store.list(keys.limit_states_prefix(group, topic, partition)) if n.endswith(".arrow")]
            if names:
                hour = int(max(names).removesuffix(".arrow"))
                state = load_state(store, group, topic, partition, hour)
                if state is not None:
                    admitted[partition] = (hour, state.counts(SERIES).get(metric, 0), state.limits)
    except AccessDeniedError:  # the analyst identity reads tables, not the log
        admitted = None
    return SeriesReport(metric, lo, hi, series, admitted)
