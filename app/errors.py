"""The error boundary's vocabulary: one line and an exit code for every failure a user can cause.

:func:`explain` turns an exception that reached the command line into
``(message, exit code)``:

- :class:`~metrics_lake.core.errors.LakeError` (everything the lake raises on
  purpose) keeps its message and its ``exit_code``;
- failures of libraries underneath that a user can cause by configuration or
  input are recognised and described: S3 access, credentials, bucket and
  connection errors as boto3, pyarrow and delta-rs report them; a full disk;
  a missing, unreadable or directory path; truncated or corrupt gzip; text
  that is not UTF-8; a Spark SQL error;
- anything else is a bug: ``None``, and the caller prints a one-line notice
  that ``--debug`` shows the traceback.

Exit codes: 1 a check failed, 2 bad input, configuration or access, 130
interrupted, 70 an unexpected error (``EX_SOFTWARE`` of BSD ``sysexits.h``).
"""

from __future__ import annotations

import errno
import gzip
import zlib

from metrics_lake.core.errors import LakeError

__all__ = ["EXIT_BUG", "EXIT_INPUT", "EXIT_INTERRUPTED", "explain", "first_line"]

EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_BUG = 70

#: Substrings by which pyarrow's and delta-rs's S3 errors (plain OSError text) are recognised.
_S3_TEXT = (
    (
        ("InvalidAccessKeyId", "SignatureDoesNotMatch", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH"),
        "S3 rejected the credentials; check LAKE_S3_ACCESS_KEY and LAKE_S3_SECRET_KEY",
    ),
    (("NoSuchBucket", "NO_SUCH_BUCKET"), "the S3 bucket in LAKE_ROOT does not exist; create it or fix LAKE_ROOT"),
    (("AccessDenied", "ACCESS_DENIED", "403 Forbidden"), "S3 denied access to the lake for the configured identity"),
    (
        ("Connection refused", "error trying to connect", "NETWORK_CONNECTION", "Failed to connect"),
        "the S3 endpoint did not answer; is it running? (`lake infra status`, or check LAKE_S3_ENDPOINT)",
    ),
)


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _os_error(exc: OSError) -> str | None:
    name = exc.filename or ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device{f' writing {name}' if name else ''}: free disk space and run again"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied: {name or first_line(exc)}"
    if exc.errno == errno.EROFS:
        return f"read-only file system: {name or first_line(exc)}"
    if exc.errno == errno.ENOENT and name:
        return f"no such file or directory: {name}"
    if exc.errno == errno.EISDIR:
        return f"{name or 'the path'} is a directory; give a file"
    if exc.errno == errno.ENOTDIR:
        return f"{name or 'a path component'} is not a directory"
    return None


def _library_error(exc: BaseException) -> str | None:
    """Describe a known third-party failure, or None."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        BotoCoreError = ClientError = ()  # noqa: N806
    if ClientError and isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        for needles, message in _S3_TEXT:
            if code in needles:
                return f"{message} ({code})"
        return f"S3 error {code}: {first_line(exc)}"
    if BotoCoreError and isinstance(exc, BotoCoreError):
        return f"S3 client error: {first_line(exc)}"
    if isinstance(exc, gzip.BadGzipFile | zlib.error):
        return f"corrupt gzip input: {first_line(exc)}"
    if isinstance(exc, EOFError):
        return f"input ended early (a truncated file?): {first_line(exc) or exc.__class__.__name__}"
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text: {exc.reason} at byte {exc.start}"
    text = str(exc)
    if isinstance(exc, OSError) or exc.__class__.__module__.startswith(("deltalake", "pyarrow")):
        for needles, message in _S3_TEXT:
            if any(needle in text for needle in needles):
                return f"{message}: {first_line(text, 200)}"
    if isinstance(exc, OSError):
        return _os_error(exc)
    if exc.__class__.__name__ == "TableNotFoundError" and exc.__class__.__module__.startswith("deltalake"):
        return f"no such Delta table: {first_line(text)}"
    if exc.__class__.__module__.startswith("pyspark.errors"):
        return f"Spark: {first_line(text)}"
    if isinstance(exc, MemoryError):
        return "out of memory: lower the batch size (LAKE_MAX_RECORDS_PER_BATCH) or give the process more memory"
    return None


def explain(exc: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit code)`` for a failure a user can cause or fix; ``None`` for a bug."""
    if isinstance(exc, LakeError):
        return str(exc) or exc.__class__.__name__, exc.exit_code
    message = _library_error(exc)
    return (message, EXIT_INPUT) if message else None
