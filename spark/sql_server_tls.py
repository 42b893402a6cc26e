"""TLS for ``lake sql-server``'s two listeners, from the same PEM certificate and key the gateway and dashboard use.

- **HiveServer2** serves TLS itself (``hive.server2.use.SSL``) from a Java
  key store: :func:`write_keystore` turns the PEM chain and key into a
  PKCS#12 store (Java 17 reads one wherever it asks for a JKS store) under a
  fresh random password, in a private folder the server deletes when it stops.
- **Spark Connect** has no TLS of its own (Spark 4.2's gRPC server is
  plain-text only), so its gRPC server listens on a loopback port and
  :class:`TlsProxy` listens on the public one: it completes the TLS handshake
  (offering HTTP/2 by ALPN, which gRPC clients require) and relays the bytes
  both ways. The proxy knows each client's address; the token check asks it
  (:meth:`TlsProxy.client_of`) so failures are still counted per client,
  not against the proxy's own loopback address.

A handshake that fails (a client that does not trust the certificate, a
plain-text client) ends only that connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from metrics_lake.lake_schemas.errors import ServiceError

__all__ = ["RELAY_BUFFER_BYTES", "TlsProxy", "write_keystore"]

log = logging.getLogger(__name__)
#: Bytes read from one side of a relayed connection at a time.
RELAY_BUFFER_BYTES = 256 * 1024


def write_keystore(cert: Path, key: Path, folder: Path) -> tuple[Path, str]:
    """A PKCS#12 key store holding ``key`` and the PEM chain of ``cert``, written to ``folder/server.p12`` (0600);
    returns its path and its random password (what ``hive.server2.keystore.*`` take)."""
    chain = x509.load_pem_x509_certificates(cert.read_bytes())
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    password = secrets.token_urlsafe(24)
    store = pkcs12.serialize_key_and_certificates(
        b"lake-sql-server",
        private,
        chain[0],
        chain[1:] or None,
        serialization.BestAvailableEncryption(password.encode()),
    )
    path = folder / "server.p12"
    with open(path, "xb", opener=lambda name, flags: os.open(name, flags, 0o600)) as handle:
        handle.write(store)
    return path, password


class TlsProxy:
    """TLS on ``host:port`` in front of a plain-text listener on ``127.0.0.1:target_port``, on a thread of its own.

    ``cert``/``key``: PEM files; ``alpn``: the protocols offered (gRPC needs
    ``h2``). :meth:`start` returns once the port is bound (raising
    :class:`~metrics_lake.lake_schemas.errors.ServiceError` if it cannot be);
    :meth:`stop` closes it and every relayed connection.
    """

    def __init__(
        self, host: str, port: int, target_port: int, cert: Path, key: Path, *, alpn: tuple[str, ...] = ("h2",)
    ) -> None:
        self.host, self.port, self.target_port = host, port, target_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.context.set_alpn_protocols(list(alpn))
        self._clients: dict[int, str] = {}  # the relay's local port toward the target -> the client's address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sql-server-tls", daemon=True)
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> None:
        """Bind and serve; raises :class:`ServiceError` naming the port if it cannot be bound."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._relay, self.host, self.port, ssl=self.context, ssl_handshake_timeout=10),
            self._loop,
        )
        try:
            self._server = future.result(timeout=10)
        except OSError as error:
            self.stop()
            raise ServiceError(f"the TLS listener on {self.host}:{self.port} cannot start: {error.strerror}") from None

    def client_of(self, relay_port: int) -> str | None:
        """The address of the client whose connection the relay opened from local port ``relay_port``, or None."""
        return self._clients.get(relay_port)

    def stop(self) -> None:
        """Stop listening and end every relayed connection."""
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        peer = client_writer.get_extra_info("peername")
        try:
            target_reader, target_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError as error:
            log.warning("the TLS listener could not reach Spark Connect on port %d: %s", self.target_port, error)
            client_writer.close()
            return
        relay_port = target_writer.get_extra_info("sockname")[1]
        self._clients[relay_port] = str(peer[0]) if peer else "unknown"
        try:
            await asyncio.gather(self._pump(client_reader, target_writer), self._pump(target_reader, client_writer))
        finally:
            self._clients.pop(relay_port, None)
            for writer in (client_writer, target_writer):
                writer.close()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer`` until either side closes, then close ``writer`` (the other pump ends)."""
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
            while data := await reader.read(RELAY_BUFFER_BYTES):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError, RuntimeError):
            writer.close()
