"""A local Prometheus Alertmanager for the lake's alerts: Debian's ``prometheus-alertmanager`` as a process.

``start`` writes ``alertmanager.yml`` under ``data_dir`` (a route grouping by
``alertname`` and ``server``, with short waits so a demo sees notifications
within seconds; the ``Watchdog`` routed apart; per-server alerts inhibited
while ``LakeNoData`` fires: docs/alerts.md explains both), runs ``prometheus-alertmanager`` bound to 127.0.0.1 with
clustering off and its data under ``data_dir``, and waits until
``/-/ready`` answers. ``stop`` and ``status`` use the PID file. With a
``webhook`` URL every notification (firing and resolved) is also POSTed
there, in Alertmanager's webhook format (the tests' and the demo's
receiver); without one, notifications go to a receiver that drops them, and
the alerts are still listed by the API and the web UI.

The lake only speaks Alertmanager's API v2, so a production Alertmanager (or
a cluster of them) is used the same way: set ``LAKE_ALERTMANAGER_URL``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from metrics_lake.infra.processes import bind_error, pid_from_file, stop_process_group
from metrics_lake.lake_schemas.errors import AlertmanagerError

__all__ = ["LocalAlertmanager", "answers", "binary", "running_pid", "start", "stop"]

#: The Debian package's binary, then the upstream name.
BINARIES = ("prometheus-alertmanager", "alertmanager")


@dataclass(frozen=True)
class LocalAlertmanager:
    """Where a local Alertmanager lives: its directory, its port on 127.0.0.1, and an optional webhook receiver.

    ``group_wait_seconds``/``group_interval_seconds``: Alertmanager's route
    timers (its defaults are 30 s and 5 min; short ones suit a demo and tests).
    ``watchdog_webhook``: where the always-firing ``Watchdog`` alert is
    notified every minute (a dead man's switch); without one it goes to a
    receiver that drops it, as kube-prometheus routes it by default.
    """

    data_dir: Path
    port: int = 9093
    webhook: str | None = None
    group_wait_seconds: int = 1
    group_interval_seconds: int = 1
    watchdog_webhook: str | None = None

    @property
    def url(self) -> str:
        """The API's base URL, for ``LAKE_ALERTMANAGER_URL``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        """The generated ``alertmanager.yml``."""
        return self.data_dir / "alertmanager.yml"

    @property
    def pid_file(self) -> Path:
        """The running process's PID."""
        return self.data_dir / "alertmanager.pid"

    @property
    def log_file(self) -> Path:
        """Alertmanager's own log."""
        return self.data_dir / "alertmanager.log"

    def config(self) -> dict:
        """The configuration ``start`` writes (YAML is a superset of JSON, so it is written as JSON)."""
        receiver: dict = {"name": "lake"}
        if self.webhook:
            receiver["webhook_configs"] = [{"url": self.webhook, "send_resolved": True}]
        watchdog: dict = {"name": "watchdog"}
        if self.watchdog_webhook:
            watchdog["webhook_configs"] = [{"url": self.watchdog_webhook, "send_resolved": False}]
        return {
            "route": {
                "receiver": "lake",
                "group_by": ["alertname", "server"],
                "group_wait": f"{self.group_wait_seconds}s",
                "group_interval": f"{self.group_interval_seconds}s",
                "repeat_interval": "4h",
                # The lake's always-firing alert, to a dead man's switch: notified again every minute while it fires.
                "routes": [{"matchers": ['alertname="Watchdog"'], "receiver": "watchdog", "repeat_interval": "1m"}],
            },
            # While the whole lake gets no record, its per-server alerts are muted: an outage pages once.
            "inhibit_rules": [{"source_matchers": ['alertname="LakeNoData"'], "target_matchers": ['server=~".+"']}],
            "receivers": [receiver, watchdog],
        }


def binary() -> str:
    """The Alertmanager executable on PATH; :class:`AlertmanagerError` saying how to install it if there is none."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    raise AlertmanagerError(
        "no Alertmanager on PATH: install it (Debian: apt-get install prometheus-alertmanager) "
        "or point LAKE_ALERTMANAGER_URL at a running one"
    )


def running_pid(manager: LocalAlertmanager) -> int | None:
    """The PID of the Alertmanager started in ``manager.data_dir`` if it runs, else None."""
    return pid_from_file(manager.pid_file)


def answers(manager: LocalAlertmanager, timeout: float = 2.0) -> bool:
    """Whether Alertmanager answers ``/-/ready`` on its port."""
    try:
        with urllib.request.urlopen(f"{manager.url}/-/ready", timeout=timeout) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def start(manager: LocalAlertmanager, *, timeout: float = 30.0, log=print) -> None:
    """Start Alertmanager unless it runs, and wait until it is ready; the configuration is written anew each start.

    Raises :class:`AlertmanagerError` naming the cause (no binary, a port
    held by another process, not ready within ``timeout`` seconds: with the
    log's tail).
    """
    manager.data_dir.mkdir(parents=True, exist_ok=True)
    if running_pid(manager) is not None:
        log(f"Alertmanager already runs (pid {running_pid(manager)}) at {manager.url}")
        return
    held = bind_error(manager.port)
    if held is not None:
        raise AlertmanagerError(f"port {manager.port} on 127.0.0.1 is in use ({held.strerror}); pass another --port")
    manager.config_file.write_text(json.dumps(manager.config(), indent=2))
    with open(manager.log_file, "ab") as output:
        process = subprocess.Popen(
            [
                binary(),
                f"--config.file={manager.config_file}",
                f"--storage.path={manager.data_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{manager.port}",
                "--cluster.listen-address=",  # one instance: no gossip port
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=manager.data_dir,
        )
    manager.pid_file.write_text(str(process.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if answers(manager):
            log(f"started Alertmanager (pid {process.pid}) at {manager.url}; config {manager.config_file}")
            return
        if process.poll() is not None:
            break
        time.sleep(0.2)
    tail = manager.log_file.read_text(errors="replace")[-1500:] if manager.log_file.exists() else ""
    stop(manager, timeout=5, log=lambda _: None)
    raise AlertmanagerError(f"Alertmanager at {manager.url} is not ready within {timeout:.0f} s; log:\n{tail}")


def stop(manager: LocalAlertmanager, *, timeout: float = 10.0, log=print) -> bool:
    """Stop the Alertmanager of ``manager.data_dir`` (SIGTERM, SIGKILL after ``timeout``); False if none ran."""
    pid = running_pid(manager)
    if pid is None:
        manager.pid_file.unlink(missing_ok=True)
        return False
    stop_process_group(pid, timeout)
    manager.pid_file.unlink(missing_ok=True)
    log(f"stopped Alertmanager (pid {pid})")
    return True
