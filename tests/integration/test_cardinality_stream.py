"""Cardinality limits in a real `lake stream` (Spark): a cardinality bomb is cut at its limit, counted in the
stream's /metrics, and a SIGKILL with the checkpoint and the limit states lost refuses exactly the same events."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest
import requests

from metrics_lake.core import keys
from metrics_lake.core.kernels.cardinality import CardinalityLimits
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.progress import CONSUMER
from tests.app.test_protocol_clients import wait_http
from tests.core.speed.test_cardinality_limits import assert_limited_exactly, events, expected_refused
from tests.helpers import free_port_block
from tests.integration.test_kill_restart import LAKE, bronze_version, lake_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]
GLOBAL = {"LAKE_LIMIT_SERIES_PER_METRIC": "12", "LAKE_LIMIT_VALUES_PER_LABEL": "20", "LAKE_LIMIT_LABELS_PER_EVENT": "4"}


def test_a_killed_stream_with_lost_states_refuses_the_same_events_and_counts_them(settings, log, store, tmp_path):
    env = {**lake_env(settings), **GLOBAL, "LAKE_MAX_RECORDS_PER_BATCH": "150"}
    with Producer(log, settings.topic, partitions=2, roll_bytes=8_000) as producer:
        producer.send(events())
    limits = CardinalityLimits.local(series_per_metric=12, values_per_label=20, labels_per_event=4, partitions=2)
    port = free_port_block((0,), lowest=24000)
    output = open(tmp_path / "stream.log", "wb")  # noqa: SIM115 - closed below, after the process
    process = subprocess.Popen(
        [LAKE, "stream", "--metrics-port", str(port)],
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", timeout=120)
        deadline = time.monotonic() + 180
        limited = 0.0
        while time.monotonic() < deadline and not limited:
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            limited = sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("lake_stream_cardinality_limited_events_total{")
            )
            time.sleep(0.2)
        assert limited > 0, (tmp_path / "stream.log").read_text()[-3000:]
        assert bronze_version(store) >= 1
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # mid-stream: later batches are still to come
        process.wait(30)
        output.close()
    shutil.rmtree(settings.checkpoint_path, ignore_errors=True)
    shutil.rmtree(store.path(f"{keys.consumer_group_prefix(CONSUMER)}/{settings.topic}.limits"), ignore_errors=True)
    final = subprocess.run([LAKE, "stream", "--once"], env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "over cardinality limits" in final.stderr + (tmp_path / "stream.log").read_text()
    assert expected_refused(log, limits, settings.topic)
    assert_limited_exactly(store, log, limits, settings.topic)
