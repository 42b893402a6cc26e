"""Lock the local SeaweedFS down so that only its signed S3 endpoint serves anyone.

``weed server`` opens eight ports on 127.0.0.1 (each HTTP port has a gRPC
twin at +10000). By default the master, volume and filer APIs answer anyone
who can connect: an anonymous client could list ``log/``, read
``_delta_log``, overwrite a bronze file or delete a segment through the
filer, or drop the bucket's collection through the master (issue 12).
:func:`write_security` prepares, once per data directory:

- ``security.toml`` (read by ``weed`` from its working directory):
  ``jwt.signing`` (volume writes need a master-issued token),
  ``jwt.filer_signing`` and ``.read`` (filer HTTP writes and reads need a
  token), ``access.ui = false`` and no directory metadata; every gRPC
  service requires mutual TLS (``[grpc]`` CA, per-component certificates);
- ``tls/``: a private CA and one certificate for the components, which all
  run in the one ``weed`` process (SeaweedFS does not check host names).

:data:`WEED_FLAGS` turns the master's and the filer's HTTP APIs off (the S3
gateway talks to them over gRPC) and telemetry off. What stays reachable
without credentials is listed by :func:`exposed_ports`.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from metrics_lake.infra.tls import write_ca, write_certificate

__all__ = ["WEED_FLAGS", "exposed_ports", "write_security"]

#: ``weed server`` flags of the locked-down setup.
WEED_FLAGS = ("-disableHttp", "-filer.disableHttp", "-master.telemetry=false")
_COMPONENTS = ("master", "volume", "filer", "s3", "client")


def _write_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate it signs for 127.0.0.1/localhost (:mod:`metrics_lake.infra.tls`); (ca, cert, key)."""
    ca = write_ca(folder, "metrics-lake local SeaweedFS CA")
    cert, key = write_certificate(ca, folder, "node", ["seaweedfs", "localhost", "127.0.0.1"])
    return ca[0], cert, key


def write_security(data_dir: Path) -> Path:
    """Write ``security.toml`` and the TLS material into ``data_dir`` unless present; returns the toml's path.

    Kept across restarts (the volume server's tokens and the gRPC peers
    must agree); the file holds the JWT signing keys, so it is mode 0600.
    """
    path = data_dir / "security.toml"
    if path.exists():
        return path
    ca, cert, key = _write_tls(data_dir / "tls")
    lines = ["# Written by `lake infra up` (metrics_lake.infra.seaweedfs_security); secrets: keep private."]
    for section in ("jwt.signing", "jwt.filer_signing", "jwt.filer_signing.read"):
        lines += [f"[{section}]", f'key = "{secrets.token_urlsafe(32)}"', "expires_after_seconds = 10", ""]
    lines += ["[access]", "ui = false", "", "[filer.expose_directory_metadata]", "enabled = false", ""]
    lines += ["[grpc]", f'ca = "{ca}"', ""]
    for component in _COMPONENTS:
        lines += [f"[grpc.{component}]", f'cert = "{cert}"', f'key = "{key}"', ""]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write("\n".join(lines).encode())
    return path


def exposed_ports(master_port: int, volume_port: int, filer_port: int, s3_port: int) -> list[tuple[int, str, str]]:
    """Every port ``weed server`` opens, with what listens and who may use it (for docs and the port probe)."""
    grpc = "gRPC, mutual TLS: only holders of a certificate of the lake's private CA (the weed process itself)"
    return [
        (s3_port, "S3 API", 'clients signing with an S3 identity\'s keys (`eval "$(lake infra up --identity NAME)"`)'),
        (s3_port + 10000, "S3 gRPC", grpc),
        (master_port, "master HTTP", "nobody: HTTP API disabled (-disableHttp); /cluster/status answers leader only"),
        (master_port + 10000, "master gRPC", grpc),
        (filer_port, "filer HTTP", "nobody: disabled (-filer.disableHttp); also needs a filer JWT"),
        (filer_port + 10000, "filer gRPC", grpc),
        (
            volume_port,
            "volume HTTP",
            "writes and deletes need a master-signed JWT; reads need a chunk's file id and random cookie, "
            "which only the filer knows; /status shows disk usage",
        ),
        (volume_port + 10000, "volume gRPC", grpc),
    ]
