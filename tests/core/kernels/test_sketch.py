"""The exponential-histogram sketch: the relative-error bound holds on any data, merging is exact and deterministic."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from metrics_lake.core.kernels import sketch


def exact_quantile(values: list[float], q: float) -> float:
    """The value the sketch estimates: rank floor(q * (n - 1)) of the sorted values (0-based)."""
    ordered = sorted(values)
    return ordered[math.floor(q * (len(ordered) - 1))]


def sketch_of(values) -> pa.BinaryArray:
    keys = sketch.bucket_keys(np.asarray(values, dtype=np.float64))
    row, keys, counts = sketch.merge_buckets(np.zeros(len(keys), np.int64), keys, np.ones(len(keys), np.int64))
    return sketch.implode(1, row, keys, counts)


def estimate(encoded: pa.Array, qs: list[float]) -> np.ndarray:
    row, keys, counts = sketch.explode(encoded)
    row, keys, counts = sketch.merge_buckets(row, keys, counts)
    return sketch.quantiles(len(encoded), row, keys, counts, qs)


DISTRIBUTIONS = {
    "lognormal latency": lambda rng: rng.lognormal(3, 0.6, 5000),
    "utilisation with zeros": lambda rng: np.clip(rng.normal(20, 30, 5000), 0, 100),
    "counter": lambda rng: 1e6 + np.cumsum(rng.poisson(300, 5000)).astype(float),
    "signed": lambda rng: rng.normal(0, 1e-3, 5000),
    "extremes": lambda rng: np.array([-1e300, -3.5, -1e-300, 0.0, 5e-324, 1e-12, 1.0, 7.25, 1e300] * 50),
    "one value": lambda rng: np.full(10, 42.0),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_every_quantile_is_within_the_relative_error_bound(name):
    values = DISTRIBUTIONS[name](np.random.default_rng(7)).tolist()
    qs = [0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]
    got = estimate(sketch_of(values), qs)[0]
    for q, value in zip(qs, got, strict=True):
        exact = exact_quantile(values, q)
        bound = max(sketch.RELATIVE_ERROR * abs(exact) * (1 + 1e-12), sketch.MIN_INDEXABLE)  # subnormals: absolute
        assert abs(value - exact) <= bound, (q, value, exact)


def test_merging_sketches_equals_sketching_the_union_byte_for_byte():
    rng = np.random.default_rng(3)
    parts = [rng.lognormal(2, 1, size) for size in (1, 10, 1000)]
    union = sketch_of(np.concatenate(parts))
    rows, keys, counts = sketch.explode(pa.concat_arrays([sketch_of(p) for p in parts]))
    merged = sketch.implode(1, *sketch.merge_buckets(np.zeros(len(keys), np.int64), keys, counts))
    assert merged.equals(union)  # deterministic: the same bytes however the values were split


def test_keys_sort_like_the_values_they_stand_for():
    values = np.array([-1e10, -2.0, -1.0, -1e-5, 0.0, 1e-5, 1.0, 2.0, 1e10])
    keys = sketch.bucket_keys(values)
    assert list(np.argsort(keys, kind="stable")) == list(range(len(values)))
    assert np.all(np.abs(sketch.representatives(keys) - values) <= sketch.RELATIVE_ERROR * np.abs(values))


def test_a_column_round_trips_with_nulls_and_empty_rows():
    column = pa.concat_arrays([sketch_of([1.0, 2.0]), pa.nulls(1, pa.binary()), sketch_of([3.0])])
    rows, keys, counts = sketch.explode(pa.chunked_array([column.slice(0, 2), column.slice(2)]))
    assert rows.tolist() == [0, 0, 2] and counts.tolist() == [1, 1, 1]
    assert np.isnan(estimate(column, [0.5])[1, 0])
    with pytest.raises(ValueError, match="not an exphist"):
        sketch.explode(pa.array([b"\x00" * 5]))


def test_a_null_row_that_keeps_bytes_is_left_out():
    # Arrow allows a null row to span bytes (a filter or if_else can leave them): they are not part of any sketch.
    valid = pa.concat_arrays([sketch_of([1.0, 2.0]), sketch_of([5.0]), sketch_of([3.0])])
    _, offsets, data = valid.buffers()
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes())
    column = pa.BinaryArray.from_buffers(pa.binary(), 3, [validity, offsets, data], null_count=1)
    rows, keys, counts = sketch.explode(column.slice(0))
    expected_rows, expected_keys, _ = sketch.explode(pa.array([valid[0].as_py(), None, valid[2].as_py()]))
    assert rows.tolist() == expected_rows.tolist() == [0, 0, 2]
    assert keys.tolist() == expected_keys.tolist() == sketch.bucket_keys(np.array([1.0, 2.0, 3.0])).tolist()


def test_estimates_clamped_to_min_and_max_stay_ordered_and_within_the_bound():
    values = [99.9, 100.0, 100.0, 100.0]  # the top bucket's representative lies above 100
    row, keys, counts = sketch.explode(sketch_of(values))
    row, keys, counts = sketch.merge_buckets(row, keys, counts)
    raw = sketch.quantiles(1, row, keys, counts, [0.0, 0.99])[0]
    assert raw[1] > 100.0
    clamped = sketch.quantiles(1, row, keys, counts, [0.0, 0.5, 0.99], low=np.array([99.9]), high=np.array([100.0]))[0]
    assert 99.9 <= clamped[0] <= clamped[1] <= clamped[2] <= 100.0
    for q, value in zip([0.0, 0.5, 0.99], clamped, strict=True):
        assert abs(value - exact_quantile(values, q)) <= sketch.RELATIVE_ERROR * exact_quantile(values, q)


@pytest.mark.parametrize("seed", range(40))
def test_merge_buckets_equals_a_dictionary_of_sums_whatever_the_order(seed):
    # Shapes the callers produce: any order; a merged run (a table's rows) then a tail (a batch's states),
    # with tails shorter and longer than the run; counts of one (raw events) or more.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    row = rng.integers(0, 30, n)
    keys = rng.integers(-5, 6, n).astype(np.int32) * (1 << 20) // 4 + rng.integers(-3, 3, n).astype(np.int32)
    counts = np.ones(n, np.int64) if seed % 3 == 0 else rng.integers(1, 9, n)
    if seed % 2:  # a merged run first, of a random share of the pairs
        # Long runs too: the run-and-tail path takes a tail of at most a fifth.
        cut = int(n - rng.integers(0, n // 5 + 1)) if seed % 4 == 1 else int(rng.integers(0, n + 1))
        run = sketch.merge_buckets(row[:cut], keys[:cut], counts[:cut])
        rest = (row[cut:], keys[cut:], counts[cut:])
        if seed % 8 in (1, 3):  # a merged rest too: the upsert's batch buckets, in the order of their target rows
            rest = sketch.merge_buckets(*rest)
        row, keys, counts = (np.concatenate([a, b]) for a, b in zip(run, rest, strict=True))
    expected: dict[tuple[int, int], int] = {}
    for r, k, c in zip(row.tolist(), keys.tolist(), counts.tolist(), strict=True):
        expected[(r, k)] = expected.get((r, k), 0) + c
    merged_row, merged_keys, merged_counts = sketch.merge_buckets(row, keys, counts)
    got = list(zip(merged_row.tolist(), merged_keys.tolist(), merged_counts.tolist(), strict=True))
    assert got == sorted((r, k, c) for (r, k), c in expected.items())
    assert merged_keys.dtype == np.int32 and merged_counts.dtype == np.int64


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("rows", [1, 7, 1 << 20, 1 << 29])
def test_raw_events_merge_the_same_packed_in_32_bits_or_not(monkeypatch, name, rows):
    # Raw events (counts of one) are packed into uint32 when their rows and distinct keys fit: the result must be
    # the int64 packing's. Rows up to 2**29 leave too few bits for some distributions' keys: the int64 way then.
    rng = np.random.default_rng(len(name) * rows)
    keys = sketch.bucket_keys(DISTRIBUTIONS[name](rng))
    row = rng.integers(0, rows, len(keys))
    counts = np.ones(len(keys), np.int64)
    narrowed = []
    real = sketch._narrow
    monkeypatch.setattr(sketch, "_narrow", lambda *args: narrowed.append(real(*args)) or narrowed[-1])
    monkeypatch.setattr(sketch, "NARROW_PAIRS", 1 << 40)
    wide = sketch.merge_buckets(row, keys, counts)
    assert narrowed == []
    monkeypatch.setattr(sketch, "NARROW_PAIRS", 1)
    narrow = sketch.merge_buckets(row, keys, counts)
    distinct = len(np.unique(keys))
    fits = (rows - 1).bit_length() + (distinct - 1).bit_length() <= 32
    assert [n is not None for n in narrowed] == [fits]
    for got, expected in zip(narrow, wide, strict=True):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_keys_at_both_ends_of_their_range_pack_into_32_bits(monkeypatch):
    # |key| < 2**21 (KEY_BITS): the table over the keys' span never needs more than 2**22 entries.
    monkeypatch.setattr(sketch, "NARROW_PAIRS", 1)
    keys = np.array([(1 << 21) - 1, 5, -(1 << 21) + 1, 5, 0], np.int32)
    row = np.array([3, 0, 3, 0, 0], np.int64)
    assert sketch._narrow(row, keys) is not None
    merged = sketch.merge_buckets(row, keys, np.ones(5, np.int64))
    assert [a.tolist() for a in merged] == [[0, 0, 3, 3], [0, 5, -(1 << 21) + 1, (1 << 21) - 1], [1, 2, 1, 1]]
    assert sketch._narrow(row, np.array([-(1 << 21), (1 << 21)], np.int32)[[0, 1, 0, 1, 0]]) is None  # not keys
