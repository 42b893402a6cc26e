"""Merging a partition's data files into one, a row group at a time: the same rows in the same order, row groups no
larger than asked, Delta statistics of the rows, and nulls for a column an old file lacks."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metrics_lake.core import keys
from metrics_lake.core.parquet_layout import write_options
from metrics_lake.core.tables import file_merge
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.file_merge import merge_data_files
from metrics_lake.core.tables.snapshots import DataFile, read_data_files
from metrics_lake.lake_schemas.log_records import with_dictionaries
from metrics_lake.lake_schemas.tables import BRONZE_EVENTS, Table
from tests.core.tables.test_data_files import expected_stats
from tests.core.tables.test_pruning import bronze_rows

BRONZE = Table.BRONZE_EVENTS


def data_file(store, written) -> DataFile:
    """The :class:`DataFile` of a file just written (as a snapshot would list it)."""
    return DataFile(
        path=f"{store.root}/{keys.table_key(BRONZE, written.path)}",
        relative=written.path,
        size=written.size,
        partition_values=tuple(sorted(written.partition_values.items())),
    )


@pytest.fixture
def one_day() -> pa.Table:
    rows = bronze_rows(seed=3, count=2_000, first_offset=0)
    day = rows[0]["event_date"]
    return pa.Table.from_pylist([r for r in rows if r["event_date"] == day], schema=BRONZE_EVENTS)


def test_the_merged_file_holds_every_row_in_order_in_bounded_row_groups_with_its_statistics(store, one_day):
    parts = [one_day.slice(lo, 150) for lo in range(0, one_day.num_rows, 150)]
    # As the stream writes bronze: strings dictionary-encoded (no Parquet statistics for them); and plain.
    coded = [p.cast(with_dictionaries(BRONZE_EVENTS)) if i % 2 else p for i, p in enumerate(parts)]
    files = [data_file(store, written) for part in coded for written in write_data_files(store, BRONZE, part)]
    assert len(files) == len(parts) > 5

    merged = merge_data_files(store, BRONZE, files, row_group_rows=400)

    (partition_value,) = {f.partition_values for f in files}
    assert tuple(sorted(merged.partition_values.items())) == partition_value
    assert merged.path.startswith(f"event_date={one_day['event_date'][0]}/compacted-")
    result = data_file(store, merged)
    assert read_data_files(store, [result], BRONZE_EVENTS).to_pylist() == one_day.to_pylist()
    footer = pq.read_metadata(result.path)
    groups = [footer.row_group(g).num_rows for g in range(footer.num_row_groups)]
    assert sum(groups) == one_day.num_rows and max(groups) <= 400 and len(groups) >= one_day.num_rows // 400
    assert json.loads(merged.stats) == expected_stats(one_day.drop_columns(["event_date"]))


def test_a_column_an_old_file_lacks_reads_as_null_in_the_merged_file(store, one_day):
    new, old = one_day.slice(0, 100), one_day.slice(100, 100)
    (written,) = write_data_files(store, BRONZE, new)
    directory = written.path.rsplit("/", 1)[0]
    legacy = old.drop_columns(["event_date", "labels"])  # written before bronze had labels
    relative = f"{directory}/part-legacy.zstd.parquet"
    path = store.path(keys.table_key(BRONZE, relative))
    pq.write_table(legacy, path, **write_options(legacy.schema))
    legacy_file = DataFile(str(path), relative, path.stat().st_size, tuple(sorted(written.partition_values.items())))

    merged = merge_data_files(store, BRONZE, [data_file(store, written), legacy_file])

    rows = read_data_files(store, [data_file(store, merged)], BRONZE_EVENTS)
    assert (
        rows.to_pylist()
        == new.to_pylist() + old.set_column(10, "labels", pa.nulls(100, old["labels"].type)).to_pylist()
    )


def test_files_of_two_partitions_are_refused(store):
    rows = bronze_rows(seed=5, count=400, first_offset=0)
    table = pa.Table.from_pylist(rows, schema=BRONZE_EVENTS)
    files = [data_file(store, written) for written in write_data_files(store, BRONZE, table)]
    assert len(files) == 2  # two days
    with pytest.raises(ValueError, match="2 partitions"):
        merge_data_files(store, BRONZE, files)


def test_a_merge_holds_about_a_row_group_not_the_whole_group(store, monkeypatch):
    """Arrow's allocations while merging 16 files of 25,000 rows, row groups of 20,000: at any write, far below
    the group's 400,000 rows (read whole, the merge held them all, and a stream kept that peak resident)."""
    day = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    n = 25_000
    files = []
    for part in range(16):
        offsets = np.arange(part * n, (part + 1) * n)
        ts = pa.array([day + dt.timedelta(milliseconds=int(o)) for o in offsets], BRONZE_EVENTS.field("ts").type)
        rows = pa.table(
            {
                "topic": pa.array(["metrics"] * n),
                "partition": pa.array(np.zeros(n, np.int32)),
                "offset": pa.array(offsets),
                "ts": ts,
                "server": pa.array([f"server-{o % 500:04d}" for o in offsets]),
                "metric": pa.array([f"app.metric_{o % 40}" for o in offsets]),
                "value": pa.array(np.random.default_rng(part).random(n)),
                "tags": pa.array([[("dc", f"dc-{o % 3}")] for o in offsets], BRONZE_EVENTS.field("tags").type),
                "ingested_at": ts,
                "event_date": pa.array([day.date()] * n),
                "labels": pa.nulls(n, BRONZE_EVENTS.field("labels").type),
            },
            schema=BRONZE_EVENTS,
        )
        files += [data_file(store, written) for written in write_data_files(store, BRONZE, rows)]
    whole = read_data_files(store, files, BRONZE_EVENTS).nbytes  # what a merge that reads the group holds
    del rows
    baseline, peaks = pa.total_allocated_bytes(), []
    real_writer = file_merge.pq.ParquetWriter

    class SampledWriter(real_writer):
        def write_table(self, table, *args, **kwargs):
            peaks.append(pa.total_allocated_bytes() - baseline)
            return super().write_table(table, *args, **kwargs)

    monkeypatch.setattr(file_merge.pq, "ParquetWriter", SampledWriter)
    merged = merge_data_files(store, BRONZE, files, row_group_rows=20_000)
    assert json.loads(merged.stats)["numRecords"] == 16 * n and len(peaks) >= 16  # a write per 20,000 rows or more
    assert max(peaks) < whole / 4, (max(peaks), whole)
