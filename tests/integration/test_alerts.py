"""Alerts end to end against a real Alertmanager: `lake stream` evaluates a threshold and an absence rule live, posts
to Debian's prometheus-alertmanager, which notifies a webhook; both alerts fire and resolve, and 30 s without
Alertmanager lose nothing (the alerts table is the outbox)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import requests

from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.delta import open_table
from metrics_lake.infra.alertmanager import LocalAlertmanager, start, stop
from tests.helpers import LAKE, WebhookReceiver, free_port_block, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SERVERS = ("web-1", "web-2", "web-3")


def transitions(store) -> list[tuple]:
    if not store.exists("tables/alerts/_delta_log"):
        return []
    rows = open_table(store, "alerts").to_pyarrow_table()
    rows = rows.filter(pc.is_in(rows.column("rule"), pa.array(["hot", "quiet"])))  # the shipped rules may pend too
    rows = rows.filter(pc.equal(rows.column("source"), "live")).sort_by(
        [("recorded_at", "ascending"), ("seq", "ascending")]
    )
    return [(r["rule"], r["server"], r["state"]) for r in rows.to_pylist()]


class Agents:
    """Three servers sending CPU and RPC latency every 0.25 s with the wall clock's time, until stopped."""

    def __init__(self, log, topic: str) -> None:
        self.latency = dict.fromkeys(SERVERS, 10.0)
        self.silent: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(log, topic), daemon=True)

    def _run(self, log, topic: str) -> None:
        with Producer(log, topic, partitions=2, linger_ms=50) as producer:
            while not self.stop.is_set():
                now = int(time.time() * 1000)
                events = [
                    {"ts": now, "server": s, "metric": "app.rpc.latency_ms", "value": self.latency[s]} for s in SERVERS
                ]
                events += [
                    {"ts": now, "server": s, "metric": "host.cpu.utilization", "value": 20.0}
                    for s in SERVERS
                    if s not in self.silent
                ]
                producer.send_payloads(events)
                self.stop.wait(0.25)


def test_threshold_and_absence_alerts_fire_and_resolve_at_alertmanager_through_an_outage(
    settings, store, log, tmp_path
):
    with WebhookReceiver() as hook:
        manager = LocalAlertmanager(tmp_path / "alertmanager", free_port_block((0,), lowest=21000), webhook=hook.url)
        start(manager, log=lambda _: None)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
        env |= {
            "LAKE_ROOT": settings.root,
            "LAKE_CHECKPOINT_DIR": settings.checkpoint_dir,
            "LAKE_SPARK_MASTER": "local[2]",
            "LAKE_SHUFFLE_PARTITIONS": "2",
            "LAKE_TRIGGER_SECONDS": "1",
            "LAKE_WATERMARK_SECONDS": "5",
            "LAKE_ALERTMANAGER_URL": manager.url,
            "LAKE_ALERT_RESEND_SECONDS": "3",
        }

        def lake(*args: str) -> None:
            result = subprocess.run([LAKE, *args], env=env, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr

        lake("queries", "add", "lat_1m", "FROM web-* SELECT app.rpc.latency_ms WINDOW 1m COMPUTE max PER SERVER")
        lake("alerts", "add", "hot", "lat_1m.max > 250 LABELS severity=page", "--description", "slow RPCs")
        lake("alerts", "add", "quiet", "ABSENT host.cpu.utilization FROM web-* FOR 3s LABELS severity=warning")
        agents = Agents(log, settings.topic)
        agents.thread.start()
        with open(tmp_path / "stream.log", "wb") as output:
            stream = subprocess.Popen(
                [LAKE, "stream"], env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for(
                lambda: store.exists("tables/alerts/_delta_log") and open_table(store, "alerts").version() > 1,
                "batches",
            )
            # Alertmanager up: a latency spike on web-1 and a silence of web-2 both reach the webhook.
            agents.latency["web-1"] = 500.0
            agents.silent.add("web-2")
            wait_for(lambda: ("firing", "hot", "web-1") in hook.seen(), "hot firing at the webhook")
            wait_for(lambda: ("firing", "quiet", "web-2") in hook.seen(), "quiet firing at the webhook")
            agents.latency["web-1"] = 10.0  # resolves when the next 1-minute window is the current one
            listed = requests.get(f"{manager.url}/api/v2/alerts", timeout=5).json()
            (hot,) = [a for a in listed if a["labels"]["alertname"] == "hot"]
            assert hot["labels"] == {"alertname": "hot", "server": "web-1", "severity": "page"}
            assert (
                hot["annotations"]["description"] == "slow RPCs"
                and "= 500 > 250 on web-1" in hot["annotations"]["summary"]
            )
            assert hot["generatorURL"].endswith("/#alert=hot")
            rows = open_table(store, "alerts").to_pyarrow_table().to_pylist()
            assert hot["fingerprint"] == next(r["fingerprint"] for r in rows if r["rule"] == "hot")

            # Alertmanager down for 30 s: web-2 returns, web-3 goes silent; both transitions wait in the outbox.
            outage = time.monotonic()
            stop(manager, log=lambda _: None)
            agents.silent.discard("web-2")
            agents.silent.add("web-3")
            wait_for(lambda: ("quiet", "web-2", "resolved") in transitions(store), "quiet on web-2 resolved")
            wait_for(lambda: ("quiet", "web-3", "firing") in transitions(store), "quiet on web-3 firing")
            time.sleep(max(0.0, 30 - (time.monotonic() - outage)))
            assert ("resolved", "quiet", "web-2") not in hook.seen()
            start(manager, log=lambda _: None)
            wait_for(lambda: ("resolved", "quiet", "web-2") in hook.seen(), "quiet on web-2 resolved at the webhook")
            wait_for(lambda: ("firing", "quiet", "web-3") in hook.seen(), "quiet on web-3 firing at the webhook")
            agents.silent.discard("web-3")
            wait_for(lambda: ("resolved", "quiet", "web-3") in hook.seen(), "quiet on web-3 resolved")
            wait_for(lambda: ("resolved", "hot", "web-1") in hook.seen(), "hot resolved")
        finally:
            agents.stop.set()
            stream.send_signal(signal.SIGTERM)  # the driver only: it stops Spark itself
            stopped = stream.wait(60)
            with contextlib.suppress(ProcessLookupError):  # whatever of the group is still running
                os.killpg(stream.pid, signal.SIGKILL)
            stop(manager, log=lambda _: None)
    log_text = " ".join((tmp_path / "stream.log").read_text().split())  # the console wraps long lines
    assert stopped == 0, log_text[-3000:]
    assert "did not answer" in log_text and "accepts alerts again" in log_text  # the outage, as the stream logged it

    expected = [
        ("hot", "web-1", "firing"),
        ("hot", "web-1", "resolved"),
        ("quiet", "web-2", "firing"),
        ("quiet", "web-2", "resolved"),
        ("quiet", "web-3", "firing"),
        ("quiet", "web-3", "resolved"),
    ]
    assert Counter(transitions(store)) == Counter(expected)  # each transition once
    for rule, server in {(r, s) for r, s, _ in expected}:  # in order: firing before resolved
        assert [state for r, s, state in transitions(store) if (r, s) == (rule, server)] == ["firing", "resolved"]
    notified = [(status, name, server) for status, name, server in hook.seen()]
    for rule, server in {(r, s) for r, s, _ in expected}:
        mine = [status for status, name, s in notified if (name, s) == (rule, server)]
        assert mine[0] == "firing" and mine[-1] == "resolved", (rule, server, mine)
