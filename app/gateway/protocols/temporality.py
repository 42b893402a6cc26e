"""Cumulative vs delta temporality: what one gateway remembers per OTLP series so counters mean what ours do.

The lake's own agents send counters as monotonic cumulative values (since
the process or host started), and histograms are stored as their new
observations (:mod:`~.histograms`). OTLP allows both temporalities, so:

- a **delta** sum is added to a running total per series
  (:meth:`SeriesMemory.running_total`), which is stored: the counter then
  reads as a cumulative one that started when this gateway first saw the
  series (a gateway restart looks like a counter reset, as an agent restart
  does);
- a **cumulative** histogram is turned into the observations since the
  series' previous point (:meth:`SeriesMemory.new_observations`). The first
  point a gateway sees of a series is expanded whole only if the series
  started after the gateway did; otherwise it only sets the baseline (its
  observations happened earlier and belong to windows long closed). This is
  the OpenTelemetry Collector's ``cumulativetodelta`` processor's rule
  (``initial_value: auto``). A point whose start time changed or whose counts
  went down is a reset: all its observations are new.

The memory holds at most ``max_series`` series (least recently used
dropped first: a dropped cumulative histogram re-sets its baseline, a
dropped delta sum restarts from zero). It lives in the gateway process and
is per gateway: an agent should keep sending to the same gateway.
Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["Buckets", "SeriesMemory"]

#: A histogram's counts by bucket key: an explicit bucket's index, or an exponential bucket's (sign, index)
#: (sign 1 or -1; (0, 0) is the zero bucket).
Buckets = dict[Hashable, int]


class SeriesMemory:
    """Per-series running totals and previous histogram counts; see the module docstring.

    ``started_ns``: when the gateway started (epoch ns), the default now.
    """

    def __init__(self, max_series: int = 1_000_000, started_ns: int | None = None) -> None:
        self.max_series = max_series
        self.started_ns = time.time_ns() if started_ns is None else started_ns
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _remember(self, key: Hashable, entry: object) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_series:
            self._entries.popitem(last=False)

    def running_total(self, key: Hashable, delta: float) -> float:
        """Add ``delta`` to series ``key``'s running total and return the new total."""
        with self._lock:
            total = self._entries.get(key, 0.0) + delta
            self._remember(key, total)
            return total

    def new_observations(
        self, key: Hashable, start_ns: int, counts: Buckets, scale: int | None = None
    ) -> tuple[Buckets, int]:
        """(new observations by bucket, scale) of cumulative histogram point ``counts`` of series ``key``.

        ``start_ns``: the point's start time (epoch ns, 0 if unknown).
        ``scale``: an exponential histogram's scale (its buckets keyed
        ``(sign, index)``; when the scale went down, the previous counts
        are merged into the new, wider buckets first). Returns no
        observations for a first point that only sets the baseline.
        """
        with self._lock:
            previous = self._entries.get(key)
            self._remember(key, (start_ns, scale, dict(counts)))
        if previous is None:
            fresh = start_ns and start_ns >= self.started_ns
            return (dict(counts) if fresh else {}), scale
        prev_start, prev_scale, prev_counts = previous
        if prev_start != start_ns or (scale is not None and (prev_scale is None or scale > prev_scale)):
            return dict(counts), scale  # the series restarted
        if scale is not None and scale < prev_scale:
            prev_counts = _downscale(prev_counts, prev_scale - scale)
        new = {k: c - prev_counts.get(k, 0) for k, c in counts.items()}
        if any(c < 0 for c in new.values()) or any(k not in counts for k in prev_counts if prev_counts[k]):
            return dict(counts), scale  # counts went down: a reset without a new start time
        return {k: c for k, c in new.items() if c}, scale


def _downscale(counts: Buckets, shift: int) -> Buckets:
    """Exponential buckets ``(sign, index)`` merged ``shift`` scales down (index >> shift, OTLP's rule)."""
    merged: Buckets = {}
    for (sign, index), count in counts.items():
        key = (sign, index >> shift if sign else 0)
        merged[key] = merged.get(key, 0) + count
    return merged
