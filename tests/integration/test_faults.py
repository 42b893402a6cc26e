"""Fault tests on the S3 backend: the gateway and the S3 server are each killed (SIGKILL) and restarted
while agents send; afterwards the events in bronze_events are exactly the events the agents produced.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time

import pyarrow as pa
import pytest
import requests

from metrics_lake.agents.gateway_client import GatewaySender
from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.infra.seaweedfs import running_pid, settings_env, store_as
from tests.helpers import LAKE, free_port_block, positions
from tests.integration.test_s3_pipeline import run_lake
from tests.spark.test_stream_metrics import table_rows

pytestmark = [pytest.mark.integration, pytest.mark.s3, pytest.mark.slow]


class GatewayProcess:
    """`lake gateway` as a child process that can be killed and restarted on the same port."""

    def __init__(self, env: dict, port: int, log_path) -> None:
        self.env, self.port, self.process, self.log_path = env, port, None, log_path
        self.url = f"http://127.0.0.1:{port}"

    def start(self, timeout: float = 60) -> float:
        """Start and wait until /healthz answers 200; returns the seconds that took."""
        started = time.monotonic()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
        with open(self.log_path, "ab") as log:  # a file, not a pipe nobody drains
            self.process = subprocess.Popen(
                [LAKE, "gateway", "--port", str(self.port), "--linger-ms", "50"], env={**clean, **self.env}, stderr=log
            )
        while time.monotonic() - started < timeout:
            assert self.process.poll() is None, self.log_path.read_text()[-3000:]
            try:
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise TimeoutError("gateway did not become healthy")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


def _agent(url: str, spool, simulator: FleetSimulator, stop_sending: threading.Event) -> GatewaySender:
    """An agent thread sending one second of events every 20 ms through its own spool."""
    sender = GatewaySender(url, spool, backoff_base=0.05, backoff_cap=1.0, timeout=5)

    def run() -> None:
        for _, batch in simulator.second_batches():
            sender.send(batch)
            time.sleep(0.02)
        stop_sending.set()

    threading.Thread(target=run, daemon=True).start()
    return sender


def event_multiset(table: pa.Table) -> collections.Counter:
    rows = table.select(["server", "metric", "ts", "value"]).to_pylist()
    return collections.Counter((r["server"], r["metric"], r["ts"], r["value"]) for r in rows)


def test_killing_the_gateway_and_the_s3_server_loses_and_duplicates_nothing(own_s3_server, tmp_path):
    server = own_s3_server
    local = {"LAKE_CHECKPOINT_DIR": str(tmp_path / "ck"), "LAKE_SPARK_MASTER": "local[2]"}
    local |= {"LAKE_SHUFFLE_PARTITIONS": "2", "LAKE_LEASE_TTL_SECONDS": "2"}
    gateway = GatewayProcess(
        settings_env(server, "agent") | local, free_port_block((0,), lowest=20000), tmp_path / "gateway.log"
    )
    gateway.start()
    start_ms = int(time.time() * 1000)
    simulators = [FleetSimulator(servers=8, metrics=5, seconds=300, seed=seed, start_ms=start_ms) for seed in (1, 2)]
    done = [threading.Event() for _ in simulators]
    agents = [_agent(gateway.url, tmp_path / f"spool-{i}", sim, done[i]) for i, sim in enumerate(simulators)]
    try:
        # Some events must be acked before the kill; on a loaded machine (the suite runs in parallel) the
        # first acks can take longer than a fixed sleep, so wait for them, bounded.
        deadline = time.monotonic() + 60
        while sum(a.stats.acked for a in agents) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        acked_before = sum(a.stats.acked for a in agents)
        gateway.kill()  # mid-run: requests in flight are lost with it, their batches stay spooled
        time.sleep(1.0)
        restart_gateway = gateway.start()  # waits out the dead gateway's lease (TTL 2 s)
        time.sleep(1.0)
        os.killpg(running_pid(server), signal.SIGKILL)  # the object store dies mid-run too
        time.sleep(2.0)
        spooled_during_outage = sum(a.pending_batches() for a in agents)
        run_lake(
            {},
            "infra",
            "up",
            "--data-dir",
            str(server.data_dir),
            "--s3-port",
            str(server.s3_port),
            "--master-port",
            str(server.master_port),
        )
        s3_back = time.monotonic()
        for event in done:
            assert event.wait(120)
        for agent in agents:
            assert agent.flush(timeout=120), "spool not drained after the faults"
            agent.close()
        drained = time.monotonic() - s3_back
    finally:
        gateway.stop()
    assert acked_before > 0 and spooled_during_outage > 0 and restart_gateway < 30
    retries = sum(a.stats.retries for a in agents)
    print(
        f"recovery: {acked_before} events acked before the gateway kill; restarted gateway healthy after "
        f"{restart_gateway:.1f} s; {spooled_during_outage} batches waiting in the spools during the S3 outage; "
        f"all sent and spools drained {drained:.1f} s after S3 was back; {retries} agent retries"
    )

    run_lake(settings_env(server, "pipeline") | local, "stream", "--once")
    bronze = table_rows(store_as(server, "admin"), "bronze_events")
    assert len(positions(bronze)) == len(set(positions(bronze)))  # no offset twice
    produced = sum((event_multiset(sim.generate()) for sim in simulators), collections.Counter())
    assert sum(produced.values()) == 2 * 8 * 5 * 300
    assert event_multiset(pa.Table.from_pylist(bronze)) == produced  # nothing lost, nothing duplicated
