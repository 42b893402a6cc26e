"""Tumbling-window aggregates over Arrow data: the one window code of the speed layer, recompute, rollups, queries.

A *window state* (:data:`WINDOW_STATE`) is one row per ``(metric, server,
window_start)`` with ``count, sum, min, max`` and a :mod:`~metrics_lake.core.kernels.sketch`
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

from metrics_lake.core.kernels import sketch
from metrics_lake.core.kernels.selectors import map_entries
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M
from metrics_lake.lake_schemas.types import TAGS, UTC_US, utc_dates

__all__ = [
    "QUANTILES",
    "WINDOW_STATE",
    "aggregate_events",
    "dictionary_codes",
    "dictionary_encoded",
    "empty_state",
    "finalize",
    "merge_into_rows",
    "merge_states",
    "presence",
    "reduce_at",
    "rewindow",
    "series_codes",
    "series_shards",
    "states_of",
    "string_codes",
]

#: The quantiles every window row carries, as (column, q).
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))

#: One partial or complete window; ``window_start`` is a UTC instant (µs), ``sketch`` an encoded sketch,
#: ``labels`` the series' labels: its newest event's tags with its server's inventory labels over them
#: (:func:`aggregate_events`, :func:`overlay_labels`, :func:`merge_states`).
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
        pa.field("labels", TAGS),
    ]
)

_US_PER_MS = 1000


def empty_state() -> pa.Table:
    """A window-state table with no rows."""
    return WINDOW_STATE.empty_table()


def dictionary_encoded(column: pa.Array) -> pa.DictionaryArray:
    """A string array as dictionary and indices: its own, if it is dictionary-encoded (read with
    ``read_dictionary``: the codes are there already), else Arrow's encoding of it (each string hashed)."""
    return column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)


def dictionary_codes(column: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(indices as a numpy array, dictionary as plain strings) of a string array without nulls
    (:func:`dictionary_encoded`): a code per row and the name each code stands for."""
    encoded = dictionary_encoded(column)
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.cast(pa.string())


def string_codes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An int64 code per row of a string (or dictionary) column, below ``2**31``: equal strings, equal codes; nulls their own."""
    if isinstance(column, pa.ChunkedArray):
        column = column.unify_dictionaries() if pa.types.is_dictionary(column.type) else column
        column = column.combine_chunks()
    encoded = dictionary_encoded(column)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    if encoded.null_count:
        return np.where(np.asarray(encoded.is_valid()), codes, len(encoded.dictionary)).astype(np.int64)
    return codes.astype(np.int64)


def series_codes(metric: pa.ChunkedArray | pa.Array, server: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An int64 code per row of the series (metric, server): equal series, equal codes (:func:`string_codes` of
    each, the metric's in the high 32 bits). Codes are only comparable within one call."""
    return string_codes(metric) << 32 | string_codes(server)


#: Multiplier of the polynomial string hash (FNV-1a's 64-bit prime) and of the mix of two hashes (golden ratio).
_HASH_PRIME, _HASH_MIX = np.uint64(0x100000001B3), np.uint64(0x9E3779B97F4A7C15)


def _string_hashes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A uint64 hash of each value of a string column: ``sum(byte[i] * _HASH_PRIME**i) mod 2**64`` over its UTF-8
    bytes; the same in every process and Python version (unlike ``hash()``). Nulls hash like ``""``."""
    if isinstance(column, pa.ChunkedArray):
        return np.concatenate([_string_hashes(chunk) for chunk in column.chunks] or [np.zeros(0, np.uint64)])
    column = dictionary_encoded(column)  # hash each distinct string once (a series' strings repeat)
    hashes = _distinct_string_hashes(column.dictionary.cast(pa.string()))
    if column.null_count:  # a null: the hash of no bytes
        hashes = np.concatenate([hashes, np.zeros(1, np.uint64)])
        return hashes[pc.fill_null(column.indices, len(hashes) - 1).to_numpy()]
    return hashes[column.indices.to_numpy()]


def _distinct_string_hashes(column: pa.StringArray) -> np.ndarray:
    """:func:`_string_hashes` of a string array without nulls, byte by byte."""
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[column.offset : column.offset + len(column) + 1]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    raw = data[offsets[0] : offsets[-1]]
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets)
    position = np.arange(len(raw), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=1)), _HASH_PRIME))  # uint64 products wrap: mod 2**64
    terms = raw.astype(np.uint64) * np.concatenate([np.ones(1, np.uint64), powers])[position]
    total = np.concatenate([np.zeros(1, np.uint64), np.cumsum(terms, dtype=np.uint64)])
    return total[offsets[:-1] + lengths] - total[offsets[:-1]]  # a row's sum: differences of the running sum


def series_shards(metric: pa.ChunkedArray | pa.Array, server: pa.ChunkedArray | pa.Array, shards: int) -> np.ndarray:
    """A shard in ``[0, shards)`` for each row's series ``(metric, server)`` (string columns): an int64 array.

    A stable hash of both strings, so a series falls in the same shard in
    every table, batch and process; series spread evenly over the shards
    (the hash's high bits, after a multiplicative mix, Knuth TAOCP 6.4).
    Each distinct string is hashed once: 40 ms for a million rows of 10,000
    servers and 100 metrics, 37 ms for 200,000 rows of as many servers. A
    null hashes like an empty string (a fleet-wide stored query's server).
    """
    with np.errstate(over="ignore"):
        mixed = (_string_hashes(metric) * _HASH_MIX ^ _string_hashes(server)) * _HASH_MIX
    return ((mixed >> np.uint64(32)) % np.uint64(shards)).astype(np.int64)


def presence(values: np.ndarray, domain: int) -> np.ndarray | None:
    """Which of ``[0, domain)`` the int array ``values`` holds (a bool table of the domain), or None when the
    domain is much larger than the array: then a table of it would cost more than hashing or sorting the values."""
    if domain > 2 * len(values) + 65_536:
        return None
    present = np.zeros(domain, np.bool_)
    present[values] = True
    return present


def _ranks(values: np.ndarray, domain: int | None = None) -> tuple[np.ndarray, int]:
    """(rank of each value among the distinct values, number of distinct values) of an int64 array.

    Hashes the values (Arrow's dictionary encoding) and sorts only the
    distinct ones: for millions of rows with far fewer distinct keys this is
    several times faster than sorting the rows. If every value is known to
    lie in ``[0, domain)`` and the domain is not much larger than the array,
    marks the values present in a table of the domain and counts instead
    (the same ranks; 4x faster for 6.9 M (series, window) keys of a day).
    """
    present = None if domain is None else presence(values, domain)
    if present is not None:
        rank = np.cumsum(present, dtype=np.int64)
        return rank[values] - 1, int(rank[-1]) if domain else 0
    encoded = pc.dictionary_encode(pa.array(values, pa.int64()))
    distinct = encoded.dictionary.to_numpy()
    rank = np.empty(len(distinct), np.int64)
    rank[np.argsort(distinct)] = np.arange(len(distinct), dtype=np.int64)
    return rank[encoded.indices.to_numpy(zero_copy_only=False)], len(distinct)


def _group(
    metric, server, start_us: np.ndarray, series: np.ndarray | None = None
) -> tuple[np.ndarray, int, np.ndarray]:
    """Group rows by key (metric, server, window start): ``(group of each row, groups, first row of each group)``.

    Groups are numbered in key order (series code, start), so a series'
    windows are adjacent and in time order. ``series``: the rows'
    :func:`series_codes`, if the caller has them.
    """
    series, series_count = _ranks(series_codes(metric, server) if series is None else series)
    window, windows = _ranks(start_us)
    # Keys are dense: series * windows + window < series count * windows, at most the row count squared.
    group, groups = _ranks(series * windows + window, series_count * windows)
    first = np.full(groups, len(group), np.int64)
    np.minimum.at(first, group, np.arange(len(group), dtype=np.int64))
    return group, groups, first


def _latest(group: np.ndarray, groups: int, position: np.ndarray | None) -> np.ndarray:
    """Per group, the row with the highest ``position`` (int64; None: the last row)."""
    position = np.arange(len(group), dtype=np.int64) if position is None else position
    best = np.full(groups, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(best, group, position)
    rows = np.flatnonzero(position == best[group])
    latest = np.empty(groups, np.int64)
    latest[group[rows]] = rows
    return latest


def _labels(table: pa.Table, rows: np.ndarray) -> pa.Array | pa.ChunkedArray:
    """The series labels of ``rows`` of ``table``: its ``labels`` over its ``tags`` (:func:`overlay_labels`) where
    it has both columns, else the one it has, else nulls."""
    # Only the taken rows' maps are decoded, where their names and values are dictionary-encoded (the speed layer's).
    taken = [table.column(c).take(pa.array(rows)).cast(TAGS) for c in ("tags", "labels") if c in table.column_names]
    if not taken:
        return pa.nulls(len(rows), TAGS)
    return taken[0] if len(taken) == 1 else overlay_labels(*taken)


def overlay_labels(tags: pa.Array | pa.ChunkedArray, labels: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Per row, the ``tags`` map with the ``labels`` map over it (a label wins over a tag of the same name, as a
    Prometheus target label over a scraped one), entries sorted by name; null where both are null.

    Both are ``map<string, string>`` arrays of equal length (an event's own
    tags and its server's inventory labels).
    """
    tag_row, tag_key, tag_value = map_entries(tags)
    label_row, label_key, label_value = map_entries(labels)
    if tags.null_count == len(tags):  # no tags at all (most agents): the labels as they are
        return labels.combine_chunks() if isinstance(labels, pa.ChunkedArray) else labels
    codes = pc.dictionary_encode(pa.concat_arrays([tag_key, label_key])).indices.to_numpy(zero_copy_only=False)
    width = int(codes.max()) + 1 if len(codes) else 1
    shadowed = np.isin(tag_row * width + codes[: len(tag_row)], label_row * width + codes[len(tag_row) :])
    entries = pa.table(
        {
            "row": np.concatenate([tag_row[~shadowed], label_row]),
            "key": pa.concat_arrays([tag_key.filter(pa.array(~shadowed)), label_key]),
            "value": pa.concat_arrays([tag_value.filter(pa.array(~shadowed)), label_value]),
        }
    ).sort_by([("row", "ascending"), ("key", "ascending")])
    n = len(tags)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.bincount(entries.column("row").to_numpy(), minlength=n), out=offsets[1:])
    valid = pc.or_(pc.is_valid(tags), pc.is_valid(labels))
    merged = pa.MapArray.from_arrays(
        pa.array(offsets), entries.column("key").combine_chunks(), entries.column("value").combine_chunks()
    )
    if isinstance(valid, pa.ChunkedArray):
        valid = valid.combine_chunks()
    return pc.if_else(valid, merged, pa.nulls(n, TAGS))


def _state_table(metric, server, start_us, count, total, low, high, row, keys, counts, groups: int, labels) -> pa.Table:
    return pa.table(
        [
            metric.cast(pa.string()),  # a no-op for strings; decodes dictionary-encoded reads
            server.cast(pa.string()),
            pa.array(start_us, pa.int64()).cast(UTC_US),
            pa.array(count, pa.int64()),
            pa.array(total, pa.float64()),
            pa.array(low, pa.float64()),
            pa.array(high, pa.float64()),
            sketch.implode(groups, row, keys, counts),
            labels,
        ],
        schema=WINDOW_STATE,
    )


def aggregate_events(events: pa.Table, window_seconds: int, *, series: np.ndarray | None = None) -> pa.Table:
    """Window states of ``events`` (columns ``ts`` timestamp, ``server``, ``metric``, ``value`` float64; optional
    ``tags`` and ``labels`` maps and ``offset`` int64; strings, map names and values plain or dictionary-encoded).

    ``series``: the events' :func:`series_codes`, when the caller computed
    them already (the speed layer's cardinality limits do): the states are
    the same, without hashing every metric and server name again.

    ``window_start`` = ``ts`` floored to a multiple of ``window_seconds``
    since the epoch (UTC), so windows align across processes and days.
    Values must be finite (the event contract guarantees it). A window's
    ``labels`` are its newest event's: the highest ``offset`` (a server's
    events are in one log partition), else the last row: its ``labels`` over
    its ``tags`` (:func:`overlay_labels`); null without either column.
    """
    if events.num_rows == 0:
        return empty_state()
    window_us = window_seconds * 1_000_000
    ts_us = events.column("ts").cast(UTC_US).cast(pa.int64()).to_numpy(zero_copy_only=False)
    start_us = ts_us - np.mod(ts_us, window_us)
    values = events.column("value").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    group, groups, first = _group(events.column("metric"), events.column("server"), start_us, series)
    row, bucket_keys, bucket_counts = sketch.merge_buckets(
        group, sketch.bucket_keys(values), np.ones(len(values), np.int64)
    )
    labels = pa.nulls(groups, TAGS)
    if "labels" in events.column_names or "tags" in events.column_names:
        offsets = events.column("offset").to_numpy(zero_copy_only=False) if "offset" in events.column_names else None
        labels = _labels(events, _latest(group, groups, offsets))
    return _state_table(
        events.column("metric").take(first),
        events.column("server").take(first),
        start_us[first],
        np.bincount(group, minlength=groups),
        np.bincount(group, weights=values, minlength=groups),  # adds in row order, as a sequential sum would
        reduce_at(np.minimum, np.inf, group, groups, values),
        reduce_at(np.maximum, -np.inf, group, groups, values),
        row,
        bucket_keys,
        bucket_counts,
        groups,
        labels,
    )


def reduce_at(ufunc: np.ufunc, identity, group: np.ndarray, groups: int, values: np.ndarray) -> np.ndarray:
    """``ufunc`` (np.minimum or np.maximum) of ``values`` per group (``group``: one in ``[0, groups)`` per value);
    ``identity`` (of the values' type) where a group holds none."""
    out = np.full(groups, identity)
    ufunc.at(out, group, values)
    return out


def _conform(states: pa.Table) -> pa.Table:
    """``states`` cast to :data:`WINDOW_STATE`, keeping dictionary-encoded ``metric``/``server`` as they are."""
    states = states.select(WINDOW_STATE.names)
    target = [
        states.schema.field(f.name) if pa.types.is_dictionary(states.schema.field(f.name).type) else f
        for f in WINDOW_STATE
    ]
    return states.cast(pa.schema(target)).unify_dictionaries().combine_chunks()


def merge_states(states: pa.Table, position: np.ndarray | None = None) -> pa.Table:
    """Combine rows of :data:`WINDOW_STATE` with equal ``(metric, server, window_start)`` into one each.

    The merged row's ``labels`` are those of the row with the highest
    ``position`` (int64 per row; None: the last row, so callers put newer
    states after older ones).
    """
    if states.num_rows == 0:
        return empty_state()
    states = _conform(states)
    start_us = states.column("window_start").cast(pa.int64()).to_numpy(zero_copy_only=False)
    group, groups, first = _group(states.column("metric"), states.column("server"), start_us)
    if groups == states.num_rows:  # nothing to combine: keep the rows, in key order
        order = np.empty(groups, np.int64)
        order[group] = np.arange(groups, dtype=np.int64)
        return states.take(pa.array(order)).cast(WINDOW_STATE)  # dictionary-encoded strings decoded
    alone = np.bincount(group, minlength=groups)[group] == 1
    if np.count_nonzero(alone) * 4 >= len(alone):
        # Windows held by one row are kept as they are; only the others' sketches are decoded and merged (the
        # chunks of a log partition share only the minutes at their edges).
        shared = np.flatnonzero(~alone)
        merged = merge_states(states.take(pa.array(shared)), None if position is None else position[shared])
        parts = pa.concat_tables([states.filter(pa.array(alone)).cast(WINDOW_STATE), merged])
        # Both parts are in key order; groups are numbered in it, and merged's are the shared ones, ascending.
        order = np.argsort(np.concatenate([group[alone], np.unique(group[shared])]), kind="stable")
        return parts.take(pa.array(order))
    row, keys, counts = sketch.explode(states.column("sketch"))
    row, keys, counts = sketch.merge_buckets(group[row], keys, counts)

    def column(name: str) -> np.ndarray:
        return states.column(name).to_numpy(zero_copy_only=False)

    return _state_table(
        states.column("metric").take(first),
        states.column("server").take(first),
        start_us[first],
        np.bincount(group, weights=column("count"), minlength=groups).astype(np.int64),
        np.bincount(group, weights=column("sum"), minlength=groups),
        reduce_at(np.minimum, np.inf, group, groups, column("min")),
        reduce_at(np.maximum, -np.inf, group, groups, column("max")),
        row,
        keys,
        counts,
        groups,
        _labels(states, _latest(group, groups, position)),
    )


def rewindow(states: pa.Table, window_seconds: int) -> pa.Table:
    """States moved to ``window_seconds`` windows (a multiple of theirs) and merged: a rollup (labels of the
    newest finer window)."""
    if states.num_rows == 0:
        return empty_state()
    window_us = window_seconds * 1_000_000
    start_us = states.column("window_start").cast(pa.int64()).to_numpy(zero_copy_only=False)
    coarse = pa.array(start_us - np.mod(start_us, window_us), pa.int64()).cast(UTC_US)
    moved = states.set_column(states.schema.get_field_index("window_start"), "window_start", coarse)
    return merge_states(moved, start_us)


def finalize(states: pa.Table, window_seconds: int, updated_at: dt.datetime | None = None) -> pa.Table:
    """Rows of ``metric_windows_1m`` (and the rollups) from merged states: end, avg, p50/p95/p99, day.

    ``updated_at`` defaults to now (UTC). Quantiles come from the sketch
    within :data:`~metrics_lake.core.kernels.sketch.RELATIVE_ERROR` of the exact
    values (see :mod:`~metrics_lake.core.kernels.sketch`).
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
        "labels": states.column("labels"),
        "updated_at": pa.array(np.full(n, int(updated_at.timestamp() * 1_000_000), np.int64)).cast(UTC_US),
        "event_date": utc_dates(start),
    }
    return pa.table(columns).select(METRIC_WINDOWS_1M.names).cast(METRIC_WINDOWS_1M)


def _buckets_by_target(state_row: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The order (int64 positions) that puts exploded state buckets (``state_row``: each bucket's state, ascending)
    in the order of their states' ``target`` rows, each state's buckets kept in key order.

    The batch's buckets then come sorted by (target row, key): with the held rows' buckets, two sorted runs,
    which :func:`~metrics_lake.core.kernels.sketch.merge_buckets` merges in linear time, where the batch's own
    order made a run of each state. A speed-layer upsert of the 12 M-event benchmark (25,000 held rows, 50,000
    states, 1.3 M buckets): 102.5 -> 93.8 ms in process (min of 5).
    """
    states = np.argsort(target, kind="stable")
    per_state = np.bincount(state_row, minlength=len(target))
    first = np.cumsum(per_state) - per_state  # each state's first bucket
    lengths = per_state[states]
    starts = np.cumsum(lengths) - lengths  # where each state's buckets go
    return np.repeat(first[states] - starts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def merge_into_rows(
    rows: pa.Table, states: pa.Table, window_seconds: int, updated_at: dt.datetime | None = None
) -> pa.Table:
    """``rows`` of a windows table with the merged ``states`` merged in: an upsert, one row per key.

    ``rows``: :data:`~metrics_lake.lake_schemas.tables.METRIC_WINDOWS_1M`
    rows with unique ``(metric, server, window_start)``; ``states``: merged
    :data:`WINDOW_STATE` rows (unique keys, :func:`merge_states`), newer
    than ``rows``. A row whose key ``states`` holds gets exactly what
    ``finalize(merge_states(concat([states_of(row), state])))`` gives it (the
    sum adds old + new, as there; the labels are the state's, the newer);
    other rows stay as they are, ``updated_at`` included; keys new to
    ``rows`` are appended in ``states``' order. Rows keep their order.

    The speed layer's upsert of an open minute (every batch touches most of
    its windows) without regrouping the rows it already holds: their
    sketches are decoded once and the batch's buckets are inserted into
    them (:func:`~metrics_lake.core.kernels.sketch.merge_buckets`'s sorted
    head), where :func:`merge_states` would group, sort and re-encode both.
    """
    if rows.num_rows == 0:  # nothing held (a new lake, a catch-up's first batch): every key is new
        return finalize(states, window_seconds, updated_at)  # the states' sketches kept, not decoded and re-encoded
    n, m = rows.num_rows, states.num_rows
    key = ["metric", "server", "window_start"]
    held = pa.table({k: rows.column(k).cast(WINDOW_STATE.field(k).type) for k in key})
    found = held.append_column("row", pa.array(np.arange(n))).join(
        states.select(key).append_column("state", pa.array(np.arange(m))), key, join_type="inner"
    )
    matched = found.column("state").to_numpy()
    target = np.empty(m, np.int64)  # each state's row in the result
    target[matched] = found.column("row").to_numpy()
    added = np.ones(m, bool)
    added[matched] = False
    new = np.flatnonzero(added)
    target[new] = n + np.arange(len(new), dtype=np.int64)
    total = n + len(new)
    touched = np.zeros(total, bool)
    touched[target] = True

    def held_then(column: pa.ChunkedArray, fill) -> np.ndarray:
        """A column of ``rows`` as numpy, then ``fill`` for each new key."""
        values = column.to_numpy(zero_copy_only=False)
        return np.concatenate([values, np.full(len(new), fill, values.dtype)])

    def held_and_new(name: str, type_: pa.DataType) -> pa.Array:
        """Column ``name`` of ``rows``, then of the new keys' states (Arrow)."""
        parts = (rows.column(name), states.column(name).take(pa.array(new)))
        return pa.concat_arrays([part.combine_chunks().cast(type_) for part in parts])

    def state(name: str) -> np.ndarray:
        return states.column(name).to_numpy(zero_copy_only=False)

    count, total_sum = held_then(rows.column("count"), 0), held_then(rows.column("sum"), 0.0)
    count[target] += state("count")  # targets are distinct: plain fancy indexing adds once each
    total_sum[target] += state("sum")
    low, high = held_then(rows.column("min"), np.inf), held_then(rows.column("max"), -np.inf)
    low[target] = np.minimum(low[target], state("min"))
    high[target] = np.maximum(high[target], state("max"))
    held_row, held_keys, held_counts = sketch.explode(rows.column("sketch"))
    state_row, state_keys, state_counts = sketch.explode(states.column("sketch"))
    pick = _buckets_by_target(state_row, target)
    row, keys, counts = sketch.merge_buckets(  # the held buckets are a sorted head the batch's are inserted into
        np.concatenate([held_row, target[state_row[pick]]]),
        np.concatenate([held_keys, state_keys[pick]]),
        np.concatenate([held_counts, state_counts[pick]]),
    )
    estimates = sketch.quantiles(total, row, keys, counts, [q for _, q in QUANTILES], low=low, high=high)
    source = np.concatenate([np.arange(n, dtype=np.int64), np.zeros(len(new), np.int64)])
    source[target] = n + np.arange(m, dtype=np.int64)  # the row of concat(rows, states) each result row takes
    labels = pa.concat_arrays(
        [rows.column("labels").combine_chunks().cast(TAGS), states.column("labels").combine_chunks().cast(TAGS)]
    )
    start = held_and_new("window_start", UTC_US)
    now_us = int((updated_at or dt.datetime.now(dt.UTC)).timestamp() * 1_000_000)
    columns = {
        "metric": held_and_new("metric", pa.string()),
        "server": held_and_new("server", pa.string()),
        "window_start": start,
        "window_end": pc.add(start, pa.scalar(dt.timedelta(seconds=window_seconds))),
        "count": pa.array(count, pa.int64()),
        "sum": pa.array(total_sum),
        "min": pa.array(low),
        "max": pa.array(high),
        "avg": pa.array(total_sum / count),
        **{
            name: pa.array(np.where(touched, estimates[:, i], held_then(rows.column(name), np.nan)))
            for i, (name, _) in enumerate(QUANTILES)
        },
        "sketch": sketch.implode(total, row, keys, counts),
        "labels": labels.take(pa.array(source)),
        "updated_at": pa.array(
            np.where(touched, now_us, held_then(pc.cast(rows.column("updated_at"), pa.int64()), 0))
        ).cast(UTC_US),
        "event_date": utc_dates(start),
    }
    return pa.table(columns).select(METRIC_WINDOWS_1M.names).cast(METRIC_WINDOWS_1M)


def states_of(rows: pa.Table) -> pa.Table:
    """The :data:`WINDOW_STATE` columns of window-table rows (to merge new events into them)."""
    return rows.select(WINDOW_STATE.names).cast(WINDOW_STATE)
