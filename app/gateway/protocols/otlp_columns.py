"""An OTLP ``ExportMetricsServiceRequest``'s metrics and number points as Arrow columns, parsed by ``ptars``.

:mod:`~metrics_lake.app.gateway.protocols.otlp` walks a request through
protobuf's messages, a Python call per metric and per point: 4.4 ms for a
request of 1,000 gauges of 2 points, three times remote-write's 1.5 ms for
the same samples (``bench/protocol_decode.py``-like loop, 2026-11-29). ptars
parses the wire format straight into Arrow arrays (Rust). Given OTLP's own
messages it builds every field of every type (1.96 ms a request), so it is
given a *trimmed* layout instead: the same field numbers, with only what a
gauge or sum point needs as fields and everything else either unknown
(skipped: resources, descriptions, units, exemplars, scopes) or kept as its
encoded bytes (a point's attributes; a histogram or summary, whose presence
is all this module reads): 0.36 ms a request. The layout, in proto3 (field
numbers as in ``opentelemetry/proto/metrics/v1/metrics.proto``)::

    message Request         { repeated ResourceMetrics resource_metrics = 1; }
    message ResourceMetrics { repeated ScopeMetrics scope_metrics = 2; }
    message ScopeMetrics    { repeated Metric metrics = 2; }
    message Metric          { string name = 1;
                              oneof data { Gauge gauge = 5; Sum sum = 7; bytes histogram = 9;
                                           bytes exponential_histogram = 10; bytes summary = 11; } }
    message Gauge           { repeated NumberDataPoint data_points = 1; }
    message Sum             { repeated NumberDataPoint data_points = 1; int32 aggregation_temporality = 2; }
    message NumberDataPoint { repeated bytes attributes = 7; fixed64 time_unix_nano = 3; uint32 flags = 8;
                              oneof value { double as_double = 4; sfixed64 as_int = 6; } }

Only the body's bytes are read here: protobuf's parser (upb) has already
accepted the body as an ``ExportMetricsServiceRequest``, and the caller
takes what is not a gauge or sum from upb's messages. Where the two parsers
may read the same bytes differently, this module says so rather than guess:
a field repeated on the wire is merged by protobuf (a singular message's
fields merged, the last of a oneof's members kept), while ptars keeps every
oneof member it saw, so a metric with more than one kind of data is
:data:`OTHER` and a point with both an ``as_double`` and an ``as_int`` has
both flags set (the caller leaves both to upb).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool
from ptars import HandlerPool

__all__ = ["GAUGE", "OTHER", "SUM", "NumberColumns", "number_columns"]

#: A metric's kind in :attr:`NumberColumns.kind`.
OTHER, GAUGE, SUM = 0, 1, 2
_PACKAGE = "metrics_lake.otlp_columns"
_F = descriptor_pb2.FieldDescriptorProto


@dataclass(frozen=True)
class NumberColumns:
    """A request's metrics (``M`` of them, in body order across resources and scopes) and the points of its gauges
    and sums (``P``, in body order).

    Per metric: ``resource_of_metric`` (int64, the index of its ``ResourceMetrics``), ``names`` (string),
    ``kind`` (int8: :data:`GAUGE`, :data:`SUM`, or :data:`OTHER` for any other data, none, or more than one
    kind on the wire), ``temporality`` (int32, a sum's ``aggregation_temporality``,
    else 0). Per point: ``metric_of_point`` (int64, ascending), ``time_unix_nano`` (uint64),
    ``as_double`` (float64) where ``has_double``, ``as_int`` (int64) where ``has_int`` (neither: the point has
    no value), ``flags`` (uint32) and ``attributes`` (list of binary: encoded ``KeyValue`` messages).
    """

    resource_of_metric: np.ndarray
    names: pa.Array
    kind: np.ndarray
    temporality: np.ndarray
    metric_of_point: np.ndarray
    time_unix_nano: np.ndarray
    as_double: np.ndarray
    has_double: np.ndarray
    as_int: np.ndarray
    has_int: np.ndarray
    flags: np.ndarray
    attributes: pa.ListArray


def _message(file: descriptor_pb2.FileDescriptorProto, name: str, fields: list[tuple], oneof: str = "") -> None:
    """Add message ``name`` with ``fields`` (name, number, type, repeated, message type or None, in the oneof)."""
    message = file.message_type.add(name=name)
    if oneof:
        message.oneof_decl.add(name=oneof)
    for field_name, number, kind, repeated, type_name, in_oneof in fields:
        label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
        field = message.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = f".{_PACKAGE}.{type_name}"
        if in_oneof:
            field.oneof_index = 0


@functools.cache
def _handler():
    """ptars's converter of request bodies into Arrow with the trimmed layout (built once: it compiles it)."""
    file = descriptor_pb2.FileDescriptorProto(name="metrics_lake_otlp_columns.proto", package=_PACKAGE)
    file.syntax = "proto3"
    message, data_bytes, points = _F.TYPE_MESSAGE, _F.TYPE_BYTES, "NumberDataPoint"
    _message(file, "Request", [("resource_metrics", 1, message, True, "ResourceMetrics", False)])
    _message(file, "ResourceMetrics", [("scope_metrics", 2, message, True, "ScopeMetrics", False)])
    _message(file, "ScopeMetrics", [("metrics", 2, message, True, "Metric", False)])
    metric = [
        ("name", 1, _F.TYPE_STRING, False, None, False),
        ("gauge", 5, message, False, "Gauge", True),
        ("sum", 7, message, False, "Sum", True),
        ("histogram", 9, data_bytes, False, None, True),
        ("exponential_histogram", 10, data_bytes, False, None, True),
        ("summary", 11, data_bytes, False, None, True),
    ]
    _message(file, "Metric", metric, oneof="data")
    _message(file, "Gauge", [("data_points", 1, message, True, points, False)])
    temporality = ("aggregation_temporality", 2, _F.TYPE_INT32, False, None, False)
    _message(file, "Sum", [("data_points", 1, message, True, points, False), temporality])
    point = [
        ("attributes", 7, data_bytes, True, None, False),
        ("time_unix_nano", 3, _F.TYPE_FIXED64, False, None, False),
        ("as_double", 4, _F.TYPE_DOUBLE, False, None, True),
        ("as_int", 6, _F.TYPE_SFIXED64, False, None, True),
        ("flags", 8, _F.TYPE_UINT32, False, None, False),
    ]
    _message(file, points, point, oneof="value")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    request = pool.FindMessageTypeByName(f"{_PACKAGE}.Request")
    return HandlerPool([request.file]).get_for_message(request)


def _fields(array: pa.Array) -> dict[str, pa.Array]:
    """A struct array's children by name, with the struct's nulls (``StructArray.flatten``)."""
    return dict(zip([field.name for field in array.type], array.flatten(), strict=True))


def _numpy(array: pa.Array, dtype) -> np.ndarray:
    """``array`` as numpy ``dtype``, nulls as 0."""
    return np.asarray(pc.fill_null(array, 0).to_numpy(zero_copy_only=False), dtype=dtype)


def _present(array: pa.Array) -> np.ndarray:
    """Whether each entry of ``array`` is set (numpy bool)."""
    return array.is_valid().to_numpy(zero_copy_only=False)


def number_columns(body: bytes) -> NumberColumns | None:
    """The :class:`NumberColumns` of a protobuf ``ExportMetricsServiceRequest`` body; ``None`` if ptars refuses it
    (a field with an unexpected wire type, which upb keeps as an unknown field: the caller walks upb's messages).
    """
    try:
        batch = _handler().list_to_record_batch([body])
    except ValueError:
        return None
    resources = _fields(batch.column(0).flatten())  # the one request's ResourceMetrics
    scope_lists = resources["scope_metrics"]
    scopes = _fields(pc.list_flatten(scope_lists))
    resource_of_scope = pc.list_parent_indices(scope_lists).to_numpy()
    metric_lists = scopes["metrics"]
    metrics = _fields(pc.list_flatten(metric_lists))
    resource_of_metric = resource_of_scope[pc.list_parent_indices(metric_lists).to_numpy()]
    gauge, total = _fields(metrics["gauge"]), _fields(metrics["sum"])
    present = [_present(metrics[name]) for name in ("gauge", "sum", "histogram", "exponential_histogram", "summary")]
    kind = np.select([present[0], present[1]], [GAUGE, SUM], OTHER).astype(np.int8)
    kind[np.sum(present, axis=0) > 1] = OTHER  # protobuf kept only the last on the wire: which, ptars cannot say
    # A metric's points are its gauge's or its sum's: both lists' points, put in metric order (stable: in body
    # order within a metric's gauge, then its sum's, which only a metric of both kinds, OTHER, has).
    lists = [points for points in (gauge["data_points"], total["data_points"]) if points.null_count < len(points)]
    lists = lists or [gauge["data_points"]]  # no gauge nor sum: no points
    owner = np.concatenate([np.zeros(0, np.int64), *(pc.list_parent_indices(points).to_numpy() for points in lists)])
    if len(lists) == 1:  # gauges only, or sums only: in order already
        points = pc.list_flatten(lists[0])
    else:
        points = pa.concat_arrays([pc.list_flatten(points) for points in lists])
        order = np.argsort(owner, kind="stable")
        points, owner = points.take(pa.array(order)), owner[order]
    point = _fields(points)
    return NumberColumns(
        resource_of_metric=resource_of_metric.astype(np.int64),
        names=metrics["name"],
        kind=kind,
        temporality=_numpy(total["aggregation_temporality"], np.int32),
        metric_of_point=owner.astype(np.int64),
        time_unix_nano=_numpy(point["time_unix_nano"], np.uint64),
        as_double=_numpy(point["as_double"], np.float64),
        has_double=_present(point["as_double"]),
        as_int=_numpy(point["as_int"], np.int64),
        has_int=_present(point["as_int"]),
        flags=_numpy(point["flags"], np.uint32),
        attributes=point["attributes"],
    )
