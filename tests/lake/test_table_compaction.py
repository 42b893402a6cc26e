"""Delta compaction: fewer, larger files with the same rows; a stream commit that loses to it is retried."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake.exceptions import CommitFailedError

import metrics_lake.core.tables
from metrics_lake.core.table_compaction import compact_table
from metrics_lake.core.tables import merge_rows, open_table, retry_on_conflict
from metrics_lake.schemas import METRIC_WINDOWS_1M

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


def test_binpack_then_zorder_keeps_every_row(store):
    for batch in range(6):
        merge_rows(store, "metric_windows_1m", window_rows([f"s{batch}"], 1), app_id="a", batch_id=batch)
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


def test_a_merge_that_loses_to_compaction_is_retried_exactly_once(store, monkeypatch):
    for batch, server in enumerate("abc"):  # three inserts: three files
        merge_rows(
            store,
            "metric_windows_1m",
            window_rows([server], 3),
            app_id="s",
            batch_id=batch,
        )
    real_ensure = metrics_lake.core.tables.ensure_table
    calls = []

    def stale_first(store_, name, like=None):
        table = real_ensure(store_, name, like)
        calls.append(table.version())
        if len(calls) == 1:  # compaction rewrites b's file after this merge read its snapshot
            assert compact_table(store_, name, target_bytes=1 << 20).files_after == 1
        return table

    monkeypatch.setattr(metrics_lake.core.tables, "ensure_table", stale_first)
    assert merge_rows(store, "metric_windows_1m", window_rows(["b"], 10), app_id="s", batch_id=3)
    assert len(calls) == 2  # the first attempt failed with CommitFailedError, the second committed
    assert counts(store) == {"a": 3, "b": 10, "c": 3}
    assert open_table(store, "metric_windows_1m").transaction_version("s") == 3


def test_retry_gives_up_after_the_last_attempt():
    attempts = []

    def always_conflicts():
        attempts.append(1)
        raise CommitFailedError("conflict")

    with pytest.raises(CommitFailedError):
        retry_on_conflict(always_conflicts, "test", attempts=3)
    assert len(attempts) == 3
