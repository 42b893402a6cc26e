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
plain-text client) ends only that connection.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from metrics_lake.lake_schemas.errors import ServiceError

__all__ = ["start_connect_tls", "write_keystore"]

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
