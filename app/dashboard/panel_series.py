"""A panel's series: the step a range is shown at, and a stored query's result rows as the API's JSON series.

:func:`choose_step` picks the finest step at which a range has at most
:data:`MAX_POINTS` points per series (the query's own step, else one of
:data:`STEPS`); :func:`series_json` turns ``query_results`` rows (or rows
evaluated at a coarser step) into the series the page draws: the fleet, and
the top servers or groups by the mean of the query's first aggregate.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.kernels.selectors import Selector, selector_mask
from metrics_lake.core.kernels.stored_queries import StoredQuery
from metrics_lake.lake_schemas.errors import RangeError

__all__ = ["MAX_POINTS", "STEPS", "choose_step", "series_json"]


#: Most points per series.
MAX_POINTS = 1500


#: Steps (seconds) a range may be shown at when the query's own step gives too many points.
STEPS = (60, 300, 900, 3600, 21_600, 86_400)


def choose_step(query: StoredQuery, seconds: int, step: int | None = None) -> int:
    """The step (seconds) for ``query`` over ``seconds``: ``step`` checked, or the finest with <= MAX_POINTS points.

    Raises :class:`RangeError` (parameter ``step``) if ``step`` is not a
    whole number of minutes at least the query's step, or gives more than
    ten times :data:`MAX_POINTS` points.
    """
    native = query.slide_s
    if step is not None:
        if step % 60 or step < native:
            raise RangeError("step", f"step must be a whole number of minutes, at least the query's {native} s")
        if seconds / step > 10 * MAX_POINTS:
            raise RangeError("step", f"step {step} s gives over {10 * MAX_POINTS} points for this range")
        return step
    for candidate in (native, *(s for s in STEPS if s > native)):
        if seconds / candidate <= MAX_POINTS:
            return candidate
    return STEPS[-1]


def series_json(rows: pa.Table, query: StoredQuery, top: int, select: Selector | None = None) -> list[dict]:
    """JSON series from result rows: the fleet (server null), and the ``top`` servers of a per-server query or
    groups of a grouped one (highest mean of the first aggregate) among those ``select`` matches."""
    if rows.num_rows == 0:
        return []
    rows = rows.sort_by([("window_start", "ascending")])
    grouped = bool(query.group_by)
    # A series is a server, a group (its labels as sorted text) or the fleet (null).
    key = (
        rows.column("server") if not grouped else pa.array([_group_name(x) for x in rows.column("labels").to_pylist()])
    )
    rows = rows.append_column("series", key)
    mine = pc.is_valid(rows.column("series"))
    if select is not None and not select.everything:
        matched = selector_mask(select, pc.fill_null(rows.column("server"), ""), rows.column("labels"))
        rows = rows.filter(pc.or_(pc.invert(mine), matched))
        mine = pc.is_valid(rows.column("series"))
    chosen: list[str | None] = [] if grouped else [None]
    if query.per_server or grouped:
        first = query.aggregates[0].label
        own = rows.filter(pc.and_(mine, pc.equal(rows.column("aggregate"), first)))
        if own.num_rows:
            means = own.group_by("series").aggregate([("value", "mean")]).sort_by([("value_mean", "descending")])
            chosen += means.column("series").to_pylist()[:top]
    out = []
    series = rows.column("series")
    for name in chosen:
        picked_rows = rows.filter(pc.is_null(series) if name is None else pc.equal(series, name))
        labels = picked_rows.column("labels")[0].as_py() if picked_rows.num_rows else None
        for aggregate in query.aggregates:
            picked = picked_rows.filter(pc.equal(picked_rows.column("aggregate"), aggregate.label))
            if picked.num_rows == 0:
                continue
            ms = (pc.cast(picked.column("window_start"), pa.int64()).to_numpy(zero_copy_only=False) // 1000).tolist()
            values = [None if v is None or v != v else v for v in picked.column("value").to_pylist()]
            out.append(
                {
                    "server": None if grouped else name,
                    "labels": dict(labels) if labels is not None else None,
                    "aggregate": aggregate.label,
                    "points": [list(p) for p in zip(ms, values, strict=True)],
                }
            )
    return out


def _group_name(labels: list[tuple[str, str]] | None) -> str:
    """A group's name in charts: ``dc=eu-west,role=web`` (``{}`` for series that lack every grouped label)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels or [])) or "{}"
