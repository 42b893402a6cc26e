"""The batch layer: a day's windows recomputed from bronze, late events included, and reconciliation."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.jobs.recompute import recompute
from metrics_lake.spark.jobs.stream_metrics import run_stream
from tests.spark.test_stream_metrics import START_MS, check_windows, produced_rows, table_rows

pytestmark = pytest.mark.spark
DAY = dt.datetime.fromtimestamp(START_MS / 1000, dt.UTC).date()


def late_events(n: int) -> list[str]:
    """``n`` events 20 minutes before the simulated data: behind the speed layer's watermark when they arrive."""
    return [
        json.dumps(
            {
                "ts": START_MS - 1_200_000 + i * 1000,
                "server": "sim-0000",
                "metric": "host.cpu.utilization",
                "value": float(i),
            }
        )
        for i in range(n)
    ]


def test_recompute_counts_late_events_reconciles_and_is_idempotent(spark, settings, log, store):
    settings = settings.model_copy(update={"watermark_seconds": 60})
    sim = FleetSimulator(servers=3, metrics=2, seconds=180, rate=2.0, seed=9, start_ms=START_MS)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(sim.generate())
    run_stream(spark, settings, once=True)  # the watermark passes START_MS + 2 min
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send_payloads(late_events(7))
    run_stream(spark, settings, once=True)
    produced = produced_rows(log)
    assert sum(w["count"] for w in table_rows(store, "metric_windows_1m")) == sim.total_events  # late ones missing

    (result,) = recompute(spark, settings, [DAY])
    assert (result.events, result.late_events, result.skipped) == (sim.total_events + 7, 7, False)
    check_windows(store, produced)  # every event, late ones included, exactly as an independent computation
    reconciliation = {r["metric"]: r for r in table_rows(store, "lambda_reconciliation")}
    assert reconciliation["host.cpu.utilization"]["late_events"] == 7
    assert reconciliation["host.cpu.utilization"]["batch_sum"] - reconciliation["host.cpu.utilization"][
        "speed_sum"
    ] == pytest.approx(sum(range(7)))
    assert all(r["late_events"] == 0 for m, r in reconciliation.items() if m != "host.cpu.utilization")

    versions = {name: open_table(store, name).version() for name in ("metric_windows_1m", "lambda_reconciliation")}
    (again,) = recompute(spark, settings, [DAY])
    assert again.skipped
    assert {name: open_table(store, name).version() for name in versions} == versions

    # More late data lands after the recompute: the next one adds it and keeps the speed layer's figures.
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send_payloads(late_events(10)[7:])
    run_stream(spark, settings, once=True)
    (third,) = recompute(spark, settings, [DAY])
    assert (third.late_events, third.skipped) == (10, False)
    check_windows(store, produced_rows(log))
