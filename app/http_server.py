"""Run an ASGI application on uvicorn in a thread of this process, until an event says stop (gateway, dashboard).

Also what both servers need to face a network: TLS from PEM files
(:class:`TlsFiles`, optionally requiring client certificates: mutual TLS)
and the rule that a server without TLS and tokens listens on loopback only
(:func:`check_exposure`).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from metrics_lake.lake_schemas.errors import ConfigError, ServiceError

__all__ = ["TlsFiles", "check_exposure", "is_loopback", "serve_asgi"]


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate chain and key (PEM), and the CA its clients' certificates must chain to (mTLS).

    Checked when built: :class:`ConfigError` naming the option if a file is
    missing or the key does not match the certificate.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None

    def __post_init__(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-cert {self.cert} / --tls-key {self.key}: cannot load them ({exc})") from None
        if self.client_ca is not None:
            try:
                context.load_verify_locations(self.client_ca)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--tls-client-ca {self.client_ca}: cannot load it ({exc})") from None

    @classmethod
    def of(
        cls, cert: Path | str | None, key: Path | str | None, client_ca: Path | str | None = None
    ) -> TlsFiles | None:
        """TLS from options or settings; None when neither file is given. :class:`ConfigError` if only one is."""
        if cert is None and key is None:
            if client_ca is not None:
                raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
            return None
        if cert is None or key is None:
            raise ConfigError("give both --tls-cert and --tls-key (PEM files), or neither")
        return cls(Path(cert), Path(key), None if client_ca is None else Path(client_ca))

    def uvicorn_options(self) -> dict:
        """The ``uvicorn.Config`` keywords serving with these files."""
        options = {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}
        if self.client_ca is not None:
            options |= {"ssl_ca_certs": str(self.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(
    what: str,
    host: str,
    tls: TlsFiles | None,
    tokens: bool,
    insecure: bool,
) -> str | None:
    """Refuse to serve ``what`` on a routable ``host`` without TLS and tokens, unless ``insecure``.

    ``tokens``: whether the lake has an active token (so requests need one).
    Returns a warning to print when ``insecure`` lets an unprotected
    server face the network; raises :class:`ConfigError` saying what is
    missing otherwise.
    """
    if is_loopback(host):
        return None
    missing = [
        name for name, ok in (("TLS (--tls-cert/--tls-key)", tls), ("tokens (lake tokens create)", tokens)) if not ok
    ]
    if not missing:
        return None
    if not insecure:
        raise ConfigError(
            f"{what} will not listen on {host} without {' and '.join(missing)}: anyone who reaches it could "
            "use it; add them, listen on 127.0.0.1, or pass --insecure"
        )
    return f"WARNING: {what} listens on {host} without {' and '.join(missing)} (--insecure)"


def serve_asgi(
    app,
    host: str,
    port: int,
    stop: threading.Event,
    *,
    name: str,
    ready=None,
    extra_ports=(),
    tls: TlsFiles | None = None,
    **options,
) -> None:
    """Serve ``app`` on ``host:port`` until ``stop`` is set; requests in flight are answered before it returns.

    ``port`` 0 picks a free port; ``ready((host, port))`` is called once the
    socket listens; ``extra_ports``: more ports on ``host`` serving the same
    app. uvicorn runs on its own thread (named ``name``) and event loop, so
    the caller keeps its signal handlers. ``options`` go to
    ``uvicorn.Config`` (access log off and the lake's logging kept unless
    given); ``tls`` serves HTTPS. Raises ``OSError`` if the address is taken,
    :class:`~metrics_lake.lake_schemas.errors.ServiceError` if the server stops by itself.
    """
    sockets = [_bound(host, p) for p in (port, *extra_ports)]
    sock = sockets[0]
    defaults = {"access_log": False, "log_config": None, "lifespan": "off"}
    config = uvicorn.Config(app, **(defaults | (tls.uvicorn_options() if tls else {}) | options))
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
