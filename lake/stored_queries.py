"""Stored queries: the grammar and its parser; the declarations ship in ``lake_schemas/stored_queries.toml``.

The query language is the APM one::

    FROM <servers> SELECT <metric> WINDOW <duration> [EVERY <slide>]
        COMPUTE <aggregate>[, <aggregate>...] [PER SERVER]

- ``<servers>``: ``*`` for every server, or a comma-separated list of names
  and shell-style globs (``web-*,db-1``);
- ``<metric>``: one metric name of the event contract;
- ``<duration>`` / ``<slide>``: ``<n>m``, ``<n>h`` or ``<n>d``, whole minutes
  (the finest stored resolution is the 1-minute window), at most one day.
  Without ``EVERY`` the window is tumbling; with it, hopping (a window of
  ``duration`` starting every ``slide``; ``slide`` <= ``duration``);
- ``<aggregate>``: ``count``, ``sum``, ``min``, ``max``, ``avg`` or
  ``percentile(p)`` with 0 < p < 100 (percent), e.g. ``percentile(99.9)``;
- by default one fleet-wide row per window and aggregate (the servers'
  KLL sketches merged, so a fleet p99 is the p99 of every matching event,
  as with Datadog's distributions); ``PER SERVER`` gives a row per server.

Keywords are case-insensitive. :func:`load_stored_queries` raises
:class:`StoredQueryError` naming the query and what is wrong with it.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from metrics_lake.core.errors import InputError
from metrics_lake.schemas.contract import METRIC_NAME

#: The declarations shipped with the lake (package data of ``metrics_lake.schemas``).
DEFAULT_FILE = Path(str(resources.files("metrics_lake.schemas").joinpath("stored_queries.toml")))
MINUTE_S, DAY_S = 60, 86_400
_UNITS = {"m": 60, "h": 3600, "d": 86_400}
_QUERY = re.compile(
    r"^\s*FROM\s+(?P<servers>\S+)\s+SELECT\s+(?P<metric>\S+)\s+WINDOW\s+(?P<duration>\S+)"
    r"(?:\s+EVERY\s+(?P<slide>\S+))?\s+COMPUTE\s+(?P<aggregates>.+?)(?P<per_server>\s+PER\s+SERVER)?\s*$",
    re.IGNORECASE,
)
_SIMPLE = ("count", "sum", "min", "max", "avg")
_PERCENTILE = re.compile(r"^percentile\(\s*(?P<p>[0-9]+(?:\.[0-9]+)?)\s*\)$", re.IGNORECASE)
_NAME = re.compile(r"[a-z0-9_]{1,64}")


class StoredQueryError(InputError):
    """A stored query (or its file) is malformed; the message names the query."""


@dataclass(frozen=True)
class Aggregate:
    """One ``COMPUTE`` item: ``kind`` is count/sum/min/max/avg/percentile; ``quantile`` in (0, 1) for percentiles."""

    kind: str
    quantile: float | None = None

    @property
    def label(self) -> str:
        """The ``aggregate`` column value: ``p99``, ``p99.9``, or the kind."""
        if self.quantile is None:
            return self.kind
        return f"p{self.quantile * 100:g}"


@dataclass(frozen=True)
class StoredQuery:
    """A parsed stored query; durations in seconds; ``servers`` are names or globs (``("*",)`` = all)."""

    name: str
    text: str
    servers: tuple[str, ...]
    metric: str
    duration_s: int
    slide_s: int
    aggregates: tuple[Aggregate, ...]
    per_server: bool
    description: str = ""

    @property
    def hopping(self) -> bool:
        """True when windows overlap (``EVERY`` shorter than the window)."""
        return self.slide_s < self.duration_s


def _seconds(name: str, what: str, text: str) -> int:
    match = re.fullmatch(r"([0-9]+)([mhd])", text.lower())
    if not match:
        raise StoredQueryError(f"stored query {name!r}: {what} {text!r} is not <n>m, <n>h or <n>d")
    seconds = int(match[1]) * _UNITS[match[2]]
    if not MINUTE_S <= seconds <= DAY_S:
        raise StoredQueryError(f"stored query {name!r}: {what} {text!r} must be between 1m and 1d")
    return seconds


def _aggregate(name: str, text: str) -> Aggregate:
    text = text.strip()
    if text.lower() in _SIMPLE:
        return Aggregate(text.lower())
    match = _PERCENTILE.match(text)
    if match:
        percent = float(match["p"])
        if 0 < percent < 100:
            return Aggregate("percentile", percent / 100)
    raise StoredQueryError(
        f"stored query {name!r}: cannot compute {text!r}; use count, sum, min, max, avg or percentile(p), 0 < p < 100"
    )


def parse_query(name: str, text: str, description: str = "") -> StoredQuery:
    """Parse one query text (grammar in the module docstring); raises :class:`StoredQueryError`."""
    if not _NAME.fullmatch(name):
        raise StoredQueryError(f"stored query name {name!r} must match [a-z0-9_]{{1,64}}")
    match = _QUERY.match(text)
    if not match:
        raise StoredQueryError(
            f"stored query {name!r}: expected 'FROM <servers> SELECT <metric> WINDOW <duration> "
            f"[EVERY <slide>] COMPUTE <aggregates> [PER SERVER]', got {text!r}"
        )
    metric = match["metric"]
    if not METRIC_NAME.fullmatch(metric):
        raise StoredQueryError(f"stored query {name!r}: {metric!r} is not a metric name ([a-z0-9_.]{{1,128}})")
    duration = _seconds(name, "WINDOW", match["duration"])
    slide = _seconds(name, "EVERY", match["slide"]) if match["slide"] else duration
    if slide > duration:
        raise StoredQueryError(
            f"stored query {name!r}: EVERY {match['slide']} is longer than WINDOW {match['duration']}"
        )
    aggregates = tuple(_aggregate(name, item) for item in match["aggregates"].split(","))
    labels = [a.label for a in aggregates]
    if len(set(labels)) != len(labels):
        raise StoredQueryError(f"stored query {name!r}: an aggregate is listed twice in {labels}")
    servers = tuple(s for s in match["servers"].split(",") if s)
    return StoredQuery(
        name, text.strip(), servers, metric, duration, slide, aggregates, bool(match["per_server"]), description
    )


def load_stored_queries(path: str | Path | None = None) -> list[StoredQuery]:
    """Parse every ``[[queries]]`` entry (keys ``name``, ``query``, optional ``description``) of ``path``.

    ``path`` defaults to :data:`DEFAULT_FILE`. Raises :class:`StoredQueryError`
    for a missing or malformed file, a bad query, or a duplicate name.
    """
    path = Path(path or DEFAULT_FILE)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise StoredQueryError(f"stored queries file {path} does not exist") from None
    except IsADirectoryError:
        raise StoredQueryError(f"stored queries file {path} is a directory; give a .toml file") from None
    except UnicodeDecodeError as exc:
        raise StoredQueryError(f"stored queries file {path} is not UTF-8 text: {exc.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise StoredQueryError(f"stored queries file {path}: {exc}") from None
    queries = []
    for i, entry in enumerate(doc.get("queries", [])):
        missing = {"name", "query"} - set(entry)
        if missing:
            raise StoredQueryError(f"{path}: queries[{i}] lacks {sorted(missing)}")
        queries.append(parse_query(entry["name"], entry["query"], entry.get("description", "")))
    names = [q.name for q in queries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise StoredQueryError(f"{path}: stored query names used twice: {duplicates}")
    return queries
