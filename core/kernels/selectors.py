"""Series selectors: which servers and labels a stored query, a dashboard filter or an alert rule reads.

A selector is a comma-separated list of items without spaces::

    *                       every series
    web-*,db-1              servers by name or shell glob (``*``, ``?``): any of them
    role=web,dc=eu-*        label matchers: every one of them (a glob on the label's value)
    team!=payments          a negative matcher: the label is absent or does not match
    web-*,dc=eu-*           both: a server among the names *and* every matcher

Labels are a series' ``labels`` map: the newest event's tags with the
server's inventory labels over them (:mod:`~metrics_lake.core.kernels.windows`).
As in Prometheus, a label a series lacks has the empty value, so
``dc!=eu-*`` keeps series without ``dc`` and ``dc=`` selects exactly them;
a matcher on a label nobody has selects nothing, which is not an error.
``server=GLOB`` is a server item. Label names follow Prometheus
(``[a-zA-Z_][a-zA-Z0-9_]*``); a malformed item raises
:class:`~metrics_lake.lake_schemas.errors.SelectorError` naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.lake_schemas.errors import SelectorError

__all__ = [
    "LABEL_NAME",
    "LabelMatcher",
    "Selector",
    "glob_pattern",
    "label_values",
    "map_entries",
    "parse_selector",
    "selector_mask",
    "server_pattern",
]

#: A label name (Prometheus's data model).
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = re.compile(r"^(?P<name>[^=!]+)(?P<op>!?=)(?P<value>.*)$")


@dataclass(frozen=True)
class LabelMatcher:
    """``name=value`` (``negated``: ``name!=value``); ``value`` a shell glob on the label's value ("" if absent)."""

    name: str
    value: str
    negated: bool = False

    def __str__(self) -> str:
        return f"{self.name}{'!=' if self.negated else '='}{self.value}"


@dataclass(frozen=True)
class Selector:
    """Servers (names or globs; ``("*",)`` = all) and label matchers (all must hold)."""

    servers: tuple[str, ...] = ("*",)
    matchers: tuple[LabelMatcher, ...] = ()

    @property
    def everything(self) -> bool:
        """True when the selector keeps every series."""
        return "*" in self.servers and not self.matchers

    def matches(self, server: str, labels: dict[str, str] | None) -> bool:
        """Whether one series (``server``, its ``labels``) is selected; :func:`selector_mask` for many."""
        pattern = server_pattern(self.servers)
        if pattern is not None and not re.fullmatch(pattern, server):
            return False
        labels = labels or {}
        return all(
            bool(re.fullmatch(glob_pattern([m.value]), labels.get(m.name, ""))) != m.negated for m in self.matchers
        )


def parse_selector(text: str) -> Selector:
    """The :class:`Selector` of ``text`` (module docstring); :class:`SelectorError` naming a malformed item."""
    servers: list[str] = []
    matchers: list[LabelMatcher] = []
    for item in (i for i in text.split(",") if i):
        match = _MATCHER.match(item)
        if match is None:
            if "=" in item or "!" in item:
                raise SelectorError(f"{item!r} is neither a server glob nor NAME=GLOB / NAME!=GLOB")
            servers.append(item)
            continue
        name, negated, value = match["name"], match["op"] == "!=", match["value"]
        if not LABEL_NAME.fullmatch(name):
            raise SelectorError(f"label name {name!r} in {item!r} does not match [a-zA-Z_][a-zA-Z0-9_]*")
        if name == "server" and not negated:
            servers.append(value)
        else:
            matchers.append(LabelMatcher(name, value, negated))
    return Selector(tuple(servers) or ("*",), tuple(matchers))


def glob_pattern(globs: tuple[str, ...] | list[str]) -> str:
    """A regular expression (RE2 and Java compatible) matching a whole string equal to any of the shell globs."""
    alternatives = ["".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in g) for g in globs]
    return "^(?:" + "|".join(alternatives) + ")$"


def server_pattern(servers: tuple[str, ...]) -> str | None:
    """:func:`glob_pattern` of ``servers`` (names or globs); None when they include ``*`` (every server)."""
    return None if "*" in servers else glob_pattern(servers)


def label_values(labels: pa.Array | pa.ChunkedArray, name: str) -> pa.Array | pa.ChunkedArray:
    """Per row of a ``map<string, string>`` column, the value of label ``name``; "" where absent or null."""
    return pc.fill_null(pc.map_lookup(labels, pa.scalar(name, pa.string()), "first"), "")


def map_entries(maps: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """(row of each entry (int64), names, values) of a ``map<string, string>`` array; a null map has no entries."""
    maps = maps.combine_chunks() if isinstance(maps, pa.ChunkedArray) else maps
    offsets = maps.offsets.to_numpy(zero_copy_only=False)  # of this (possibly sliced) array, into whole children
    lengths = np.diff(offsets)
    entries = slice(int(offsets[0]), int(offsets[-1])) if len(offsets) else slice(0, 0)  # zero-copy views
    return np.repeat(np.arange(len(maps), dtype=np.int64), lengths), maps.keys[entries], maps.items[entries]


def selector_mask(
    selector: Selector, servers: pa.Array | pa.ChunkedArray, labels: pa.Array | pa.ChunkedArray
) -> pa.Array | pa.ChunkedArray | None:
    """Boolean mask of the rows (``servers`` strings, ``labels`` maps) that ``selector`` keeps; None for all."""
    mask = None
    pattern = server_pattern(selector.servers)
    if pattern is not None:
        mask = pc.fill_null(pc.match_substring_regex(servers, pattern), False)
    for matcher in selector.matchers:
        hit = pc.match_substring_regex(label_values(labels, matcher.name), glob_pattern([matcher.value]))
        hit = pc.invert(hit) if matcher.negated else hit
        mask = hit if mask is None else pc.and_(mask, hit)
    return mask
