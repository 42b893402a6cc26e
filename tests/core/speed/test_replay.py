"""Replay and consumer groups after a speed-layer run."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.consumer_groups import commit_offsets, lag_report
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.replay import replay, replay_ranges
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.jobs.sql_query import run_sql
from metrics_lake.spark.jobs.stream_metrics import run_stream
from tests.helpers import positions
from tests.spark.test_stream_metrics import INVALID, START_MS, produced_rows

pytestmark = pytest.mark.spark
TABLE_NAMES = ("bronze_events", "quarantine_events", "metric_windows_1m")


@pytest.fixture
def ingested(spark, settings, log, store):
    sim = FleetSimulator(servers=5, metrics=3, seconds=240, rate=1.0, seed=3, start_ms=START_MS)
    with Producer(log, settings.topic, partitions=settings.partitions, roll_bytes=20_000) as producer:
        producer.send(sim.generate())
        producer.send_payloads(list(INVALID))
    run_stream(spark, settings, once=True)
    return produced_rows(log)


def versions(store) -> dict[str, int]:
    return {name: open_table(store, name).version() for name in TABLE_NAMES}


def test_the_speed_layer_commits_its_consumer_groups(ingested, log):
    report = lag_report(log)
    assert {(r.group, r.partition) for r in report} == {(CONSUMER, p) for p in range(4)}
    assert all(r.lag == 0 and r.committed == r.end for r in report)
    commit_offsets(log.store, "analytics", "metrics", {0: 1})  # a group that has read one record
    mine = lag_report(log, "analytics")
    assert [(r.partition, r.committed, r.lag) for r in mine][0] == (0, 1, mine[0].end - 1)
    assert mine[1].committed is None and mine[1].lag == mine[1].end  # never read partition 1


def test_replaying_an_ingested_range_changes_no_table(ingested, log, store):
    before = versions(store)
    stats = replay(log, "metrics", replay_ranges(log, "metrics"))
    assert stats.read == ingested.num_rows and stats.already_present == ingested.num_rows
    assert sum(stats.written.values()) == 0 and stats.commits == 0
    assert versions(store) == before


def test_replay_restores_exactly_the_rows_a_table_lost(ingested, log, store):
    bronze = open_table(store, "bronze_events")
    full = sorted(positions(bronze.to_pyarrow_table()))
    bronze.delete("`partition` = 1 AND `offset` >= 10")  # rows lost downstream (say, a bad manual fix)
    lost = len(full) - open_table(store, "bronze_events").to_pyarrow_table().num_rows
    assert lost > 0
    stats = replay(log, "metrics", replay_ranges(log, "metrics", partitions=[1]))
    assert stats.written == {"bronze_events": lost, "quarantine_events": 0}
    assert sorted(positions(open_table(store, "bronze_events").to_pyarrow_table())) == full


def test_replay_of_a_time_range_into_a_new_table_reproduces_it(ingested, spark, settings, log, store):
    start, end = START_MS + 60_000, START_MS + 150_000
    ranges = replay_ranges(log, "metrics", from_time_ms=start, to_time_ms=end)
    stats = replay(log, "metrics", ranges, into="bronze_replay", from_time_ms=start, to_time_ms=end)
    ts = pc.cast(ingested.column("ts"), "int64")
    in_range = ingested.filter(pc.and_(pc.greater_equal(ts, start), pc.less(ts, end)))
    assert stats.written == {"bronze_replay": in_range.num_rows} and in_range.num_rows == 5 * 3 * 90
    copy = (
        open_table(store, "bronze_replay")
        .to_pyarrow_table()
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert positions(copy) == positions(in_range.sort_by([("partition", "ascending"), ("offset", "ascending")]))
    # Row for row, the copy equals what the speed layer wrote to bronze_events for those positions.
    bronze = {
        (r["partition"], r["offset"]): r for r in open_table(store, "bronze_events").to_pyarrow_table().to_pylist()
    }
    assert copy.to_pylist() == [bronze[(r["partition"], r["offset"])] for r in copy.to_pylist()]
    # Analysts can query the new table like any other.
    rows = run_sql(spark, settings, "SELECT count(*) AS n, min(ts) AS lo FROM bronze_replay").collect()
    assert rows[0]["n"] == in_range.num_rows
