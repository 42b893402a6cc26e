"""S3 failures classified by their error codes, whichever client reported them.

Three S3 clients work for the lake, and each reports a failure its own way:

- boto3 (:class:`~metrics_lake.core.storage.S3Store`) raises ``ClientError``
  whose ``response["Error"]["Code"]`` is the S3 error code (``AccessDenied``),
  and connection failures as ``EndpointConnectionError`` and friends;
- pyarrow's S3 file system (the AWS SDK for C++) raises ``OSError`` with the
  SDK's error enum in a fixed frame: ``AWS Error ACCESS_DENIED during
  HeadObject operation`` (``AWS Error UNKNOWN (HTTP status 403)`` when the
  SDK has no name for it);
- delta-rs (Rust ``object_store``) raises ``OSError`` carrying the S3 error
  document (``<Code>AccessDenied</Code>``), the HTTP status (``status 403``)
  or, when nothing answered, the operating system's error number
  (``Connection refused (os error 111)``).

:func:`error_code` reads the code out of each (the S3 code, with the SDK's
``ACCESS_DENIED`` spelled ``AccessDenied``; else ``HTTP <status>``; else
``errno <n>``), and :func:`storage_error_class` maps a code to the
:class:`~metrics_lake.lake_schemas.errors.StorageError` subclass it means. The store and
the command line's error boundary both go through this one table, so a code
means the same everywhere; no message text is matched beyond the frames
that carry the codes.
"""

from __future__ import annotations

import errno
import re

from metrics_lake.lake_schemas.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    CredentialsError,
    StorageError,
    StorageUnavailableError,
)

__all__ = ["CODES", "as_storage_error", "error_code", "storage_error_class"]

#: Error code -> the StorageError subclass it means. S3 codes (AWS S3 "Error responses"), HTTP statuses, errnos.
CODES: dict[str, type[StorageError]] = {
    **dict.fromkeys(("AccessDenied", "AllAccessDisabled", "HTTP 403"), AccessDeniedError),
    **dict.fromkeys(
        ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidSignature"),
        CredentialsError,
    ),
    "NoCredentials": CredentialsError,
    "NoSuchBucket": BucketNotFoundError,
    **dict.fromkeys(
        (
            "NetworkConnection",
            "RequestTimeout",
            "ServiceUnavailable",
            "SlowDown",
            "HTTP 503",
            *(f"errno {n}" for n in (errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH)),
            *(f"errno {n}" for n in (errno.ECONNRESET, errno.ECONNABORTED)),
        ),
        StorageUnavailableError,
    ),
}

# The frames the clients put codes in (module docstring).
_AWS_SDK = re.compile(r"AWS Error (?P<code>[A-Z][A-Z0-9_]*)(?: \(HTTP status (?P<status>\d{3})\))?")
_S3_DOCUMENT = re.compile(r"<Code>(?P<code>[A-Za-z0-9]+)</Code>")
_HTTP_STATUS = re.compile(r"\bstatus(?: code)?:? (?P<status>[1-5]\d\d)\b")
_OS_ERROR = re.compile(r"\(os error (?P<errno>\d+)\)")


def _camel(sdk_name: str) -> str:
    """The AWS SDK's enum name as the S3 code: ``INVALID_ACCESS_KEY_ID`` -> ``InvalidAccessKeyId``."""
    return "".join(part.capitalize() for part in sdk_name.split("_"))


def error_code(exc: BaseException) -> str | None:
    """The error code an S3 client's exception carries (module docstring), or None if it carries none.

    Text frames are read only from ``OSError`` and the exceptions of pyarrow
    and delta-rs, which is how those clients report S3 failures.
    """
    if exc.__class__.__module__.startswith("botocore"):
        return _botocore_code(exc)
    if not (isinstance(exc, OSError) or exc.__class__.__module__.startswith(("deltalake", "pyarrow"))):
        return None  # only the S3 clients' own failures carry these frames
    text = str(exc)
    sdk = _AWS_SDK.search(text)
    if sdk and sdk["code"] != "UNKNOWN":
        return _camel(sdk["code"])
    if sdk and sdk["status"]:
        return f"HTTP {sdk['status']}"
    document = _S3_DOCUMENT.search(text)
    if document:
        return document["code"]
    status = _HTTP_STATUS.search(text)
    if status:
        return f"HTTP {status['status']}"
    os_error = _OS_ERROR.search(text)
    if os_error:
        return f"errno {os_error['errno']}"
    return None


def _botocore_code(exc: BaseException) -> str | None:
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return f"HTTP {code}" if code.isdigit() else code or None  # a HEAD's answer has no body, only its status
    if isinstance(exc, NoCredentialsError):
        return "NoCredentials"
    if isinstance(exc, EndpointConnectionError | BotoConnectionError | ConnectionClosedError | ReadTimeoutError):
        return "NetworkConnection"
    return None


def storage_error_class(code: str | None) -> type[StorageError] | None:
    """The :class:`StorageError` subclass an error code means, or None for a code that is not the store's failure."""
    return CODES.get(code) if code else None


#: What to check for each kind of failure, for a message that names no key (the boundary's).
_ADVICE: dict[type[StorageError], str] = {
    AccessDeniedError: "S3 denied access to the lake for the configured identity",
    CredentialsError: "S3 rejected the credentials; check LAKE_S3_ACCESS_KEY and LAKE_S3_SECRET_KEY",
    BucketNotFoundError: "the S3 bucket in LAKE_ROOT does not exist; create it or fix LAKE_ROOT",
    StorageUnavailableError: (
        "the S3 endpoint did not answer; is it running? (`lake infra status`, or check LAKE_S3_ENDPOINT)"
    ),
}


def as_storage_error(exc: BaseException) -> StorageError | None:
    """``exc`` as the :class:`StorageError` its code means, with a one-line message; None if it carries no such code.

    For failures of an S3 client that reached the command line directly
    (pyarrow and delta-rs inside a job); the store's own calls already raise
    :class:`StorageError` with the key and endpoint named.
    """
    if isinstance(exc, StorageError):
        return exc
    code = error_code(exc)
    kind = storage_error_class(code)
    if kind is None:
        return None
    detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), exc.__class__.__name__)
    return kind(f"{_ADVICE[kind]} ({code}): {detail[:200]}")
