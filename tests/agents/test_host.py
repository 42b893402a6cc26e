"""The host agent reads real metrics from this machine."""

from __future__ import annotations

import threading

import psutil

from metrics_lake.agents.host import HostAgent
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.lake_schemas.contract import validate_event


def test_sample_has_every_metric_family_and_passes_the_contract():
    events = HostAgent("test-host").sample()
    names = {e["metric"] for e in events}
    cores = psutil.cpu_count(logical=True)
    assert {f"host.cpu.core_{i}.utilization" for i in range(cores)} <= names
    for required in (
        "host.cpu.utilization",
        "host.memory.utilization",
        "host.memory.used_bytes",
        "host.swap.used_bytes",
        "host.net.recv_bytes",
        "host.load.1m",
        "host.processes.count",
    ):
        assert required in names
    for event in events:
        validate_event(event)
        assert event["server"] == "test-host"
    memory = next(e for e in events if e["metric"] == "host.memory.used_bytes")["value"]
    assert 0 < memory <= psutil.virtual_memory().total


def test_run_samples_on_an_interval_into_the_log(log):
    agent = HostAgent("test-host")
    with Producer(log, "metrics", partitions=2, linger_ms=50) as producer:
        sent = agent.run(producer, interval=0.2, duration=0.5, stop=threading.Event())
    per_sample = len(agent.sample())
    assert sent == 3 * per_sample  # samples at t=0, 0.2, 0.4
    stored = sum(read_range(log, "metrics", p, 0, end).num_rows for p, end in end_offsets(log, "metrics").items())
    assert stored == sent
