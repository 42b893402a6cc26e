"""Exactly-once commits: the same micro-batch committed twice leaves one copy."""

from __future__ import annotations

import pyarrow as pa

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.consumer import read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables import merge_rows, open_table, write_data_files
from metrics_lake.spark.sinks.delta_sink import BRONZE, QUARANTINE, commit_batch, split_log_rows
from metrics_lake.spark.sources.log_source import SPARK_LOG_ROW


def log_rows(log, n_invalid: int = 2) -> pa.Table:
    with Producer(log, "metrics", partitions=1) as producer:
        producer.send(FleetSimulator(servers=2, metrics=2, seconds=30, seed=4).generate())
        producer.send_payloads(["{oops"] * n_invalid)
    return read_range(log, "metrics", 0, 0, log.index("metrics", 0).next_offset).cast(SPARK_LOG_ROW)


def write_batch(store, rows: pa.Table):
    bronze, quarantine = split_log_rows(rows)
    return write_data_files(store, BRONZE, bronze) + write_data_files(store, QUARANTINE, quarantine)


def test_same_batch_committed_twice_leaves_one_copy(log, store):
    rows = log_rows(log)
    first = commit_batch(store, write_batch(store, rows), app_id="q1", batch_id=0)
    # A replay after a crash writes new files for the same batch and commits again.
    second = commit_batch(store, write_batch(store, rows), app_id="q1", batch_id=0)
    assert first == {BRONZE: True, QUARANTINE: True}
    assert second == {BRONZE: False, QUARANTINE: False}
    bronze = open_table(store, BRONZE)
    assert bronze.to_pyarrow_table().num_rows == rows.num_rows - 2
    assert open_table(store, QUARANTINE).to_pyarrow_table().num_rows == 2
    assert bronze.transaction_version("q1") == 0
    assert bronze.version() == 1  # create + one commit


def test_later_batches_and_other_queries_still_commit(log, store):
    rows = log_rows(log, n_invalid=0)
    assert commit_batch(store, write_batch(store, rows), app_id="q1", batch_id=0) == {BRONZE: True}
    assert commit_batch(store, write_batch(store, rows), app_id="q1", batch_id=1) == {BRONZE: True}
    assert commit_batch(store, write_batch(store, rows), app_id="q2", batch_id=0) == {BRONZE: True}
    assert open_table(store, BRONZE).to_pyarrow_table().num_rows == 3 * rows.num_rows


def test_same_window_merge_twice_is_skipped(spark, log, store):
    from metrics_lake.spark.jobs.stream_metrics import finalize_windows, window_aggregates

    rows = log_rows(log, n_invalid=0)
    events = spark.createDataFrame(rows.to_pandas())
    windows = finalize_windows(window_aggregates(events, 120)).toArrow()
    assert merge_rows(store, "metric_windows_1m", windows, app_id="w", batch_id=5)
    version = open_table(store, "metric_windows_1m").version()
    assert not merge_rows(store, "metric_windows_1m", windows, app_id="w", batch_id=5)
    assert open_table(store, "metric_windows_1m").version() == version
    assert open_table(store, "metric_windows_1m").to_pyarrow_table().num_rows == windows.num_rows


def test_readers_can_filter_committed_files_on_every_column(log, store):
    rows = log_rows(log)
    commit_batch(store, write_batch(store, rows), app_id="q1", batch_id=0)
    bronze = open_table(store, BRONZE)
    some_server = rows.column("server").drop_null()[0].as_py()
    want = sum(1 for s in rows.column("server").to_pylist() if s == some_server)
    # delta-rs prunes files by the stats we write: wrong or missing bounds would drop matching rows.
    assert bronze.to_pyarrow_table(filters=[("topic", "=", "metrics"), ("server", "=", some_server)]).num_rows == want
    assert bronze.to_pyarrow_table(filters=[("offset", ">=", 0), ("partition", "=", 0)]).num_rows == 120
    assert open_table(store, QUARANTINE).to_pyarrow_table(filters=[("topic", "=", "metrics")]).num_rows == 2
