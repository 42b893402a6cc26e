"""Delta compaction: fewer, larger files with the same rows; it leaves alone what other writers may rewrite."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake.exceptions import CommitFailedError

from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.maintenance.table_compaction import compact_table
from metrics_lake.core.tables.commits import commit_files, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.errors import LeaseHeldError
from metrics_lake.lake_schemas.tables import METRIC_WINDOWS_1M

DAY = dt.date(2027, 1, 15)


def window_rows(servers: list[str], count: int) -> pa.Table:
    start = dt.datetime(2027, 1, 15, 10, tzinfo=dt.UTC)
    rows = [
        {
            "metric": "host.cpu.utilization",
            "server": server,
            "window_start": start,
            "window_end": start + dt.timedelta(minutes=1),
            "count": count,
            "sum": float(count),
            "min": 1.0,
            "max": 1.0,
            "avg": 1.0,
            "event_date": DAY,
        }
        for server in servers
    ]
    return pa.Table.from_pylist(rows, schema=METRIC_WINDOWS_1M)


def counts(store) -> dict[str, int]:
    rows = open_table(store, "metric_windows_1m").to_pyarrow_table(columns=["server", "count"]).to_pylist()
    return {r["server"]: r["count"] for r in rows}


def append(store, rows: pa.Table, batch: int) -> None:
    files = write_data_files(store, "metric_windows_1m", rows)
    commit_files(store, "metric_windows_1m", [f.add_action() for f in files], app_id="load", batch_id=batch)


def test_binpack_then_zorder_keeps_every_row(store):
    for batch in range(6):
        append(store, window_rows([f"s{batch}"], 1), batch)
    before = counts(store)
    result = compact_table(store, "metric_windows_1m", target_bytes=1 << 20)
    assert (result.files_before, result.files_after, result.partitions_rewritten) == (6, 1, 1)
    assert result.avg_bytes_after > result.avg_bytes_before
    assert counts(store) == before
    z = compact_table(store, "metric_windows_1m", z_order=True)
    assert (z.files_after, counts(store)) == (1, before)
    filtered = open_table(store, "metric_windows_1m").to_pyarrow_table(filters=[("server", "=", "s3")])
    assert filtered.num_rows == 1
    assert store.exists(f"tables/metric_windows_1m/_delta_log/{z.version:020d}.checkpoint.parquet")
    assert compact_table(store, "metric_windows_1m").partitions_rewritten == 0  # nothing small left


def test_days_a_writer_may_still_rewrite_are_skipped(store):
    for batch in range(3):
        append(store, window_rows([f"s{batch}"], 1), batch)
    skipped = compact_table(store, "metric_windows_1m", target_bytes=1 << 20, skip_from=DAY)
    assert (skipped.files_before, skipped.files_after, skipped.partitions_rewritten) == (3, 3, 0)
    later = compact_table(store, "metric_windows_1m", target_bytes=1 << 20, skip_from=DAY + dt.timedelta(days=1))
    assert later.files_after == 1


def test_a_day_replacement_waits_for_a_running_compaction(store):
    """Compaction and day replacements of one table never interleave: the second waits for the maintenance lease."""
    append(store, window_rows(["a"], 1), 0)
    with maintenance_lease(store, "metric_windows_1m"):
        with pytest.raises(LeaseHeldError, match="table metric_windows_1m is leased"):
            with maintenance_lease(store, "metric_windows_1m", wait_s=0.3):
                pass
    with maintenance_lease(store, "metric_windows_1m", wait_s=0):  # released: free at once
        pass


def test_retry_gives_up_after_the_last_attempt():
    attempts = []

    def always_conflicts():
        attempts.append(1)
        raise CommitFailedError("conflict")

    with pytest.raises(CommitFailedError):
        retry_on_conflict(always_conflicts, "test", attempts=3)
    assert len(attempts) == 3
