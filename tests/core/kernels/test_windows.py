"""Window states: exact against a plain-Python computation, and merging partial states equals aggregating all events."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels import sketch
from metrics_lake.core.kernels.windows import (
    aggregate_events,
    finalize,
    merge_into_rows,
    merge_states,
    rewindow,
    series_codes,
    series_shards,
    states_of,
)
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M
from metrics_lake.lake_schemas.types import TAGS
from tests.helpers import expected_windows


def events(seed=1, servers=7, metrics=4, seconds=150, rate=2.0) -> pa.Table:
    start = 1_763_600_000_000 - 1_763_600_000_000 % 60_000 + 17_000  # windows do not start at the first event
    return FleetSimulator(
        servers=servers, metrics=metrics, seconds=seconds, rate=rate, seed=seed, start_ms=start
    ).generate()


def by_key(rows: pa.Table) -> dict[tuple, dict]:
    out = {}
    for row in rows.to_pylist():
        start = int(row["window_start"].timestamp() * 1000)
        out[(row["metric"], row["server"], start)] = row
    return out


def test_windows_equal_an_independent_computation_and_quantiles_are_within_the_bound():
    data = events()
    rows = by_key(finalize(aggregate_events(data, 60), 60))
    expected = expected_windows(data)
    assert rows.keys() == expected.keys()
    for key, want in expected.items():
        got = rows[key]
        assert (got["count"], got["min"], got["max"]) == (want["count"], want["min"], want["max"])
        assert got["sum"] == pytest.approx(want["sum"], rel=1e-12) and got["avg"] == pytest.approx(
            want["sum"] / want["count"]
        )
        assert got["window_end"] - got["window_start"] == dt.timedelta(minutes=1)
        for column, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            exact = want["sorted"][math.floor(q * (want["count"] - 1))]
            assert abs(got[column] - exact) <= sketch.RELATIVE_ERROR * abs(exact) * (1 + 1e-12)


def test_partials_of_consecutive_time_ranges_merge_to_the_states_of_everything_in_key_order():
    # As a log partition's chunks: each holds its own minutes, and neighbours share the minute at their edge.
    data = events(seed=8, seconds=300)
    data = data.take(pa.array(np.argsort(data.column("ts").to_numpy(), kind="stable")))
    parts = [data.slice(lo, hi - lo) for lo, hi in ((0, 500), (500, 1700), (1700, data.num_rows))]
    partials = pa.concat_tables([aggregate_events(part, 60) for part in parts])
    whole = aggregate_events(data, 60)
    keys = Counter(zip(*(partials.column(c).to_pylist() for c in ("metric", "server", "window_start")), strict=True))
    alone = sum(1 for n in keys.values() if n == 1)
    assert alone < partials.num_rows and alone * 4 >= partials.num_rows  # merge_states keeps those rows as they are
    merged = merge_states(partials)
    for name in ("metric", "server", "window_start", "count", "min", "max", "sketch", "labels"):
        assert merged.column(name).equals(whole.column(name)), name  # row for row: both in key order
    assert np.allclose(merged.column("sum").to_numpy(), whole.column("sum").to_numpy(), rtol=1e-12, atol=0)


def test_merging_partials_of_any_split_equals_aggregating_everything():
    data = events(seed=5)
    whole = finalize(aggregate_events(data, 60), 60, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    rng = np.random.default_rng(11)
    cut = np.sort(rng.choice(data.num_rows, size=6, replace=False))
    parts = [data.slice(lo, hi - lo) for lo, hi in zip([0, *cut], [*cut, data.num_rows], strict=True)]
    merged = merge_states(pa.concat_tables([aggregate_events(part, 60) for part in parts]))
    merged = finalize(merged, 60, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    for table in (whole, merged):
        assert table.num_rows == len(expected_windows(data))
    left, right = by_key(whole), by_key(merged)
    for key in left:
        a, b = left[key], right[key]
        assert a["sum"] == pytest.approx(b["sum"], rel=1e-12)
        a.pop("sum"), b.pop("sum"), a.pop("avg"), b.pop("avg")
        assert a == b  # counts, min, max, quantiles and sketch bytes identical


def test_merging_states_into_held_rows_equals_regrouping_them_and_leaves_untouched_rows_alone():
    """The speed layer's upsert of kept rows (merge_into_rows) against its upsert of read rows (merge_states)."""
    earlier, later = dt.datetime(2026, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    held = finalize(aggregate_events(events(seed=21, servers=6), 60), 60, earlier)
    newer = events(seed=22, servers=9, seconds=60)  # new servers and a new minute: keys the rows do not hold
    newer = newer.append_column("labels", pa.array([{"team": f"t{i % 3}"} for i in range(newer.num_rows)], TAGS))
    states = aggregate_events(newer, 60)
    merged = merge_into_rows(held, states, 60, later)
    key = ["metric", "server", "window_start"]

    def keys_of(table: pa.Table) -> list[tuple]:
        return [tuple(row.values()) for row in table.select(key).to_pylist()]

    hit = set(keys_of(states))
    touched = held.filter(pa.array([k in hit for k in keys_of(held)]))
    regrouped = finalize(merge_states(pa.concat_tables([states_of(touched), states])), 60, later)
    assert merged.num_rows == len({*keys_of(held), *hit}) == len(set(keys_of(merged)))
    assert 0 < touched.num_rows < held.num_rows and regrouped.num_rows > touched.num_rows  # all three cases occur
    assert merged.slice(0, held.num_rows).select(key).equals(held.select(key))  # held rows keep their order
    got, want, before = by_key(merged), by_key(regrouped), by_key(held)
    for row_key, row in got.items():
        assert row == (want[row_key] if row_key in want else before[row_key])  # sketch bytes, labels, updated_at too


def test_merging_states_into_no_rows_gives_the_regrouped_states_in_their_order():
    """With nothing held (a new lake), the upsert is the states' own rows, as regrouping them gives."""
    later = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    states = aggregate_events(events(seed=23, servers=5, seconds=180), 60)
    fresh = merge_into_rows(METRIC_WINDOWS_1M.empty_table(), states, 60, later)
    key = ["metric", "server", "window_start"]
    assert fresh.num_rows == states.num_rows > 0
    assert fresh.select(key).equals(states.select(key).cast(fresh.select(key).schema))  # appended in states' order
    assert by_key(fresh) == by_key(finalize(merge_states(states), 60, later))  # sketch bytes and updated_at too


def test_rewindow_rolls_minutes_up_to_hours_like_aggregating_the_events_by_hour():
    data = events(seed=9, seconds=7200, rate=0.2, servers=3, metrics=2)
    hourly = by_key(finalize(rewindow(aggregate_events(data, 60), 3600), 3600))
    direct = by_key(finalize(aggregate_events(data, 3600), 3600))
    assert hourly.keys() == direct.keys()
    for key in direct:
        for column in ("count", "min", "max", "p50", "p95", "p99", "sketch"):
            assert hourly[key][column] == direct[key][column]


def dictionary_chunks(table: pa.Table, columns: tuple[str, ...], pieces: int = 3) -> pa.Table:
    """``table`` in ``pieces`` chunks whose ``columns`` are dictionary-encoded, each chunk with its own dictionary."""
    size = -(-table.num_rows // pieces)
    chunks = []
    for start in range(0, table.num_rows, size):
        chunk = table.slice(start, size)
        for name in columns:
            index = chunk.schema.get_field_index(name)
            chunk = chunk.set_column(index, name, chunk.column(name).combine_chunks().dictionary_encode())
        chunks.append(chunk)
    return pa.concat_tables(chunks)


def test_dictionary_encoded_input_gives_the_same_states_as_strings_in_key_order():
    data = events(seed=3).select(["ts", "server", "metric", "value"])
    encoded = dictionary_chunks(data, ("server", "metric"))
    # each chunk codes the servers differently: equal codes in two chunks can be different servers
    assert len({tuple(chunk.dictionary.to_pylist()) for chunk in encoded.column("server").chunks}) == 3
    states = aggregate_events(data, 60)
    assert aggregate_events(encoded, 60).equals(states)
    keys = list(zip(*(states.column(c).to_pylist() for c in ("metric", "server", "window_start")), strict=True))
    assert len(set(keys)) == len(keys) == len(expected_windows(data))
    series = [key[:2] for key in keys]
    assert all(a[:2] != b[:2] or a[2] < b[2] for a, b in zip(keys, keys[1:], strict=False))  # time order in a series
    assert len(set(series)) == sum(1 for a, b in zip([None, *series], series, strict=False) if a != b)

    halves = [aggregate_events(data.slice(0, 700), 60), aggregate_events(data.slice(700), 60)]
    from_strings = merge_states(pa.concat_tables(halves))
    from_dictionaries = merge_states(dictionary_chunks(pa.concat_tables(halves), ("metric", "server"), pieces=2))
    assert from_dictionaries.schema == from_strings.schema and from_dictionaries.equals(from_strings)
    assert from_strings.drop_columns("sum").equals(states.drop_columns("sum"))


def test_dictionary_encoded_tags_give_the_same_states_and_labels_as_strings():
    """The speed layer's bronze rows keep the log segments' dictionaries, the tags' names and values too."""
    data = events(seed=4)
    labels = pa.array([[("team", "db")] if i % 3 else [] for i in range(data.num_rows)], TAGS)
    data = data.append_column("labels", labels).append_column("offset", pa.array(range(data.num_rows), pa.int64()))
    coded_tags = pa.map_(pa.dictionary(pa.int32(), pa.string()), pa.dictionary(pa.int32(), pa.string()))
    encoded = dictionary_chunks(data, ("server", "metric")).cast(
        data.schema.set(data.schema.get_field_index("tags"), pa.field("tags", coded_tags))
    )
    assert encoded.schema.field("tags").type == coded_tags and data.column("tags").null_count < data.num_rows
    assert aggregate_events(encoded, 60).equals(aggregate_events(data, 60))


def test_series_codes_a_caller_already_has_give_the_same_states():
    """The speed layer hands the cardinality limits' series codes on to the windows: the states are those the
    windows' own hashing gives, row for row; in another row order (other codes), the same windows."""
    data = events(seed=5)
    states = aggregate_events(data, 60)
    assert aggregate_events(data, 60, series=series_codes(data.column("metric"), data.column("server"))).equals(states)

    shuffled = data.take(pa.array(np.random.default_rng(5).permutation(data.num_rows)))
    codes = series_codes(shuffled.column("metric"), shuffled.column("server"))
    keys = [("metric", "ascending"), ("server", "ascending"), ("window_start", "ascending")]
    unordered = ["sum", "labels"]  # a float sum in another order, the last row's labels
    from_codes = aggregate_events(shuffled, 60, series=codes).drop_columns(unordered).sort_by(keys)
    assert from_codes.equals(states.drop_columns(unordered).sort_by(keys))


def test_ranks_over_a_known_domain_equal_the_hashed_ranks():
    from metrics_lake.core.kernels.windows import _ranks

    rng = np.random.default_rng(7)
    for size, domain in (
        (0, 0),
        (1, 1),
        (1000, 10),
        (1000, 5000),
        (100_000, 250_000),
    ):  # each domain within the dense limit (2n + 65,536)
        values = rng.integers(0, max(domain, 1), size).astype(np.int64)
        dense, dense_count = _ranks(values, domain)
        hashed, hashed_count = _ranks(values)
        assert dense_count == hashed_count == len(np.unique(values))
        np.testing.assert_array_equal(dense, hashed)
        np.testing.assert_array_equal(dense, np.searchsorted(np.unique(values), values))


def reference_shard(metric: str | None, server: str | None, shards: int) -> int:
    """series_shards' hash, written out in plain Python integers mod 2**64."""

    def polynomial(text: str | None) -> int:
        return sum(byte * pow(0x100000001B3, i, 2**64) for i, byte in enumerate((text or "").encode())) % 2**64

    golden = 0x9E3779B97F4A7C15
    mixed = (((polynomial(metric) * golden) % 2**64 ^ polynomial(server)) * golden) % 2**64
    return (mixed >> 32) % shards


def test_series_shards_are_a_stable_hash_of_the_series_that_spreads_series_evenly():
    """A series' shard is a fixed function of its two strings (the same in another process, table or split of the
    rows, whatever the column's encoding; a null like an empty string) and series spread evenly over the shards:
    the speed layer's upsert shards and the batch layer's shuffle key."""
    metrics = pa.array(["cpu", "cpu", "", "mémoire", None, "cpu", "q"])
    servers = pa.array(["web-1", "web-2", "web-1", "db-☃", "web-1", "web-1", None])  # null: a fleet-wide row
    for shards in (1, 2, 3, 7):
        expected = [
            reference_shard(m, s, shards) for m, s in zip(metrics.to_pylist(), servers.to_pylist(), strict=True)
        ]
        assert series_shards(metrics, servers, shards).tolist() == expected
        chunked = series_shards(
            pa.chunked_array([metrics[:1], metrics[1:4], metrics[4:]]).dictionary_encode(),
            pa.chunked_array([servers[:3], servers.slice(3)]),
            shards,
        )
        assert chunked.tolist() == expected
    assert len(set(series_shards(metrics, servers, 7).tolist())) > 1
    assert series_shards(metrics.slice(0, 0), servers.slice(0, 0), 4).tolist() == []
    series = [(f"m.{i % 50}", f"srv-{i // 50:04d}") for i in range(30_000)]  # 600 servers x 50 metrics
    shards = series_shards(pa.array([m for m, _ in series]), pa.array([s for _, s in series]), 3)
    assert np.all(np.abs(np.bincount(shards, minlength=3) - 10_000) < 300)  # a binomial's sd is 82
