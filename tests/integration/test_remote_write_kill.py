"""Remote-write exactly once across gateway crashes: senders retry whole bodies as Prometheus does, the gateway is
SIGKILLed twice mid-load and restarted, and bronze holds every sample of every body once.

Remote-write carries no sequence numbers: a sender whose request failed (connection refused or reset, 5xx, 429)
sends the same body again until it gets a 2xx. A body whose points the killed gateway had appended but not yet
answered is therefore sent twice; the gateway knows it by its digest, also after a restart (the request keys in
the segments' footers, kept ``LAKE_GATEWAY_REQUEST_WINDOW_SECONDS``). To make that case certain rather than a
matter of timing, every sender also re-sends its last acknowledged body after each outage, as if that answer had
been lost too, and a third of its bodies once more at random.
"""

from __future__ import annotations

import collections
import random
import threading
import time

import cramjam
import pytest
import requests

from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.jobs.stream_metrics import run_stream
from tests.helpers import free_port_block
from tests.integration.test_faults import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

SENDERS = 6
BODIES_PER_SENDER = 40
HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}


def body_of(sender: int, first_ms: int, rng: random.Random) -> tuple[bytes, list[tuple]]:
    """A snappy ``WriteRequest`` of 1-40 series of ``host-<sender>`` with 1-5 samples each from ``first_ms`` on, and
    its samples as (server, metric, ts ms, value)."""
    request, samples = WriteRequest(), []
    for series in range(rng.randint(1, 40)):
        labels = {"__name__": f"rw_metric_{series}", "instance": f"host-{sender}", "job": "kill-test"}
        added = request.timeseries.add()
        added.labels.extend(Label(name=k, value=v).SerializeToString() for k, v in labels.items())
        for step in range(rng.randint(1, 5)):
            value, ts = rng.random(), first_ms + step
            added.samples.add(value=value, timestamp=ts)
            samples.append((f"host-{sender}", f"rw_metric_{series}", ts, value))
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString())), samples


class Sender:
    """One Prometheus-like sender: each body is sent until a 2xx; counts what it sent and resent."""

    def __init__(self, url: str, index: int, start_ms: int) -> None:
        self.url, self.index, self.rng = f"{url}/api/v1/write", index, random.Random(index)
        self.start_ms = start_ms
        self.samples: list[tuple] = []
        self.outages = self.resent = 0
        self.error: BaseException | None = None  # what stopped the thread early, for the test to report
        self.thread = threading.Thread(target=self.run_recording_errors, daemon=True)

    def post_until_acknowledged(self, body: bytes) -> None:
        """Send ``body`` until a 2xx, counting an outage if an attempt failed on the way (the gateway was down)."""
        failed = False
        while True:
            try:
                status = requests.post(self.url, data=body, headers=HEADERS, timeout=10).status_code
                if status in (200, 204):
                    self.outages += failed
                    return
                assert status in (429, 503), status  # what Prometheus retries; anything else is a test failure
            except requests.RequestException:
                pass
            failed = True
            time.sleep(0.05)

    def run_recording_errors(self) -> None:
        try:
            self.run()
        except BaseException as error:  # a thread's exception would otherwise only be printed
            self.error = error

    def run(self) -> None:
        last = None
        for number in range(BODIES_PER_SENDER):
            body, samples = body_of(self.index, self.start_ms + number * 1000, self.rng)
            outages = self.outages
            self.post_until_acknowledged(body)
            if self.outages > outages and last is not None:  # the answer before the outage may be the lost one
                self.post_until_acknowledged(last)
                self.resent += 1
            self.samples += samples
            if self.rng.random() < 1 / 3:
                self.post_until_acknowledged(body)
                self.resent += 1
            last = body
            time.sleep(0.02)


def test_a_sigkilled_gateway_lands_every_retried_remote_write_sample_once(spark, settings, store, tmp_path):
    env = {
        "LAKE_ROOT": settings.root,
        "LAKE_CHECKPOINT_DIR": settings.checkpoint_dir,
        "LAKE_LEASE_TTL_SECONDS": "2",
    }
    gateway = GatewayProcess(env, free_port_block((0,), lowest=20000), tmp_path / "gateway.log")
    gateway.start()
    start_ms = int(time.time() * 1000) - 3_600_000  # an hour ago: every sample within the contract's range
    senders = [Sender(gateway.url, i, start_ms + i * 100_000) for i in range(SENDERS)]
    try:
        for sender in senders:
            sender.thread.start()
        for _ in range(2):
            deadline, target = time.monotonic() + 60, sum(len(s.samples) for s in senders) + 200
            while sum(len(s.samples) for s in senders) < target and time.monotonic() < deadline:  # mid-load
                time.sleep(0.05)
            time.sleep(random.uniform(0.2, 0.6))
            gateway.kill()  # mid-load: some bodies are appended and not answered, others not appended
            time.sleep(0.5)
            gateway.start()  # waits out the dead gateway's leases (TTL 2 s), then reads their request keys
        for sender in senders:
            sender.thread.join(180)
            assert not sender.thread.is_alive()
    finally:
        gateway.stop()
    assert [sender.error for sender in senders] == [None] * SENDERS
    assert [sender.outages >= 1 for sender in senders] == [True] * SENDERS  # every sender lived through an outage
    resent = sum(sender.resent for sender in senders)
    expected = collections.Counter(sample for sender in senders for sample in sender.samples)
    assert resent > SENDERS and max(expected.values()) == 1  # bodies were re-sent; each sample is one point

    run_stream(spark, settings, once=True)
    bronze = open_table(store, "bronze_events").to_pyarrow_table(columns=["server", "metric", "ts", "value"])
    landed = collections.Counter(
        (row["server"], row["metric"], round(row["ts"].timestamp() * 1000), row["value"]) for row in bronze.to_pylist()
    )
    assert sum(landed.values()) == sum(expected.values())
    assert landed == expected  # every acknowledged sample once: no retry and no re-sent body landed twice
