"""TLS for ``lake sql-server``'s two listeners, from the same PEM certificate and key the gateway and dashboard use.

- **HiveServer2** serves TLS itself (``hive.server2.use.SSL``) from a Java
  key store: :func:`write_keystore` turns the PEM chain and key into a
  PKCS#12 store (Java 17 reads one wherever it asks for a JKS store) under a
  fresh random password, in a private folder the server deletes when it stops.
- **Spark Connect**'s plugin starts a plain-text gRPC server only (Spark
  4.2), so that one listens on a loopback port and
  :func:`start_connect_tls` starts a second gRPC server in the driver on the
  public port (``spark/jvm/metricslake/spark/LakeConnectTls.java``): the
  same Connect service and token interceptor, with TLS from the same key
  store and ALPN ``h2`` (which gRPC clients require). The encryption happens
  in the JVM's Netty, where the answer's bytes are produced; the token check
  sees each client's own address.

A handshake that fails (a client that does not trust the certificate, a
plain-text client) ends only that connection. Before the first client,
:func:`warm_up_tls` runs TLS connections between sockets of its own in the
JVM, so that HiveServer2's first client is not the one that runs JSSE's
code cold, and :func:`handshake_with` makes handshakes with HiveServer2's
own listener (its first one costs about 25 ms more than the next).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import ssl
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from metrics_lake.lake_schemas.errors import ServiceError

__all__ = ["TLS_WARM_UP_HANDSHAKES", "handshake_with", "start_connect_tls", "warm_up_tls", "write_keystore"]

log = logging.getLogger(__name__)


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


#: Handshakes :func:`warm_up_tls` runs. Measured on this project's 2-core machine in a fresh JVM: the first
#: connection took 127 ms, and from about the 15th 6-10 ms (both ends of it), where a compiled handshake stays;
#: the 40 take about half a second.
TLS_WARM_UP_HANDSHAKES = 40


def warm_up_tls(jvm, keystore: tuple[Path, str], rounds: int = TLS_WARM_UP_HANDSHAKES) -> list[float]:
    """Run ``rounds`` TLS connections in the JVM ``jvm`` with ``keystore`` (:func:`write_keystore`'s path and
    password), between sockets of its own on a loopback port, so that JSSE's handshake and cipher code is
    compiled before a client's handshake needs it (``spark/jvm/metricslake/spark/LakeTlsWarmUp.java`` says what
    it warms and what it measured). Returns each connection's milliseconds. Raises py4j's ``Py4JJavaError`` if the
    key store is unusable (the listeners, started from it, would have failed first) or a connection fails."""
    nanos = jvm.metricslake.spark.LakeTlsWarmUp.handshakes(str(keystore[0]), keystore[1], rounds)
    return [n / 1e6 for n in nanos]


def handshake_with(host: str, port: int, wait_s: float = 10.0) -> float:
    """Complete one TLS handshake with the listener on ``host:port`` (a wildcard ``host``: this machine's loopback)
    and close; returns its milliseconds.

    For HiveServer2's listener, whose first handshake costs about 25 ms more than the next even after
    :func:`warm_up_tls` (measured: 30-39 ms, then 5-14 ms): the server's own socket and key manager warm up.
    HiveServer2 reads a connection closed before its first message as a client that left, and logs nothing.
    Nothing is sent and the certificate is not checked (no secret crosses this connection). Waits up to
    ``wait_s`` for the listener to accept (Thrift binds it on its own thread); raises ``OSError`` after that.
    """
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + wait_s
    while True:
        try:
            raw = socket.create_connection((target, port), timeout=wait_s)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    started = time.perf_counter()
    with raw, context.wrap_socket(raw):  # raw is closed too if the handshake fails
        return (time.perf_counter() - started) * 1000


def start_connect_tls(jvm, host: str, port: int, keystore: tuple[Path, str]):
    """Serve Spark Connect over TLS on ``host:port`` from ``keystore`` (:func:`write_keystore`'s path and password),
    in the driver's JVM ``jvm`` (a started Connect plugin's); returns the Java gRPC server (``shutdownNow()`` stops
    it). Raises :class:`~metrics_lake.lake_schemas.errors.ServiceError` naming the port if it cannot be bound."""
    from py4j.protocol import Py4JJavaError

    try:
        return jvm.metricslake.spark.LakeConnectTls.start(host, port, str(keystore[0]), keystore[1])
    except Py4JJavaError as error:
        cause = error.java_exception
        while cause.getCause() is not None:  # Netty wraps the socket's error
            cause = cause.getCause()
        raise ServiceError(
            f"the Spark Connect TLS listener on {host}:{port} cannot start: {cause.getMessage()}"
        ) from None
