"""Prometheus remote-write 1.0: a snappy-compressed ``WriteRequest`` into log records.

Per the specification (https://prometheus.io/docs/specs/prw/remote_write_spec/):
the body is a protobuf ``prometheus.WriteRequest`` (messages in
``prompb/remote.proto``, generated code beside it) compressed with snappy's
*block* format (not framed), decompressed with ``cramjam``. Per time series:

- **metric**: the ``__name__`` label through
  :mod:`metrics_lake.app.gateway.protocols.metric_names` (``job:rate5m:sum`` becomes
  ``job_rate5m_sum`` with the original in the tag ``original_name``);
- **server**: the ``instance`` label (none: quarantined as
  ``missing_field: server``);
- **tags**: every other label, ``instance`` and ``job`` included (lossless);
- each sample: one event at its timestamp (epoch ms) with its value.

Stale markers (the NaN with bits ``0x7ff0000000000002`` Prometheus writes
when a series disappears) are counted and skipped; any other NaN or
infinity is quarantined as ``non_finite_value``, as in the JSON path.
Native histograms are quarantined as ``unsupported`` (their message kept,
base64); exemplars and metadata are not stored. A body that is not snappy
or not a ``WriteRequest`` is one ``invalid_payload`` reject holding it
(base64). Classic histograms and summaries arrive as ordinary series
(``_bucket`` with an ``le`` tag, ``_count``, ``_sum``, ``quantile``).
"""

from __future__ import annotations

import base64

import cramjam
import numpy as np
from google.protobuf.message import DecodeError

from metrics_lake.app.gateway.protocols import Decoded
from metrics_lake.app.gateway.protocols.metric_names import ORIGINAL_NAME_TAG, metric_name
from metrics_lake.app.gateway.protocols.points import PointsBuilder, SeriesKey
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest
from metrics_lake.app.gateway.protocols.series_catalog import RecentSeries, SeriesCatalog

__all__ = ["SnappyError", "SnappyTooLarge", "decode", "snappy_length"]

#: The bits of Prometheus's stale marker (``value.StaleNaN`` in prometheus/model).
STALE_NAN_BITS = 0x7FF0000000000002


class SnappyError(ValueError):
    """The body is not a snappy block (no length preamble): the body is answered as unreadable."""


class SnappyTooLarge(SnappyError):
    """The body's declared uncompressed length is over the limit (answered 413 before decompressing)."""


def snappy_length(body: bytes) -> int:
    """The uncompressed length a snappy block declares (its leading varint); :class:`SnappyError` if there is none."""
    length, shift = 0, 0
    for i, byte in enumerate(body[:10]):
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return length
        shift += 7
        if i == 4:  # snappy's preamble is at most 5 bytes (lengths below 2**32)
            break
    raise SnappyError("no snappy length preamble")


class Decoder:
    """Decodes remote-write bodies, keeping the series of recent requests in a
    :class:`~metrics_lake.app.gateway.protocols.series_catalog.SeriesCatalog` keyed by their encoded labels
    (:class:`~metrics_lake.app.gateway.protocols.series_catalog.RecentSeries`); thread-safe."""

    def __init__(self, recent: RecentSeries | None = None) -> None:
        self.recent = recent or RecentSeries()

    def decode(self, body: bytes, limit: int) -> Decoded:
        """Log records of one remote-write body (module docstring); never raises for bad input except
        :class:`SnappyTooLarge` when it would inflate past ``limit`` bytes."""
        try:
            if snappy_length(body) > limit:
                raise SnappyTooLarge(f"body declares {snappy_length(body):,} bytes uncompressed, over {limit:,}")
            request = WriteRequest.FromString(bytes(cramjam.snappy.decompress_raw(body)))
        except SnappyTooLarge:
            raise
        except (ValueError, DecodeError, cramjam.DecompressionError) as exc:
            return _unreadable(body, f"not a snappy-compressed remote-write WriteRequest: {str(exc)[:200]}")
        catalog = self.recent.catalog()
        builder = PointsBuilder(catalog)
        try:
            skipped = _points(request, builder, catalog)
        except DecodeError as exc:  # a label that is not a Label message (or not UTF-8): the body is malformed
            return _unreadable(body, f"not a remote-write WriteRequest: a label does not decode ({str(exc)[:200]})")
        return Decoded(builder.records(), skipped)


def _points(request: WriteRequest, builder: PointsBuilder, catalog: SeriesCatalog) -> int:
    """Add every sample of ``request`` to ``builder`` (on ``catalog``); return the stale markers skipped.

    Samples are collected in plain lists and handed over as arrays once
    (:meth:`PointsBuilder.extend`); a series' id is looked up by its encoded
    labels, which are decoded only for a series the catalog lacks; stale
    markers are found vectorised, by their bits. Raises ``DecodeError`` for
    a label that is not a ``Label`` message.
    """
    series_ids, stamps, values = [], [], []
    id_of, add_id, add_stamp, add_value = catalog.id_of, series_ids.append, stamps.append, values.append
    histograms = []  # (samples before it, the histogram's bytes, its series id)
    for series in request.timeseries:
        sid = id_of(tuple(series.labels), _series_of)
        for sample in series.samples:
            add_id(sid)
            add_stamp(sample.timestamp)
            add_value(sample.value)
        if series.histograms:
            histograms += [(len(stamps), bytes(h), sid) for h in series.histograms]
    value = np.asarray(values, dtype=np.float64)
    stale = value.view(np.uint64) == STALE_NAN_BITS
    index = np.asarray(series_ids, dtype=np.int64)
    ts = np.asarray(stamps, dtype=np.int64)
    skipped = int(stale.sum())
    if skipped:
        kept = ~stale
        index, ts, value = index[kept], ts[kept], value[kept]
        before = np.concatenate([[0], np.cumsum(kept)])  # points kept before each original position
    builder.extend(index, ts, value)
    for position, histogram, sid in histograms:
        at = int(before[position]) if skipped else position
        metric = catalog.series(sid)[1]
        builder.reject(base64.b64encode(histogram), "unsupported", f"a native histogram of {metric!r}", before=at)
    return skipped


def _unreadable(body: bytes, detail: str) -> Decoded:
    """A body that does not decode: one ``invalid_payload`` reject holding it (base64)."""
    builder = PointsBuilder()
    builder.reject(base64.b64encode(body), "invalid_payload", detail)
    return Decoded(builder.records(), unreadable=detail)


def _series_of(encoded: tuple[bytes, ...]) -> SeriesKey:
    """(server, metric, tags) of a series' encoded ``Label`` messages; a ``DecodeError`` if one is not."""
    labels = tuple((label.name, label.value) for label in map(Label.FromString, encoded))
    named = dict(labels)
    metric, original = metric_name(named.get("__name__", ""))
    tags = [(k, v) for k, v in labels if k != "__name__"]
    if original is not None:
        tags.append((ORIGINAL_NAME_TAG, original))
    return named.get("instance") or None, metric, tuple(tags)


def decode(body: bytes, limit: int) -> Decoded:
    """:meth:`Decoder.decode` without a shared series cache (tests, benchmarks)."""
    return Decoder().decode(body, limit)
