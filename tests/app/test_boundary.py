"""The boundary's vocabulary: known failures become one line and an exit code, anything else is a bug (None)."""

from __future__ import annotations

import errno
import gzip

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from metrics_lake.app.cli.boundary import explain
from metrics_lake.lake_schemas.errors import EXIT_INPUT, CheckFailedError, ConfigError, StorageUnavailableError


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/lake/x"), "no space left on the device writing /lake/x"),
        (OSError(errno.EACCES, "Permission denied", "/lake/x"), "permission denied: /lake/x"),
        (OSError(errno.EISDIR, "Is a directory", "/data"), "/data is a directory"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/nope"), "no such file or directory: /nope"),
        (EOFError("Compressed file ended before the end-of-stream marker was reached"), "input ended early"),
        (gzip.BadGzipFile("Not a gzipped file (b'{\"')"), "corrupt gzip input"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8"),
        (client_error("AccessDenied"), "S3 denied access"),
        (client_error("InvalidAccessKeyId"), "rejected the credentials"),
        (client_error("NoSuchBucket"), "bucket in LAKE_ROOT does not exist"),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "did not answer"),
        # delta-rs and pyarrow report S3 failures as OSError text
        (OSError("Generic S3 error: Client error with status 403 Forbidden: <Code>AccessDenied</Code>"), "S3 denied"),
        (OSError("AWS Error ACCESS_DENIED during HeadObject operation"), "S3 denied"),
        (OSError("error sending request: Connection refused (os error 111)"), "did not answer"),
        (MemoryError(), "out of memory"),
    ],
)
def test_known_failures_are_one_line_with_exit_2(exc, expected):
    message, code = explain(exc)
    assert expected in message and "\n" not in message
    assert code == EXIT_INPUT


def test_lake_errors_keep_their_message_and_exit_code():
    assert explain(ConfigError("invalid configuration: LAKE_ROOT: bad")) == ("invalid configuration: LAKE_ROOT: bad", 2)
    assert explain(CheckFailedError("critical expectation failed")) == ("critical expectation failed", 1)
    assert explain(StorageUnavailableError("S3 endpoint did not answer"))[1] == 2


@pytest.mark.parametrize("exc", [KeyError("x"), AttributeError("y"), ZeroDivisionError()])
def test_anything_else_is_a_bug(exc):
    assert explain(exc) is None
