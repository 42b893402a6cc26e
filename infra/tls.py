"""A private certificate authority for local TLS: the SeaweedFS gRPC mesh, and the gateway and dashboard demos.

:func:`write_ca` mints a CA once per folder; :func:`write_certificate`
a certificate it signs for the given host names and addresses (server and
client use, so the same file works for mutual TLS). Keys are ECDSA P-256,
written 0600; certificates are valid for 10 years from 5 minutes ago (clock
skew). Production deployments bring their own PKI: the servers only read
PEM files (``--tls-cert``, ``--tls-key``, ``--tls-client-ca``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["TRUSTSTORE_PASSWORD", "write_ca", "write_certificate", "write_java_truststore"]

#: The password of :func:`write_java_truststore`'s store: Java's customary one (its own ``cacerts``'). A trust store
#: holds public certificates only; Java asks for a password to check the file's integrity, not to keep a secret.
TRUSTSTORE_PASSWORD = "changeit"
VALIDITY = dt.timedelta(days=3650)
SKEW = dt.timedelta(minutes=5)


def _private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by the owner only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """``folder/ca.crt`` and ``folder/ca.key`` (common name ``name``), minted unless present; returns their paths."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = folder / "ca.crt", folder / "ca.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign: what Python's ssl (OpenSSL 3 strict mode) requires of a CA
        .sign(key, hashes.SHA256())
    )
    _private(key_path, _key_pem(key))
    cert_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def write_certificate(ca: tuple[Path, Path], folder: Path, stem: str, names: list[str]) -> tuple[Path, Path]:
    """``folder/<stem>.crt`` and ``.key``: a certificate signed by ``ca`` (cert, key) for ``names`` (DNS names or
    IP addresses; the first is the common name), usable by servers and clients. Returns (cert, key)."""
    authority = x509.load_pem_x509_certificate(ca[0].read_bytes())
    authority_key = serialization.load_pem_private_key(ca[1].read_bytes(), password=None)
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    alternatives = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority_key.public_key()), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(authority_key, hashes.SHA256())
    )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    _private(key_path, _key_pem(key))
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def write_java_truststore(ca_cert: Path, path: Path) -> Path:
    """``path``: a PKCS#12 trust store holding the PEM certificate ``ca_cert`` as a trusted entry, for Java clients
    (beeline's and the Hive JDBC driver's ``sslTrustStore``, DBeaver), password :data:`TRUSTSTORE_PASSWORD`.
    Rewritten on every call (it holds nothing secret); returns ``path``."""
    certificate = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    entry = pkcs12.PKCS12Certificate(certificate, b"metrics-lake-ca")
    path.write_bytes(
        pkcs12.serialize_java_truststore([entry], serialization.BestAvailableEncryption(TRUSTSTORE_PASSWORD.encode()))
    )
    return path
