"""docs/lake-stream.service: the systemd unit the docs point operators to for `lake stream`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAKE = str(Path(sys.executable).with_name("lake"))


def test_the_shipped_stream_unit_is_valid_and_signals_the_driver_alone(tmp_path):
    """It passes systemd's own check (ExecStart pointed at this installation), and `systemctl stop` sends SIGTERM to
    `lake stream` only (KillMode=mixed), which stops between micro-batches, with time for a batch to commit."""
    unit = (ROOT / "docs" / "lake-stream.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert (settings["KillMode"], settings["Restart"]) == ("mixed", "on-failure")
    assert int(settings["TimeoutStopSec"]) >= 60
    assert settings["ExecStart"].split()[1:3] == ["stream", "--metrics-port"]
    local = tmp_path / "lake-stream.service"
    local.write_text(unit.replace(settings["ExecStart"].split()[0], LAKE))
    checked = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
