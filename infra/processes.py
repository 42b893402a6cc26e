"""What the local servers share: a daemon's PID file, stopping the process group it leads, checking its ports."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

__all__ = ["bind_error", "pid_from_file", "stop_process_group"]


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
        try:  # a leader that this process started stays a zombie, still in its group, until it is reaped
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (started by an earlier command): its parent or init reaps it
            pass
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def bind_error(port: int, host: str = "127.0.0.1") -> OSError | None:
    """Why a server could not bind ``host:port`` now (a listener, or a client socket using the port), or None.

    Binds with ``SO_REUSEADDR`` as servers do, so connections in TIME_WAIT
    are no conflict.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None
