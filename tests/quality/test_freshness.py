"""Missing data is a signal: a run for today fails critically when the newest window is too old, or absent."""

from __future__ import annotations

import datetime as dt
import json

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.quality.freshness import EXPECTATION, freshness_outcomes

START_MS = 1_750_000_000_000 - 1_750_000_000_000 % 60_000
QUERIES = [parse_query("cpu_5m", "FROM * SELECT host.cpu.utilization WINDOW 5m COMPUTE avg")]


def test_freshness_passes_while_data_is_recent_and_fails_when_it_stops(settings, store, log):
    with Producer(log, "metrics", partitions=2) as producer:
        producer.send(FleetSimulator(servers=2, metrics=1, seconds=600, seed=1, start_ms=START_MS).generate())
    run_batch_in_process(
        store, "metrics", end_offsets(log, "metrics"), watermark_seconds=120, clock_skew_seconds=300, queries=QUERIES
    )
    newest = dt.datetime.fromtimestamp((START_MS + 600_000) / 1000, dt.UTC)  # the last minute's end
    fresh = freshness_outcomes(settings, QUERIES, newest + dt.timedelta(seconds=60))
    assert [(o.table, o.success, o.critical, o.expectation) for o in fresh] == [
        ("metric_windows_1m", True, True, EXPECTATION),
        ("query_results", True, True, EXPECTATION),
    ]
    assert json.loads(fresh[0].threshold) == {"max_lag_seconds": settings.quality_freshness_lag_seconds}

    stale = freshness_outcomes(settings, QUERIES, newest + dt.timedelta(hours=2))  # data ended two hours ago
    assert [o.success for o in stale] == [False, False]
    assert "7,200 s before the check" in stale[0].observed_value

    missing = QUERIES + [parse_query("never", "FROM * SELECT no.such.metric WINDOW 1m COMPUTE count")]
    assert freshness_outcomes(settings, missing, newest)[-1].observed_value == "no window at all"


def test_an_empty_lake_is_not_fresh(settings):
    [windows] = freshness_outcomes(settings, [], dt.datetime.now(dt.UTC))
    assert (windows.success, windows.observed_value) == (False, "no window at all")
