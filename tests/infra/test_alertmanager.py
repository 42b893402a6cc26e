"""`lake infra alertmanager up|status|down`: Debian's prometheus-alertmanager as a local process, configured for the
lake (a webhook receiver with resolved notifications), with clear errors."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from tests.helpers import LAKE, free_port_block

pytestmark = pytest.mark.integration


def lake(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LAKE, "infra", "alertmanager", *args], capture_output=True, text=True, timeout=120)


def test_up_status_down(tmp_path):
    port = free_port_block((0,), lowest=24000)
    where = ["--data-dir", str(tmp_path / "am"), "--port", str(port)]
    up = lake("up", *where, "--webhook", "http://127.0.0.1:9/notifications")
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"export LAKE_ALERTMANAGER_URL=http://127.0.0.1:{port}"  # eval "$(...)" works
    config = json.loads((tmp_path / "am" / "alertmanager.yml").read_text())
    assert config["receivers"] == [
        {"name": "lake", "webhook_configs": [{"url": "http://127.0.0.1:9/notifications", "send_resolved": True}]},
        {"name": "watchdog"},  # the lake's always-firing Watchdog: dropped unless a dead man's switch is given
    ]
    assert config["route"]["group_by"] == ["alertname", "server"]
    assert config["route"]["routes"] == [
        {"matchers": ['alertname="Watchdog"'], "receiver": "watchdog", "repeat_interval": "1m"}
    ]
    assert config["inhibit_rules"] == [
        {"source_matchers": ['alertname="LakeNoData"'], "target_matchers": ['server=~".+"']}
    ]
    try:
        status = lake("status", *where)
        assert status.returncode == 0 and "answers" in status.stderr and "0 alert(s) in Alertmanager" in status.stderr
        assert "already runs" in lake("up", *where).stderr
    finally:
        down = lake("down", *where)
    assert down.returncode == 0 and "stopped Alertmanager" in down.stderr
    after = lake("status", *where)
    assert after.returncode == 1 and "does not answer" in after.stderr
    assert "not running" in lake("down", *where).stderr


def test_bad_input_is_one_line(tmp_path):
    port = free_port_block((0,), lowest=24500)
    bad = lake("up", "--data-dir", str(tmp_path / "am"), "--port", str(port), "--webhook", "ftp://x")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --webhook 'ftp://x'")
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        taken = lake("up", "--data-dir", str(tmp_path / "am"), "--port", str(port))
    assert taken.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1
