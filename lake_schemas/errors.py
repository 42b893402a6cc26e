"""Every error the lake raises on purpose, under one root, :class:`LakeError`, with the exit code it ends a command with.

A :class:`LakeError`'s message is meant for the person running the command:
it says what failed and what to do about it, in one line where possible. The
command line catches the root at one place (``metrics_lake.app.cli.main``),
prints the message and exits with the class's :attr:`~LakeError.exit_code`.
The hierarchy (standard-library bases in parentheses; exit code after the
colon where it differs from the parent's)::

    LakeError: 2                          fix the input, configuration or access, run again
    ├── ConfigError (ValueError)          a LAKE_* setting or lake.toml is invalid
    ├── InputError (ValueError)           an argument, option, file or request is unusable
    │   ├── ContractViolation             an event breaks the event contract (its reason goes to quarantine)
    │   ├── StoredQueryError              a stored query, or the file declaring them, is malformed
    │   ├── AlertRuleError                an alert rule is malformed or names what the config store lacks
    │   ├── SelectorError                 a series selector (a query's FROM, the label filter) is malformed
    │   ├── RangeError                    a dashboard API range or step is malformed (names the parameter)
    │   ├── RemoteReadError               a Prometheus remote-read request is malformed or too large
    │   ├── SequenceConflictError         a producer reused a sequence number for another body
    │   └── TokenError                    a request's token is missing, malformed, unknown, expired, revoked
    │                                     or lacks the scope (the HTTP answer is 401 or 403)
    ├── NotFoundError (LookupError)       a named thing does not exist
    │   ├── TopicNotFoundError            nothing was ever produced to the topic
    │   └── BucketNotFoundError           (also a StorageError) the bucket of LAKE_ROOT
    ├── StorageError (OSError)            the object store refused or failed an operation
    │   ├── AccessDeniedError (PermissionError)   the identity may not do this on this key
    │   ├── CredentialsError              the store does not accept the credentials
    │   ├── BucketNotFoundError
    │   └── StorageUnavailableError (ConnectionError)   the store did not answer; retryable
    ├── ServiceError (RuntimeError)       a server of ours could not start, run or stop
    │   ├── InfraError                    the local S3 server (SeaweedFS)
    │   ├── SparkClusterError             the local Spark standalone cluster
    │   └── AlertmanagerError             Alertmanager did not start, or did not accept alerts; retryable
    ├── ConflictError (RuntimeError): 75  another writer holds or changed what this one needed; run again
    │   ├── LeaseHeldError                a partition or table is leased to another live writer
    │   ├── FencedError                   this writer's lease was taken over
    │   ├── ConcurrentWriterError         another speed layer commits to the same tables
    │   └── ConfigConflictError           another edit of the config store won; nothing of this one applied
    ├── IntegrityError (ValueError): 65   an object under the lake root is not what the lake wrote
    └── CheckFailedError: 1               a check ran and failed
        ├── QualityGateError              a critical data-quality expectation failed
        └── ConsumerBehindRetentionError  retention removed records a consumer group had not read

Exit codes follow BSD ``sysexits.h`` where one fits: 65 ``EX_DATAERR``,
70 ``EX_SOFTWARE`` (an unexpected error: a bug, printed with a notice that
``--debug`` shows the traceback), 75 ``EX_TEMPFAIL``; 130 is an interrupt
(128 + SIGINT), as shells report it.

Subclasses keep a standard-library base where callers already catch one
(``ConfigError`` is a ``ValueError``, ``AccessDeniedError`` a
``PermissionError``...), the pattern of delta-rs's ``deltalake.exceptions``.
This module sits in the bottom layer so that every layer, the contracts
included, raises from the same root; ``tests/lake_schemas/test_errors.py``
checks that every ``LakeError`` subclass of the package is defined here and
drawn above.

Exceptions that only carry control flow inside one module (a compare-and-swap
that lost, ``ObjectExistsError`` of a create-if-absent, a decoder's unreadable
line) are not lake errors: their callers turn them into answers or into one
of the classes above.
"""

from __future__ import annotations

__all__ = [
    "EXIT_BUG",
    "EXIT_CHECK_FAILED",
    "EXIT_DATA",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_RETRY",
    "AccessDeniedError",
    "AlertRuleError",
    "AlertmanagerError",
    "BucketNotFoundError",
    "CheckFailedError",
    "ConcurrentWriterError",
    "ConfigError",
    "ConflictError",
    "ConsumerBehindRetentionError",
    "ContractViolation",
    "CredentialsError",
    "FencedError",
    "InfraError",
    "InputError",
    "IntegrityError",
    "LakeError",
    "LeaseHeldError",
    "NotFoundError",
    "QualityGateError",
    "RangeError",
    "ConfigConflictError",
    "RemoteReadError",
    "SelectorError",
    "SequenceConflictError",
    "ServiceError",
    "SparkClusterError",
    "StorageError",
    "StorageUnavailableError",
    "StoredQueryError",
    "TokenError",
    "TopicNotFoundError",
]

#: Exit code of a check that ran and failed.
EXIT_CHECK_FAILED = 1
#: Exit code of bad input, configuration or access: fix it and run again.
EXIT_INPUT = 2
#: Exit code of data in the lake that is not what the lake wrote (``EX_DATAERR``).
EXIT_DATA = 65
#: Exit code of an unexpected error, a bug (``EX_SOFTWARE``).
EXIT_BUG = 70
#: Exit code of a temporary failure: another writer won, run again (``EX_TEMPFAIL``).
EXIT_RETRY = 75
#: Exit code after Ctrl-C or SIGINT (128 + 2).
EXIT_INTERRUPTED = 130


class LakeError(Exception):
    """Root of the lake's errors; ``exit_code`` is what the CLI exits with (module docstring)."""

    exit_code = EXIT_INPUT


class ConfigError(LakeError, ValueError):
    """A setting is invalid; the message names the ``LAKE_*`` variable and what would be valid."""


class InputError(LakeError, ValueError):
    """A file, option, argument or request given to the lake is unusable (a directory, a truncated gzip, a bad name)."""


class ContractViolation(InputError):
    """An event breaks the event contract (``metrics_lake.lake_schemas.contract``).

    ``code`` is one of the contract's reason codes (``REASON_CODES`` there) and
    ``reason`` is ``"<code>: <detail>"``, the text a quarantined event keeps.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.reason = f"{code}: {detail}"


class StoredQueryError(InputError):
    """A stored query (or its file) is malformed; the message names the query and the clause."""


class AlertRuleError(InputError):
    """An alert rule is malformed, or names a stored query (or aggregate) the config store lacks; names rule and clause."""


class SelectorError(InputError):
    """A series selector (a stored query's ``FROM``, the dashboard's label filter) has a malformed item; names it."""


class RemoteReadError(InputError):
    """A Prometheus remote-read request the lake cannot answer as asked (the dashboard answers 400 with it)."""


class RangeError(InputError):
    """A requested range or step is malformed; ``parameter`` names the query parameter at fault."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class SequenceConflictError(InputError):
    """An upstream producer reused a sequence number for another body (or one too old to check): nothing was sent."""


class TokenError(InputError):
    """A request's credential is refused (``metrics_lake.core.tokens``); ``status`` is the HTTP answer.

    401 when the request did not prove who it is (no token, a malformed,
    unknown, expired, revoked or wrong one), 403 when it did but the token
    may not do this (a read token writing, a ``web-*`` token writing
    ``db-1``), 429 when the address failed too often (``retry_after``
    seconds). The message never contains the token.
    """

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class NotFoundError(LakeError, LookupError):
    """A named thing (topic, table, stored query) does not exist."""


class TopicNotFoundError(NotFoundError):
    """The topic has no ``topic.json``: nothing was ever produced to it."""


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


class ServiceError(LakeError, RuntimeError):
    """A server of the lake (gateway, dashboard, a local S3 server or Spark cluster) could not start, run or stop."""


class InfraError(ServiceError):
    """The local S3 server could not be started, found or stopped."""


class SparkClusterError(ServiceError):
    """The local Spark standalone cluster could not be started, found or stopped."""


class AlertmanagerError(ServiceError):
    """Alertmanager could not be started, found or stopped, or did not accept alerts (they stay in the outbox)."""

    retryable = True


class ConflictError(LakeError, RuntimeError):
    """Another writer holds or changed what this one needed; nothing was half-done, so running again is safe."""

    exit_code = EXIT_RETRY


class LeaseHeldError(ConflictError):
    """The partition or table is leased to another live writer (and waiting for it timed out)."""


class FencedError(ConflictError):
    """This writer's lease was taken over: it must stop writing to the partition."""


class ConcurrentWriterError(ConflictError):
    """Another speed layer committed positions to the same table meanwhile: two streams on one topic."""


class ConfigConflictError(ConflictError):
    """The config store (stored queries, alert rules) changed after the edit read it; nothing of the edit was applied."""


class IntegrityError(LakeError, ValueError):
    """An object under the lake root is not what the lake wrote (a foreign file, a damaged segment or sketch).

    The message names the object; nothing was committed by the failing
    operation. Running again does not help: inspect or restore the object.
    """

    exit_code = EXIT_DATA


class CheckFailedError(LakeError):
    """A check ran and failed (a critical expectation, a consumer behind retention): exit code 1."""

    exit_code = EXIT_CHECK_FAILED


class QualityGateError(CheckFailedError):
    """A critical data-quality expectation failed: downstream steps must not use the data."""


class ConsumerBehindRetentionError(CheckFailedError):
    """Retention removed log records that a consumer group had not read yet."""
