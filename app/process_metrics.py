"""Prometheus gauges of a long-running lake process's own memory, for ``/metrics`` of ``lake stream`` and the gateway.

A resident size that grows says little by itself: the process may hold more
live data, or its allocators may keep memory it freed (the lake's processes
ask glibc's malloc to keep it for reuse, ``metrics_lake.core.arrow_memory``).
Beside prometheus_client's process collector (``process_resident_memory_bytes``,
open fds, CPU seconds) :func:`register_process_metrics` adds
:class:`MemoryCollector`, read at each scrape:

- ``lake_process_malloc_in_use_bytes``: glibc malloc's allocated bytes (live
  native data: pyarrow's buffers, numpy arrays, CPython's larger objects);
- ``lake_process_malloc_free_bytes``: free bytes malloc keeps in its arenas;
- ``lake_process_arrow_allocated_bytes``: pyarrow's default pool, allocated
  and not yet freed;
- ``lake_process_malloc_releases_total``: times the process gave malloc's
  free memory back to the system (after compaction rounds, and whenever its
  resident size grew ``LAKE_FREED_MEMORY_KEEP_BYTES`` above its low).

Resident size growing while the first stays flat is memory kept, not leaked;
the first growing is data held. Memory of other allocators (delta-rs's
jemalloc, CPython's small-object arenas) is in neither: it is the rest of
the resident size.
"""

from __future__ import annotations

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from metrics_lake.core.arrow_memory import memory_usage

__all__ = ["MemoryCollector", "register_process_metrics"]


class MemoryCollector:
    """A prometheus_client collector of :func:`~metrics_lake.core.arrow_memory.memory_usage` (module docstring)."""

    def collect(self):
        """The gauges and the releases counter, as ``prometheus_client`` asks for them (no malloc gauges where there is
        no ``mallinfo2``)."""
        usage = memory_usage()
        gauges = (
            (
                "lake_process_malloc_in_use_bytes",
                "Bytes allocated from glibc malloc and not freed.",
                usage.malloc_in_use,
            ),
            ("lake_process_malloc_free_bytes", "Free bytes glibc malloc keeps in its arenas.", usage.malloc_free),
            (
                "lake_process_arrow_allocated_bytes",
                "Bytes pyarrow's default memory pool has allocated and not freed.",
                usage.arrow_allocated,
            ),
        )
        for name, documentation, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(name, documentation, value=value)
        yield CounterMetricFamily(
            "lake_process_malloc_releases",
            "Times the process gave the memory glibc malloc keeps free back to the system.",
            value=usage.releases,
        )


def register_process_metrics(registry: prom.CollectorRegistry) -> None:
    """Register prometheus_client's process collector and a :class:`MemoryCollector` in ``registry``."""
    prom.ProcessCollector(registry=registry)
    registry.register(MemoryCollector())
