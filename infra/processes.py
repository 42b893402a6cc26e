"""What the local servers share: a daemon's PID file, and stopping the process group it leads."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["pid_from_file", "stop_process_group"]


def pid_from_file(path: Path) -> int | None:
    """The PID written in ``path`` if that process runs; None for a missing, malformed or stale file."""
    try:
        pid = int(path.read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def stop_process_group(pid: int, timeout: float) -> None:
    """SIGTERM the process group led by ``pid`` (a daemon started in its own session and the children it
    launched), wait up to ``timeout`` seconds for all of it to exit, then SIGKILL what remains."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
