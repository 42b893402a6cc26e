"""Prometheus metrics of ``lake stream``: what each committed micro-batch did, served on ``--metrics-port``.

``prometheus_client`` serves them (its own HTTP server thread, text format at
``/metrics``) from a registry of their own; every counter is fed by the
stream's progress callback with a
:class:`~metrics_lake.core.speed.micro_batch.BatchOutcome`, so a replayed batch
that committed nothing counts nothing.
"""

from __future__ import annotations

import prometheus_client as prom

from metrics_lake.core.speed.micro_batch import BatchOutcome

__all__ = ["SpeedMetrics"]


class SpeedMetrics:
    """The speed layer's counters; :meth:`observe` a batch, :meth:`serve` them over HTTP."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.batches = prom.Counter("lake_stream_batches", "Committed micro-batches.", registry=self.registry)
        self.records = prom.Counter("lake_stream_records_read", "Log records read.", registry=self.registry)
        self.rows = prom.Counter("lake_stream_rows", "Rows committed per table.", ["table"], registry=self.registry)
        self.late = prom.Counter(
            "lake_stream_late_events", "Events older than the watermark (bronze only).", registry=self.registry
        )
        self.unknown = prom.Counter(
            "lake_stream_unknown_server_events",
            "Events of servers the inventory does not hold (kept, unlabelled).",
            registry=self.registry,
        )
        self.limited = prom.Counter(
            "lake_stream_cardinality_limited_events",
            "Valid events sent to quarantine for a cardinality limit, per limit.",
            ["limit"],
            registry=self.registry,
        )
        self.seconds = prom.Histogram(
            "lake_stream_batch_seconds",
            "Wall time of a micro-batch, plan to last commit (seconds).",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        for name in ("labels_per_event", "series_per_metric", "values_per_label"):
            self.limited.labels(name)  # shown at 0 before the first refusal

    def observe(self, outcome: BatchOutcome) -> None:
        """Count one committed batch."""
        self.batches.inc()
        self.records.inc(outcome.records)
        for table, count in outcome.rows.items():
            self.rows.labels(str(table)).inc(count)
        self.late.inc(outcome.late_events)
        self.unknown.inc(outcome.unknown_servers)
        for name, count in outcome.limited.items():
            self.limited.labels(name).inc(count)
        self.seconds.observe(outcome.seconds)

    def serve(self, host: str, port: int):
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns (server, thread)."""
        return prom.start_http_server(port, addr=host, registry=self.registry)
