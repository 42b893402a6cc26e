"""Data points decoded from another protocol (OTLP, remote-write, line protocol) into checked log records.

A decoder feeds a :class:`PointsBuilder` the points of one request in
order: each point names a *series* (server, metric, tags), registered once
with :meth:`PointsBuilder.series`, and carries a time (epoch ms) and a value;
what the decoder itself cannot read (a line that does not parse, a point
with no server) goes in as :meth:`PointsBuilder.reject` with a reason.
:meth:`PointsBuilder.records` then checks the points against the event
contract (:mod:`metrics_lake.lake_schemas.contract`) vectorised, per series for
the names and per point for the time range and a finite value, and returns
:data:`~metrics_lake.lake_schemas.log_records.LOG_RECORD` rows in input order. A point the
contract rejects gets the reason the JSON path would give
(:func:`~metrics_lake.lake_schemas.contract.validate_event`) and, as raw payload,
the text the decoder gave for it or else the point as a JSON object of the
contract's fields, so the quarantine shows what arrived.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.lake_schemas.contract import (
    MAX_TS_MS,
    MIN_TS_MS,
    REASON_CODES,
    metrics_ok,
    raw_text,
    servers_ok,
    validate_event,
)
from metrics_lake.lake_schemas.errors import ContractViolation
from metrics_lake.lake_schemas.log_records import LOG_RECORD
from metrics_lake.lake_schemas.types import TAGS

if TYPE_CHECKING:
    from metrics_lake.app.gateway.protocols.series_catalog import SeriesCatalog

__all__ = ["PointsBuilder", "SeriesKey", "Tags", "series_ok", "tags_array"]

#: A series' tags: (key, value) string pairs, in the order the protocol gave them.
Tags = tuple[tuple[str, str], ...]
#: A series: (server, metric, tags); a ``None`` name fails the contract's check.
SeriesKey = tuple[str | None, str | None, Tags]


class PointsBuilder:
    """The points and rejects of one request, in arrival order, turned into LOG_RECORD rows by :meth:`records`.

    Strings (servers, metrics, tags) must be valid Unicode, as protobuf's
    decoding and a strict UTF-8 decode guarantee. Not thread-safe: one
    builder per request.

    ``catalog``: a :class:`~metrics_lake.app.gateway.protocols.series_catalog.SeriesCatalog` whose ids the
    points name (:meth:`series` registers there, or a decoder looks its own keys up there): the records take
    each point's server, metric and tags from the catalog's Arrow columns instead of converting them.
    """

    def __init__(self, catalog: SeriesCatalog | None = None) -> None:
        self._catalog = catalog
        self._series: dict[SeriesKey, int] = {}
        self._series_list: list[SeriesKey] = []
        # Points added one by one, and earlier ones already in arrays (index, ts, value) by extend(), in order.
        self._index: list[int] = []
        self._ts: list[int] = []
        self._value: list[float] = []
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._chunked = 0  # points held in _chunks
        self._raw: dict[int, str] = {}
        self._rejects: list[tuple[int, str, str]] = []  # (points before it, raw, reason)

    @property
    def points(self) -> int:
        """Points added so far (rejects not counted)."""
        return self._chunked + len(self._ts)

    @property
    def rejects(self) -> int:
        """Rejects added so far by :meth:`reject`."""
        return len(self._rejects)

    def series(self, server: str | None, metric: str | None, tags: Tags) -> int:
        """The id of the series (server, metric, tags), registered on first use (in the catalog, if the builder
        has one); a ``None`` name fails the check."""
        key = (server, metric, tags)
        if self._catalog is not None:
            return self._catalog.id_of(key, _itself)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = len(self._series_list)
            self._series_list.append(key)
        return found

    def add(self, series: int, ts_ms: int, value: float, raw: str | None = None) -> None:
        """One point of ``series`` at ``ts_ms`` (epoch milliseconds); ``raw``: its original text, if it has one."""
        if raw is not None:
            self._raw[self.points] = raw
        self._index.append(series)
        self._ts.append(ts_ms)
        self._value.append(value)

    def extend(self, series: np.ndarray, ts_ms: np.ndarray, values: np.ndarray) -> None:
        """Many points at once, after those added so far: ``series`` ids (int64), times (epoch ms, int64) and
        values (float64), arrays of one length (a decoder that reads a request's samples in bulk)."""
        self._seal()
        self._chunks.append((series.astype(np.int64, copy=False), ts_ms.astype(np.int64), values.astype(np.float64)))
        self._chunked += len(ts_ms)

    def _seal(self) -> None:
        """Move the points added one by one into an array chunk, keeping their order."""
        if self._ts:
            self._chunks.append(
                (
                    np.asarray(self._index, dtype=np.int64),
                    np.asarray(self._ts, dtype=np.int64),
                    np.asarray(self._value, dtype=np.float64),
                )
            )
            self._chunked += len(self._ts)
            self._index, self._ts, self._value = [], [], []

    def reject(self, raw: str | bytes, code: str, detail: str, *, before: int | None = None) -> None:
        """Something the decoder could not turn into points: quarantined with ``"<code>: <detail>"`` and ``raw``.

        ``code`` is one of :data:`~metrics_lake.lake_schemas.contract.REASON_CODES`; ``before``: the number of
        points that precede it in the request (default: the points added so far).
        """
        if code not in REASON_CODES:
            raise ValueError(f"{code!r} is not a reason code of the contract")  # programming error
        position = self.points if before is None else before
        self._rejects.append((position, raw_text(raw), ContractViolation(code, detail).reason))

    def records(self) -> pa.Table:
        """LOG_RECORD rows of every point and reject, in the order they were added; never raises for bad points."""
        self._seal()
        if len(self._chunks) == 1:
            index, ts, value = self._chunks[0]
        elif self._chunks:
            index, ts, value = (np.concatenate(parts) for parts in zip(*self._chunks, strict=True))
        else:
            index, ts, value = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        servers, metrics, tags, names_ok = self._series_columns()
        ok = (ts >= MIN_TS_MS) & (ts < MAX_TS_MS) & np.isfinite(value)
        if len(servers):
            ok &= names_ok[index]
        kept = np.flatnonzero(ok)
        take = pa.array(index[kept])
        accepted = pa.table(
            {
                "ts": pa.array(ts[kept], pa.int64()).cast(LOG_RECORD.field("ts").type),
                "server": _contiguous(servers.take(take)),
                "metric": _contiguous(metrics.take(take)),
                "value": pa.array(value[kept], pa.float64()),
                "tags": _contiguous(tags.take(take)),
                "raw": pa.nulls(len(kept), pa.string()),
                "reason": pa.nulls(len(kept), pa.string()),
            },
            schema=LOG_RECORD,
        )
        failed = np.flatnonzero(~ok)
        if not len(failed) and not self._rejects:
            return accepted
        raws, reasons = [], []
        for i in failed.tolist():
            server, metric, point_tags = self._series_of(int(index[i]))
            event = {"ts": int(ts[i]), "server": server, "metric": metric, "value": float(value[i])}
            event["tags"] = dict(point_tags) if point_tags else None
            raws.append(self._raw.get(i) or raw_text(json.dumps(event, allow_nan=True)))
            reasons.append(_reason(event))
        for _, raw, reason in self._rejects:
            raws.append(raw)
            reasons.append(reason)
        refused = pa.table(
            {
                **{name: pa.nulls(len(raws), LOG_RECORD.field(name).type) for name in LOG_RECORD.names[:5]},
                "raw": pa.array(raws, pa.string()),
                "reason": pa.array(reasons, pa.string()),
            },
            schema=LOG_RECORD,
        )
        # Points keep their slot 2*i+1; a reject made after m points goes before point m (slot 2*m).
        slots = np.concatenate(
            [2 * kept + 1, 2 * failed + 1, np.asarray([2 * m for m, _, _ in self._rejects], np.int64)]
        )
        return pa.concat_tables([accepted, refused]).take(pa.array(np.argsort(slots, kind="stable")))

    def _series_columns(self) -> tuple[pa.Array | pa.ChunkedArray, pa.Array | pa.ChunkedArray, pa.Array, np.ndarray]:
        """Servers, metrics, tags by series id, and whether each series' names pass the contract (numpy bool)."""
        if self._catalog is not None:
            return self._catalog.columns()
        servers, metrics, tags = zip(*self._series_list, strict=True) if self._series_list else ((), (), ())
        servers, metrics = pa.array(servers, pa.string()), pa.array(metrics, pa.string())
        return servers, metrics, tags_array(tags), series_ok(servers, metrics) if len(servers) else np.zeros(0, bool)

    def _series_of(self, series_id: int) -> SeriesKey:
        """(server, metric, tags) of a series id, as Python values."""
        return self._catalog.series(series_id) if self._catalog is not None else self._series_list[series_id]


def _itself(key: SeriesKey) -> SeriesKey:
    """A series key that is its own (server, metric, tags)."""
    return key


def _contiguous(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``values`` as one array (a catalog's columns are chunked; records are built of plain arrays)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def tags_array(tags: tuple[Tags, ...]) -> pa.Array:
    """A TAGS array of one entry per series; each distinct tag set converted once (series share resource tags)."""
    distinct: dict[Tags, int] = {}
    index = [distinct.setdefault(t, len(distinct)) for t in tags]
    return pa.array([list(t) or None for t in distinct], TAGS).take(pa.array(index, pa.int32()))


def series_ok(servers: pa.Array, metrics: pa.Array) -> np.ndarray:
    """Per series: the contract's server and metric-name rules (a null name fails); numpy bool."""
    return pc.fill_null(pc.and_(servers_ok(servers), metrics_ok(metrics)), False).to_numpy(zero_copy_only=False)


def _reason(event: dict) -> str:
    """The contract's reason for rejecting ``event`` (a point that failed the vectorised check)."""
    try:
        validate_event(event)
    except ContractViolation as violation:
        return violation.reason
    raise AssertionError(f"point failed the vectorised check but passes the contract: {event!r}")
