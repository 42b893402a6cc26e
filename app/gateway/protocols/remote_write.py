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

Decoding: protobuf's own parser (upb) decides whether a body is a
``WriteRequest``, as it always did; the samples are then taken as columns
by ``ptars``, which parses the protobuf wire format straight into Arrow
arrays (Rust), with no Python object per series or sample: the Python loop
over upb's series and samples was most of a request's decoding, which now
runs about three times as fast (``bench/protocol_decode.py``, on
docs/performance.md). A body ptars refuses although
upb reads it (a field with an unexpected wire type, which upb keeps as an
unknown field) is decoded through upb's messages, with the same result.
"""

from __future__ import annotations

import base64
import functools

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
from ptars import HandlerPool

from metrics_lake.app.gateway.protocols import Decoded
from metrics_lake.app.gateway.protocols.metric_names import ORIGINAL_NAME_TAG, metric_name
from metrics_lake.app.gateway.protocols.points import PointsBuilder, SeriesKey
from metrics_lake.app.gateway.protocols.prompb.remote_pb2 import Label, WriteRequest
from metrics_lake.app.gateway.protocols.series_catalog import RecentSeries, SeriesCatalog, joined_lists

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
            payload = bytes(cramjam.snappy.decompress_raw(body))
            request = WriteRequest.FromString(payload)
        except SnappyTooLarge:
            raise
        except (ValueError, DecodeError, cramjam.DecompressionError) as exc:
            return _unreadable(body, f"not a snappy-compressed remote-write WriteRequest: {str(exc)[:200]}")
        catalog = self.recent.catalog()
        builder = PointsBuilder(catalog)
        try:
            samples = _sample_columns(payload)
            if samples is None:
                samples = _message_samples(request)
            skipped = _points(samples, builder, catalog)
        except DecodeError as exc:  # a label that is not a Label message (or not UTF-8): the body is malformed
            return _unreadable(body, f"not a remote-write WriteRequest: a label does not decode ({str(exc)[:200]})")
        return Decoded(builder.records(), skipped)


#: A request's samples as columns: per series its encoded labels (one ``Label`` message each), samples and native
#: histograms (encoded ``Histogram`` messages), and all samples' timestamps (epoch ms, int64) and values (float64).
Samples = tuple[pa.Array, pa.Array, pa.Array, np.ndarray, np.ndarray]


@functools.cache
def _handler():
    """ptars's converter of ``WriteRequest`` bodies into Arrow (built once: it compiles the message layout)."""
    return HandlerPool([WriteRequest.DESCRIPTOR.file]).get_for_message(WriteRequest.DESCRIPTOR)


def _sample_columns(payload: bytes) -> Samples | None:
    """The columns of an uncompressed ``WriteRequest`` that upb read, parsed by ptars; ``None`` if ptars refuses it."""
    try:
        batch = _handler().list_to_record_batch([payload])
    except ValueError:
        return None
    series = batch.column(0).flatten()  # the one request's TimeSeries, a struct each
    fields = dict(zip([field.name for field in series.type], series.flatten(), strict=True))
    flat = pc.list_flatten(fields["samples"])
    return (
        fields["labels"],
        pc.list_value_length(fields["samples"]),
        fields["histograms"],
        flat.field("timestamp").to_numpy(zero_copy_only=False),
        flat.field("value").to_numpy(zero_copy_only=False),
    )


def _message_samples(request: WriteRequest) -> Samples:
    """:data:`Samples` of a request walked through upb's messages: what ptars gives, for a body it refuses."""
    series = list(request.timeseries)
    stamps = [sample.timestamp for one in series for sample in one.samples]
    values = [sample.value for one in series for sample in one.samples]
    return (
        pa.array([list(one.labels) for one in series], pa.list_(pa.binary())),
        pa.array([len(one.samples) for one in series], pa.int32()),
        pa.array([list(one.histograms) for one in series], pa.list_(pa.binary())),
        np.asarray(stamps, dtype=np.int64),
        np.asarray(values, dtype=np.float64),
    )


def _points(samples: Samples, builder: PointsBuilder, catalog: SeriesCatalog) -> int:
    """Add every sample of a request (its :data:`Samples`) to ``builder`` (on ``catalog``); return the stale
    markers skipped.

    A series' id is looked up by its encoded labels (:func:`_label_keys`), which are decoded only for a series the
    catalog lacks; stale markers are found vectorised, by their bits. Raises ``DecodeError`` for a label that is
    not a ``Label`` message.
    """
    labels, counts, histograms, ts, value = samples
    ids = catalog.ids_of(_label_keys(labels), lambda at: _series_of(tuple(labels[at].as_py())))
    counts = np.asarray(counts.to_numpy(zero_copy_only=False), dtype=np.int64)
    index = np.repeat(ids, counts)
    stale = value.view(np.uint64) == STALE_NAN_BITS
    skipped = int(stale.sum())
    if skipped:
        kept = ~stale
        index, ts, value = index[kept], ts[kept], value[kept]
    builder.extend(index, ts, value)
    with_histograms = np.flatnonzero(pc.list_value_length(histograms).to_numpy(zero_copy_only=False))
    if len(with_histograms):
        before = np.concatenate([[0], np.cumsum(counts)])  # samples before each series
        if skipped:
            before = np.concatenate([[0], np.cumsum(~stale)])[before]  # points kept before it
        for at in with_histograms.tolist():
            metric = catalog.series(int(ids[at]))[1]
            for histogram in histograms[at].as_py():
                builder.reject(
                    base64.b64encode(histogram),
                    "unsupported",
                    f"a native histogram of {metric!r}",
                    before=int(before[at + 1]),
                )
    return skipped


def _label_keys(labels: pa.Array) -> list[bytes]:
    """Per series, its encoded labels joined into one key (:func:`~.series_catalog.joined_lists`): equal exactly
    for equal label lists."""
    return joined_lists(labels).to_pylist()


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
