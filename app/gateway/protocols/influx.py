"""InfluxDB line protocol into log records: one event per field.

Syntax per InfluxDB's reference
(https://docs.influxdata.com/influxdb/v2/reference/syntax/line-protocol/)::

    measurement[,tag_key=tag_value...] field_key=field_value[,field_key=field_value...] [timestamp]

- lines are split on ``\\n`` only (a trailing ``\\r`` dropped); blank lines and
  lines starting with ``#`` (comments) are skipped;
- escapes: in the measurement ``\\,`` and ``\\ ``; in tag keys, tag values and
  field keys also ``\\=``; in string field values ``\\"`` and ``\\\\``; two
  backslashes are one; a backslash before any other character is literal;
- field values: floats (``1``, ``-1.5e3``), integers (``1i``), unsigned
  integers (``1u``), booleans (``t``/``true``/``True``/``TRUE``, ``f``...:
  stored as 1.0/0.0) and strings (``"..."``: the contract holds numbers
  only, so a string field is quarantined as ``wrong_type`` with its line);
- the timestamp is an integer in the request's ``precision`` (``ns`` by
  default; v2 ``ns|us|ms|s``, v1 ``n|u|ms|s|m|h``), floored to milliseconds;
  without one, the gateway's receive time is used (as InfluxDB does).

Each field becomes an event: **metric** ``<measurement>.<field key>``
through :mod:`metrics_lake.app.gateway.protocols.metric_names` (``cpu,host=a
usage_idle=99`` gives ``cpu.usage_idle``), **server** the ``host`` tag
(Telegraf's default), else the ``server`` tag (none: quarantined as
``missing_field: server``), **tags** every tag. A line that does not parse
(or is not UTF-8) is one ``invalid_payload`` reject holding the line.
"""

from __future__ import annotations

import re
import time

from metrics_lake.app.gateway.protocols import Decoded
from metrics_lake.app.gateway.protocols.metric_names import ORIGINAL_NAME_TAG, metric_name
from metrics_lake.app.gateway.protocols.points import PointsBuilder
from metrics_lake.app.gateway.protocols.series_catalog import RecentSeries
from metrics_lake.lake_schemas.errors import InputError

__all__ = ["PRECISIONS", "LineError", "decode", "precision_divisor"]

#: Timestamp precisions (the ``precision`` query parameter, v2 and v1 spellings) as nanoseconds per unit.
PRECISIONS = {
    "ns": 1,
    "n": 1,
    "us": 1_000,
    "u": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
#: Tags naming the server, in order of preference.
SERVER_TAGS = ("host", "server")
_FLOAT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d{1,20}")
_TRUE = frozenset({"t", "T", "true", "True", "TRUE"})
_FALSE = frozenset({"f", "F", "false", "False", "FALSE"})
_UNESCAPE_NAME = re.compile(r"\\([,= \\])")  # measurement, tag keys and values, field keys
_UNESCAPE_STRING = re.compile(r'\\(["\\])')  # string field values


class LineError(ValueError):
    """A line that is not line protocol; the message says where."""


def precision_divisor(precision: str | None) -> int:
    """Nanoseconds per timestamp unit for a ``precision`` parameter (default ns); :class:`InputError` if unknown."""
    if precision in (None, ""):
        return 1
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise InputError(f"precision {precision[:20]!r} is not one of {', '.join(PRECISIONS)}") from None


def decode(body: bytes, precision: int = 1, now_ms: int | None = None, recent: RecentSeries | None = None) -> Decoded:
    """Log records of a line-protocol body (module docstring); never raises for bad input.

    ``precision``: nanoseconds per timestamp unit (:func:`precision_divisor`);
    ``now_ms``: the time of lines without a timestamp (default: now);
    ``recent``: the series of earlier requests, so this one's records take
    their columns from a catalog (:mod:`~metrics_lake.app.gateway.protocols.series_catalog`).
    """
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    builder = PointsBuilder(recent.catalog() if recent is not None else None)
    try:
        lines = body.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = None
    for number, raw in enumerate(lines if lines is not None else body.split(b"\n"), start=1):
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                builder.reject(raw, "invalid_payload", f"line {number} is not UTF-8 ({exc.reason} at byte {exc.start})")
                continue
        else:
            line = raw
        line = line[:-1] if line.endswith("\r") else line
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            measurement, tags, fields, timestamp = _parse(line)
        except LineError as exc:
            builder.reject(line, "invalid_payload", f"line {number}: {exc}")
            continue
        ts = now_ms if timestamp is None else timestamp * precision // 1_000_000
        named = dict(tags)
        server = next((named[t] for t in SERVER_TAGS if named.get(t)), None)
        for key, value in fields:
            source = f"{measurement}.{key}"
            metric, original = metric_name(source)
            if isinstance(value, str):
                builder.reject(line, "wrong_type", f"field {key[:64]!r} is a string; the lake stores numbers")
                continue
            series_tags = tags if original is None else (*tags, (ORIGINAL_NAME_TAG, original))
            builder.add(builder.series(server, metric, series_tags), ts, value, raw=line)
    return Decoded(builder.records())


def _parse(line: str) -> tuple[str, tuple, list, int | None]:
    """(measurement, tags, [(field key, float or str)], timestamp or None) of one line; :class:`LineError`."""
    simple = "\\" not in line and '"' not in line
    if simple:
        parts = line.split(" ")
    else:  # quotes delimit strings in field values only; in the measurement and tags they are plain characters
        head = _split(line, " ", first=True)
        parts = head[:1] + (_split(head[1], " ", quotes=True) if len(head) == 2 else [])
    if len(parts) not in (2, 3) or not all(parts):
        raise LineError("expected 'measurement[,tags] fields [timestamp]' separated by single spaces")
    series = parts[0].split(",") if simple else _split(parts[0], ",")
    measurement = series[0] if simple else _unescape(series[0])
    if not measurement:
        raise LineError("empty measurement")
    tags = []
    for tag in series[1:]:
        pair = tag.split("=") if simple else _split(tag, "=")
        if len(pair) != 2 or not pair[0] or not pair[1]:
            raise LineError(f"tag {tag[:64]!r} is not key=value")
        tags.append((pair[0], pair[1]) if simple else (_unescape(pair[0]), _unescape(pair[1])))
    fields = []
    for field in parts[1].split(",") if simple else _split(parts[1], ",", quotes=True):
        pair = field.split("=", 1) if simple else _split(field, "=", quotes=True, first=True)
        if len(pair) != 2 or not pair[0]:
            raise LineError(f"field {field[:64]!r} is not key=value")
        key = pair[0] if simple else _unescape(pair[0])
        fields.append((key, _field_value(key, pair[1])))
    timestamp = None
    if len(parts) == 3:
        if not _INTEGER.fullmatch(parts[2]):
            raise LineError(f"timestamp {parts[2][:40]!r} is not an integer")
        timestamp = int(parts[2])
    return measurement, tuple(tags), fields, timestamp


def _field_value(key: str, text: str) -> float | str:
    if text[:1] == '"':
        if len(text) < 2 or text[-1] != '"':
            raise LineError(f"field {key[:64]!r}: unterminated string")
        return _UNESCAPE_STRING.sub(r"\1", text[1:-1])
    if text[-1:] in ("i", "u") and _INTEGER.fullmatch(text[:-1]):
        number = int(text[:-1])
        if text[-1] == "u" and not 0 <= number < 1 << 64 or text[-1] == "i" and not -(1 << 63) <= number < 1 << 63:
            raise LineError(f"field {key[:64]!r}: {text[:40]} is out of range")
        return float(number)
    if text in _TRUE:
        return 1.0
    if text in _FALSE:
        return 0.0
    if _FLOAT.fullmatch(text):
        return float(text)  # may be inf for 1e999: the contract quarantines it as non-finite
    raise LineError(f"field {key[:64]!r}: {text[:40]!r} is not a number, boolean or string")


def _unescape(text: str) -> str:
    return _UNESCAPE_NAME.sub(r"\1", text)


def _split(text: str, separator: str, *, quotes: bool = False, first: bool = False) -> list[str]:
    """``text`` cut at each ``separator`` not escaped by a backslash (nor inside double quotes, with ``quotes``).

    ``first``: cut at the first separator only. Pieces keep their escapes. :class:`LineError` on an open quote.
    """
    pieces, start, i, quoted, n = [], 0, 0, False, len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if quotes and char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            pieces.append(text[start:i])
            start = i + 1
            if first:
                break
        i += 1
    if quoted:
        raise LineError("unterminated string")
    pieces.append(text[start:])
    return pieces
