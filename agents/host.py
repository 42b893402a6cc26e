"""The host agent: this machine's real metrics, read with psutil every interval.

Metric names (units in the name or noted):

- ``host.cpu.utilization`` (percent, all cores) and
  ``host.cpu.core_<n>.utilization`` (percent, per core);
- ``host.memory.utilization`` (percent), ``host.memory.used_bytes``,
  ``host.memory.available_bytes``; ``host.swap.utilization`` (percent),
  ``host.swap.used_bytes``;
- ``host.disk.read_bytes``, ``host.disk.write_bytes``, ``host.net.recv_bytes``,
  ``host.net.sent_bytes``: monotonic counters since boot (bytes);
- ``host.load.1m``, ``host.load.5m``, ``host.load.15m`` (run-queue length);
- ``host.processes.count``;
- ``agent.heartbeat``: seconds since the agent started (a drop to 0 is a
  restart), one per sample, so "the agent is alive" has a metric of its own
  that absence rules watch (the shipped ``agent_heartbeat_missing``).

CPU percentages are measured over the time since the previous sample
(``psutil.cpu_percent(interval=None)``), so the first sample is primed at
construction.

**Supervision.** Under systemd (``Type=notify``, ``WatchdogSec=``; the unit
in ``docs/lake-agent.service``), :meth:`HostAgent.run` tells systemd
``READY=1`` after its first sample is handed to the log or the gateway, and
``WATCHDOG=1`` after every one since (``sd_notify``, through the
``sdnotify`` package): an agent stuck in a send, or dead, stops pinging and
systemd restarts it. Without ``NOTIFY_SOCKET`` the pings go nowhere.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import psutil
import sdnotify

from metrics_lake.core.log.producer import Producer

#: The metric every sample carries to say the agent is alive.
HEARTBEAT = "agent.heartbeat"


def systemd_notify() -> Callable[[str], None]:
    """``sd_notify``: a function sending one state (``READY=1``, ``WATCHDOG=1``, ``STATUS=…``) to systemd's
    ``NOTIFY_SOCKET``; a no-op where it is not set (not under systemd)."""
    return sdnotify.SystemdNotifier().notify


class HostAgent:
    """Samples this host's metrics as contract events for server ``server`` (default: hostname)."""

    def __init__(self, server: str | None = None) -> None:
        self.server = server or socket.gethostname()
        self.started = time.monotonic()
        psutil.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None, percpu=True)

    def sample(self) -> list[dict]:
        """One reading of every metric, as event dicts with ``ts`` in epoch ms."""
        ts = int(time.time() * 1000)
        values: dict[str, float] = {"host.cpu.utilization": psutil.cpu_percent(interval=None)}
        for core, percent in enumerate(psutil.cpu_percent(interval=None, percpu=True)):
            values[f"host.cpu.core_{core}.utilization"] = percent
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        values.update(
            {
                "host.memory.utilization": memory.percent,
                "host.memory.used_bytes": memory.used,
                "host.memory.available_bytes": memory.available,
                "host.swap.utilization": swap.percent,
                "host.swap.used_bytes": swap.used,
                "host.processes.count": len(psutil.pids()),
            }
        )
        disk = psutil.disk_io_counters()
        if disk is not None:  # None in some containers without block-device stats
            values["host.disk.read_bytes"] = disk.read_bytes
            values["host.disk.write_bytes"] = disk.write_bytes
        net = psutil.net_io_counters()
        values["host.net.recv_bytes"] = net.bytes_recv
        values["host.net.sent_bytes"] = net.bytes_sent
        for window, load in zip(("1m", "5m", "15m"), psutil.getloadavg(), strict=False):
            values[f"host.load.{window}"] = load
        values[HEARTBEAT] = round(time.monotonic() - self.started, 3)
        tags = {"source": "host-agent"}
        return [
            {"ts": ts, "server": self.server, "metric": name, "value": float(value), "tags": tags}
            for name, value in values.items()
        ]

    def run(
        self,
        producer: Producer,
        *,
        interval: float,
        duration: float | None,
        stop: threading.Event,
        notify: Callable[[str], None] | None = None,
    ) -> int:
        """Sample every ``interval`` seconds into ``producer`` until ``duration`` passes or ``stop`` is set.

        Returns the number of events sent. Sampling is scheduled on a fixed
        grid, so a slow sample does not shift later ones. ``notify``
        (:func:`systemd_notify`) gets ``READY=1`` after the first sample was
        handed over and ``WATCHDOG=1`` after each one (module docstring).
        """
        sent = 0
        start = time.monotonic()
        tick = 0
        while not stop.is_set():
            events = self.sample()
            producer.send_payloads(events)
            sent += len(events)
            if notify is not None:
                notify("WATCHDOG=1" if tick else f"READY=1\nSTATUS=sampling {self.server} every {interval:g} s")
            tick += 1
            next_at = start + tick * interval
            if duration is not None and next_at - start > duration:
                break
            stop.wait(max(0.0, next_at - time.monotonic()))
        if notify is not None:
            notify("STOPPING=1")
        return sent
