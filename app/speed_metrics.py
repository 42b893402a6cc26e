"""Prometheus metrics of ``lake stream``: what each committed micro-batch did, served on ``--metrics-port``.

``prometheus_client`` serves them (its own HTTP server thread, text format at
``/metrics``) from a registry of their own; every counter is fed by the
stream's progress callback with a
:class:`~metrics_lake.core.speed.micro_batch.BatchOutcome`, so a replayed batch
that committed nothing counts nothing. ``lake_stream_batch_stage_seconds_total{stage}``
adds up the wall seconds of each step of the batches (``plan``, ``tasks``, each
table's commit): divided by ``lake_stream_batches_total`` over the same period it
is the step's mean seconds per batch.

For a stream that runs for months, gauges read at each scrape say whether
anything grows that should not: the process's own (``process_*``:
``process_resident_memory_bytes`` and the rest of prometheus_client's
process collector; ``lake_process_*``: what its allocators hold in use and
free, :mod:`metrics_lake.app.process_metrics`), and the lake's (:class:`LakeStateCollector`): active data
files and Delta version per speed table (``lake_table_active_files``,
``lake_table_version``) and segments per log partition
(``lake_log_segments``). Alert on them as on any other metric (e.g. files
growing for an hour while continuous compaction is on).
"""

from __future__ import annotations

import threading

import prometheus_client as prom
from prometheus_client.core import GaugeMetricFamily

from metrics_lake.app.process_metrics import register_process_metrics
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.micro_batch import BatchOutcome
from metrics_lake.core.speed.progress import POSITION_TABLES
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.core.tables.snapshots import snapshot_files
from metrics_lake.lake_schemas.errors import TopicNotFoundError

__all__ = ["LakeStateCollector", "SpeedMetrics"]


class LakeStateCollector:
    """A prometheus_client collector of the lake's size, read at each scrape (module docstring): per speed table its
    active files and version, per partition of ``topic`` its log segments."""

    def __init__(self, store: Store, topic: str) -> None:
        self.store, self.topic = store, topic
        self._tables = LatestTables()
        self._lock = threading.Lock()  # scrapes may overlap; LatestTables is not for concurrent use

    def collect(self):
        """The gauges, as ``prometheus_client`` asks for them."""
        files = GaugeMetricFamily("lake_table_active_files", "Active data files of a speed table.", labels=["table"])
        versions = GaugeMetricFamily("lake_table_version", "Delta version of a speed table.", labels=["table"])
        segments = GaugeMetricFamily(
            "lake_log_segments", "Segments of a log partition of the stream's topic.", labels=["partition"]
        )
        with self._lock:
            for name in POSITION_TABLES:
                table = self._tables.latest(self.store, name)
                files.add_metric([str(name)], len(snapshot_files(self.store, name, table)))
                versions.add_metric([str(name)], table.version())
        log = SegmentLog(self.store)
        try:
            partitions = log.partitions(self.topic)
        except TopicNotFoundError:
            partitions = 0  # no record yet
        for partition in range(partitions):
            segments.add_metric([str(partition)], len(log.index(self.topic, partition).segments))
        yield from (files, versions, segments)


class SpeedMetrics:
    """The speed layer's counters; :meth:`observe` a batch, :meth:`serve` them over HTTP. With ``store`` and
    ``topic``, also the process's and the lake's gauges (module docstring)."""

    def __init__(self, store: Store | None = None, topic: str | None = None) -> None:
        self.registry = prom.CollectorRegistry()
        register_process_metrics(self.registry)  # resident size, open fds, CPU seconds, malloc and Arrow bytes
        if store is not None and topic is not None:
            self.registry.register(LakeStateCollector(store, topic))
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
        # A counter per stage rather than a histogram: rate(stage) / rate(batches) is the stage's mean seconds per
        # batch, which is what tells an operator which step a slower stream spends its time in.
        self.stage_seconds = prom.Counter(
            "lake_stream_batch_stage_seconds",
            "Wall seconds spent in each step of the micro-batches (plan, tasks, each table's commit...).",
            ["stage"],
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
        for stage, seconds in outcome.stages.items():
            self.stage_seconds.labels(stage).inc(seconds)

    def serve(self, host: str, port: int):
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns (server, thread)."""
        return prom.start_http_server(port, addr=host, registry=self.registry)
