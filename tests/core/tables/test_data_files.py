"""Data files' Delta statistics come from the Parquet footer the writer made, and equal the same statistics computed
from the rows one by one: null counts, bounds rounded outward, no bounds where Delta cannot carry them."""

from __future__ import annotations

import datetime as dt
import json
import math

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from metrics_lake.core import keys
from metrics_lake.core.parquet_layout import write_options
from metrics_lake.core.tables.data_files import MAX_STRING_STAT_CHARS, footer_stats, write_data_files
from metrics_lake.lake_schemas.tables import TABLES, Table
from tests.core.tables.test_pruning import bronze_rows

UTC = dt.UTC
NAN, INF = float("nan"), float("inf")


def expected_stats(data: pa.Table) -> dict:
    """The Delta statistics of ``data``, computed from its Python values (the independent oracle)."""
    stats: dict = {"numRecords": data.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for field in data.schema:
        if pa.types.is_nested(field.type):
            continue
        values = data.column(field.name).to_pylist()
        stats["nullCount"][field.name] = sum(value is None for value in values)
        present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if not present or pa.types.is_binary(field.type):
            continue
        lo, hi = min(present), max(present)
        if isinstance(lo, dt.datetime):
            lo = lo.replace(microsecond=lo.microsecond // 1000 * 1000)
            hi = hi.replace(microsecond=hi.microsecond // 1000 * 1000) + dt.timedelta(
                microseconds=1000 if hi.microsecond % 1000 else 0
            )
            lo, hi = (f"{t.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}"[:-3] + "Z" for t in (lo, hi))
        elif isinstance(lo, dt.date):
            lo, hi = lo.isoformat(), hi.isoformat()
        elif isinstance(lo, str) and max(len(lo), len(hi)) > MAX_STRING_STAT_CHARS:
            continue
        elif isinstance(lo, float) and not (math.isfinite(lo) and math.isfinite(hi)):
            continue
        stats["minValues"][field.name], stats["maxValues"][field.name] = lo, hi
    return stats


def written_stats(data: pa.Table, row_group_rows: int | None = None) -> dict:
    """:func:`footer_stats` of ``data`` written as the lake writes a table file."""
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, row_group_size=row_group_rows, **write_options(data.schema))
    return json.loads(footer_stats(pq.read_metadata(pa.BufferReader(sink.getvalue())), data.schema))


def at(ms: int, us: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 25, tzinfo=UTC) + dt.timedelta(milliseconds=ms, microseconds=us)


EDGE_CASES = pa.table(
    {
        "ts": pa.array([at(5, 999), at(1, 1), None, at(9)], pa.timestamp("us", tz="UTC")),
        "ms_times": pa.array([at(3), at(7), at(2), None], pa.timestamp("ms", tz="UTC")),
        "server": ["b", "a", None, "c"],
        "long": ["x" * (MAX_STRING_STAT_CHARS + 1), "a", "b", None],
        "huge_inside": ["a", "b" * 5000, "c", None],
        "value": [1.5, NAN, -0.0, -7.25],
        "all_nan": [NAN, NAN, NAN, None],
        "infinite": [1.0, INF, 2.0, 3.0],
        "count": pa.array([3, None, -2, 10], pa.int64()),
        "partition": pa.array([1, 1, 2, 0], pa.int32()),
        "day": pa.array([dt.date(2026, 1, 2), dt.date(2025, 12, 31), None, None]),
        "flag": [True, None, False, True],
        "sketch": pa.array([b"\x00", None, b"\xff", b"\x01"]),
        "nothing": pa.array([None, None, None, None], pa.float64()),
        "tags": pa.array([[("k", "v")], None, [], [("a", "b")]], pa.map_(pa.string(), pa.string())),
    }
)


@pytest.mark.parametrize("row_group_rows", [None, 1, 3])
def test_footer_statistics_equal_the_rows_own_in_one_row_group_or_several(row_group_rows) -> None:
    stats, expected = written_stats(EDGE_CASES, row_group_rows), expected_stats(EDGE_CASES)
    if row_group_rows == 1:
        # A row group without bounds leaves the file without them, never guessed: the long string's own (the
        # writer keeps at most 4 KiB) and the NaN's own (NaN is no bound).
        for column in ("huge_inside", "value"):
            assert column not in stats["minValues"] and column not in stats["maxValues"]
            expected["minValues"].pop(column), expected["maxValues"].pop(column)
    assert stats == expected
    # Spelled out for the cases the oracle could get wrong the same way:
    assert (stats["minValues"]["ts"], stats["maxValues"]["ts"]) == (
        "2026-11-25T00:00:00.001Z",
        "2026-11-25T00:00:00.009Z",
    )
    assert stats["maxValues"]["ms_times"] == "2026-11-25T00:00:00.007Z"
    if row_group_rows != 1:
        assert (stats["minValues"]["value"], stats["maxValues"]["value"]) == (-7.25, 1.5)  # NaN is no bound
    for unbounded in ("long", "all_nan", "infinite", "sketch", "nothing"):
        assert unbounded not in stats["minValues"] and unbounded not in stats["maxValues"]
    assert stats["nullCount"]["nothing"] == 4 and "tags" not in stats["nullCount"]


def test_a_timestamp_between_milliseconds_widens_both_bounds_outward() -> None:
    data = pa.table({"ts": pa.array([at(1, 500), at(2, 1)], pa.timestamp("us", tz="UTC"))})
    stats = written_stats(data)
    assert (stats["minValues"]["ts"], stats["maxValues"]["ts"]) == (
        "2026-11-25T00:00:00.001Z",
        "2026-11-25T00:00:00.003Z",
    )
    nanos = pa.table({"ts": pa.array([1_000_000_001, 2_000_000_001], pa.timestamp("ns", tz="UTC"))})
    stats = written_stats(nanos)
    assert (stats["minValues"]["ts"], stats["maxValues"]["ts"]) == (
        "1970-01-01T00:00:01.000Z",
        "1970-01-01T00:00:02.001Z",
    )


def test_table_files_carry_parquet_statistics_for_flat_columns_only() -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(EDGE_CASES, sink, **write_options(EDGE_CASES.schema))
    metadata = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    with_statistics = {
        metadata.schema.column(i).path
        for i in range(metadata.num_columns)
        if metadata.row_group(0).column(i).is_stats_set
    }
    assert with_statistics == {f.name for f in EDGE_CASES.schema if not pa.types.is_nested(f.type)}


@pytest.mark.parametrize("name", [Table.BRONZE_EVENTS, Table.QUARANTINE_EVENTS, Table.METRIC_WINDOWS_1M])
def test_every_lake_table_file_gets_the_statistics_of_its_rows(store, name) -> None:
    schema = TABLES[name].schema
    if name == Table.BRONZE_EVENTS:
        rows = bronze_rows(seed=7, count=500, first_offset=40)
    elif name == Table.QUARANTINE_EVENTS:  # raw payloads: one short, one too long for bounds, one missing
        rows = [
            {"topic": "metrics", "partition": p, "offset": o, "raw": raw, "reason": "bad_json", "ingested_at": ts}
            for p, o, raw, ts in [(0, 4, "{", at(5)), (3, 9, "x" * 300, at(1, 1)), (1, 2, None, at(86_400_000))]
        ]
        rows = [{**row, "ingest_date": row["ingested_at"].date()} for row in rows]
    else:
        rows = [
            {
                "metric": "cpu",
                "server": server,
                "window_start": at(m * 60_000),
                "window_end": at(m * 60_000 + 60_000),
                "count": 2,
                "sum": v,
                "min": v,
                "max": v,
                "avg": v / 2,
                "p50": v,
                "p95": v,
                "p99": v,
                "sketch": b"\x01",
                "updated_at": at(7, 3),
                "event_date": at(m * 60_000).date(),
                "labels": [("team", "db")],
            }
            for m, server, v in [(0, "a", 1.0), (1, "b", NAN), (1, "c", -3.5)]
        ]
    data = pa.Table.from_pylist(rows, schema=schema)
    written = write_data_files(store, name, data)
    partition_by = list(TABLES[name].partition_by)
    assert len(written) == (1 if name == Table.METRIC_WINDOWS_1M else 2)  # rows of two days: two files
    for file in written:
        rows = data
        for column, value in file.partition_values.items():
            rows = rows.filter(pc.equal(pc.cast(rows.column(column), pa.string()), value))
        assert json.loads(file.stats) == expected_stats(rows.drop_columns(partition_by))
    assert sum(json.loads(file.stats)["numRecords"] for file in written) == data.num_rows


def coded_chunks(data: pa.Table, pieces: int = 2) -> pa.Table:
    """``data`` in ``pieces`` chunks whose strings (``topic``, ``server``, ``metric``, the tags' names and values)
    are dictionary-encoded as the speed layer reads them from log segments: each chunk with its own dictionaries,
    each dictionary holding two strings no row uses, one sorting before every value and one after."""
    size = -(-data.num_rows // pieces)
    chunks = []
    for start in range(0, data.num_rows, size):
        chunk = data.slice(start, size)
        for name in ("topic", "server", "metric"):
            encoded = chunk.column(name).combine_chunks().dictionary_encode()
            padded = pa.concat_arrays([encoded.dictionary, pa.array(["", "~unused"])])
            chunk = chunk.set_column(
                chunk.schema.get_field_index(name), name, pa.DictionaryArray.from_arrays(encoded.indices, padded)
            )
        tags = chunk.column("tags").combine_chunks()
        coded = pa.MapArray.from_arrays(
            tags.offsets, tags.keys.dictionary_encode(), tags.items.dictionary_encode(), mask=tags.is_null()
        )
        chunks.append(chunk.set_column(chunk.schema.get_field_index("tags"), "tags", coded))
    return pa.concat_tables(chunks)


@pytest.mark.parametrize("row_group_rows", [None, 100])
def test_dictionary_encoded_strings_are_written_as_the_tables_strings_with_the_statistics_of_the_rows(
    store, row_group_rows
) -> None:
    """The speed layer's bronze rows keep the segments' dictionaries: the files read back as the table's schema,
    the same rows, and their Delta statistics are the rows' own (not the dictionaries' unused values); in one row
    group, the dictionary columns have no Parquet statistics, in several each row group has Arrow's."""
    schema = TABLES[Table.BRONZE_EVENTS].schema
    data = pa.Table.from_pylist(bronze_rows(seed=11, count=600, first_offset=0), schema=schema)
    coded = coded_chunks(data)
    assert pa.types.is_dictionary(coded.schema.field("server").type) and coded.column("server").num_chunks == 2
    assert coded.column("server").null_count > 0  # bronze_rows leaves some servers out
    written = write_data_files(store, Table.BRONZE_EVENTS, coded, row_group_rows=row_group_rows)
    assert len(written) == 2  # rows of two days
    filesystem, base = store.arrow_fs()
    for file in written:
        rows = data.filter(
            pc.equal(pc.cast(data.column("event_date"), pa.string()), file.partition_values["event_date"])
        )
        rows = rows.drop_columns(["event_date"])
        assert json.loads(file.stats) == expected_stats(rows)
        path = f"{base}/{keys.table_key(Table.BRONZE_EVENTS, file.path)}"
        back = pq.read_table(path, filesystem=filesystem)
        assert back.schema.equals(rows.schema) and back.equals(rows)
        metadata = pq.read_metadata(path, filesystem=filesystem)
        assert metadata.num_row_groups == (1 if row_group_rows is None else -(-rows.num_rows // row_group_rows))
        column = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
        for name in ("topic", "server", "metric", "tags.key_value.value"):
            chunk = metadata.row_group(0).column(column[name])
            assert "RLE_DICTIONARY" in chunk.encodings
            if name != "tags.key_value.value":
                assert chunk.is_stats_set == (row_group_rows is not None)


def test_dictionary_encoded_columns_get_parquet_dictionaries_and_no_statistics() -> None:
    schema = pa.schema([("server", pa.dictionary(pa.int32(), pa.string())), ("raw", pa.string()), ("n", pa.int64())])
    options = write_options(schema)
    assert options["use_dictionary"] == ["server"]  # raw: high cardinality
    assert options["write_statistics"] == ["raw", "n"]
