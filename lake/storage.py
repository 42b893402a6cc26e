"""Object storage behind the lake: the few primitives the log and tables need.

The backend follows from ``LAKE_ROOT``: a local directory (the embedded
default) or ``s3://bucket/prefix``. Paths passed to a store are relative keys
such as ``log/metrics/0/00000000000000000000.arrow``.

Guarantees the log builds on:
- :meth:`LocalStore.create` is an atomic create-if-absent: the bytes are
  written to a temporary file and ``link(2)``-ed to the final name, which
  fails if the name exists (POSIX link semantics), so a reader never sees a
  partial object and no writer overwrites another's.
- :meth:`LocalStore.replace` is an atomic replace (write then ``rename(2)``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from lake.config import ConfigError, LakeSettings


class ObjectExistsError(FileExistsError):
    """A create-if-absent found the object already there."""


class LocalStore:
    """A lake root on the local file system."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """Absolute local path of ``key``."""
        return self.root / key

    def uri(self, key: str) -> str:
        """URI of ``key`` for other engines (delta-rs, Spark): an absolute path."""
        return str(self.path(key))

    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options`` for this backend (none for local)."""
        return {}

    def _write_temp(self, key: str, data: bytes | pa.Buffer) -> Path:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return Path(temp)

    def create(self, key: str, data: bytes | pa.Buffer) -> None:
        """Atomically create ``key`` with ``data``; :class:`ObjectExistsError` if it exists."""
        temp = self._write_temp(key, data)
        try:
            os.link(temp, self.path(key))
        except FileExistsError as exc:
            raise ObjectExistsError(key) from exc
        finally:
            temp.unlink()

    def replace(self, key: str, data: bytes | pa.Buffer) -> None:
        """Atomically write ``key`` with ``data``, replacing any previous version."""
        temp = self._write_temp(key, data)
        os.replace(temp, self.path(key))

    def read(self, key: str) -> bytes:
        """Whole object as bytes; :class:`FileNotFoundError` if absent."""
        return self.path(key).read_bytes()

    def open_arrow(self, key: str) -> pa.NativeFile:
        """Memory-mapped Arrow file for zero-copy reads."""
        return pa.memory_map(str(self.path(key)), "r")

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        return self.path(key).exists()

    def size(self, key: str) -> int:
        """Size of ``key`` in bytes."""
        return self.path(key).stat().st_size

    def list(self, prefix: str) -> list[str]:
        """Names (not keys) directly under ``prefix``, sorted; temp files excluded."""
        directory = self.path(prefix)
        if not directory.is_dir():
            return []
        return sorted(name for name in os.listdir(directory) if not name.startswith(".tmp-"))

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self.path(key).unlink(missing_ok=True)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive cross-process lock named ``key`` (``flock(2)``), held for the block.

        It serialises writers of one partition across processes on this host.
        """
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def open_store(settings: LakeSettings) -> LocalStore:
    """The store for ``settings.root``.

    Raises :class:`ConfigError` for ``s3://`` roots: the object-storage
    backend (conditional appends, leases) is tracked separately and not
    part of this build yet.
    """
    if settings.is_s3:
        raise ConfigError(
            f"LAKE_ROOT={settings.root}: the S3 backend is not available in this build yet; "
            "use a local path such as ./lakehouse"
        )
    return LocalStore(settings.root)
