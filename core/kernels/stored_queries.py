"""Stored queries: the grammar, its parser, and their evaluation over 1-minute window states (Arrow).

The declarations ship in ``lake_schemas/stored_queries.toml``.

The query language is the APM one::

    FROM <selector> SELECT <metric> WINDOW <duration> [EVERY <slide>]
        COMPUTE <aggregate>[, <aggregate>...] [PER SERVER | BY <label>[,<label>...]]

- ``<selector>``: ``*`` for every series, or a comma-separated list of
  server names and shell-style globs (``web-*,db-1``) and label matchers
  (``role=web,dc=eu-*``, ``team!=payments``) on the series' labels (its
  tags and its server's inventory labels):
  :mod:`~metrics_lake.core.kernels.selectors`;
- ``<metric>``: one metric name of the event contract;
- ``<duration>`` / ``<slide>``: ``<n>m``, ``<n>h`` or ``<n>d``, whole minutes
  (the finest stored resolution is the 1-minute window), at most one day.
  Without ``EVERY`` the window is tumbling; with it, hopping (a window of
  ``duration`` starting every ``slide``; ``slide`` <= ``duration``);
- ``<aggregate>``: ``count``, ``sum``, ``min``, ``max``, ``avg`` or
  ``percentile(p)`` with 0 < p < 100 (percent), e.g. ``percentile(99.9)``;
- by default one fleet-wide row per window and aggregate (the servers'
  sketches merged, so a fleet p99 is the p99 of every matching event within
  the sketch's relative error, as with Datadog's distributions);
  ``PER SERVER`` gives a row per server, and the fleet-wide row too;
  ``BY dc,role`` a row per group of series with equal values of those
  labels (a missing label is the empty value), the group's values in the
  row's ``labels`` (empty ones left out) and ``server`` null, as
  PromQL's ``quantile by (dc, role)`` over merged sketches.

Keywords are case-insensitive. :func:`load_stored_queries` raises
:class:`StoredQueryError` naming the query and what is wrong with it.

Evaluation (:func:`query_states`, then :func:`query_rows` after merging) is
engine-independent: a query window holds exactly the 1-minute windows that
start inside it, so its state is the merge of theirs, and count, sum, min
and max are exact.
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels import sketch
from metrics_lake.core.kernels.selectors import (
    LABEL_NAME,
    LabelMatcher,
    Selector,
    label_values,
    parse_selector,
    selector_mask,
)
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states
from metrics_lake.lake_schemas.contract import METRIC_NAME
from metrics_lake.lake_schemas.errors import SelectorError, StoredQueryError
from metrics_lake.lake_schemas.tables import QUERY_RESULTS
from metrics_lake.lake_schemas.types import TAGS, UTC_US, utc_dates

#: The declarations shipped with the lake (package data of ``metrics_lake.lake_schemas``).
DEFAULT_FILE = Path(str(resources.files("metrics_lake.lake_schemas").joinpath("stored_queries.toml")))
MINUTE_S, DAY_S = 60, 86_400
_UNITS = {"m": 60, "h": 3600, "d": 86_400}
_QUERY = re.compile(
    r"^\s*FROM\s+(?P<selector>\S+)\s+SELECT\s+(?P<metric>\S+)\s+WINDOW\s+(?P<duration>\S+)"
    r"(?:\s+EVERY\s+(?P<slide>\S+))?\s+COMPUTE\s+(?P<aggregates>.+?)"
    r"(?:(?P<per_server>\s+PER\s+SERVER)|\s+BY\s+(?P<group_by>\S+))?\s*$",
    re.IGNORECASE,
)
_SIMPLE = ("count", "sum", "min", "max", "avg")
_PERCENTILE = re.compile(r"^percentile\(\s*(?P<p>[0-9]+(?:\.[0-9]+)?)\s*\)$", re.IGNORECASE)
_NAME = re.compile(r"[a-z0-9_]{1,64}")


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
    """A parsed stored query; durations in seconds; ``servers`` are names or globs (``("*",)`` = all), ``matchers``
    the label matchers of its selector, ``group_by`` the labels of ``BY`` (empty without it)."""

    name: str
    text: str
    servers: tuple[str, ...]
    metric: str
    duration_s: int
    slide_s: int
    aggregates: tuple[Aggregate, ...]
    per_server: bool
    description: str = ""
    #: The config version at which this text was defined (``metrics_lake.core.config_store``); 0 for a file's.
    revision: int = 0
    matchers: tuple[LabelMatcher, ...] = ()
    group_by: tuple[str, ...] = ()

    @property
    def selector(self) -> Selector:
        """The series the query reads."""
        return Selector(self.servers, self.matchers)

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
            f"stored query {name!r}: expected 'FROM <selector> SELECT <metric> WINDOW <duration> "
            f"[EVERY <slide>] COMPUTE <aggregates> [PER SERVER | BY <labels>]', got {text!r}"
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
    try:
        selector = parse_selector(match["selector"])
    except SelectorError as exc:
        raise StoredQueryError(f"stored query {name!r}: FROM {match['selector']}: {exc}") from None
    group_by = _group_by(name, match["group_by"])
    return StoredQuery(
        name,
        text.strip(),
        selector.servers,
        metric,
        duration,
        slide,
        aggregates,
        bool(match["per_server"]),
        description,
        matchers=selector.matchers,
        group_by=group_by,
    )


def _group_by(name: str, text: str | None) -> tuple[str, ...]:
    """The label names of a ``BY`` clause, checked; () without one."""
    if text is None:
        return ()
    labels = tuple(text.split(","))
    for label in labels:
        if label.lower() == "server":
            raise StoredQueryError(f"stored query {name!r}: group by server with PER SERVER, not BY server")
        if not LABEL_NAME.fullmatch(label):
            raise StoredQueryError(
                f"stored query {name!r}: BY {text}: {label!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"
            )
    if len(set(labels)) != len(labels):
        raise StoredQueryError(f"stored query {name!r}: BY {text} names a label twice")
    return labels


def read_toml(path: Path, error: type[Exception], what: str) -> dict:
    """The TOML document at ``path``; ``error`` saying which ``what`` (e.g. "stored queries file") is missing, a
    directory, not UTF-8 or not TOML, and where."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory; give a .toml file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text: {exc.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{what} {path}: {exc}") from None


def load_stored_queries(path: str | Path | None = None) -> list[StoredQuery]:
    """Parse every ``[[queries]]`` entry (keys ``name``, ``query``, optional ``description``) of ``path``.

    ``path`` defaults to :data:`DEFAULT_FILE`. Raises :class:`StoredQueryError`
    for a missing or malformed file, a bad query, or a duplicate name.
    """
    path = Path(path or DEFAULT_FILE)
    doc = read_toml(path, StoredQueryError, "stored queries file")
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


def query_states(windows: pa.Table, query: StoredQuery, day: dt.date) -> pa.Table:
    """Window states of ``query``'s windows ending in ``day`` (UTC), from 1-minute window rows.

    ``windows`` has the :data:`~metrics_lake.core.kernels.windows.WINDOW_STATE`
    columns of ``metric_windows_1m`` rows covering days ``day - 1`` and
    ``day``. Each minute goes to every query window that contains it (one
    for tumbling, ``WINDOW / EVERY`` for hopping); the result is keyed by
    ``metric`` = the query's *name*, ``server`` (null for the fleet-wide
    row, the only one unless ``PER SERVER``) and the query window's start, ready for
    :func:`~metrics_lake.core.kernels.windows.merge_states` and :func:`query_rows`.
    """
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    start_us = int(start.timestamp() * 1_000_000)
    end_us = start_us + DAY_S * 1_000_000
    return _states(
        windows,
        query,
        start_us - query.duration_s * 1_000_000,
        end_us,
        lambda window_start, window_end: (window_end > start_us) & (window_end <= end_us),
    )


def affected_windows(query: StoredQuery, minutes_us: np.ndarray) -> np.ndarray:
    """Starts (epoch µs, sorted, unique) of ``query``'s windows holding any of the 1-minute windows ``minutes_us``."""
    if len(minutes_us) == 0:
        return np.zeros(0, np.int64)
    slide_us = query.slide_s * 1_000_000
    first = minutes_us - np.mod(minutes_us, slide_us)
    hops = -(-query.duration_s // query.slide_s)
    starts = np.concatenate([first - k * slide_us for k in range(hops)])
    inside = starts + query.duration_s * 1_000_000 > np.tile(minutes_us, hops)
    return np.unique(starts[inside])


#: How a ``PER SERVER`` query's own 1-minute rows are handed to the window merge: ``settle(query, windows, keep)``
#: gives the rows of ``windows`` that the boolean mask ``keep`` selects, sorted by minute, or rows that merge into
#: the same per-server window states, some minutes of a window already merged into one row at the window's start
#: (their fold, in minute order: exactly what merging them again would give). :func:`sorted_rows`, or a memo that
#: keeps each window's settled minutes merged (:meth:`metrics_lake.core.speed.open_windows.OpenWindows.settled_minutes`).
ServerRows = Callable[[StoredQuery, pa.Table, pa.ChunkedArray | pa.Array], pa.Table]

#: How a query's 1-minute rows become one row per key and minute: ``merge(query, windows, keep, keyed)`` merges
#: the rows of ``windows`` that the boolean mask ``keep`` selects, after ``keyed`` (rows -> rows keyed by group or
#: fleet). :func:`merge_selected`, or a memo of it that selects only the minutes it has not merged before.
MinuteMerge = Callable[[StoredQuery, pa.Table, pa.ChunkedArray | pa.Array, Callable[[pa.Table], pa.Table]], pa.Table]


def sorted_rows(query: StoredQuery, windows: pa.Table, keep: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The rows of ``windows`` that ``keep`` selects, in minute order (stable): the :data:`ServerRows` that
    remembers nothing."""
    return windows.filter(keep).sort_by([("window_start", "ascending")])


def merge_selected(
    query: StoredQuery, windows: pa.Table, keep: pa.ChunkedArray | pa.Array, keyed: Callable[[pa.Table], pa.Table]
) -> pa.Table:
    """The rows of ``windows`` that ``keep`` selects, keyed by ``keyed`` and merged per key and minute
    (:func:`merge_minutes`): the :data:`MinuteMerge` that remembers nothing."""
    return merge_minutes(keyed(windows.filter(keep)))


def window_states(
    windows: pa.Table,
    query: StoredQuery,
    starts_us: np.ndarray,
    merge: MinuteMerge | None = None,
    settle: ServerRows | None = None,
) -> pa.Table:
    """Window states of ``query``'s windows starting at ``starts_us`` (epoch µs), like :func:`query_states`.

    ``windows`` must hold every 1-minute row of those windows (the range
    ``[min(starts), max(starts) + WINDOW)`` of the query's metric); columns
    besides :data:`WINDOW_STATE`'s are left to ``merge``. ``merge``: how the
    query's rows are keyed and merged per key and minute (a :data:`MinuteMerge`;
    default :func:`merge_selected`; the speed layer passes one that takes only
    the minutes it has not merged before, :mod:`metrics_lake.core.speed.open_windows`); ``settle``: how a
    ``PER SERVER`` query's own rows are handed over (a :data:`ServerRows`; default: as they are). The states
    returned then differ, but :func:`~metrics_lake.core.kernels.windows.merge_states` makes the same rows of them.
    """
    if len(starts_us) == 0:
        return WINDOW_STATE.empty_table()
    wanted = np.asarray(starts_us, dtype=np.int64)
    return _states(
        windows,
        query,
        *window_span(query, wanted),
        lambda window_start, window_end: np.isin(window_start, wanted),
        merge,
        settle,
    )


def window_span(query: StoredQuery, starts_us: np.ndarray) -> tuple[int, int]:
    """``[lo, hi)`` (epoch µs): the minutes that ``query``'s windows starting at ``starts_us`` (not empty) hold."""
    wanted = np.asarray(starts_us, dtype=np.int64)
    return int(wanted.min()), int(wanted.max()) + query.duration_s * 1_000_000


def _states(
    windows: pa.Table,
    query: StoredQuery,
    lo_us: int,
    hi_us: int,
    chosen,
    merge: MinuteMerge | None = None,
    settle: ServerRows | None = None,
) -> pa.Table:
    """States of the query windows that ``chosen(window_start, window_end)`` (µs arrays) keeps, from the minutes
    of ``windows`` in ``[lo_us, hi_us)``; ``merge`` and ``settle`` as for :func:`window_states`.

    Keyed by ``server``: the server (``PER SERVER``), null (the fleet), or
    for ``BY`` an injective text of the group's label values, the group's
    labels in ``labels`` (so merging keeps them); rows are in minute order,
    so a merged per-server row keeps the labels of its newest minute.
    """
    merge = merge or merge_selected
    duration_us, slide_us = query.duration_s * 1_000_000, query.slide_s * 1_000_000
    minute = pc.cast(windows.column("window_start"), pa.int64())
    keep = pc.and_(
        pc.equal(windows.column("metric"), query.metric),
        pc.and_(pc.greater_equal(minute, lo_us), pc.less(minute, hi_us)),
    )
    selected = selector_mask(query.selector, windows.column("server"), windows.column("labels"))
    if selected is not None:
        keep = pc.and_(keep, selected)
    # A key's rows of a minute keep their order whether or not the rows are sorted (a stable sort), so its sums
    # are added in the same order; a group's or the fleet's labels are the same in every row: merged rows need no
    # sort. A PER SERVER query's own rows are a source as they are: in minute order, a server keeps its newest labels.
    keyed = partial(_keyed, query)
    if query.per_server:  # it also gets the fleet row (server null), so a dashboard shows both from stored rows
        sources = [(settle or sorted_rows)(query, windows, keep), merge(query, windows, keep, keyed)]
    else:
        sources = [merge(query, windows, keep, keyed)]
    hops = -(-query.duration_s // query.slide_s)
    pieces = []
    for source in sources:
        minutes = pc.cast(source.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False)
        first = minutes - np.mod(minutes, slide_us)  # latest window start at or before the minute
        for k in range(hops):
            window_start = first - k * slide_us
            window_end = window_start + duration_us
            inside = (window_end > minutes) & chosen(window_start, window_end)
            if not inside.any():
                continue
            picked = source.filter(pa.array(inside))
            pieces.append(
                pa.table(
                    {
                        "metric": pa.array([query.name] * picked.num_rows, pa.string()),
                        "server": picked.column("server"),
                        "window_start": pa.array(window_start[inside], pa.int64()).cast(UTC_US),
                        **{name: picked.column(name) for name in ("count", "sum", "min", "max", "sketch", "labels")},
                        "minute": pa.array(minutes[inside], pa.int64()),
                    }
                )
            )
    if not pieces:
        return WINDOW_STATE.empty_table()
    states = pa.concat_tables(pieces).sort_by([("minute", "ascending")])
    return states.drop_columns(["minute"]).cast(WINDOW_STATE)


def _keyed(query: StoredQuery, rows: pa.Table) -> pa.Table:
    """``rows`` keyed for merging: by group (``server`` the group key, ``labels`` the group's labels) for a ``BY``
    query, else as the fleet (``server`` and ``labels`` null)."""
    if query.group_by:
        rows = rows.set_column(rows.schema.get_field_index("server"), "server", _group_key(rows, query.group_by))
        return rows.set_column(rows.schema.get_field_index("labels"), "labels", _group_labels(rows, query.group_by))
    n = rows.num_rows
    rows = rows.set_column(rows.schema.get_field_index("server"), "server", pa.nulls(n, pa.string()))
    return rows.set_column(rows.schema.get_field_index("labels"), "labels", pa.nulls(n, TAGS))


def merge_minutes(rows: pa.Table) -> pa.Table:
    """``rows`` (1-minute window states keyed by ``server``: a group key, or null for the fleet; other columns
    than :data:`WINDOW_STATE`'s are ignored) merged into one per key and minute, in minute order.

    A minute's state is merged once here rather than once per hopping window
    holding it: a 5-minute window every minute over 2,500 servers merged 5 x
    2,500 sketches per window, now 5 (merging is exact and associative:
    :mod:`~metrics_lake.core.kernels.windows`).
    """
    merged = merge_states(rows.select(WINDOW_STATE.names))
    return merged.sort_by([("window_start", "ascending")])


def _group_key(rows: pa.Table, group_by: tuple[str, ...]) -> pa.Array:
    """Per row, a text equal for equal values of the ``group_by`` labels and different otherwise."""
    values = [label_values(rows.column("labels"), name) for name in group_by]
    # Escaping the separator's escape and the separator makes the joined text injective.
    escaped = [pc.replace_substring(pc.replace_substring(v, "\\", "\\\\"), "\x1f", "\\x1f") for v in values]
    return pc.binary_join_element_wise(*escaped, "\x1f")


def _group_labels(rows: pa.Table, group_by: tuple[str, ...]) -> pa.Array:
    """Per row, the map of its ``group_by`` labels to their values, labels the series lacks left out."""
    n = rows.num_rows
    values = [label_values(rows.column("labels"), name).combine_chunks() for name in group_by]
    present = np.stack([pc.not_equal(v, "").to_numpy(zero_copy_only=False) for v in values], axis=1)
    entries = (np.arange(len(group_by))[None, :] * n + np.arange(n)[:, None])[present]  # row-major order
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    names = pa.array(np.array(group_by, dtype=object)[np.nonzero(present)[1]], pa.string())
    return pa.MapArray.from_arrays(pa.array(offsets), names, pa.concat_arrays(values).take(pa.array(entries)))


def query_rows(states: pa.Table, queries: list[StoredQuery], day: dt.date | None, computed_at: dt.datetime) -> pa.Table:
    """``query_results`` rows (long format) from merged states of :func:`query_states` for ``day``.

    With ``day`` None (live evaluation) each row's ``event_date`` is the day
    its window's last minute falls in.
    """
    by_name = {q.name: q for q in queries}
    row, keys, counts = sketch.explode(states.column("sketch"))
    row, keys, counts = sketch.merge_buckets(row, keys, counts)
    names = states.column("metric")
    percentiles = sorted({a.quantile for q in queries for a in q.aggregates if a.quantile is not None})
    estimates = sketch.quantiles(
        states.num_rows,
        row,
        keys,
        counts,
        percentiles,
        low=states.column("min").to_numpy(zero_copy_only=False),
        high=states.column("max").to_numpy(zero_copy_only=False),
    )
    column = {q: i for i, q in enumerate(percentiles)}
    simple = {
        "count": states.column("count").cast(pa.float64()).to_numpy(zero_copy_only=False),
        "sum": states.column("sum").to_numpy(zero_copy_only=False),
        "min": states.column("min").to_numpy(zero_copy_only=False),
        "max": states.column("max").to_numpy(zero_copy_only=False),
    }
    simple["avg"] = simple["sum"] / simple["count"]
    pieces = []
    for name in pc.unique(names).to_pylist():
        query = by_name[name]
        mask = pc.equal(names, name).to_numpy(zero_copy_only=False)
        chosen = states.filter(pa.array(mask))
        start = chosen.column("window_start")
        for aggregate in query.aggregates:
            values = (
                estimates[mask, column[aggregate.quantile]]
                if aggregate.kind == "percentile"
                else simple[aggregate.kind][mask]
            )
            n = chosen.num_rows
            pieces.append(
                pa.table(
                    {
                        "query": pa.array([name] * n, pa.string()),
                        "metric": pa.array([query.metric] * n, pa.string()),
                        "server": pa.nulls(n, pa.string()) if query.group_by else chosen.column("server"),
                        "window_start": start,
                        "window_end": pc.add(start, pa.scalar(dt.timedelta(seconds=query.duration_s))),
                        "aggregate": pa.array([aggregate.label] * n, pa.string()),
                        "value": pa.array(values, pa.float64()),
                        "labels": chosen.column("labels"),
                        "computed_at": pa.array([computed_at] * n, UTC_US),
                        "event_date": pa.array([day] * n, pa.date32())
                        if day is not None
                        else _last_minute_day(start, query.duration_s),
                    }
                )
            )
    if not pieces:
        return QUERY_RESULTS.empty_table()
    return pa.concat_tables(pieces).select(QUERY_RESULTS.names).cast(QUERY_RESULTS)


def _last_minute_day(window_start: pa.ChunkedArray | pa.Array, duration_s: int) -> pa.Array:
    """The UTC day of each window's last minute (``event_date`` of ``query_results``)."""
    last_us = pc.add(pc.cast(window_start, pa.int64()), (duration_s - MINUTE_S) * 1_000_000)
    return utc_dates(pc.cast(last_us, UTC_US))
