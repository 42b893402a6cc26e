"""Run an ASGI application on uvicorn in a thread of this process, until an event says stop (gateway, dashboard)."""

from __future__ import annotations

import socket
import threading

import uvicorn

from metrics_lake.lake_schemas.errors import ServiceError

__all__ = ["serve_asgi"]


def serve_asgi(
    app, host: str, port: int, stop: threading.Event, *, name: str, ready=None, extra_ports=(), **options
) -> None:
    """Serve ``app`` on ``host:port`` until ``stop`` is set; requests in flight are answered before it returns.

    ``port`` 0 picks a free port; ``ready((host, port))`` is called once the
    socket listens; ``extra_ports``: more ports on ``host`` serving the same
    app. uvicorn runs on its own thread (named ``name``) and event loop, so
    the caller keeps its signal handlers. ``options`` go to
    ``uvicorn.Config`` (access log off and the lake's logging kept unless
    given). Raises ``OSError`` if the address is taken,
    :class:`~metrics_lake.lake_schemas.errors.ServiceError` if the server stops by itself.
    """
    sockets = [_bound(host, p) for p in (port, *extra_ports)]
    sock = sockets[0]
    config = uvicorn.Config(app, **({"access_log": False, "log_config": None, "lifespan": "off"} | options))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, name=name, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive() and not stop.wait(0.01):
            pass
        if ready is not None and server.started:
            ready(sock.getsockname()[:2])
        while not stop.wait(0.5) and thread.is_alive():
            pass
        if not thread.is_alive() and not stop.is_set():
            raise ServiceError(f"the {name} server stopped unexpectedly (see the log above)")
    finally:
        server.should_exit = True
        thread.join()
        for each in sockets:
            each.close()


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock
