"""Fixtures of the application tests: gateways served in-process on free ports, the ``lake`` CLI on a test lake."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from metrics_lake.app.gateway import Gateway, serve
from metrics_lake.core.config import load_settings
from tests.helpers import LAKE


@pytest.fixture
def start_gateway(tmp_path):
    """Start gateways on free ports over one lake; yields a function returning (url, gateway); ``tls``: a
    :class:`~metrics_lake.app.http_server.TlsFiles` to serve HTTPS with; ``flush_when_idle=False``: batches wait
    their whole linger (to hold them unflushed)."""
    stops = []

    def start(linger_ms: int = 20, tls=None, flush_when_idle: bool = True, **overrides):
        settings = load_settings(root=str(tmp_path / "lake"), lease_ttl_seconds=2, **overrides)
        gateway = Gateway(settings, linger_ms=linger_ms, flush_when_idle=flush_when_idle)
        stop, ready, address = threading.Event(), threading.Event(), []
        thread = threading.Thread(
            target=serve,
            args=(gateway, "127.0.0.1", 0, stop),
            kwargs={"ready": lambda a: (address.append(a), ready.set()), "tls": tls},
            daemon=True,
        )
        thread.start()
        ready.wait(10)
        stops.append((stop, thread))
        return f"{'https' if tls else 'http'}://127.0.0.1:{address[0][1]}", gateway

    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(30)


@pytest.fixture
def lake(tmp_path, store):
    """``lake(*args, expect=0, env_extra=None)``: run the ``lake`` CLI on the test's lake (as ``alice``); asserts the
    exit code and that no traceback leaked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env |= {"LAKE_ROOT": str(store.root), "LAKE_AUTHOR": "alice", "COLUMNS": "200"}

    def run(*args: str, expect: int = 0, env_extra: dict | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [LAKE, *args], env={**env, **(env_extra or {})}, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == expect, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        return result

    return run


def one_line(result: subprocess.CompletedProcess) -> str:
    """The command's stderr, which must be one ``error: …`` line."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]
