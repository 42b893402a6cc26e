"""The lakelog streaming source: read limits, splits, and reads of exact ranges."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.spark.sources.log_source import LogRange, LogStreamReader, limit_offsets


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
    return LogStreamReader(
        {"root": settings.root, "topic": "metrics", "maxRecordsPerBatch": "100", "recordsPerSplit": "64"}
    )


def test_offsets_respect_read_limit_and_all_available(reader, log):
    start = reader.initialOffset()
    assert start == {"0": 0, "1": 0}
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    limited = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert sum(limited.values()) == 100
    everything = reader.latestOffset(start, ReadAllAvailable())
    assert everything == {str(p): log.index("metrics", p).next_offset for p in (0, 1)}


def test_partitions_split_ranges_and_read_returns_exact_offsets(reader):
    end = reader.latestOffset({"0": 0, "1": 0}, ReadAllAvailable())
    ranges = reader.partitions({"0": 0, "1": 0}, end)
    assert all(r.end - r.start <= 64 for r in ranges)
    offsets = []
    for r in ranges:
        for batch in reader.read(r):
            offsets += [(r.partition, o) for o in batch.column("offset").to_pylist()]
    assert sorted(offsets) == [(p, o) for p in (0, 1) for o in range(int(end[str(p)]))]
    assert reader.partitions(end, end) == []
    assert isinstance(ranges[0], LogRange)
