"""The day everything goes dark: a real `lake gateway` and `lake stream` with two real Alertmanagers (an HA pair).

Two agents post through the gateway once a second, then everything stops
while the stream keeps running: the absence rule fires for both servers and
``LakeNoData`` fires, with no record arriving (the stream's idle evaluation);
the Watchdog is listed by both Alertmanagers throughout; one Alertmanager
is stopped for 30 s meanwhile and, once back, holds the same alerts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest
import requests

from metrics_lake.infra.alertmanager import LocalAlertmanager, start, stop
from tests.app.gateway_process import running_gateway
from tests.helpers import LAKE, free_port_block, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FOR_S = 10
NODATA_S = 20


def listed(manager: LocalAlertmanager) -> dict[tuple[str, str | None], dict]:
    """The alerts an Alertmanager holds and considers active, by (alertname, server); {} when it does not answer."""
    try:
        alerts = requests.get(f"{manager.url}/api/v2/alerts", timeout=2).json()
    except requests.RequestException:
        return {}
    return {(a["labels"]["alertname"], a["labels"].get("server")): a for a in alerts}


def test_total_silence_fires_absence_and_lakenodata_at_both_alertmanagers_with_the_watchdog_throughout(
    settings, tmp_path
):
    ports = free_port_block((0, 1), lowest=25000)
    first = LocalAlertmanager(tmp_path / "am1", ports)
    second = LocalAlertmanager(tmp_path / "am2", ports + 1)
    start(first, log=lambda _: None)
    start(second, log=lambda _: None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env |= {
        "LAKE_ROOT": settings.root,
        "LAKE_CHECKPOINT_DIR": settings.checkpoint_dir,
        "LAKE_SPARK_MASTER": "local[2]",
        "LAKE_SHUFFLE_PARTITIONS": "2",
        "LAKE_TRIGGER_SECONDS": "1",
        "LAKE_WATERMARK_SECONDS": "5",
        "LAKE_ALERTMANAGER_URL": f"{first.url},{second.url}",
        "LAKE_ALERT_RESEND_SECONDS": "2",
        "LAKE_NODATA_SECONDS": str(NODATA_S),
    }
    added = subprocess.run(
        [LAKE, "alerts", "add", "quiet", f"ABSENT host.cpu.utilization FROM * FOR {FOR_S}s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert added.returncode == 0, added.stderr
    stream = None
    watchdog_gaps: list[str] = []
    watching = threading.Event()

    def watch_watchdog() -> None:  # the Watchdog at the Alertmanager that stays up, every half second
        while not watching.wait(0.5):
            if ("Watchdog", None) not in listed(first):
                watchdog_gaps.append(time.strftime("%H:%M:%S"))

    try:
        with running_gateway(env, "--linger-ms", "20") as gateway:
            with open(tmp_path / "stream.log", "wb") as output:
                stream = subprocess.Popen(
                    [LAKE, "stream"], env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
                )
            sent = 0
            deadline = time.monotonic() + 90
            # The agents post once a second until the stream has committed them and the Watchdog is up.
            while time.monotonic() < deadline:
                now = int(time.time() * 1000)
                events = [
                    {"ts": now, "server": s, "metric": "host.cpu.utilization", "value": 20.0} for s in ("a-1", "a-2")
                ]
                answer = requests.post(f"{gateway.url}/v1/events", json=events, timeout=10)
                assert answer.status_code == 200, answer.text
                sent += 1
                if sent >= 10 and ("Watchdog", None) in listed(first) and ("Watchdog", None) in listed(second):
                    break
                time.sleep(1)
            assert ("Watchdog", None) in listed(first), (tmp_path / "stream.log").read_text()[-3000:]
            threading.Thread(target=watch_watchdog, daemon=True).start()
            silent_since = time.monotonic()  # the fleet (and the gateway) go silent
            stop(second, log=lambda _: None)
            down_since = time.monotonic()

            def fired() -> bool:
                alerts = listed(first)
                return all(key in alerts for key in (("quiet", "a-1"), ("quiet", "a-2"), ("LakeNoData", None)))

            wait_for(fired, "absence alerts and LakeNoData at the first Alertmanager", timeout=90)
            took = time.monotonic() - silent_since
            # FOR + 10 s for the absence alerts; LakeNoData (20 s) is the later one: its own bound.
            assert took <= NODATA_S + 10 + 3, took  # +3: the last post's own second and the poll
            alerts = listed(first)
            assert alerts[("LakeNoData", None)]["labels"] == {
                "alertname": "LakeNoData",
                "severity": "critical",
                "topic": settings.topic,
            }
            # The local Alertmanager's inhibit rule: per-server alerts are muted while LakeNoData fires.
            assert alerts[("quiet", "a-1")]["status"]["inhibitedBy"] == [alerts[("LakeNoData", None)]["fingerprint"]]
            time.sleep(max(0.0, 30 - (time.monotonic() - down_since)))
            start(second, log=lambda _: None)
            wait_for(
                lambda: all(
                    key in listed(second) for key in (("quiet", "a-1"), ("quiet", "a-2"), ("LakeNoData", None))
                ),
                "the second Alertmanager caught up",
                timeout=60,
            )
            assert ("Watchdog", None) in listed(second)
    finally:
        watching.set()
        if stream is not None:
            stream.send_signal(signal.SIGTERM)
            stopped = stream.wait(60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(stream.pid, signal.SIGKILL)
        stop(first, log=lambda _: None)
        stop(second, log=lambda _: None)
    assert stopped == 0, (tmp_path / "stream.log").read_text()[-3000:]
    assert watchdog_gaps == []  # present throughout at the Alertmanager that stayed up
