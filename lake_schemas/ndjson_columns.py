"""The event contract checked on the Arrow columns of a parsed block of JSON Lines: step 4 of :mod:`.ndjson`.

:func:`check_columns` takes the table ``pyarrow.json`` made of a block of
lines (whatever types it inferred: a column may be missing, of the wrong
type, or hold nulls) and returns which rows keep the contract, and those
rows as log records. It checks types, nulls, ranges, the metric pattern,
the server length, finite values, string-to-string tags and ISO-8601 times
with a zone, agreeing with the per-line validator
(:func:`metrics_lake.lake_schemas.contract.to_log_records`) on which rows
pass; the rows it rejects go to that validator, which gives the reason.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.lake_schemas.contract import MAX_TS_MS, MIN_TS_MS, metrics_ok, servers_ok
from metrics_lake.lake_schemas.log_records import CODED_LOG_RECORD, LOG_RECORD

__all__ = ["check_columns"]


_ZONE = r"(Z|z|[+-]\d\d(:?\d\d)?)$"


def _column(table: pa.Table, name: str) -> pa.Array | None:
    if name not in table.column_names:
        return None
    column = table.column(name).combine_chunks()
    return None if pa.types.is_null(column.type) else column


def _valid(column: pa.Array) -> np.ndarray:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    return column.is_valid().to_numpy(zero_copy_only=False)


def _times(column: pa.Array | None, ok: np.ndarray) -> np.ndarray:
    """Epoch ms of each row (0 where not acceptable); clears ``ok`` for rows the contract rejects."""
    ms = np.zeros(len(ok), dtype=np.int64)
    if column is None:
        ok[:] = False
    elif pa.types.is_integer(column.type):
        ok &= _valid(column)
        ms = column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    elif pa.types.is_string(column.type):
        ok &= _valid(column) & np.asarray(pc.fill_null(pc.match_substring_regex(column, _ZONE), False))
        try:
            parsed = pc.cast(pc.if_else(pa.array(ok), column, "1970-01-01T00:00:00Z"), pa.timestamp("ms", "UTC"))
            ms = parsed.cast(pa.int64()).to_numpy(zero_copy_only=False)
        except pa.ArrowInvalid:
            ok[:] = False  # some string Arrow cannot read: leave all string times to the per-line validator
    else:  # floats and booleans are wrong types
        ok[:] = False
    ok &= (ms >= MIN_TS_MS) & (ms < MAX_TS_MS)
    return ms


def _strings(column: pa.Array | None, ok: np.ndarray) -> pa.Array:
    if column is None or not pa.types.is_string(column.type):
        ok[:] = False
        return pa.nulls(len(ok), pa.string())
    ok &= _valid(column)
    return column


def _per_value(column: pa.Array, check) -> tuple[np.ndarray, pa.DictionaryArray]:
    """``check`` (a compute function on distinct values) per row, False for nulls (servers and metrics repeat),
    and ``column`` dictionary-encoded (int32 indices, nulls where it is null)."""
    encoded = pc.dictionary_encode(column)
    verdict = pc.fill_null(check(encoded.dictionary), False).to_numpy(zero_copy_only=False)
    indices = encoded.indices
    result = (
        verdict[indices.fill_null(0).to_numpy(zero_copy_only=False)] if len(verdict) else np.zeros(len(column), bool)
    )
    return result & _valid(indices), encoded


def _tags(column: pa.Array | None, ok: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The tags (``kind``: the ``tags`` type of :data:`LOG_RECORD`, or of :data:`CODED_LOG_RECORD`, whose names and
    values are dictionary-encoded) of the rows left in ``ok`` from the parsed ``tags`` (objects of string to string, or null), after
    clearing ``ok`` for the rows whose tags the contract rejects.

    The last check of a block: the map is built for the accepted rows only, since filtering a map array
    afterwards costs more than the whole build (25 against 15 ns a row, measured).
    """
    if column is None:
        return pa.nulls(int(ok.sum()), kind)
    present = _valid(column)
    if not pa.types.is_struct(column.type):
        ok &= ~present  # a string, number or list where an object belongs
        return pa.nulls(int(ok.sum()), kind)
    children = [column.field(i) for i in range(column.type.num_fields)]
    for child in children:
        if not pa.types.is_string(child.type):
            ok &= ~(present & _valid(child))
        # A null field is either a key that line lacks (fine) or an explicit null (rejected): the per-line
        # validator tells them apart, so such rows go there.
        ok &= ~(present & ~_valid(child))
    names = pa.array([column.type.field(i).name for i in range(column.type.num_fields)], pa.string())
    # After the checks above, an accepted row with tags has a string for every field: when every accepted row has
    # tags (the usual block: an agent's tags are fixed), each carries every name.
    if children and all(pa.types.is_string(c.type) for c in children) and present[ok].all():
        field, item, offsets = _fields_in_order(children, ok)
        mask = None
    else:
        accepted = np.flatnonzero(ok)
        rank = np.cumsum(ok) - 1  # a row's place among the accepted rows
        rows, fields, items = [], [], []
        for k, child in enumerate(children):
            if pa.types.is_string(child.type):
                where = np.flatnonzero(present & _valid(child) & ok)
                rows.append(rank[where])
                fields.append(np.full(len(where), k, dtype=np.int32))
                items.append(child if len(where) == len(ok) else child.take(pa.array(where)))
        row = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        field = np.concatenate(fields) if fields else np.zeros(0, np.int32)
        item = pa.concat_arrays(items) if items else pa.array([], pa.string())
        if len(items) > 1:  # entries row by row, in the order of the object's fields: the order they were joined in
            order = np.argsort(row, kind="stable")  # sorted runs, one per field: timsort merges them
            row, field, item = row[order], field[order], item.take(pa.array(order))
        offsets = np.zeros(len(accepted) + 1, dtype=np.int32)
        np.cumsum(np.bincount(row, minlength=len(accepted)), out=offsets[1:])
        mask = pa.array(~present[accepted])
    if pa.types.is_dictionary(kind.item_type):
        # The names of the object's fields are a dictionary already, which each entry's field number indexes.
        keys, item = pa.DictionaryArray.from_arrays(pa.array(field), names), pc.dictionary_encode(item)
    else:
        keys = names.take(pa.array(field))
    return pa.MapArray.from_arrays(pa.array(offsets), keys, item, mask=mask).cast(kind)


def _fields_in_order(children: list[pa.Array], ok: np.ndarray) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """The map entries of the rows left in ``ok``, each of which has a value for every one of ``children`` (the
    tags' fields, strings): (each entry's field number (int32), its value, the rows' offsets (int32)).

    A row's entries are its object's fields in order, laid out directly: no ranks, counts or sort.
    """
    n, width = len(ok), len(children)
    accepted = np.arange(n) if ok.all() else np.flatnonzero(ok)
    field = np.tile(np.arange(width, dtype=np.int32), len(accepted))
    if width == 1:
        item = children[0] if len(accepted) == n else children[0].take(pa.array(accepted))
    else:
        entry = (accepted[:, None] + np.arange(width)[None, :] * n).ravel()  # row by row, field by field
        item = pa.concat_arrays(children).take(pa.array(entry))
    return field, item, np.arange(len(accepted) + 1, dtype=np.int32) * width


def check_columns(table: pa.Table, dictionaries: bool = False) -> tuple[np.ndarray, pa.Table]:
    """(accepted mask, the accepted lines' rows) for one parsed block (``table``: what ``pyarrow.json`` read, one
    row per line): :data:`~metrics_lake.lake_schemas.log_records.LOG_RECORD` rows, or
    :data:`~metrics_lake.lake_schemas.log_records.CODED_LOG_RECORD` ones if ``dictionaries``."""
    schema = CODED_LOG_RECORD if dictionaries else LOG_RECORD
    n = table.num_rows
    ok = np.ones(n, dtype=bool)
    ms = _times(_column(table, "ts"), ok)
    server = _strings(_column(table, "server"), ok)
    ok &= pc.fill_null(servers_ok(server), False).to_numpy(zero_copy_only=False)  # faster than per distinct value
    metric = _strings(_column(table, "metric"), ok)
    metric_ok, coded_metric = _per_value(metric, metrics_ok)
    ok &= metric_ok
    if dictionaries:
        server, metric = pc.dictionary_encode(server), coded_metric
    value = _column(table, "value")
    if value is None or not (pa.types.is_integer(value.type) or pa.types.is_floating(value.type)):
        ok[:] = False
        value = pa.nulls(n, pa.float64())
    value = value.cast(pa.float64())
    ok &= _valid(value) & np.asarray(pc.fill_null(pc.is_finite(value), False))
    tags = _tags(_column(table, "tags"), ok, schema.field("tags").type)  # the last check: the accepted rows' tags
    ts = pa.array(ms, pa.int64()).cast(LOG_RECORD.field("ts").type)
    if not ok.all():  # most blocks are all valid: a filter would copy every column for nothing
        keep = pa.array(ok)
        ts, server, metric, value = ts.filter(keep), server.filter(keep), metric.filter(keep), value.filter(keep)
    records = pa.table(
        {
            "ts": ts,
            "server": server,
            "metric": metric,
            "value": value,
            "tags": tags,
            "raw": pa.nulls(int(ok.sum()), pa.string()),
            "reason": pa.nulls(int(ok.sum()), pa.string()),
        },
        schema=schema,
    )
    return ok, records
