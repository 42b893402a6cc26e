"""How the lake writes Parquet: dictionaries cut to the values a column uses."""

from __future__ import annotations

import pyarrow as pa

from metrics_lake.core.parquet_layout import compact_dictionaries
from metrics_lake.lake_schemas.log_records import DICTIONARY_STRING

CODED_TAGS = pa.map_(DICTIONARY_STRING, DICTIONARY_STRING)


def test_a_dictionary_keeps_only_the_values_its_rows_use_in_their_order():
    column = pa.DictionaryArray.from_arrays(pa.array([4, None, 1, 4, 1], pa.int32()), ["a", "b", "c", "d", "e"])
    compact = compact_dictionaries(column)
    assert compact.dictionary.to_pylist() == ["b", "e"] and compact.indices.to_pylist() == [1, None, 0, 1, 0]
    assert compact.to_pylist() == column.to_pylist() and compact.type == column.type
    used = pa.DictionaryArray.from_arrays(pa.array([1, 0], pa.int32()), ["a", "b"])
    assert compact_dictionaries(used) is used  # nothing to cut: the same array
    plain = pa.array(["x", None])
    assert compact_dictionaries(plain) is plain


def test_a_maps_names_and_values_keep_only_the_values_used_and_null_maps_stay_null():
    tags = pa.array(
        [[("dc", "eu"), ("az", "b")], None, [("dc", "us")], [("dc", "eu")]], pa.map_(pa.string(), pa.string())
    )
    names = pa.DictionaryArray.from_arrays(pa.array([0, 2, 0, 0], pa.int32()), ["dc", "rack", "az"])
    values = pa.DictionaryArray.from_arrays(pa.array([3, 0, 1, 3], pa.int32()), ["b", "us", "unused", "eu"])
    coded = pa.MapArray.from_arrays(tags.offsets, names, values, mask=tags.is_null()).cast(CODED_TAGS)
    compact = compact_dictionaries(coded)
    assert compact.type == CODED_TAGS and compact.to_pylist() == tags.to_pylist()
    assert compact.keys.dictionary.to_pylist() == ["dc", "az"]
    assert compact.items.dictionary.to_pylist() == ["b", "us", "eu"]
    sliced = compact_dictionaries(coded.slice(1, 2))  # a slice: its rows read the same
    assert sliced.to_pylist() == tags.slice(1, 2).to_pylist()
