"""Tumbling-window aggregates over Arrow data: the one window code of the speed layer, recompute, rollups, queries.

A *window state* (:data:`WINDOW_STATE`) is one row per ``(metric, server,
window_start)`` with ``count, sum, min, max`` and a :mod:`~metrics_lake.core.sketch`
of the values. States are mergeable: :func:`merge_states` combines rows with
the same key (counts and sums added, min and max taken, sketches merged), so
partial states from any split of the events — Spark tasks, micro-batches,
the rows already in a table — merge to the state of all the events, exactly
(count, min, max; the sum up to floating-point addition order; the sketch's
bucket counts exactly). :func:`rewindow` moves states to a coarser window
(rollups); :func:`finalize` adds ``window_end``, ``avg`` and the quantiles to
give a row of ``metric_windows_1m`` and the rollup tables.

Everything is vectorised with numpy over dictionary codes; no Python loop
runs per event or per window.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core import sketch
from metrics_lake.schemas import METRIC_WINDOWS_1M, UTC_US

__all__ = [
    "QUANTILES",
    "WINDOW_STATE",
    "aggregate_events",
    "empty_state",
    "finalize",
    "merge_states",
    "rewindow",
    "states_of",
]

#: The quantiles every window row carries, as (column, q).
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))

#: One partial or complete window; ``window_start`` is a UTC instant (µs), ``sketch`` an encoded sketch.
WINDOW_STATE = pa.schema(
    [
        pa.field("metric", pa.string()),
        pa.field("server", pa.string()),
        pa.field("window_start", UTC_US),
        pa.field("count", pa.int64()),
        pa.field("sum", pa.float64()),
        pa.field("min", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("sketch", pa.binary()),
    ]
)

_US_PER_MS = 1000


def empty_state() -> pa.Table:
    """A window-state table with no rows."""
    return WINDOW_STATE.empty_table()


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(int64 code per row, dictionary) of a string column; nulls get their own code."""
    encoded = pc.dictionary_encode(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    if encoded.null_count:
        codes = np.where(np.asarray(encoded.is_valid()), codes, len(encoded.dictionary)).astype(np.int64)
        return codes, pa.concat_arrays([encoded.dictionary, pa.nulls(1, encoded.dictionary.type)])
    return codes.astype(np.int64), encoded.dictionary


def _group(metric, server, start_us: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort order of the rows by key (metric, server, start), the group starts in that order, and each sorted row's group."""
    m_codes, _ = _codes(metric)
    s_codes, _ = _codes(server)
    order = np.lexsort((start_us, s_codes, m_codes))
    m_sorted, s_sorted, w_sorted = m_codes[order], s_codes[order], start_us[order]
    change = (m_sorted[1:] != m_sorted[:-1]) | (s_sorted[1:] != s_sorted[:-1]) | (w_sorted[1:] != w_sorted[:-1])
    starts = np.flatnonzero(np.concatenate([[True], change]))
    marks = np.zeros(len(order), dtype=np.int64)
    marks[starts[1:]] = 1
    return order, starts, np.cumsum(marks)


def _state_table(metric, server, start_us, count, total, low, high, row, keys, counts, groups: int) -> pa.Table:
    return pa.table(
        [
            metric,
            server,
            pa.array(start_us, pa.int64()).cast(UTC_US),
            pa.array(count, pa.int64()),
            pa.array(total, pa.float64()),
            pa.array(low, pa.float64()),
            pa.array(high, pa.float64()),
            sketch.implode(groups, row, keys, counts),
        ],
        schema=WINDOW_STATE,
    )


def aggregate_events(events: pa.Table, window_seconds: int) -> pa.Table:
    """Window states of ``events`` (columns ``ts`` timestamp, ``server``, ``metric``, ``value`` float64).

    ``window_start`` = ``ts`` floored to a multiple of ``window_seconds``
    since the epoch (UTC), so windows align across processes and days.
    Values must be finite (the event contract guarantees it).
    """
    if events.num_rows == 0:
        return empty_state()
    window_us = window_seconds * 1_000_000
    ts_us = events.column("ts").cast(UTC_US).cast(pa.int64()).to_numpy(zero_copy_only=False)
    start_us = ts_us - np.mod(ts_us, window_us)
    values = events.column("value").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    order, starts, group_of_sorted = _group(events.column("metric"), events.column("server"), start_us)
    sorted_values = values[order]
    keys = sketch.bucket_keys(sorted_values)
    row, bucket_keys, bucket_counts = sketch.merge_buckets(group_of_sorted, keys, np.ones(len(keys), np.int64))
    first = pa.array(order[starts])
    return _state_table(
        events.column("metric").take(first),
        events.column("server").take(first),
        start_us[order[starts]],
        np.diff(np.append(starts, len(order))),
        np.add.reduceat(sorted_values, starts),
        np.minimum.reduceat(sorted_values, starts),
        np.maximum.reduceat(sorted_values, starts),
        row,
        bucket_keys,
        bucket_counts,
        len(starts),
    )


def merge_states(states: pa.Table) -> pa.Table:
    """Combine rows of :data:`WINDOW_STATE` with equal ``(metric, server, window_start)`` into one each."""
    if states.num_rows == 0:
        return empty_state()
    states = states.select(WINDOW_STATE.names).cast(WINDOW_STATE).combine_chunks()
    start_us = states.column("window_start").cast(pa.int64()).to_numpy(zero_copy_only=False)
    order, starts, group_of_sorted = _group(states.column("metric"), states.column("server"), start_us)
    if len(starts) == states.num_rows:  # nothing to combine: keep the rows, in key order
        return states.take(pa.array(order))
    group_of_row = np.empty(len(order), dtype=np.int64)
    group_of_row[order] = group_of_sorted
    row, keys, counts = sketch.explode(states.column("sketch"))
    row, keys, counts = sketch.merge_buckets(group_of_row[row], keys, counts)

    def reduce(name: str, ufunc) -> np.ndarray:
        return ufunc.reduceat(states.column(name).to_numpy(zero_copy_only=False)[order], starts)

    first = order[starts]
    return _state_table(
        states.column("metric").take(pa.array(first)),
        states.column("server").take(pa.array(first)),
        start_us[first],
        reduce("count", np.add),
        reduce("sum", np.add),
        reduce("min", np.minimum),
        reduce("max", np.maximum),
        row,
        keys,
        counts,
        len(starts),
    )


def rewindow(states: pa.Table, window_seconds: int) -> pa.Table:
    """States moved to ``window_seconds`` windows (a multiple of theirs) and merged: a rollup."""
    if states.num_rows == 0:
        return empty_state()
    window_us = window_seconds * 1_000_000
    start_us = states.column("window_start").cast(pa.int64()).to_numpy(zero_copy_only=False)
    coarse = pa.array(start_us - np.mod(start_us, window_us), pa.int64()).cast(UTC_US)
    return merge_states(states.set_column(states.schema.get_field_index("window_start"), "window_start", coarse))


def finalize(states: pa.Table, window_seconds: int, updated_at: dt.datetime | None = None) -> pa.Table:
    """Rows of ``metric_windows_1m`` (and the rollups) from merged states: end, avg, p50/p95/p99, day.

    ``updated_at`` defaults to now (UTC). Quantiles come from the sketch
    within :data:`~metrics_lake.core.sketch.RELATIVE_ERROR` of the exact
    values (see :mod:`~metrics_lake.core.sketch`).
    """
    updated_at = updated_at or dt.datetime.now(dt.UTC)
    n = states.num_rows
    row, keys, counts = sketch.explode(states.column("sketch"))
    estimates = sketch.quantiles(
        n,
        row,
        keys,
        counts,
        [q for _, q in QUANTILES],
        low=states.column("min").to_numpy(zero_copy_only=False),
        high=states.column("max").to_numpy(zero_copy_only=False),
    )
    start = states.column("window_start")
    end = pc.add(start, pa.scalar(dt.timedelta(seconds=window_seconds)))
    columns = {
        "metric": states.column("metric"),
        "server": states.column("server"),
        "window_start": start,
        "window_end": end,
        "count": states.column("count"),
        "sum": states.column("sum"),
        "min": states.column("min"),
        "max": states.column("max"),
        "avg": pc.divide(states.column("sum"), pc.cast(states.column("count"), pa.float64())),
        **{name: pa.array(estimates[:, i]) for i, (name, _) in enumerate(QUANTILES)},
        "sketch": states.column("sketch"),
        "updated_at": pa.array(np.full(n, int(updated_at.timestamp() * 1_000_000), np.int64)).cast(UTC_US),
        "event_date": pc.cast(start, pa.date32()),
    }
    return pa.table(columns).select(METRIC_WINDOWS_1M.names).cast(METRIC_WINDOWS_1M)


def states_of(rows: pa.Table) -> pa.Table:
    """The :data:`WINDOW_STATE` columns of window-table rows (to merge new events into them)."""
    return rows.select(WINDOW_STATE.names).cast(WINDOW_STATE)
