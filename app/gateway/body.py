"""A request body into log records: bounded decompression, then the contract checked vectorised.

Two limits protect the gateway (both ``LAKE_GATEWAY_MAX_BODY_BYTES``): the
bytes received, and the bytes after decompression, which are inflated as a
stream (:class:`BodyDecoder`) and abandoned as soon as they pass the limit,
so a small compressed body cannot blow up in memory (a 40 KB gzip body that
inflates to 40 MB is refused at the limit, never held whole).

Events are then read by :func:`records_from_body`: NDJSON goes straight to
:func:`metrics_lake.lake_schemas.ndjson.records_from_lines` (Arrow's JSON reader,
lines split on ``\\n`` only); a JSON array is parsed by :mod:`json` with
guards and its elements are written out again as lines for the same path.
Invalid UTF-8 is a reject (``invalid_json``) whatever the body's shape, as in
``lake produce --from-file``.
"""

from __future__ import annotations

import json
import zlib

import pyarrow as pa

from metrics_lake.lake_schemas.contract import raw_text
from metrics_lake.lake_schemas.log_records import LOG_RECORD
from metrics_lake.lake_schemas.ndjson import records_from_lines

__all__ = ["BodyDecoder", "BodyError", "records_from_body"]

#: Content-Encoding values accepted (gzip and zlib "deflate"; zlib detects which from the header).
ENCODINGS = ("gzip", "x-gzip", "deflate")
#: Integers with more digits than this are read as floats (Python refuses above 4,300 digits, a DoS guard).
MAX_INT_DIGITS = 4000


class BodyError(Exception):
    """The body cannot be read: ``status`` is the HTTP answer (400, 413, 415), the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BodyDecoder:
    """Collects a body chunk by chunk, inflating it if compressed, refusing it past ``limit`` bytes.

    ``encoding``: the ``Content-Encoding`` header (empty or ``identity``:
    none). :meth:`feed` each received chunk, then :meth:`finish` for the
    whole decoded body. Raises :class:`BodyError`: 415 for an unknown
    encoding, 413 once the received or the decoded bytes pass ``limit``,
    400 for a corrupt or truncated compressed stream.
    """

    def __init__(self, encoding: str, limit: int) -> None:
        encoding = encoding.strip().lower()
        if encoding not in ("", "identity", *ENCODINGS):
            raise BodyError(415, f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
        self.limit = limit
        self.received = 0
        self._parts: list[bytes] = []
        self._decoded = 0
        # wbits 32 + 15: accept a gzip or a zlib header, with the largest window.
        self._inflate = zlib.decompressobj(32 + zlib.MAX_WBITS) if encoding in ENCODINGS else None

    @property
    def decoded_bytes(self) -> int:
        """Bytes of decoded body held so far."""
        return self._decoded

    def feed(self, chunk: bytes) -> None:
        """Add one received chunk; raises :class:`BodyError` (413, 400)."""
        self.received += len(chunk)
        if self.received > self.limit:
            raise BodyError(413, f"body over {self.limit:,} bytes; send smaller batches")
        if self._inflate is None:
            self._keep(chunk)
            return
        data = chunk
        while data:
            if self._inflate.eof:
                raise BodyError(400, "unreadable request: data after the end of the compressed stream")
            try:
                # Inflate at most one byte past the limit: enough to know the body is too large.
                out = self._inflate.decompress(data, self.limit - self._decoded + 1)
            except zlib.error as exc:
                raise BodyError(400, f"unreadable request: corrupt compressed body ({exc})") from None
            self._keep(out)
            data = self._inflate.unconsumed_tail

    def _keep(self, data: bytes) -> None:
        self._decoded += len(data)
        if self._decoded > self.limit:
            raise BodyError(413, f"body over {self.limit:,} bytes once decompressed; send smaller batches")
        if data:
            self._parts.append(data)

    def finish(self) -> bytes:
        """The whole decoded body; :class:`BodyError` (400) if a compressed stream ended early."""
        if self._inflate is not None and self.received and not self._inflate.eof:
            raise BodyError(400, "unreadable request: the compressed body is truncated")
        body = b"".join(self._parts)
        self._parts = [body]
        return body


def _bounded_int(digits: str) -> int | float:
    # Huge integers become floats (inf beyond a double), which the contract rejects as out of range.
    return int(digits) if len(digits) <= MAX_INT_DIGITS else float(digits)


def _keep_constant(token: str) -> float:
    return float(token)  # NaN/Infinity reach the contract, which quarantines them as non-finite values


def records_from_body(body: bytes, content_type: str) -> pa.Table:
    """:data:`~metrics_lake.lake_schemas.log_records.LOG_RECORD` rows for the events of one request body, in body order.

    The body is a JSON array when it starts with ``[`` (after whitespace)
    and ``content_type`` does not say NDJSON; otherwise NDJSON. An array
    that is not valid JSON (or nests deeper than Python's parser allows) is
    one rejected record holding the body. Never raises for bad input.
    """
    if body.lstrip()[:1] == b"[" and "ndjson" not in content_type:
        try:
            events = json.loads(body, parse_int=_bounded_int, parse_constant=_keep_constant)
        except RecursionError:
            return _one_reject(body, "invalid_json: nested too deeply")
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            return _one_reject(body, f"invalid_json: {str(exc)[:200]}")
        if not isinstance(events, list):
            return _one_reject(body, "not_an_object: the body is not a JSON array of events")
        try:
            lines = [json.dumps(event, allow_nan=True, separators=(",", ":")) for event in events]
        except (RecursionError, ValueError):  # cannot happen for json.loads output; guard anyway
            return _one_reject(body, "invalid_json: an element cannot be written back as JSON")
        body = "\n".join(lines).encode()  # ASCII: json.dumps escapes everything else
    return records_from_lines(body).records


def _one_reject(body: bytes, reason: str) -> pa.Table:
    row = dict.fromkeys(LOG_RECORD.names)
    row["raw"], row["reason"] = raw_text(body), reason
    return pa.Table.from_pylist([row], schema=LOG_RECORD)
