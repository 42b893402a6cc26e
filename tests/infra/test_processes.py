"""Stopping a daemon's process group (infra/processes.py)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from metrics_lake.infra.processes import stop_process_group


def test_a_group_this_process_started_is_done_when_it_exits_not_at_the_timeout():
    # The leader is our child: once it exits it stays a zombie (still in its group) until reaped. Before, the wait
    # saw the zombie's group as alive for the whole timeout (the demo's Alertmanager cost 10 s at every exit).
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    started = time.monotonic()
    stop_process_group(child.pid, timeout=60)
    assert time.monotonic() - started < 30  # SIGTERM ends sleep at once; the 60 s timeout was not waited out
    with pytest.raises(ProcessLookupError):
        os.killpg(child.pid, 0)
