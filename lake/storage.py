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
- :meth:`LocalStore.replace_if` is a compare-and-swap on the object's
  version (the MD5 of its bytes, like an S3 ETag); on S3 it is a PUT with
  ``If-Match``. Partition leases and the partition index rely on it.
  Because the version is a content hash, callers put a changing field
  (revision, timestamp) in every document they swap, so A-B-A cannot occur.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from lake.config import LakeSettings


class ObjectExistsError(FileExistsError):
    """A create-if-absent found the object already there."""


class VersionConflictError(RuntimeError):
    """A :meth:`~LocalStore.replace_if` found another version than the caller expected."""


def content_version(data: bytes | pa.Buffer) -> str:
    """Version of an object's bytes: their MD5 in hex (an S3 single-part ETag without quotes)."""
    return hashlib.md5(memoryview(data), usedforsecurity=False).hexdigest()


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

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and version; :class:`FileNotFoundError` if absent."""
        data = self.read(key)
        return data, content_version(data)

    def replace_if(self, key: str, data: bytes | pa.Buffer, version: str | None) -> str:
        """Write ``key`` only if its current version is ``version`` (``None``: only if absent).

        Returns the new version. Raises :class:`VersionConflictError` if the
        object changed (or exists, for ``None``). Writers on this host are
        serialised by an ``flock`` on a hidden sidecar file, which makes the
        check and the atomic rename one step.
        """
        target = self.path(key)
        with self.lock(str(Path(key).parent / f".{target.name}.lock")):
            try:
                current = content_version(target.read_bytes())
            except FileNotFoundError:
                current = None
            if current != version:
                raise VersionConflictError(f"{key}: version is {current}, expected {version}")
            self.replace(key, data)
        return content_version(data)

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
        """Names (not keys) directly under ``prefix``, sorted; hidden temp and lock files excluded."""
        directory = self.path(prefix)
        if not directory.is_dir():
            return []
        return sorted(name for name in os.listdir(directory) if not name.startswith("."))

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self.path(key).unlink(missing_ok=True)

    def arrow_fs(self) -> tuple[pafs.FileSystem, str]:
        """A ``pyarrow.fs`` file system and the base path of the lake root in it."""
        return pafs.LocalFileSystem(), str(self.root)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive cross-process lock named ``key`` (``flock(2)``), held for the block."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class S3Store:
    """A lake root in S3-compatible object storage (AWS S3, MinIO, SeaweedFS), via boto3.

    Same primitives as :class:`LocalStore`. :meth:`create` is a conditional
    PUT with ``If-None-Match: *`` and :meth:`replace_if` one with
    ``If-Match: <etag>``; both are answered 412 when the condition fails
    (AWS S3 since 2024-08 and 2024-11, MinIO, SeaweedFS), so two writers
    never overwrite each other. A PUT is atomic: readers never see a
    partial object. Objects are written in one part, so an ETag is the MD5
    of the bytes, the same as :func:`content_version`.
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
    ) -> None:
        import boto3
        from botocore.config import Config

        if not uri.startswith("s3://"):
            raise ValueError(f"{uri!r} is not an s3:// URI")
        self.bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        self.prefix = prefix.strip("/")
        self.root = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.endpoint = endpoint
        self.region = region
        self._access_key = access_key
        self._secret_key = secret_key
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name=region,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}),
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        """``s3://bucket/prefix/key``."""
        return f"s3://{self.bucket}/{self._key(key)}"

    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options``: endpoint, keys, region, conditional-put commits."""
        options = {"AWS_REGION": self.region, "conditional_put": "etag"}
        if self.endpoint:
            options.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ALLOW_HTTP="true")
        if self._access_key and self._secret_key:
            options.update(AWS_ACCESS_KEY_ID=self._access_key, AWS_SECRET_ACCESS_KEY=self._secret_key)
        return options

    def arrow_fs(self) -> tuple[pafs.FileSystem, str]:
        """A ``pyarrow.fs.S3FileSystem`` with this store's endpoint and keys, and ``bucket/prefix``."""
        scheme = "https"
        endpoint = None
        if self.endpoint:
            scheme, _, endpoint = self.endpoint.partition("://")
        fs = pafs.S3FileSystem(
            access_key=self._access_key,
            secret_key=self._secret_key,
            region=self.region,
            endpoint_override=endpoint,
            scheme=scheme,
        )
        return fs, f"{self.bucket}/{self.prefix}".rstrip("/")

    @staticmethod
    def _code(exc) -> str:
        return str(exc.response.get("Error", {}).get("Code", ""))

    _PRECONDITION = ("PreconditionFailed", "412", "ConditionalRequestConflict")

    def create(self, key: str, data: bytes | pa.Buffer) -> None:
        """Create ``key`` only if absent; :class:`ObjectExistsError` if it exists."""
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data), IfNoneMatch="*")
        except ClientError as exc:
            if self._code(exc) in self._PRECONDITION:
                raise ObjectExistsError(key) from exc
            raise

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and version (its ETag); :class:`FileNotFoundError` if absent."""
        from botocore.exceptions import ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                raise FileNotFoundError(self.uri(key)) from None
            raise
        return answer["Body"].read(), answer["ETag"].strip('"')

    def replace_if(self, key: str, data: bytes | pa.Buffer, version: str | None) -> str:
        """Write ``key`` only if its ETag is ``version`` (``None``: only if absent); returns the new ETag.

        Raises :class:`VersionConflictError` when the server answers 412.
        """
        from botocore.exceptions import ClientError

        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": f'"{version}"'}
        try:
            answer = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data), **condition)
        except ClientError as exc:
            if self._code(exc) in self._PRECONDITION:
                raise VersionConflictError(f"{self.uri(key)}: changed since version {version}") from exc
            raise
        return answer["ETag"].strip('"')

    def replace(self, key: str, data: bytes | pa.Buffer) -> None:
        """Write ``key``, replacing any previous version (one atomic PUT)."""
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))

    def read(self, key: str) -> bytes:
        """Whole object as bytes; :class:`FileNotFoundError` if absent."""
        return self.read_versioned(key)[0]

    def open_arrow(self, key: str) -> pa.NativeFile:
        """The object as an in-memory Arrow file."""
        return pa.BufferReader(self.read(key))

    def _head(self, key: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (as an object or as a prefix of objects)."""
        if self._head(key) is not None:
            return True
        listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(key).rstrip("/") + "/", MaxKeys=1)
        return listing.get("KeyCount", 0) > 0

    def size(self, key: str) -> int:
        """Size of ``key`` in bytes; :class:`FileNotFoundError` if absent."""
        head = self._head(key)
        if head is None:
            raise FileNotFoundError(self.uri(key))
        return int(head["ContentLength"])

    def list(self, prefix: str) -> list[str]:
        """Names (objects and sub-prefixes) directly under ``prefix``, sorted."""
        base = self._key(prefix).rstrip("/") + "/"
        names: set[str] = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base, Delimiter="/"
        ):
            names.update(entry["Key"][len(base) :] for entry in page.get("Contents", []))
            names.update(entry["Prefix"][len(base) :].rstrip("/") for entry in page.get("CommonPrefixes", []))
        return sorted(name for name in names if name and not name.startswith("."))

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


def s3_store(settings: LakeSettings) -> S3Store:
    """An :class:`S3Store` for an ``s3://`` ``settings.root`` and the ``LAKE_S3_*`` settings."""

    def secret(value) -> str | None:
        return value.get_secret_value() if value is not None else None

    return S3Store(
        settings.root,
        endpoint=settings.s3_endpoint,
        access_key=secret(settings.s3_access_key),
        secret_key=secret(settings.s3_secret_key),
        region=settings.s3_region,
    )


Store = LocalStore | S3Store


def open_store(settings: LakeSettings) -> Store:
    """The store for ``settings.root``: :class:`S3Store` for ``s3://…``, else :class:`LocalStore`."""
    return s3_store(settings) if settings.is_s3 else LocalStore(settings.root)
