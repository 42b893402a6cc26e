"""Partition pruning, file skipping and row filtering: exactly the matching rows, from fewer files.

A bronze table of several files over two days is read through the
reader's planning (:class:`DeltaSnapshotReader` with pushed Spark filters:
the same objects Spark passes) and compared with a row-by-row filter of
every row; then clustering must make a series query read one file.
"""

from __future__ import annotations

import datetime as dt
import operator
import random

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)

from metrics_lake.core.maintenance.clustering import CLUSTERED_PREFIX, cluster_table
from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table
from metrics_lake.core.tables.snapshots import read_data_file, snapshot_files
from metrics_lake.lake_schemas.tables import TABLES, Table
from metrics_lake.spark.datasources.delta_reader import DeltaSnapshotReader

BRONZE = TABLES[Table.BRONZE_EVENTS]
DAY = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
METRICS = ["cpu", "mem", "rpc.count", "rpc.latency"]
SERVERS = [f"web-{i:02d}" for i in range(12)]


def bronze_rows(seed: int, count: int, first_offset: int) -> list[dict]:
    """Random bronze rows over two days; ``server`` is null in about 1 of 50 (a column with nulls)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        ts = DAY + dt.timedelta(seconds=rng.randrange(2 * 86_400), microseconds=rng.randrange(1_000_000))
        rows.append(
            {
                "topic": "metrics",
                "partition": rng.randrange(4),
                "offset": first_offset + i,
                "ts": ts,
                "server": None if rng.random() < 0.02 else rng.choice(SERVERS),
                "metric": rng.choice(METRICS),
                "value": rng.random() * 100,
                "tags": [("region", rng.choice(["eu", "us"]))],
                "ingested_at": ts + dt.timedelta(seconds=1),
                "event_date": ts.date(),
                "labels": None,
            }
        )
    return rows


@pytest.fixture
def bronze(store) -> list[dict]:
    """A bronze table of 6 batches (12 files: each batch has rows of both days); returns every row."""
    every = []
    for batch in range(6):
        rows = bronze_rows(batch, 400, batch * 400)
        files = write_data_files(store, Table.BRONZE_EVENTS, pa.Table.from_pylist(rows, BRONZE.schema))
        commit_files(store, Table.BRONZE_EVENTS, [f.add_action() for f in files], app_id="test", batch_id=batch)
        every += rows
    return every


def planned(settings, filters: list) -> tuple[DeltaSnapshotReader, list]:
    """(reader, filters it returned to Spark) for a scan of bronze with ``filters`` pushed, as Spark plans it."""
    reader = DeltaSnapshotReader({"root": settings.root, "table": Table.BRONZE_EVENTS}, BRONZE.schema, ["event_date"])
    returned = list(reader.pushFilters(filters))
    return reader, returned


def scanned(settings, filters: list) -> tuple[list[int], int, list]:
    """(sorted offsets the scan returns, files it reads, filters returned to Spark)."""
    reader, returned = planned(settings, filters)
    groups = reader.partitions()
    offsets = []
    for group in groups:
        for batch in reader.read(group):
            offsets += batch.column("offset").to_pylist()
    files = {f.relative for g in groups for f in g.files}
    return sorted(offsets), len(files), returned


COMPARE = {
    EqualTo: operator.eq,
    GreaterThan: operator.gt,
    GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt,
    LessThanOrEqual: operator.le,
}


def matches(row: dict, spark_filter) -> bool:
    """Spark SQL's meaning of one filter on one row (null compares to nothing)."""
    value = row[spark_filter.attribute[0]]
    if isinstance(spark_filter, IsNull):
        return value is None
    if isinstance(spark_filter, IsNotNull):
        return value is not None
    if value is None:
        return False
    if isinstance(spark_filter, In):
        return value in spark_filter.value
    if isinstance(spark_filter, StringStartsWith):
        return value.startswith(spark_filter.value)
    return COMPARE[type(spark_filter)](value, spark_filter.value)


def random_filter(rng: random.Random, rows: list[dict]):
    """One filter of a random kind on a random column, its operand drawn from the data (or just outside it)."""
    row = rng.choice(rows)
    column = rng.choice(["metric", "server", "ts", "event_date", "offset", "partition", "topic"])
    value = row[column]
    if value is None:
        return IsNull((column,)) if rng.random() < 0.5 else IsNotNull((column,))
    kind = rng.choice([EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, In, IsNotNull])
    if column == "metric" and rng.random() < 0.2:
        return StringStartsWith((column,), value[:3])  # not applied by the reader: returned to Spark
    if kind is In:
        return In((column,), [value, rng.choice(rows)[column] or value])
    if kind is IsNotNull:
        return IsNotNull((column,))
    return kind((column,), value)


def test_a_scan_returns_exactly_the_matching_rows_for_random_predicates(settings, bronze):
    rng = random.Random(7)
    for _ in range(120):
        filters = [random_filter(rng, bronze) for _ in range(rng.randint(1, 3))]
        offsets, _, returned = scanned(settings, filters)
        applied = [f for f in filters if not any(f is r for r in returned)]
        expected = sorted(r["offset"] for r in bronze if all(matches(r, f) for f in applied))
        assert offsets == expected, filters
        assert all(isinstance(f, StringStartsWith) for f in returned), returned  # everything else applied exactly


def test_partition_and_statistics_pruning_read_only_the_files_that_may_match(settings, store, bronze):
    assert scanned(settings, [])[1] == 12
    # Partition pruning: one day of two.
    offsets, files, _ = scanned(settings, [EqualTo(("event_date",), DAY.date())])
    assert files == 6 and offsets == sorted(r["offset"] for r in bronze if r["event_date"] == DAY.date())
    # Statistics: offsets of the first batch live in its two files only.
    offsets, files, _ = scanned(settings, [LessThan(("offset",), 400)])
    assert files == 2 and offsets == list(range(400))
    # Nothing matches a metric outside every file's min/max.
    assert scanned(settings, [EqualTo(("metric",), "zzz")])[:2] == ([], 0)
    # Unclustered, every file holds every metric; clustered, a series lives in one file of a day.
    series = [EqualTo(("metric",), "rpc.latency"), EqualTo(("server",), "web-03")]
    before, files_before, _ = scanned(settings, series)
    assert files_before == 12
    result = cluster_table(store, Table.BRONZE_EVENTS, rows_per_file=150, row_group_rows=50)
    assert (result.files_read, result.rows) == (12, 2400)
    after, files_after, _ = scanned(settings, series)
    table = open_table(store, Table.BRONZE_EVENTS)
    files = snapshot_files(store, Table.BRONZE_EVENTS, table)
    day_rows = sum(1 for r in bronze if r["event_date"] == DAY.date())
    assert len(files) == result.files_written == -(-day_rows // 150) + -(-(2400 - day_rows) // 150) and all(
        CLUSTERED_PREFIX in f.relative for f in files
    )
    # The files that may hold the series, from their rows: both its metric and its server within the file's range.
    filesystem, _ = store.arrow_fs()
    may_hold = 0
    for data_file in files:
        rows = read_data_file(data_file, BRONZE.schema, filesystem).to_pylist()
        metrics = [r["metric"] for r in rows]
        servers = [r["server"] for r in rows if r["server"] is not None]
        may_hold += (
            min(metrics) <= "rpc.latency" <= max(metrics) and bool(servers) and min(servers) <= "web-03" <= max(servers)
        )
    assert after == before and files_after == may_hold and files_after <= 6  # of 17: at most 3 per day


def test_clustering_keeps_every_row_once_sorted_and_does_not_rewrite_clustered_files(settings, store, bronze):
    first = cluster_table(store, Table.BRONZE_EVENTS, rows_per_file=500)
    assert (first.files_read, first.rows, first.partitions) == (12, 2400, 2)
    again = cluster_table(store, Table.BRONZE_EVENTS, rows_per_file=500)
    assert (again.files_read, again.files_written) == (0, 0)
    table = open_table(store, Table.BRONZE_EVENTS)
    filesystem, _ = store.arrow_fs()
    offsets = []
    for data_file in snapshot_files(store, Table.BRONZE_EVENTS, table):
        rows = read_data_file(data_file, BRONZE.schema, filesystem).to_pylist()
        keys = [(r["metric"], r["server"] is None, r["server"] or "", r["ts"]) for r in rows]  # nulls last
        assert keys == sorted(keys)
        offsets += [r["offset"] for r in rows]
    assert sorted(offsets) == list(range(2400))


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        ("2026-11-24T00:00:00", "2026-11-25T00:00:00", ["2026-11-24"]),  # a whole day, end excluded
        ("2026-11-24T23:59:59.999999", "2026-11-25T00:00:00.000001", ["2026-11-24", "2026-11-25"]),
        ("2026-11-22T12:00:00", "2026-11-24T00:00:00.000001", ["2026-11-22", "2026-11-23", "2026-11-24"]),
        ("1969-12-31T23:00:00", "1970-01-01T01:00:00", ["1969-12-31", "1970-01-01"]),  # before the epoch
        ("2026-11-24T00:00:00", "2026-11-24T00:00:00", []),  # empty, at a day's start
    ],
)
def test_days_between_gives_the_utc_days_a_microsecond_range_overlaps(lo, hi, expected):
    from metrics_lake.core.tables.snapshots import days_between

    def us(text: str) -> int:
        return (dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC) - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // (
            dt.timedelta(microseconds=1)
        )

    assert days_between(us(lo), us(hi)) == expected
