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

Both backends implement the abstract :class:`Store`. Failures of the store
itself surface as :class:`~metrics_lake.lake_schemas.errors.StorageError` subclasses
(``AccessDeniedError``, ``CredentialsError``, ``BucketNotFoundError``,
``StorageUnavailableError``) whose messages name the key, the endpoint and
what to check; S3 answers are translated in one place, ``S3Store._call``.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from metrics_lake.core import s3_errors
from metrics_lake.core.config import LakeSettings
from metrics_lake.lake_schemas.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    ConfigError,
    CredentialsError,
    InputError,
    StorageError,
    StorageUnavailableError,
)

__all__ = [
    "LocalStore",
    "ObjectExistsError",
    "S3Store",
    "Store",
    "VersionConflictError",
    "check_key",
    "content_version",
    "open_store",
]


class ObjectExistsError(FileExistsError):
    """A create-if-absent found the object already there."""


class VersionConflictError(RuntimeError):
    """A :meth:`~Store.replace_if` found another version than the caller expected."""


def content_version(data: bytes | pa.Buffer) -> str:
    """Version of an object's bytes: their MD5 in hex (an S3 single-part ETag without quotes)."""
    return hashlib.md5(memoryview(data), usedforsecurity=False).hexdigest()


class Store(abc.ABC):
    """The object-store contract the log and the tables are built on (see the module docstring).

    ``root`` names the lake root for people and other engines: an absolute
    local path, or ``s3://bucket/prefix``. Keys are ``/``-separated paths
    relative to it. Failures of the store itself raise
    :class:`~metrics_lake.lake_schemas.errors.StorageError` subclasses (access
    denied, bad credentials, missing bucket, unreachable); a missing object
    raises ``FileNotFoundError``.
    """

    root: str
    #: Appends worth running side by side (a producer's flush threads, one partition each).
    parallel_appends: int = 8
    #: Whether an append is mostly work under Python's GIL (encoding, a local disk's writes) rather than waiting on
    #: round trips: a producer serving requests then appends one partition at a time while requests are being
    #: decoded (:class:`~metrics_lake.core.log.producer.Producer`'s ``flush_when_idle``). On an object store an
    #: append waits on a few round trips, so several overlap whatever else the process does.
    appends_hold_the_gil: bool = False

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """URI of ``key`` for other engines (delta-rs, Spark): an absolute path or ``s3://…``."""

    @abc.abstractmethod
    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options`` for this backend."""

    @abc.abstractmethod
    def arrow_fs(self) -> tuple[pafs.FileSystem, str]:
        """A ``pyarrow.fs`` file system and the lake root's base path in it."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes | pa.Buffer) -> None:
        """Atomically create ``key`` with ``data``; :class:`ObjectExistsError` if it exists."""

    @abc.abstractmethod
    def replace(self, key: str, data: bytes | pa.Buffer) -> None:
        """Atomically write ``key``, replacing any previous version."""

    @abc.abstractmethod
    def replace_if(self, key: str, data: bytes | pa.Buffer, version: str | None) -> str:
        """Compare-and-swap: write ``key`` only if its version is ``version`` (``None``: absent); the new version.

        Raises :class:`VersionConflictError` when the object changed.
        """

    @abc.abstractmethod
    def read(self, key: str) -> bytes:
        """Whole object as bytes; ``FileNotFoundError`` if absent."""

    @abc.abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and version; ``FileNotFoundError`` if absent."""

    @abc.abstractmethod
    def open_arrow(self, key: str) -> pa.NativeFile:
        """The object as a readable Arrow file."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (as an object or as a prefix of objects)."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """Size of ``key`` in bytes; ``FileNotFoundError`` if absent."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Names (not keys) directly under ``prefix``, sorted; hidden names (leading ``.``) excluded."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""


def check_key(key: str) -> str:
    """Return ``key`` if it names something under the lake root; else raise :class:`InputError`.

    Keys are relative, ``/``-separated; a ``.`` or ``..`` segment or a
    leading ``/`` could reach outside the root (a local path, another S3
    prefix), whatever name built the key.
    """
    if key.startswith("/") or any(part in (".", "..") for part in key.split("/")) or "\x00" in key:
        raise InputError(f"storage key {key!r} would leave the lake root (a '.' or '..' part, or a leading '/')")
    return key


class LocalStore(Store):
    """A lake root on the local file system; ``root`` is its absolute path, ``base`` the same as a ``Path``."""

    # An append here is CPU (encoding) and two fsyncs on one disk: beside the threads decoding requests, appends side
    # by side only took turns at the GIL, about 170 thread switches each. The gateway took 164-181 k remote-write
    # samples/s from 32 senders with 4 flush threads and 226-261 k with one (bench/ingest_protocols.py, 2026-11-29,
    # three runs each). With nothing being decoded (one sender waiting for its answer) side by side is faster.
    parallel_appends = 4
    appends_hold_the_gil = True

    def __init__(self, root: str | os.PathLike) -> None:
        self.base = Path(root).expanduser().resolve()
        self.root = str(self.base)
        try:
            self.base.mkdir(parents=True, exist_ok=True)
        except PermissionError as exc:
            raise AccessDeniedError(f"cannot create the lake root {self.base}: {exc.strerror}") from None
        except OSError as exc:
            raise StorageError(f"cannot use {self.base} as the lake root: {exc.strerror or exc}") from None

    def path(self, key: str) -> Path:
        """Absolute local path of ``key``; :class:`InputError` if the key would leave the root."""
        return self.base / check_key(key)

    def uri(self, key: str) -> str:
        """URI of ``key`` for other engines (delta-rs, Spark): an absolute path."""
        return str(self.path(key))

    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options`` for this backend (none for local)."""
        return {}

    def _write_temp(self, key: str, data: bytes | pa.Buffer) -> Path:
        """Write ``data`` to a hidden temporary file beside ``key`` and fsync it; removed again on failure."""
        target = self.path(key)
        temp = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:
                raise StorageError(
                    f"no space left on the device holding the lake root {self.root} (writing {key}); "
                    "free disk space and run again"
                ) from None
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise AccessDeniedError(f"cannot write {target}: {exc.strerror}") from None
            raise
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
        return pafs.LocalFileSystem(), self.root

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


class S3Store(Store):
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
            raise ConfigError(f"{uri!r} is not an s3:// URI; use s3://bucket/prefix")
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
        check_key(key)
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
        return s3_errors.error_code(exc) or ""

    _PRECONDITION = ("PreconditionFailed", "HTTP 412", "ConditionalRequestConflict")
    _NOT_FOUND = ("NoSuchKey", "HTTP 404", "NotFound")
    _VERBS = {
        "put_object": "write",
        "get_object": "read",
        "head_object": "read",
        "list_objects_v2": "list",
        "delete_object": "delete",
    }

    def _call(self, operation: str, key: str, **params):
        """Run one S3 API call on ``key`` and translate the store's own failures (module docstring).

        Precondition and not-found answers stay ``ClientError`` for the
        caller to interpret; access, credential, bucket and connection
        failures become :class:`~metrics_lake.lake_schemas.errors.StorageError`
        subclasses, chosen by their error code (:mod:`metrics_lake.core.s3_errors`),
        with a message naming the key and what to check.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(Bucket=self.bucket, **params)
        except (ClientError, BotoCoreError) as exc:
            code = s3_errors.error_code(exc)
            kind = s3_errors.storage_error_class(code)
            if kind is None:
                raise
            raise kind(self._describe(kind, code, operation, key, exc)) from None

    def _describe(self, kind: type[StorageError], code: str | None, operation: str, key: str, exc) -> str:
        where = self.endpoint or "AWS S3"
        if kind is AccessDeniedError:
            verb = self._VERBS.get(operation, operation)
            return (
                f"S3 at {where} denied access ({code}): identity {self._access_key or '(default chain)'} "
                f"may not {verb} {self.uri(key)}"
            )
        if kind is CredentialsError and code == "NoCredentials":
            return "no S3 credentials: set LAKE_S3_ACCESS_KEY and LAKE_S3_SECRET_KEY (or configure the AWS credential chain)"
        if kind is CredentialsError:
            return f"S3 at {where} rejected the credentials ({code}); check LAKE_S3_ACCESS_KEY and LAKE_S3_SECRET_KEY"
        if kind is BucketNotFoundError:
            return f"bucket {self.bucket!r} does not exist at {where}; create it or fix LAKE_ROOT"
        if kind is StorageUnavailableError:
            return (
                f"S3 endpoint {where} did not answer ({exc.__class__.__name__}); is it running? "
                "(`lake infra status` for the local server, or check LAKE_S3_ENDPOINT)"
            )
        return f"S3 at {where} failed ({code}) on {self.uri(key)}: {exc}"

    def create(self, key: str, data: bytes | pa.Buffer) -> None:
        """Create ``key`` only if absent; :class:`ObjectExistsError` if it exists."""
        from botocore.exceptions import ClientError

        try:
            self._call("put_object", key, Key=self._key(key), Body=bytes(data), IfNoneMatch="*")
        except ClientError as exc:
            if self._code(exc) in self._PRECONDITION:
                raise ObjectExistsError(key) from exc
            raise

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and version (its ETag); ``FileNotFoundError`` if absent."""
        from botocore.exceptions import ClientError

        try:
            answer = self._call("get_object", key, Key=self._key(key))
        except ClientError as exc:
            if self._code(exc) in self._NOT_FOUND:
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
            answer = self._call("put_object", key, Key=self._key(key), Body=bytes(data), **condition)
        except ClientError as exc:
            if self._code(exc) in self._PRECONDITION:
                raise VersionConflictError(f"{self.uri(key)}: changed since version {version}") from exc
            raise
        return answer["ETag"].strip('"')

    def replace(self, key: str, data: bytes | pa.Buffer) -> None:
        """Write ``key``, replacing any previous version (one atomic PUT)."""
        self._call("put_object", key, Key=self._key(key), Body=bytes(data))

    def read(self, key: str) -> bytes:
        """Whole object as bytes; ``FileNotFoundError`` if absent."""
        return self.read_versioned(key)[0]

    def open_arrow(self, key: str) -> pa.NativeFile:
        """The object as an in-memory Arrow file."""
        return pa.BufferReader(self.read(key))

    def _head(self, key: str) -> dict | None:
        from botocore.exceptions import ClientError

        try:
            return self._call("head_object", key, Key=self._key(key))
        except ClientError as exc:
            if self._code(exc) in self._NOT_FOUND:
                return None
            raise

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (as an object or as a prefix of objects)."""
        if self._head(key) is not None:
            return True
        prefix = self._key(key).rstrip("/") + "/"
        listing = self._call("list_objects_v2", key, Prefix=prefix, MaxKeys=1)
        return listing.get("KeyCount", 0) > 0

    def size(self, key: str) -> int:
        """Size of ``key`` in bytes; ``FileNotFoundError`` if absent."""
        head = self._head(key)
        if head is None:
            raise FileNotFoundError(self.uri(key))
        return int(head["ContentLength"])

    def list(self, prefix: str) -> list[str]:
        """Names (objects and sub-prefixes) directly under ``prefix``, sorted."""
        base = self._key(prefix).rstrip("/") + "/"
        names: set[str] = set()
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", prefix, Prefix=base, Delimiter="/", **token)
            names.update(entry["Key"][len(base) :] for entry in page.get("Contents", []))
            names.update(entry["Prefix"][len(base) :].rstrip("/") for entry in page.get("CommonPrefixes", []))
            if not page.get("IsTruncated"):
                break
            token = {"ContinuationToken": page["NextContinuationToken"]}
        return sorted(name for name in names if name and not name.startswith("."))

    def delete(self, key: str) -> None:
        """Remove ``key`` if present."""
        self._call("delete_object", key, Key=self._key(key))


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


def open_store(settings: LakeSettings) -> Store:
    """The store for ``settings.root``: :class:`S3Store` for ``s3://…``, else :class:`LocalStore`."""
    return s3_store(settings) if settings.is_s3 else LocalStore(settings.root)
