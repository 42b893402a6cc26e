"""Decoders for the protocols real agents speak, each body into log records like the gateway's JSON path.

- :mod:`~.otlp`: OTLP/HTTP metrics (``POST /v1/metrics``), protobuf or JSON;
- :mod:`~.remote_write`: Prometheus remote-write 1.0 (``POST /api/v1/write``; ``prompb/`` holds its protobuf);
- :mod:`~.influx`: InfluxDB line protocol (``POST /api/v2/write``, ``/write``);
- what they share: :mod:`~.points` (points into checked log records), :mod:`~.metric_names`
  (one naming rule), :mod:`~.histograms` (histogram points as samples), :mod:`~.temporality`
  (cumulative vs delta OTLP series).

Every decoder returns a :class:`Decoded`: :data:`~metrics_lake.lake_schemas.log_records.LOG_RECORD`
rows built with :class:`~metrics_lake.app.gateway.protocols.points.PointsBuilder` (so the
same contract check, reasons and quarantine as JSON events), and the count of
points skipped on purpose (Prometheus stale markers, OTLP points flagged
"no recorded value", the first point of a cumulative histogram that only
sets the baseline). Metric names go through the one naming rule of
:mod:`metrics_lake.app.gateway.protocols.metric_names`. Nothing a client sends makes a
decoder raise: a body it cannot read is one ``invalid_payload`` reject
holding the body (base64 if binary).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

__all__ = ["Decoded"]


@dataclass(frozen=True)
class Decoded:
    """What a request body decoded to: ``records`` (LOG_RECORD, body order), ``skipped`` points (not stored),
    and why the body as a whole could not be read (``unreadable``; it is then one ``invalid_payload`` record)."""

    records: pa.Table
    skipped: int = 0
    unreadable: str | None = None

    @property
    def rejected(self) -> int:
        """Records that carry a reason (they go to quarantine)."""
        return self.records.num_rows - self.records.column("reason").null_count
