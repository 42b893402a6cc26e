"""Stored queries kept live by the speed layer: ``query_results`` after each batch equals an independent computation.

Tumbling, hopping, fleet-wide and per-server queries over events produced in
rounds, with late events inside the watermark; exact after a crash between
the windows commit and the query results commit, and a replayed batch
changes nothing.
"""

from __future__ import annotations

import random

import pytest
from deltalake import DeltaTable

import metrics_lake.core.speed.micro_batch as speed_layer
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.table_commits import query_results as query_results_commit
from metrics_lake.core.tables.delta import table_uri
from tests.helpers import assert_query_results

START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 3_600_000  # a past hour
TOPIC = "metrics"
QUERIES = [
    parse_query(
        "tumbling", "FROM * SELECT m.lat WINDOW 5m COMPUTE count, sum, min, max, avg, percentile(50), percentile(99)"
    ),
    parse_query("hopping", "FROM web-* SELECT m.lat WINDOW 3m EVERY 1m COMPUTE count, max, percentile(95)"),
    parse_query("per_server", "FROM * SELECT m.lat WINDOW 2m COMPUTE count, sum, min, percentile(90) PER SERVER"),
    parse_query("other_metric", "FROM * SELECT m.cpu WINDOW 1h COMPUTE count, avg"),
]
SERVERS = ["web-1", "web-2", "web-3", "db-1"]


def events_between(rng: random.Random, lo_ms: int, hi_ms: int, n: int) -> list[dict]:
    return [
        {
            "ts": rng.randrange(lo_ms, hi_ms),
            "server": rng.choice(SERVERS),
            "metric": rng.choice(["m.lat", "m.lat", "m.cpu"]),
            "value": round(rng.lognormvariate(3, 1), 3),
        }
        for _ in range(n)
    ]


def assert_query_results_exact(store, events: list[dict]) -> None:
    rows = DeltaTable(table_uri(store, "query_results")).to_pyarrow_table().to_pylist()
    assert_query_results(rows, events, QUERIES)


def produce_and_batch(store, log, events: list[dict]) -> None:
    with Producer(log, TOPIC, partitions=3, roll_bytes=20_000) as producer:
        producer.send_payloads(events)
    ends = end_offsets(log, TOPIC)
    speed_layer.run_batch_in_process(
        store, TOPIC, ends, watermark_seconds=120, clock_skew_seconds=10**9, queries=QUERIES
    )


#: Ten minutes before a UTC midnight: windows that start together end on either side of it (per_server's 2-minute
#: and hopping's 3-minute windows from 23:58), so their query_results rows are two days' (two partitions).
BEFORE_MIDNIGHT_MS = START_MS - START_MS % 86_400_000 - 600_000


@pytest.mark.parametrize("start_ms", [START_MS, BEFORE_MIDNIGHT_MS], ids=["past_hour", "across_midnight"])
def test_query_results_follow_every_batch_exactly_including_late_events(store, log, start_ms):
    rng = random.Random(7)
    events: list[dict] = []
    for round_ in range(3):
        lo = start_ms + round_ * 600_000
        new = events_between(rng, lo, lo + 600_000, 1500)
        if events:  # late, but inside the watermark (2 min) of what the windows hold
            newest = max(e["ts"] for e in events)
            new += events_between(rng, newest - 100_000, newest, 200)
        events += new
        produce_and_batch(store, log, new)
        assert_query_results_exact(store, events)


def test_a_crash_before_the_query_results_commit_is_caught_up_and_a_replay_changes_nothing(store, log, monkeypatch):
    rng = random.Random(8)
    first = events_between(rng, START_MS, START_MS + 300_000, 800)
    produce_and_batch(store, log, first)
    real = query_results_commit.upsert_query_results

    def crash(*args, **kwargs):
        raise RuntimeError("killed before the query results commit")

    monkeypatch.setattr(query_results_commit, "upsert_query_results", crash)
    second = events_between(rng, START_MS + 300_000, START_MS + 600_000, 800)
    with pytest.raises(RuntimeError):
        produce_and_batch(store, log, second)
    monkeypatch.setattr(query_results_commit, "upsert_query_results", real)
    version = DeltaTable(table_uri(store, "query_results")).version()
    produce_and_batch(store, log, [])  # the next batch: nothing new in the log, query results catch up
    assert_query_results_exact(store, first + second)
    caught_up = DeltaTable(table_uri(store, "query_results")).version()
    assert caught_up == version + 1
    produce_and_batch(store, log, [])  # a replay: every table holds the positions, nothing is committed
    assert DeltaTable(table_uri(store, "query_results")).version() == caught_up
