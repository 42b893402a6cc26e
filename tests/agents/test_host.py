"""The host agent reads real metrics from this machine."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil

from metrics_lake.agents.host import HEARTBEAT, HostAgent
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.lake_schemas.contract import validate_event
from tests.helpers import LAKE

ROOT = Path(__file__).resolve().parents[2]


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


def test_every_sample_carries_a_heartbeat_that_grows_with_the_agents_age():
    agent = HostAgent("test-host")
    first = next(e["value"] for e in agent.sample() if e["metric"] == HEARTBEAT)
    time.sleep(0.05)
    second = next(e["value"] for e in agent.sample() if e["metric"] == HEARTBEAT)
    assert 0 <= first < second < 5


def test_under_systemd_the_agent_reports_ready_then_pings_the_watchdog_after_each_sample(tmp_path):
    """`lake agent` with NOTIFY_SOCKET set, as systemd starts a Type=notify unit: the datagrams systemd would get."""
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(30)
    env = {
        **os.environ,
        "NOTIFY_SOCKET": address,
        "LAKE_ROOT": str(tmp_path / "lake"),
        "LAKE_SPOOL_DIR": str(tmp_path / "spool"),
    }
    agent = subprocess.run(
        [LAKE, "agent", "--interval", "0.3", "--duration", "1", "--server", "unit-host"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert agent.returncode == 0, agent.stderr
    messages = []
    listener.settimeout(0.5)
    with contextlib.suppress(TimeoutError):
        while True:
            messages.append(listener.recv(4096).decode())
    listener.close()
    assert messages[0] == "READY=1\nSTATUS=sampling unit-host every 0.3 s"
    assert messages[1:-1] == ["WATCHDOG=1"] * 3 and messages[-1] == "STOPPING=1"  # samples at 0, 0.3, 0.6, 0.9 s


def test_the_shipped_systemd_unit_is_valid_and_supervises_with_the_watchdog(tmp_path):
    """docs/lake-agent.service passes systemd's own check (with ExecStart pointed at this installation)."""
    unit = (ROOT / "docs" / "lake-agent.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert (settings["Type"], settings["Restart"], settings["WatchdogSec"]) == ("notify", "always", "30")
    assert " agent " in settings["ExecStart"]
    local = tmp_path / "lake-agent.service"
    local.write_text(unit.replace(settings["ExecStart"].split()[0], LAKE))
    checked = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
