"""Prometheus remote-read over the lake: ``POST /api/v1/read`` of ``lake dashboard``, so PromQL (and Grafana
through a Prometheus) queries the lake.

The protocol (https://prometheus.io/docs/prometheus/latest/querying/remote_read_api/,
as Thanos, Mimir, InfluxDB 1.x and VictoriaMetrics serve it): a snappy
(block format) ``prometheus.ReadRequest`` of queries, each a time range
(epoch ms, inclusive) and label matchers (``=``, ``!=``, ``=~``, ``!~``; a
regular expression matches the whole value, RE2 syntax as in Prometheus);
the answer a snappy ``ReadResponse`` with one ``QueryResult`` of time series
(labels, samples in time order) per query, the ``SAMPLES`` response type.

How the lake's rows become series:

- **names** follow Prometheus's rules: ``host.cpu.utilization`` is
  ``host_cpu_utilization``; a series that came in by remote-write under a
  name the lake had to change keeps its original (the ``original_name``
  tag, :mod:`~metrics_lake.app.gateway.protocols.metric_names`);
- **labels**: ``server``, then the series' labels as the windows keep them
  (the event's tags with the server's inventory labels over them,
  :func:`~metrics_lake.core.kernels.windows.overlay_labels`);
- **samples** come from ``bronze_events`` (every raw event) from the first
  day bronze retains (``LAKE_RETENTION_BRONZE_DAYS``) on, and from the
  1-minute windows before it: ``<name>`` is a window's ``avg`` at its start;
  ``<name>:min``, ``:max``, ``:count``, ``:p50``, ``:p95`` and ``:p99`` are
  the windows' other columns over the whole range.

Reads are pruned by day (partitions), metric (file statistics) and, for a
``server="…"`` matcher, server; other matchers filter the rows read. A
request for more than :data:`MAX_SAMPLES` samples, a malformed body or
matcher, or a query without a matcher that names metrics, is refused with a
400 whose text Prometheus shows (:class:`RemoteReadError`). Read-only: it
needs the ``analyst`` identity on S3.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from google.protobuf.message import DecodeError

from metrics_lake.app.dashboard.reader import DashboardReader, utc_days
from metrics_lake.app.gateway.protocols.metric_names import ORIGINAL_NAME_TAG, metric_name
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import (
    Label,
    LabelMatcher,
    ReadRequest,
    ReadResponse,
    Sample,
    TimeSeries,
)
from metrics_lake.core.kernels.selectors import label_values
from metrics_lake.core.kernels.windows import overlay_labels
from metrics_lake.lake_schemas.errors import RemoteReadError
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.lake_schemas.types import TAGS

__all__ = ["MAX_SAMPLES", "WINDOW_SERIES", "RemoteReader", "prometheus_name"]

#: Most samples one request may return (Prometheus's own ``remote_read_sample_limit`` is 5e7 per query).
MAX_SAMPLES = 5_000_000
#: Name suffix -> windows column of the series served from the 1-minute windows.
WINDOW_SERIES = {
    "": "avg",
    ":min": "min",
    ":max": "max",
    ":count": "count",
    ":p50": "p50",
    ":p95": "p95",
    ":p99": "p99",
}
_NAME_LABEL, _SERVER_LABEL = "__name__", "server"
_OPS = {LabelMatcher.EQ: "=", LabelMatcher.NEQ: "!=", LabelMatcher.RE: "=~", LabelMatcher.NRE: "!~"}


def prometheus_name(metric: str) -> str:
    """The Prometheus name of a lake metric: each character outside ``[a-zA-Z0-9_:]`` becomes ``_``."""
    return re.sub(r"[^a-zA-Z0-9_:]", "_", metric)


@dataclass(frozen=True)
class _Matcher:
    name: str
    op: str
    value: str

    def match_text(self, text: str) -> bool:
        return bool(self.mask(pa.array([text], pa.string()))[0].as_py())

    def mask(self, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        if self.op in ("=", "!="):
            hit = pc.equal(values, self.value)
        else:
            hit = pc.match_substring_regex(values, f"^(?:{self.value})$")
        return hit if self.op in ("=", "=~") else pc.invert(hit)


def _matchers(query) -> list[_Matcher]:
    matchers = []
    for m in query.matchers:
        op = _OPS.get(m.type)
        if op is None:
            raise RemoteReadError(f"unknown label matcher type {m.type} on {m.name!r}")
        matcher = _Matcher(m.name, op, m.value)
        try:  # RE2, the syntax Prometheus's matchers use
            matcher.match_text("")
        except pa.ArrowInvalid as exc:
            raise RemoteReadError(f"bad regular expression in {m.name}{op}{m.value!r}: {exc}") from None
        matchers.append(matcher)
    return matchers


def decode_request(body: bytes) -> ReadRequest:
    """The ``ReadRequest`` of a snappy-compressed body; :class:`RemoteReadError` if it is neither."""
    try:
        request = ReadRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))
    except (cramjam.DecompressionError, DecodeError) as exc:
        raise RemoteReadError(f"the body is not a snappy-compressed prometheus.ReadRequest: {exc}") from None
    types = list(request.accepted_response_types)
    if types and ReadRequest.SAMPLES not in types:
        raise RemoteReadError("only the SAMPLES response type is served; accept it in the request")
    return request


class RemoteReader:
    """Answers remote-read requests from the tables a :class:`DashboardReader` reads (its cache of table
    snapshots, its clock and settings)."""

    def __init__(self, reader: DashboardReader) -> None:
        self.reader = reader

    def answer(self, body: bytes) -> bytes:
        """The snappy-compressed ``ReadResponse`` to a request body; raises :class:`RemoteReadError`."""
        request = decode_request(body)
        response = ReadResponse()
        budget = [MAX_SAMPLES]
        for query in request.queries:
            result = response.results.add()
            for labels, times, values in self.series(query, budget):
                series = TimeSeries(labels=[Label(name=k, value=v).SerializeToString() for k, v in labels])
                series.samples.extend(
                    Sample(value=v, timestamp=t) for t, v in zip(times.tolist(), values.tolist(), strict=True)
                )
                result.timeseries.append(series)
        return bytes(cramjam.snappy.compress_raw(response.SerializeToString()))

    def series(self, query, budget: list[int]) -> list[tuple[list[tuple[str, str]], np.ndarray, np.ndarray]]:
        """One query's series: (sorted labels, epoch ms int64, values float64), sorted by labels."""
        matchers = _matchers(query)
        names = [m for m in matchers if m.name == _NAME_LABEL]
        if not any(m.op in ("=", "=~") and not m.match_text("") for m in names):
            raise RemoteReadError('a query needs a __name__ matcher that selects metrics, e.g. {__name__="cpu"}')
        lo, hi = query.start_timestamp_ms, query.end_timestamp_ms
        if hi < lo:
            return []
        chosen = self._chosen_metrics(_days_ms(lo, hi), names)
        server = next((m.value for m in matchers if m.name == _SERVER_LABEL and m.op == "="), None)
        cutoff = self._bronze_from_ms()
        pieces = []
        if chosen.get("") and hi >= cutoff:  # raw samples where bronze has them
            pieces.append(
                self._samples(Table.BRONZE_EVENTS, "ts", "value", "", chosen[""], max(lo, cutoff), hi, server)
            )
        for suffix, metrics in chosen.items():
            window_hi = hi if suffix else min(hi, cutoff - 1)
            if window_hi >= lo:
                column = WINDOW_SERIES[suffix]
                pieces.append(
                    self._samples(
                        Table.METRIC_WINDOWS_1M, "window_start", column, suffix, metrics, lo, window_hi, server
                    )
                )
        rows = pa.concat_tables(pieces) if pieces else _ROWS.empty_table()
        keep = None
        for matcher in matchers:
            if matcher.name == _NAME_LABEL:
                values = rows.column("name")
            elif matcher.name == _SERVER_LABEL:
                values = rows.column("server")
            else:
                values = label_values(rows.column("labels"), matcher.name)
            hit = matcher.mask(values)
            keep = hit if keep is None else pc.and_(keep, hit)
        if keep is not None:
            rows = rows.filter(keep)
        budget[0] -= rows.num_rows
        if budget[0] < 0:
            raise RemoteReadError(
                f"the request selects more than {MAX_SAMPLES:,} samples; narrow its matchers or time range"
            )
        return _group(rows)

    # -- reads --------------------------------------------------------------------------------------------------

    def _chosen_metrics(self, days: list[dt.date], names: list[_Matcher]) -> dict[str, list[str]]:
        """Per name suffix (:data:`WINDOW_SERIES`), the lake metrics (of the windows of ``days``) whose series of
        that suffix the ``__name__`` matchers may select; suffixes selecting none left out."""
        rows = self.reader.scan(Table.METRIC_WINDOWS_1M, days, ["metric"])
        known = [] if rows is None else pc.unique(rows.column("metric")).to_pylist()
        chosen = {suffix: [m for m in known if _selects(m, suffix, names)] for suffix in WINDOW_SERIES}
        return {suffix: metrics for suffix, metrics in chosen.items() if metrics}

    def _bronze_from_ms(self) -> int:
        """Epoch ms of the first whole day bronze still holds under its retention."""
        today = dt.datetime.fromtimestamp(self.reader.clock(), dt.UTC).date()
        first = today - dt.timedelta(days=self.reader.settings.retention_bronze_days - 1)
        return int(dt.datetime.combine(first, dt.time(), dt.UTC).timestamp() * 1000)

    def _samples(
        self, table: str, time: str, value: str, suffix: str, metrics: list[str], lo: int, hi: int, server: str | None
    ) -> pa.Table:
        """:data:`_ROWS` of ``metrics`` from ``table`` (bronze, or the 1-minute windows) with ``lo <= time <= hi``
        (epoch ms): ``value`` at ``time``, named with ``suffix``; bronze's labels are its tags with its
        inventory labels over them, as the windows keep them already."""
        condition = _in_range(time, lo, hi) & ds.field("metric").isin(metrics)
        if server is not None:
            condition &= ds.field("server") == server
        raw = table == Table.BRONZE_EVENTS
        columns = [time, "server", "metric", value, *(["tags"] if raw else []), "labels"]
        rows = self.reader.scan(table, _days_ms(lo, hi), columns, condition)
        if rows is None or rows.num_rows == 0:
            return _ROWS.empty_table()
        labels = overlay_labels(rows.column("tags"), rows.column("labels")) if raw else rows.column("labels")
        return pa.table(
            {
                "name": pc.binary_join_element_wise(_names(rows.column("metric"), labels), suffix, ""),
                "server": rows.column("server"),
                "labels": _without_original(labels),
                "ts": pc.cast(pc.cast(rows.column(time), pa.timestamp("ms", "UTC")), pa.int64()),
                "value": pc.cast(rows.column(value), pa.float64()),
            },
            schema=_ROWS,
        )


_ROWS = pa.schema(
    [
        pa.field("name", pa.string()),
        pa.field("server", pa.string()),
        pa.field("labels", TAGS),
        pa.field("ts", pa.int64()),
        pa.field("value", pa.float64()),
    ]
)


def _selects(metric: str, suffix: str, names: list[_Matcher]) -> bool:
    """Whether the ``__name__`` matchers may select ``metric``'s series named with ``suffix``: by its Prometheus
    name, or (a remote-written series kept under its original name) by an exact name the gateway maps to it."""
    if all(m.match_text(prometheus_name(metric) + suffix) for m in names):
        return True
    return any(
        m.op == "=" and m.value.endswith(suffix) and metric_name(m.value[: len(m.value) - len(suffix)])[0] == metric
        for m in names
    )


def _days_ms(lo_ms: int, hi_ms: int) -> list[dt.date]:
    """UTC days of the inclusive range ``[lo_ms, hi_ms]`` (epoch ms), as remote-read's ranges are."""
    return utc_days(lo_ms // 1000, hi_ms // 1000 + 1)


def _in_range(column: str, lo_ms: int, hi_ms: int) -> ds.Expression:
    """The dataset filter ``lo_ms <= column <= hi_ms`` (epoch ms) on a UTC microsecond timestamp column."""
    kind = pa.timestamp("us", "UTC")
    return (ds.field(column) >= pa.scalar(lo_ms * 1000, kind)) & (ds.field(column) <= pa.scalar(hi_ms * 1000, kind))


def _names(metrics: pa.ChunkedArray, labels: pa.ChunkedArray) -> pa.ChunkedArray:
    """Per row, the series name: the ``original_name`` tag if it has one, else :func:`prometheus_name`."""
    original = label_values(labels, ORIGINAL_NAME_TAG)
    return pc.if_else(pc.equal(original, ""), pc.replace_substring_regex(metrics, r"[^a-zA-Z0-9_:]", "_"), original)


def _without_original(labels: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Labels without the ``original_name`` tag (it is the series' name) and the reserved ``__*`` and ``server``."""
    labels = labels.combine_chunks() if isinstance(labels, pa.ChunkedArray) else labels
    labels = pa.concat_arrays([labels]) if len(labels) else labels  # unsliced: children hold exactly its entries
    keys, items = labels.keys, labels.items
    drop = pc.or_(pc.or_(pc.equal(keys, ORIGINAL_NAME_TAG), pc.equal(keys, _SERVER_LABEL)), pc.starts_with(keys, "__"))
    if not pc.any(drop).as_py():
        return labels
    keep = pc.invert(drop).to_numpy(zero_copy_only=False)
    offsets = labels.offsets.to_numpy(zero_copy_only=False)
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    new_offsets = kept_before[offsets].astype(np.int32)
    mask = pa.array(keep)
    return pa.MapArray.from_arrays(
        pa.array(new_offsets), keys.filter(mask), items.filter(mask), mask=pc.is_null(labels)
    )


def _group(rows: pa.Table) -> list[tuple[list[tuple[str, str]], np.ndarray, np.ndarray]]:
    """Rows (name, server, labels, ts, value) as series: equal name, server and labels; samples in time order."""
    if rows.num_rows == 0:
        return []
    labels = rows.column("labels").combine_chunks()
    text = pc.binary_join(
        pa.ListArray.from_arrays(labels.offsets, pc.binary_join_element_wise(labels.keys, labels.items, "\x1f")),
        "\x1e",
    )
    key = pc.binary_join_element_wise(rows.column("name"), rows.column("server"), pc.fill_null(text, ""), "\x1d")
    encoded = pc.dictionary_encode(key).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    ts = rows.column("ts").to_numpy()
    order = np.lexsort((ts, codes))
    codes, ts = codes[order], ts[order]
    values = rows.column("value").to_numpy()[order]
    bounds = np.flatnonzero(np.diff(codes)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(codes)]])
    names, servers = rows.column("name"), rows.column("server")
    out = []
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        row = int(order[lo])
        series_labels = {_NAME_LABEL: names[row].as_py(), _SERVER_LABEL: servers[row].as_py()}
        series_labels.update(dict(labels[row].as_py() or []))
        out.append((sorted(series_labels.items()), ts[lo:hi], values[lo:hi]))
    out.sort(key=lambda s: s[0])
    return out
