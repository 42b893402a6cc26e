"""Every error the lake raises on purpose, under one root: :class:`LakeError`.

A :class:`LakeError`'s message is meant for the person running the command:
it says what failed and what to do about it, in one line where possible. The
command line catches the root at one place (``metrics_lake.app.cli.main``),
prints the message and exits with :attr:`LakeError.exit_code`: 2 for bad
input, configuration or access (fix something and re-run), 1 for a check that
ran and failed (quality gates, consumers behind retention).

Subclasses keep a standard-library base where callers already catch one
(``ConfigError`` is a ``ValueError``, ``AccessDeniedError`` a
``PermissionError``...), the pattern of delta-rs's ``deltalake.exceptions``.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "BucketNotFoundError",
    "CheckFailedError",
    "ConfigError",
    "CredentialsError",
    "InputError",
    "LakeError",
    "NotFoundError",
    "StorageError",
    "StorageUnavailableError",
]


class LakeError(Exception):
    """Root of the lake's errors; ``exit_code`` is what the CLI exits with (2: fix input/config and re-run)."""

    exit_code = 2


class ConfigError(LakeError, ValueError):
    """A setting is invalid; the message names the ``LAKE_*`` variable and what would be valid."""


class InputError(LakeError, ValueError):
    """A file, option or argument given to a command is unusable (a directory, a truncated gzip, a bad name)."""


class NotFoundError(LakeError, LookupError):
    """A named thing (topic, table, stored query) does not exist."""


class CheckFailedError(LakeError):
    """A check ran and failed (a critical expectation, a consumer behind retention): exit code 1."""

    exit_code = 1


class StorageError(LakeError, OSError):
    """The object store refused or failed an operation; ``retryable`` says whether trying again may help."""

    retryable = False


class AccessDeniedError(StorageError, PermissionError):
    """The store's identity may not do this operation on this key (S3 ``AccessDenied``, a read-only directory)."""


class CredentialsError(StorageError):
    """The store does not accept the credentials (S3 ``InvalidAccessKeyId``, ``SignatureDoesNotMatch``)."""


class BucketNotFoundError(StorageError, NotFoundError):
    """The S3 bucket named in ``LAKE_ROOT`` does not exist."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The store did not answer (connection refused, timeout); retrying later may work."""

    retryable = True
