"""Histogram points (OTLP explicit-bucket and exponential) as samples the window sketch can take.

The lake's windows compute percentiles from individual values, so a
histogram point is stored as its *new observations* (those since the
series' previous point, see :mod:`~.temporality`), each as one event at its
bucket's representative value; ``<name>.count`` and ``<name>.sum`` are
stored beside as exact cumulative counters. Every metric view then works on
histograms unchanged: windows, rollups, stored queries' ``percentile(p)``,
the dashboard.

**Representatives and the error bound.** Expansion keeps each bucket's
count, so the value of rank ``k`` among the expanded samples is the
representative of the bucket holding the true rank-``k`` observation, and a
percentile read from the samples is off by at most the distance from that
representative to the bucket's ends:

- explicit buckets ``(b[i-1], b[i]]`` are represented by their midpoint,
  with the open ends closed by the point's ``min``/``max`` when present
  (else by the finite bound) and every bucket clipped to ``[min, max]``:
  error ≤ half the bucket's (clipped) width;
- exponential buckets at scale ``s`` (``base = 2**(2**-s)``, bucket ``i`` =
  ``(base**i, base**(i+1)]``) by ``2 * base**(i+1) / (base + 1)``, DDSketch's
  representative: relative error ≤ ``(base - 1) / (base + 1)`` (0.54 % at
  scale 6, 2.7 % at scale 3); the zero bucket by 0 (absolute error ≤ its
  threshold).

The window sketch then adds its own relative error
(:data:`metrics_lake.core.kernels.sketch.RELATIVE_ERROR`, 0.54 %) to the representative.

**Volume cap.** A point with more than :data:`MAX_SAMPLES_PER_POINT` new
observations is expanded to that many samples, each bucket's count scaled
down with the largest-remainder method: a percentile's rank then moves by at
most one bucket boundary's share (``buckets / MAX_SAMPLES_PER_POINT`` of the
ranks), and the window's ``count`` counts samples, not observations (the
exact count is ``<name>.count``).
"""

from __future__ import annotations

import math

__all__ = ["MAX_SAMPLES_PER_POINT", "HistogramError", "downsample", "explicit_representatives", "exponential_value"]

#: New observations of one histogram point stored as samples, at most (above it they are scaled down).
MAX_SAMPLES_PER_POINT = 10_000


class HistogramError(ValueError):
    """A histogram point whose buckets contradict each other (the point is quarantined as ``invalid_payload``)."""


def explicit_representatives(bounds: list[float], low: float | None, high: float | None) -> list[float]:
    """The representative of each of the ``len(bounds) + 1`` explicit buckets (module docstring).

    ``low``/``high``: the point's min and max, if it has them. Raises
    :class:`HistogramError` for bounds that are not finite and strictly increasing.
    """
    if any(not math.isfinite(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise HistogramError("explicit_bounds must be finite and strictly increasing")
    if not bounds:  # one bucket holding everything: its middle, if min and max say where that is
        if low is not None and high is not None:
            return [(low + high) / 2]
        return [low if low is not None else high if high is not None else 0.0]
    edges = [low if low is not None and low <= bounds[0] else bounds[0], *bounds]
    edges.append(high if high is not None and high >= bounds[-1] else bounds[-1])
    representatives = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        if low is not None:
            lo, hi = max(lo, low), max(hi, low)
        if high is not None:
            lo, hi = min(lo, high), min(hi, high)
        representatives.append((lo + hi) / 2)
    return representatives


def exponential_value(scale: int, index: int) -> float:
    """The representative of positive bucket ``index`` at ``scale``: ``2 * base**(index+1) / (base + 1)``.

    Raises :class:`HistogramError` when the bucket lies beyond a double's range.
    """
    if not -10 <= scale <= 20:  # OTLP's scales: 20 at most; below -10 every double is in one bucket
        raise HistogramError(f"scale {scale} is outside -10..20")
    base = 2.0 ** (2.0**-scale)
    try:
        value = 2.0 * 2.0 ** ((index + 1) * 2.0**-scale) / (base + 1.0)
    except OverflowError:
        raise HistogramError(f"bucket {index} at scale {scale} is beyond a double's range") from None
    if not math.isfinite(value) or value == 0.0:
        raise HistogramError(f"bucket {index} at scale {scale} is beyond a double's range")
    return value


def downsample(counts: list[int], cap: int = MAX_SAMPLES_PER_POINT) -> list[int]:
    """``counts`` scaled to sum to ``cap`` (largest remainder) when they sum to more; else unchanged."""
    total = sum(counts)
    if total <= cap:
        return counts
    shares = [c * cap / total for c in counts]
    scaled = [int(s) for s in shares]
    by_remainder = sorted(range(len(counts)), key=lambda i: shares[i] - scaled[i], reverse=True)
    for i in by_remainder[: cap - sum(scaled)]:
        scaled[i] += 1
    return scaled
