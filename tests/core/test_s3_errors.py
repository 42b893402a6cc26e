"""S3 failures are classified by their error codes, whichever client reported them (boto3, pyarrow, delta-rs)."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from metrics_lake.core.s3_errors import as_storage_error, error_code, storage_error_class
from metrics_lake.lake_schemas.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    CredentialsError,
    StorageUnavailableError,
)


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")


@pytest.mark.parametrize(
    ("exc", "code", "kind"),
    [
        (client_error("AccessDenied"), "AccessDenied", AccessDeniedError),
        (client_error("403"), "HTTP 403", AccessDeniedError),  # a HEAD's answer: a status, no body
        (client_error("SignatureDoesNotMatch"), "SignatureDoesNotMatch", CredentialsError),
        (client_error("NoSuchBucket"), "NoSuchBucket", BucketNotFoundError),
        (client_error("NoSuchKey"), "NoSuchKey", None),  # the caller's to interpret, not a store failure
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "NetworkConnection", StorageUnavailableError),
        (NoCredentialsError(), "NoCredentials", CredentialsError),
        # pyarrow's S3 file system (AWS SDK for C++), as it words them
        (
            OSError("When getting information for key 'x' in bucket 'lake': AWS Error ACCESS_DENIED during HeadObject"),
            "AccessDenied",
            AccessDeniedError,
        ),
        (OSError("AWS Error INVALID_ACCESS_KEY_ID during PutObject operation"), "InvalidAccessKeyId", CredentialsError),
        (OSError("AWS Error UNKNOWN (HTTP status 403) during HeadObject operation"), "HTTP 403", AccessDeniedError),
        (
            OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect"),
            "NetworkConnection",
            StorageUnavailableError,
        ),
        # delta-rs (object_store): the S3 error document, a status, or the errno of a refused connection
        (
            OSError("Generic S3 error: Client error with status 403 Forbidden: <Code>AccessDenied</Code>"),
            "AccessDenied",
            AccessDeniedError,
        ),
        (
            OSError("Generic S3 error: Server returned non-2xx status code: 503 Service Unavailable"),
            "HTTP 503",
            StorageUnavailableError,
        ),
        (
            OSError("Kernel error -> Generic S3 error\n  tcp connect error\n  Connection refused (os error 111)"),
            "errno 111",
            StorageUnavailableError,
        ),
        # a local file system error carries no S3 code
        (OSError(28, "No space left on device"), None, None),
        (ValueError("AccessDenied is a word in this text"), None, None),
    ],
)
def test_each_client_s_code_is_read_and_classified(exc, code, kind):
    assert error_code(exc) == code
    assert storage_error_class(code) is kind
    converted = as_storage_error(exc)
    assert (converted is None) == (kind is None)
    if converted is not None:
        assert type(converted) is kind and code in str(converted) and "\n" not in str(converted)
