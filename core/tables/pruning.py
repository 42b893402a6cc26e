"""Skipping a Delta snapshot's files and rows with predicates: partition pruning, min/max statistics, row filters.

A query's conjunctive predicates (``column op value``, AND-ed) are used
three times, each time only where the answer is exact:

1. **Partition pruning** (:func:`keep_files`): a file whose partition value
   cannot satisfy a predicate on a partition column is not read.
2. **File skipping**: a file whose Delta statistics (``minValues``,
   ``maxValues``, ``nullCount``; PROTOCOL.md "Per-file Statistics") prove
   that no row satisfies a predicate is not read, the rule Delta-Spark's
   data skipping applies. Bounds are used conservatively: a timestamp's
   maximum counts as 1 ms later (Delta keeps milliseconds, delta-rs
   truncates), a string maximum of 32 characters or more is ignored
   (writers may truncate long strings to a prefix), a file without
   statistics is read.
3. **Row filtering** (:func:`row_filter`): the surviving files are read with
   a pyarrow expression, which also skips Parquet row groups by their own
   statistics, so only matching rows leave the reader.

Only types whose comparison semantics pyarrow shares with Spark SQL are
supported (:func:`supported`): strings (binary order), integers, booleans,
dates and timestamps. Floating-point columns are left to the engine:
Spark orders NaN above every number and equal to itself, pyarrow treats
every comparison with NaN as false.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["OPS", "Predicate", "keep_files", "row_filter", "supported"]

#: Operators a predicate may have: comparisons, membership, null tests.
OPS = ("=", "<", "<=", ">", ">=", "in", "is_null", "is_not_null")
#: A string statistic at least this long may be a truncated prefix (Delta-Spark's default prefix length is 32).
TRUNCATED_STRING_CHARS = 32


@dataclass(frozen=True)
class Predicate:
    """``column op value``: ``op`` one of :data:`OPS`; ``value`` a scalar, a tuple for ``in``, None for null tests.

    Values are Python objects of the column's type: ``str``, ``int``,
    ``bool``, ``datetime.date``, timezone-aware ``datetime.datetime``.
    """

    column: str
    op: str
    value: Any = None

    def __str__(self) -> str:
        if self.op in ("is_null", "is_not_null"):
            return f"{self.column} {self.op.replace('_', ' ').upper()}"
        if self.op == "in":
            return f"{self.column} IN ({', '.join(repr(v) for v in self.value)})"
        return f"{self.column} {self.op} {self.value!r}"


def _value_fits(kind: pa.DataType, value: Any) -> bool:
    if value is None:
        return False
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return isinstance(value, str)
    if pa.types.is_boolean(kind):
        return isinstance(value, bool)
    if pa.types.is_integer(kind):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_timestamp(kind):
        return isinstance(value, dt.datetime) and value.tzinfo is not None
    if pa.types.is_date(kind):
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    return False


def supported(schema: pa.Schema, predicate: Predicate) -> bool:
    """Whether ``predicate`` can be applied exactly to a table of ``schema`` (module docstring: the types)."""
    if predicate.op not in OPS or predicate.column not in schema.names:
        return False
    kind = schema.field(predicate.column).type
    if predicate.op in ("is_null", "is_not_null"):
        return not pa.types.is_floating(kind) and not pa.types.is_nested(kind)
    values = predicate.value if predicate.op == "in" else (predicate.value,)
    if predicate.op == "in" and not (isinstance(values, tuple) and values):
        return False
    return all(_value_fits(kind, v) for v in values)


def _expression(predicate: Predicate, kind: pa.DataType) -> pc.Expression:
    field = pc.field(predicate.column)
    if predicate.op == "is_null":
        return field.is_null()
    if predicate.op == "is_not_null":
        return field.is_valid()
    if predicate.op == "in":
        return field.isin(pa.array(predicate.value, kind))
    value = pa.scalar(predicate.value, kind)
    return {
        "=": field == value,
        "<": field < value,
        "<=": field <= value,
        ">": field > value,
        ">=": field >= value,
    }[predicate.op]


def row_filter(predicates: list[Predicate], schema: pa.Schema) -> pc.Expression | None:
    """The AND of ``predicates`` as a pyarrow expression over columns of ``schema`` (None if there are none)."""
    expression = None
    for predicate in predicates:
        term = _expression(predicate, schema.field(predicate.column).type)
        expression = term if expression is None else expression & term
    return expression


def _partition_mask(actions: pa.Table, predicate: Predicate, kind: pa.DataType) -> np.ndarray:
    """True where a file's partition value satisfies ``predicate`` (exact: every row of the file has that value)."""
    values = actions.column(f"partition.{predicate.column}")
    if values.type != kind:
        values = pc.cast(values.cast(pa.string()), kind)
    positions = pa.table({predicate.column: values, "_position": pa.array(np.arange(actions.num_rows))})
    kept = positions.filter(_expression(predicate, kind)).column("_position").to_numpy()
    mask = np.zeros(actions.num_rows, dtype=bool)
    mask[kept] = True
    return mask


def _stat(actions: pa.Table, prefix: str, column: str, kind: pa.DataType) -> pa.ChunkedArray | None:
    name = f"{prefix}.{column}"
    if name not in actions.column_names:
        return None
    values = actions.column(name)
    if pa.types.is_timestamp(kind) and pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("us", tz="UTC"))
        kind = values.type
    return values if values.type == kind else pc.cast(values, kind, safe=False)


def _stats_mask(actions: pa.Table, predicate: Predicate, kind: pa.DataType) -> np.ndarray:
    """True where a file's statistics allow a row matching ``predicate`` (or the file has none)."""
    rows = actions.num_rows
    if predicate.op in ("is_null", "is_not_null"):
        nulls = _stat(actions, "null_count", predicate.column, pa.int64())
        if nulls is None:
            return np.ones(rows, dtype=bool)
        if predicate.op == "is_null":
            possible = pc.greater(nulls, 0)
        else:
            records = actions.column("num_records").cast(pa.int64())
            possible = pc.less(nulls, records)
        return pc.fill_null(possible, True).to_numpy(zero_copy_only=False)
    low = _stat(actions, "min", predicate.column, kind)
    high = _stat(actions, "max", predicate.column, kind)
    if low is None or high is None:
        return np.ones(rows, dtype=bool)
    if pa.types.is_timestamp(kind):
        high = pc.add(high, pa.scalar(1000, pa.duration("us")))  # Delta keeps ms: the true maximum may be later
        kind = high.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        high = pc.if_else(pc.greater_equal(pc.utf8_length(high), TRUNCATED_STRING_CHARS), None, high)
    values = predicate.value if predicate.op == "in" else (predicate.value,)
    possible = None
    for value in values:
        scalar = pa.scalar(value, kind) if not pa.types.is_timestamp(kind) else pa.scalar(value, low.type)
        term = {
            "=": pc.and_kleene(pc.less_equal(low, scalar), pc.greater_equal(high, scalar)),
            "in": pc.and_kleene(pc.less_equal(low, scalar), pc.greater_equal(high, scalar)),
            "<": pc.less(low, scalar),
            "<=": pc.less_equal(low, scalar),
            ">": pc.greater(high, scalar),
            ">=": pc.greater_equal(high, scalar),
        }[predicate.op]
        possible = term if possible is None else pc.or_kleene(possible, term)
    possible = pc.fill_null(possible, True).to_numpy(zero_copy_only=False)
    nulls = _stat(actions, "null_count", predicate.column, pa.int64())
    if nulls is not None:  # a column that is null in every row matches no comparison
        records = actions.column("num_records").cast(pa.int64())
        possible &= ~pc.fill_null(pc.equal(nulls, records), False).to_numpy(zero_copy_only=False)
    return possible


def keep_files(
    actions: pa.Table, predicates: list[Predicate], schema: pa.Schema, partition_columns: list[str]
) -> np.ndarray:
    """Which files of a snapshot may hold rows matching every predicate: a boolean mask, one per file.

    ``actions``: delta-rs ``get_add_actions(flatten=True)`` (columns
    ``partition.<c>``, ``num_records``, ``null_count.<c>``, ``min.<c>``,
    ``max.<c>``); ``schema``: the table's; every predicate must be
    :func:`supported`. Partition predicates are exact; statistics predicates
    are conservative (module docstring).
    """
    keep = np.ones(actions.num_rows, dtype=bool)
    for predicate in predicates:
        if not keep.any():
            break
        kind = schema.field(predicate.column).type
        if predicate.column in partition_columns:
            keep &= _partition_mask(actions, predicate, kind)
        else:
            keep &= _stats_mask(actions, predicate, kind)
    return keep
