"""How the lake writes Parquet: per-column encodings chosen from the schema, for log segments and table files.

Parquet writers try a dictionary for every column by default and fall back
when it grows too big; for offsets, timestamps and measured values, which
never repeat, that costs time for nothing. Measured on 300,000 bronze rows
(``pyarrow`` 26, zstd): the default takes 0.34 s for 4.06 MB; dictionaries
only for string columns take 0.15 s for 2.96 MB, with statistics still
written.

Floating-point columns are plain (zstd), not ``BYTE_STREAM_SPLIT``:
measured with ``bench/storage_density.py`` and ``bench/same_file.py``'s
files, byte-stream-split made node_exporter values larger (bronze 1.43 ->
1.50 B/sample; windows 38.6 -> 41.4 B/window), windows of random values
larger too (81.8 -> 91.6 B/window), and saved 0.1 B/event only on bronze of
random values (6.29 -> 6.18 for ``value``). Spark's vectorised Parquet
reader cannot decode it either (``Unsupported encoding: BYTE_STREAM_SPLIT``).

64-bit integers and timestamps (offsets, event and append times, window
starts, counts) are ``DELTA_BINARY_PACKED``: a file's offsets are dense and
its times close together, so the differences take a few bits each where
zstd over plain 8-byte values leaves about one byte. Measured on a 500,000
row bronze file of ``bench/same_file.py`` (random values): 9.50 -> 8.34
B/row, written in the same time. Sorting the file by series instead made it
larger (10.8 B/row): offsets and the simulator's jittered times lose their
order, and random values gain nothing from neighbours. Every reader of the
lake's tables decodes it (Parquet 2.0 encoding: arrow-rs for delta-rs,
DuckDB, Polars, Spark's vectorised reader).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = [
    "HIGH_CARDINALITY",
    "compact_dictionaries",
    "has_dictionary",
    "is_string",
    "leaves",
    "used_values",
    "write_options",
]

#: String columns whose values rarely repeat: no dictionary for them.
HIGH_CARDINALITY = frozenset({"raw"})


def leaves(field: pa.Field, prefix: str = "") -> list[tuple[str, pa.DataType]]:
    """The Parquet columns of ``field``: (dotted path as Parquet names it, Arrow type) per leaf; a map's are
    ``<name>.key_value.key`` and ``<name>.key_value.value``, a struct's ``<name>.<child>``."""
    path = f"{prefix}{field.name}"
    if pa.types.is_map(field.type):
        return [(f"{path}.key_value.key", field.type.key_type), (f"{path}.key_value.value", field.type.item_type)]
    if pa.types.is_struct(field.type):
        return [leaf for child in field.type for leaf in leaves(child, f"{path}.")]
    return [(path, field.type)]


def write_options(schema: pa.Schema, *, statistics: bool = True) -> dict:
    """Keyword arguments for ``pyarrow.parquet.write_table`` of data with ``schema`` (zstd, per-column encodings).

    ``statistics``: Parquet column statistics (min, max, null count) for
    the top-level columns that are not nested, which are the ones readers
    skip row groups by and the ones Delta statistics cover
    (:func:`metrics_lake.core.tables.data_files.footer_stats` reads them
    back); none for map and struct leaves (tags, labels), which no reader
    filters on: measured on a 500,000-row bronze file, 8 of the 20 ms the
    writer spent on statistics. None either for dictionary-encoded columns,
    whose statistics Arrow computes from the decoded strings (``server`` of
    500,000 bronze rows: 16.9 ms written with them, 4.5 without); their
    bounds are the dictionary's (:func:`metrics_lake.core.tables.data_files.dictionary_bounds`).
    False: no statistics at all. Dictionary-encoded string columns are
    written with Parquet's dictionary encoding, straight from their indices.
    """
    columns = [leaf for field in schema for leaf in leaves(field)]
    strings = [path for path, kind in columns if is_string(kind)]
    deltas = [path for path, kind in columns if pa.types.is_int64(kind) or pa.types.is_timestamp(kind)]
    plain = [f.name for f in schema if not pa.types.is_nested(f.type) and not pa.types.is_dictionary(f.type)]
    return {
        "compression": "zstd",
        "use_dictionary": [path for path in strings if path.split(".")[0] not in HIGH_CARDINALITY],
        "column_encoding": dict.fromkeys(deltas, "DELTA_BINARY_PACKED"),
        "write_statistics": plain if statistics else False,
    }


def is_string(kind: pa.DataType) -> bool:
    """Whether ``kind`` holds strings: ``string``, ``large_string``, or a dictionary of either."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def has_dictionary(field: pa.Field) -> bool:
    """Whether any Parquet column of ``field`` (its own, or a map's keys or values) is dictionary-encoded."""
    return any(pa.types.is_dictionary(kind) for _, kind in leaves(field))


def used_values(array: pa.DictionaryArray) -> pa.Array:
    """The values of ``array``'s dictionary that its rows use, in the dictionary's order (a dictionary may hold
    more): a count of the indices, not a comparison per row."""
    return array.dictionary.filter(pa.array(_used(array)))


def _used(array: pa.DictionaryArray) -> np.ndarray:
    """Per dictionary value (bool), whether a non-null row of ``array`` indexes it."""
    indices = array.indices.drop_null().to_numpy(zero_copy_only=False)
    return np.bincount(indices, minlength=len(array.dictionary)) > 0


def compact_dictionaries(column: pa.Array) -> pa.Array:
    """``column`` with its dictionary (or its map's keys' and values' dictionaries) cut to the values its rows use,
    in their order there; any other column as it is.

    Arrow's Parquet writer writes a dictionary-encoded column's dictionary
    whole, and its indices with as many bits as the dictionary's size needs:
    the importer's records of one partition index the dictionary of their
    whole chunk, every partition's servers (a segment of the 12 M-event
    benchmark: 2,501 servers in its dictionary, 625 used, 3.4 % more bytes).
    A map's entries beyond a sliced map's rows count as used (unread, not
    wrong).
    """
    if pa.types.is_dictionary(column.type):
        return _compact(column)
    if pa.types.is_map(column.type) and any(
        pa.types.is_dictionary(t) for t in (column.type.key_type, column.type.item_type)
    ):
        keys, items = column.keys, column.items  # the whole entries, which the offsets index
        mask = column.is_null() if column.null_count else None
        offsets = pa.array(column.offsets.to_numpy(zero_copy_only=False))  # a slice's, unsliced: Arrow wants so
        rebuilt = pa.MapArray.from_arrays(offsets, _compact(keys), _compact(items), mask=mask)
        return rebuilt.cast(column.type)  # the type's field names and nullability, as given
    return column


def _compact(array: pa.Array) -> pa.Array:
    """A dictionary array with only the dictionary values its indices use (nulls stay null); others as they are."""
    if not pa.types.is_dictionary(array.type):
        return array
    used = _used(array)
    if used.all():
        return array
    remap = (np.cumsum(used) - 1).astype(array.type.index_type.to_pandas_dtype())
    mask = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else None
    indices = pa.array(
        remap[array.indices.fill_null(0).to_numpy(zero_copy_only=False)], array.type.index_type, mask=mask
    )
    return pa.DictionaryArray.from_arrays(indices, array.dictionary.filter(pa.array(used)))
