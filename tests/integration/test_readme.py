"""The README's Quick start: exactly two commands, and both work.

The test command is what `.ci/run` runs (so CI proves it); the demo command is
run here as written, from the repository root, with only LAKE_ROOT and
LAKE_CHECKPOINT_DIR pointed at a temporary directory so a test run never
touches a developer's ./lakehouse.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_second():
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    assert shlex.split(commands[0])[-2:] == ["lake", "demo"]
    ci_lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert commands[1] in ci_lines


@pytest.mark.integration
@pytest.mark.slow
def test_demo_command_runs_end_to_end_in_under_three_minutes(tmp_path):
    env = {
        **os.environ,
        "LAKE_ROOT": str(tmp_path / "lakehouse"),
        "LAKE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "COLUMNS": "200",
    }
    started = time.monotonic()
    result = subprocess.run(
        shlex.split(quick_start_commands()[0]), cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert elapsed < 180, f"demo took {elapsed:.0f} s"
    assert "demo finished" in output
    rows = {
        m.group(1): int(m.group(2).replace(",", ""))
        for m in re.finditer(
            r"(bronze_events|quarantine_events|metric_windows_1m)\s*│\s*\d+\s*│\s*\d+\s*│\s*([\d,]+)", output
        )
    }
    assert rows["quarantine_events"] == 9  # one per malformed sample the demo sends
    assert rows["bronze_events"] > 20 * 8 * 50 and rows["metric_windows_1m"] > 20 * 8
    assert "host.cpu.utilization" in output or "window_start" in output
    # The last simulated server goes silent part way: the demo's absence rule fires and resolves, and the demo's
    # Alertmanager (.ci/run installs Debian's) notifies its webhook of both.
    assert re.search(r"demo_server_silent\s*│\s*sim-0019\s*│\s*inactive -> firing", output), output[-4000:]
    assert re.search(r"demo_server_silent\s*│\s*sim-0019\s*│\s*firing -> resolved", output)
    assert "FIRING: alertname=demo_server_silent server=sim-0019" in output
    assert "RESOLVED: alertname=demo_server_silent server=sim-0019" in output
    # The demo labels its servers (3 teams x 3 dcs) and answers its grouped query: one row per group.
    groups = re.findall(r"(payments|search|checkout)\s*│\s*(eu-west|eu-north|us-east)\s*│\s*\d\d:\d\d\s*│\s*\d", output)
    assert len(set(groups)) == len(groups) == 9, output[-3000:]
