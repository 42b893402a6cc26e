"""``lake stream --metrics-port``'s metrics: what the committed batches did, where their time went, and the lake's size.

Two real in-process batches are observed; every figure is checked against its own source (the outcomes, the
Delta snapshot, the partition index), read independently of the collector.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.speed_metrics import SpeedMetrics
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.speed.progress import POSITION_TABLES
from metrics_lake.core.tables.delta import table_uri

TOPIC = "metrics"


def samples(metrics: SpeedMetrics) -> dict[tuple[str, tuple], float]:
    """Every sample of the registry's text exposition, by (name, sorted labels)."""
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_batches_rows_stage_seconds_and_the_lakes_size_are_exported(store, log):
    metrics = SpeedMetrics(store, TOPIC)
    fleet = FleetSimulator(servers=3, metrics=2, seconds=2, seed=5, start_ms=1_763_600_040_000)
    outcomes, sent = [], 0
    for _, events in fleet.second_batches():
        with Producer(log, TOPIC, partitions=2) as producer:
            producer.send(events)
        sent += events.num_rows
        outcome = run_batch_in_process(
            store, TOPIC, end_offsets(log, TOPIC), watermark_seconds=120, clock_skew_seconds=10**9
        )
        metrics.observe(outcome)
        outcomes.append(outcome)

    got = samples(metrics)
    assert got[("lake_stream_batches_total", ())] == 2
    assert got[("lake_stream_records_read_total", ())] == sent
    assert got[("lake_stream_rows_total", (("table", "bronze_events"),))] == sent
    stages = {stage for outcome in outcomes for stage in outcome.stages}
    assert {"bronze_events", "metric_windows_1m", "query_results"} <= stages
    for stage in stages:
        spent = sum(outcome.stages.get(stage, 0.0) for outcome in outcomes)
        assert got[("lake_stream_batch_stage_seconds_total", (("stage", stage),))] == pytest.approx(spent, rel=1e-9)
    assert sum(got[("lake_stream_batch_stage_seconds_total", (("stage", s),))] for s in stages) <= sum(
        outcome.seconds for outcome in outcomes
    )

    for table in POSITION_TABLES:
        delta = DeltaTable(table_uri(store, table))
        assert got[("lake_table_active_files", (("table", str(table)),))] == len(delta.file_uris())
        assert got[("lake_table_version", (("table", str(table)),))] == delta.version()
    listed = {partition: len(log.index(TOPIC, partition).segments) for partition in range(2)}
    assert sum(listed.values()) >= 2  # a segment per producer at least
    for partition, count in listed.items():
        assert got[("lake_log_segments", (("partition", str(partition)),))] == count
