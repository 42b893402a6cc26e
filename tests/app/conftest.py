"""Fixtures of the application tests: gateways served in-process on free ports."""

from __future__ import annotations

import threading

import pytest

from metrics_lake.app.gateway import Gateway, serve
from metrics_lake.core.config import load_settings


@pytest.fixture
def start_gateway(tmp_path):
    """Start gateways on free ports over one lake; yields a function returning (url, gateway)."""
    stops = []

    def start(linger_ms: int = 20, **overrides):
        settings = load_settings(root=str(tmp_path / "lake"), lease_ttl_seconds=2, **overrides)
        gateway = Gateway(settings, linger_ms=linger_ms)
        stop, ready, address = threading.Event(), threading.Event(), []
        thread = threading.Thread(
            target=serve,
            args=(gateway, "127.0.0.1", 0, stop),
            kwargs={"ready": lambda a: (address.append(a), ready.set())},
            daemon=True,
        )
        thread.start()
        ready.wait(10)
        stops.append((stop, thread))
        return f"http://127.0.0.1:{address[0][1]}", gateway

    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(30)
