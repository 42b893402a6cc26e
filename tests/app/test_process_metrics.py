"""The memory gauges of ``/metrics`` (``app/process_metrics.py``): each follows what its allocator holds."""

from __future__ import annotations

import re

import numpy as np
import prometheus_client as prom
import pyarrow as pa

from metrics_lake.app.process_metrics import register_process_metrics

MIB = 2**20


def scrape() -> dict[str, float]:
    """The ``process_resident_memory_bytes`` and ``lake_process_*`` gauges of a fresh registry, read now."""
    registry = prom.CollectorRegistry()
    register_process_metrics(registry)
    text = prom.generate_latest(registry).decode()
    return {
        m[1]: float(m[2])
        for m in re.finditer(r"^(process_resident_memory_bytes|lake_process_\w+_bytes) (\S+)$", text, re.M)
    }


def test_the_gauges_follow_what_malloc_and_arrow_hold_in_use():
    before = scrape()
    assert set(before) == {
        "process_resident_memory_bytes",
        "lake_process_malloc_in_use_bytes",
        "lake_process_malloc_free_bytes",
        "lake_process_arrow_allocated_bytes",
    }
    block = np.ones(64 * MIB, dtype=np.uint8)  # numpy allocates from malloc
    buffer = pa.allocate_buffer(64 * MIB)  # from pyarrow's default pool
    during = scrape()
    assert during["lake_process_arrow_allocated_bytes"] - before["lake_process_arrow_allocated_bytes"] == 64 * MIB
    assert during["lake_process_malloc_in_use_bytes"] - before["lake_process_malloc_in_use_bytes"] >= 64 * MIB
    del block, buffer
    after = scrape()
    assert after["lake_process_arrow_allocated_bytes"] == before["lake_process_arrow_allocated_bytes"]
    assert after["lake_process_malloc_in_use_bytes"] < during["lake_process_malloc_in_use_bytes"] - 60 * MIB
