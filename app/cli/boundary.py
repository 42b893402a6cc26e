"""The command line's error boundary: every failure becomes one line and an exit code.

:func:`translate` turns an exception that reached the command line into a
:class:`~metrics_lake.lake_schemas.errors.LakeError`:

- a :class:`~metrics_lake.lake_schemas.errors.LakeError` (everything the lake raises on
  purpose) as it is;
- a failed call into Spark's driver JVM after that JVM exited (killed, or
  out of memory) as a :class:`~metrics_lake.lake_schemas.errors.ServiceError`;
- a failure of a library underneath that a user can cause by configuration
  or input as the lake error it means: S3 failures of boto3, pyarrow and
  delta-rs by their error codes (:mod:`metrics_lake.core.s3_errors`); a full
  disk, a missing, unreadable or directory path; truncated or corrupt gzip;
  text that is not UTF-8; a missing Delta table; a Spark SQL error; memory;
- anything else is a bug: ``None``, and the caller prints a one-line notice
  that ``--debug`` shows the traceback (exit code 70).

:func:`explain` gives ``(message, exit code)``; the exit codes are the
errors' own (:mod:`metrics_lake.lake_schemas.errors`).
"""

from __future__ import annotations

import errno
import gzip
import re
import zlib

from metrics_lake.core.s3_errors import as_storage_error
from metrics_lake.lake_schemas import errors
from metrics_lake.lake_schemas.errors import (
    InputError,
    LakeError,
    NotFoundError,
    ServiceError,
    StorageError,
)

__all__ = ["explain", "first_line", "translate"]


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _os_error(exc: OSError) -> LakeError | None:
    name = exc.filename or ""
    if exc.errno == errno.ENOSPC:
        return StorageError(
            f"no space left on the device{f' writing {name}' if name else ''}: free disk space and run again"
        )
    # A path of the machine (an input file, a local lake): InputError, not the store's AccessDeniedError, whose
    # message gets the hint about S3 identities.
    if exc.errno in (errno.EACCES, errno.EPERM):
        return InputError(f"permission denied: {name or first_line(exc)}")
    if exc.errno == errno.EROFS:
        return InputError(f"read-only file system: {name or first_line(exc)}")
    if exc.errno == errno.ENOENT and name:
        return InputError(f"no such file or directory: {name}")
    if exc.errno == errno.EISDIR:
        return InputError(f"{name or 'the path'} is a directory; give a file")
    if exc.errno == errno.ENOTDIR:
        return InputError(f"{name or 'a path component'} is not a directory")
    return None


#: A lake error raised inside Spark's Python workers (a data source planning a scan) as Spark reports it: the
#: worker's traceback, ending with the error's class and message.
_WORKER_ERROR = re.compile(r"^metrics_lake\.lake_schemas\.errors\.(\w+): (.+)$", re.MULTILINE)


def _raised_in_spark(message: str) -> LakeError | None:
    """The lake error a Spark error wraps (raised in a Python worker), rebuilt with its class; None if none."""
    match = _WORKER_ERROR.search(message)
    if match is None:
        return None
    kind = getattr(errors, match.group(1), None)
    if not (isinstance(kind, type) and issubclass(kind, LakeError)):
        return None
    return kind(match.group(2).strip())


def _spark_jvm_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is a call into Spark's JVM that failed because the JVM this process started has exited.

    pyspark's calls then fail with ``ConnectionRefusedError`` or a py4j error, which name neither Spark nor why.
    Waits up to a second for the JVM to finish exiting (its shutdown hooks run first).
    """
    if not (isinstance(exc, ConnectionRefusedError) or exc.__class__.__module__.startswith("py4j")):
        return False
    from metrics_lake.spark.session import driver_jvm_exited

    return driver_jvm_exited(wait=1.0)


def translate(exc: BaseException) -> LakeError | None:
    """``exc`` as the lake error it means (module docstring), or None for a bug."""
    if isinstance(exc, LakeError):
        return exc
    if _spark_jvm_gone(exc):
        return ServiceError(
            "Spark's driver JVM exited unexpectedly (killed from outside, or by the kernel for memory: see dmesg); "
            "the lake's commits are atomic and exactly once: run the command again"
        )
    storage = as_storage_error(exc)
    if storage is not None:
        return storage
    if exc.__class__.__module__.startswith("botocore"):
        return StorageError(f"S3 client error: {first_line(exc)}")
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        return InputError(f"corrupt gzip input: {first_line(exc)}")
    if isinstance(exc, EOFError):
        return InputError(f"input ended early (a truncated file?): {first_line(exc) or exc.__class__.__name__}")
    if isinstance(exc, UnicodeDecodeError):
        return InputError(f"input is not UTF-8 text: {exc.reason} at byte {exc.start}")
    if isinstance(exc, OSError):
        return _os_error(exc)
    if exc.__class__.__name__ == "TableNotFoundError" and exc.__class__.__module__.startswith("deltalake"):
        return NotFoundError(f"no such Delta table: {first_line(exc)}")
    if exc.__class__.__module__.startswith("pyspark.errors"):
        return _raised_in_spark(str(exc)) or InputError(f"Spark: {first_line(exc)}")
    if isinstance(exc, MemoryError):
        return LakeError(
            "out of memory: lower the batch size (LAKE_MAX_RECORDS_PER_BATCH) or give the process more memory"
        )
    return None


def explain(exc: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit code)`` for a failure a user can cause or fix; ``None`` for a bug."""
    error = translate(exc)
    if error is None:
        return None
    return str(error) or error.__class__.__name__, error.exit_code
