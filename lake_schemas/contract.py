"""The event contract (docs/ingest.md, Event contract) and its validator.

One event is a JSON object::

    {"ts": ISO-8601 string with a zone, or epoch milliseconds (int),
     "server": str of 1..128 chars,
     "metric": str matching [a-z0-9_.]{1,128},
     "value": finite number,
     "tags": {str: str}  (optional)}

Unknown extra fields are ignored (forward compatibility). An event that breaks
the contract is never dropped: :func:`to_log_records` turns it into a log
record with the raw payload and a reason ``"<code>: <detail>"`` where code is
one of :data:`REASON_CODES`, and the pipeline routes it to
``quarantine_events``. The raw payload is kept up to :data:`MAX_RAW_BYTES`
of UTF-8, then cut with a marker saying how much was left out.

No input makes the validator raise anything but :class:`ContractViolation`:
JSON nested deeper than Python's recursion limit, integers beyond Python's
digit limit or a double's range, strings with lone surrogates (not UTF-8)
and bytes that are not UTF-8 are reasons like any other. Epoch milliseconds
from ISO-8601 strings are computed with integers (no float rounding).
:mod:`metrics_lake.lake_schemas.ndjson` checks whole blocks of JSON Lines the same
way, vectorised, and comes here for every line it rejects.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.lake_schemas.errors import ContractViolation
from metrics_lake.lake_schemas.log_records import LOG_RECORD

METRIC_NAME = re.compile(r"[a-z0-9_.]{1,128}")
MAX_SERVER_LEN = 128
# Plausible event-time range, epoch ms: catches seconds sent as milliseconds.
MIN_TS_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
MAX_TS_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
#: Raw payloads of rejected events are kept up to this many bytes of UTF-8, then cut with a marker.
MAX_RAW_BYTES = 64 * 1024
# The marker raw_text puts after a cut payload; a payload already cut (an import re-sent through a gateway) stays as is.
_CUT_MARK = re.compile(rb"\xe2\x80\xa6\[\d{1,20} more bytes\]\Z")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

#: Reasons of the JSON event contract (the importer and ``POST /v1/events``).
EVENT_REASON_CODES = (
    "invalid_json",
    "not_an_object",
    "missing_field",
    "wrong_type",
    "non_finite_value",
    "bad_metric_name",
    "bad_server",
    "bad_timestamp",
    "bad_tags",
)
#: Reasons only the gateway's other protocols (OTLP, remote-write, line protocol) give, besides the above.
PROTOCOL_REASON_CODES = (
    "invalid_payload",  # a body or line the protocol's decoder cannot read (raw kept, base64 if binary)
    "unsupported",  # a well-formed point of a kind the lake does not store (e.g. a native histogram)
)
#: The gateway's reason for a valid event its token may not write (another server than the token's ``--servers``).
ACCESS_REASON_CODE = "forbidden_server"
#: The speed layer's reason for a valid event over a cardinality limit (``metrics_lake.core.kernels.cardinality``).
LIMIT_REASON_CODE = "cardinality_limit"
REASON_CODES = EVENT_REASON_CODES + PROTOCOL_REASON_CODES + (ACCESS_REASON_CODE,)


def servers_ok(servers: pa.Array) -> pa.Array:
    """The server rule on a string array, vectorised: 1..MAX_SERVER_LEN characters (null where the server is null)."""
    length = pc.binary_length(servers)  # bytes: as many as characters or more, and read without a scan
    if (pc.max(length).as_py() or 0) > MAX_SERVER_LEN:  # characters then matter
        length = pc.utf8_length(servers)
    return pc.and_(pc.greater_equal(length, 1), pc.less_equal(length, MAX_SERVER_LEN))


def metrics_ok(metrics: pa.Array) -> pa.Array:
    """The metric-name rule (:data:`METRIC_NAME`) on a string array, vectorised (null where the name is null)."""
    return pc.match_substring_regex(metrics, f"^{METRIC_NAME.pattern}$")


def _parse_ts(value: Any) -> int:
    if isinstance(value, bool):
        raise ContractViolation("wrong_type", "ts must be an ISO-8601 string or epoch milliseconds, got bool")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ContractViolation("bad_timestamp", f"{value[:64]!r} is not ISO-8601") from None
        if parsed.tzinfo is None:
            raise ContractViolation("bad_timestamp", f"{value[:64]!r} has no time zone")
        ms = (parsed - _EPOCH) // _MS
    else:
        raise ContractViolation(
            "wrong_type", f"ts must be an ISO-8601 string or epoch milliseconds, got {type(value).__name__}"
        )
    if not MIN_TS_MS <= ms < MAX_TS_MS:
        shown = repr(value) if len(str(ms)) <= 64 else f"a number of {len(str(ms))} digits"
        raise ContractViolation("bad_timestamp", f"{shown} is outside 2000..2100 (epoch milliseconds expected)")
    return ms


def validate_event(event: Any) -> dict:
    """Check one decoded event against the contract.

    Returns ``{"ts": epoch ms, "server", "metric", "value": float, "tags":
    list of (key, value) or None}``. Raises :class:`ContractViolation`.
    """
    if not isinstance(event, dict):
        raise ContractViolation("not_an_object", f"expected a JSON object, got {type(event).__name__}")
    for name in ("ts", "server", "metric", "value"):
        if name not in event or event[name] is None:
            raise ContractViolation("missing_field", name)
    ts = _parse_ts(event["ts"])
    server = event["server"]
    if not isinstance(server, str):
        raise ContractViolation("wrong_type", f"server must be a string, got {type(server).__name__}")
    if not 1 <= len(server) <= MAX_SERVER_LEN:
        raise ContractViolation("bad_server", f"length {len(server)} not in 1..{MAX_SERVER_LEN}")
    if not _is_unicode(server):
        raise ContractViolation("bad_server", "not valid Unicode (a lone surrogate)")
    metric = event["metric"]
    if not isinstance(metric, str):
        raise ContractViolation("wrong_type", f"metric must be a string, got {type(metric).__name__}")
    if not METRIC_NAME.fullmatch(metric):
        raise ContractViolation("bad_metric_name", f"{metric[:64]!r} does not match [a-z0-9_.]{{1,128}}")
    value = event["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractViolation("wrong_type", f"value must be a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ContractViolation("non_finite_value", "an integer too large for a double") from None
    if not math.isfinite(value):
        raise ContractViolation("non_finite_value", repr(value))
    tags = event.get("tags")
    if tags is not None:
        if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
            raise ContractViolation("bad_tags", "tags must be an object of string to string")
        if not all(_is_unicode(k) and _is_unicode(v) for k, v in tags.items()):
            raise ContractViolation("bad_tags", "a tag is not valid Unicode (a lone surrogate)")
        tags = list(tags.items())
    return {"ts": ts, "server": server, "metric": metric, "value": value, "tags": tags}


def _is_unicode(text: str) -> bool:
    """Whether ``text`` can be stored as UTF-8 (JSON's ``\\ud800`` escapes decode to lone surrogates that cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reject_constant(token: str) -> float:
    # json.loads accepts NaN/Infinity by default; keep them so they are
    # quarantined as non-finite values rather than as invalid JSON.
    return float(token)


def parse_payload(payload: str | bytes | dict) -> dict:
    """Decode (if needed) and validate one event; raises :class:`ContractViolation`."""
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload, parse_constant=_reject_constant)
        except RecursionError:
            raise ContractViolation("invalid_json", "nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers beyond Python's digit limit
            raise ContractViolation("invalid_json", str(exc)[:200]) from None
    return validate_event(payload)


def raw_text(payload: str | bytes | dict) -> str:
    """A rejected payload as storable text: bytes that are not UTF-8 and lone surrogates backslash-escaped,
    cut after :data:`MAX_RAW_BYTES` with a marker ``…[N more bytes]``.

    Idempotent: text it returned, given again, comes back unchanged (so a
    rejected row re-sent by an import through the gateway keeps its count).
    """
    if isinstance(payload, bytes):
        data = payload
    else:
        if not isinstance(payload, str):
            try:
                payload = json.dumps(payload, default=str, allow_nan=True)
            except (ValueError, RecursionError):
                payload = repr(payload)[: MAX_RAW_BYTES * 2]
        data = payload.encode("utf-8", errors="backslashreplace")
    if len(data) > MAX_RAW_BYTES:
        mark = _CUT_MARK.search(data, len(data) - 40)
        if mark and mark.start() <= MAX_RAW_BYTES:
            return data.decode("utf-8", errors="backslashreplace")
        kept = data[:MAX_RAW_BYTES].decode("utf-8", errors="ignore")  # never end inside a character
        return f"{kept}…[{len(data) - len(kept.encode())} more bytes]"
    return data.decode("utf-8", errors="backslashreplace")


def to_log_records(payloads: list[str | bytes | dict]) -> pa.Table:
    """Validate ``payloads`` into a :data:`LOG_RECORD` table, keeping input order.

    Valid events fill ts/server/metric/value/tags with ``raw``/``reason``
    null; rejected ones carry ``raw`` (the payload as text) and ``reason``.
    Never raises for bad events.
    """
    columns: dict[str, list] = {name: [] for name in LOG_RECORD.names}
    for payload in payloads:
        try:
            event = parse_payload(payload)
        except ContractViolation as violation:
            event = {"ts": None, "server": None, "metric": None, "value": None, "tags": None}
            event["raw"], event["reason"] = raw_text(payload), violation.reason
        else:
            event["raw"] = event["reason"] = None
        for name in LOG_RECORD.names:
            columns[name].append(event[name])
    return pa.table(columns, schema=LOG_RECORD)
