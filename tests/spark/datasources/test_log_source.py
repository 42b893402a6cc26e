"""The lakelog streaming source: read limits, a start taken from the tables, one range row per partition."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.spark.datasources.log_source import LogRange, LogStreamReader, limit_offsets


def test_limit_is_shared_fairly_and_never_exceeded():
    start = {0: 0, 1: 10, 2: 0}
    ends = {0: 5, 1: 1000, 2: 1000}
    limited = limit_offsets(start, ends, 300)
    assert limited == {0: 5, 1: 157, 2: 148}
    assert sum(limited[p] - start[p] for p in start) == 300
    assert limit_offsets(start, ends, 10**9) == ends


@pytest.fixture
def reader(settings, log):
    with Producer(log, "metrics", partitions=2) as producer:
        producer.send(FleetSimulator(servers=4, metrics=3, seconds=50, seed=8).generate())
    return LogStreamReader({"root": settings.root, "topic": "metrics", "maxRecordsPerBatch": "100"})


def test_offsets_respect_read_limit_and_all_available(reader, log):
    start = reader.initialOffset()
    assert start == {"0": 0, "1": 0}
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    limited = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert sum(limited.values()) == 100
    everything = reader.latestOffset(start, ReadAllAvailable())
    assert everything == {str(p): log.index("metrics", p).next_offset for p in (0, 1)}


def test_a_batch_is_one_range_row_per_partition(reader):
    end = reader.latestOffset({"0": 0, "1": 0}, ReadAllAvailable())
    ranges = reader.partitions({"0": 0, "1": 0}, end)
    assert all(isinstance(r, LogRange) for r in ranges)
    rows = [row for r in ranges for batch in reader.read(r) for row in batch.to_pylist()]
    assert rows == [{"topic": "metrics", "partition": p, "start": 0, "end": int(end[str(p)])} for p in (0, 1)]


def test_a_new_query_starts_where_the_tables_are(reader, settings, store, log):
    from metrics_lake.core.speed.micro_batch import run_batch_in_process

    assert reader.initialOffset() == {"0": 0, "1": 0}  # the reader keeps the tables it opened for this
    halves = {p: log.index("metrics", p).next_offset // 2 for p in (0, 1)}
    run_batch_in_process(store, "metrics", halves, watermark_seconds=120, clock_skew_seconds=300)
    # The kept tables are brought up to date: the batch's positions, and a read limit counts from them.
    assert reader.initialOffset() == {str(p): offset for p, offset in halves.items()}
    limited = reader.latestOffset({"0": 0, "1": 0}, reader.getDefaultReadLimit())
    assert sum(int(limited[str(p)]) - halves[p] for p in (0, 1)) == 100
    again = pickle.loads(pickle.dumps(reader))  # as Spark ships it: store and tables opened anew where unpickled
    assert again.initialOffset() == reader.initialOffset()


def test_spark_s_planner_processes_import_the_source_without_pandas():
    """Spark starts a Python process per planning step of the stream (create_data_source, plan_data_source_read),
    each importing this module: nothing it imports may load ``pyarrow.dataset``, which imports pandas (0.2 s of
    each such process, on the way to a new ``lake stream``'s first batch)."""
    probe = "import sys, metrics_lake.spark.datasources.log_source; print(sorted({'pandas', 'pyarrow.dataset'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
