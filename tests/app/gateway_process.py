"""``lake gateway`` as a child process, for tests that need its memory, its logs or a kill."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from tests.helpers import LAKE


@dataclass
class GatewayProcess:
    """A running gateway: its URL, process, stderr lines so far and peak RSS (bytes) sampled every 50 ms."""

    url: str
    process: subprocess.Popen
    stderr: list[str] = field(default_factory=list)
    peak_rss: int = 0

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.poll() is None


@contextmanager
def running_gateway(env: dict[str, str], *args: str, timeout: float = 60) -> Iterator[GatewayProcess]:
    """Start ``lake gateway --port 0 *args`` with ``env``; yields once it listens; SIGTERM (then waits) on exit."""
    process = subprocess.Popen(
        [LAKE, "gateway", "--port", "0", *args],
        env={**os.environ, **env},
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        errors="replace",
    )
    lines: list[str] = []
    listening = threading.Event()
    url: list[str] = []

    def drain() -> None:  # keep reading stderr so the child never blocks on a full pipe
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                url.append(match.group(1))
                listening.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not listening.wait(0.1):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("gateway did not start:\n" + "\n".join(lines))
    gateway = GatewayProcess(url[0], process, lines)
    stop = threading.Event()

    def sample() -> None:
        proc = psutil.Process(process.pid)
        while not stop.wait(0.05):
            try:
                gateway.peak_rss = max(gateway.peak_rss, proc.memory_info().rss)
            except psutil.Error:
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield gateway
    finally:
        stop.set()
        sampler.join()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def fan_out(agent, url: str, requests: int, threads: int, *shared) -> None:
    """Run ``agent(url, t, count, *shared)`` on ``threads`` threads, thread ``t`` sending ``count`` of ``requests``."""
    workers = [
        threading.Thread(target=agent, args=(url, t, len(range(t, requests, threads)), *shared)) for t in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
