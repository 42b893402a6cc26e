"""Token-bucket rate limits: events per second per token or tenant, failed logins per source address.

A bucket holds up to ``burst`` units and refills at ``rate`` units per
second (the token bucket of RFC 2697's single-rate meter, and of Mimir's
per-tenant ``ingestion_rate``/``ingestion_burst_size``). :meth:`TokenBucket.take`
of ``n`` units succeeds when the bucket holds ``min(n, burst)``, so a
request larger than the burst passes when the bucket is full and leaves it
in debt (negative) for as long as its excess takes to refill; otherwise it
returns how long to wait, the ``Retry-After`` a client is told. Buckets are
thread-safe and kept per key in :class:`RateLimits`, which forgets keys idle
for long enough to have refilled.
"""

from __future__ import annotations

import threading
import time

__all__ = ["RateLimits", "TokenBucket"]


class TokenBucket:
    """``burst`` units refilled at ``rate`` units/s (module docstring); ``clock`` is in seconds (monotonic)."""

    def __init__(self, rate: float, burst: float, *, clock=time.monotonic) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a bucket needs rate > 0 and burst > 0")  # programming error
        self.rate, self.burst, self.clock = rate, burst, clock
        self.level = burst
        self.stamp = clock()
        self.lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, n: float) -> float:
        """Take ``n`` units: 0.0 if taken, else the seconds until they could be (nothing taken)."""
        with self.lock:
            self._refill()
            need = min(n, self.burst)
            if self.level >= need:
                self.level -= n
                return 0.0
            return (need - self.level) / self.rate

    def charge(self, n: float) -> None:
        """Take ``n`` units whatever the level (a debt if need be): what failed logins cost."""
        with self.lock:
            self._refill()
            self.level -= n

    def empty(self) -> float:
        """Seconds until the bucket holds one unit (0.0 if it does now); takes nothing."""
        with self.lock:
            self._refill()
            return 0.0 if self.level >= 1 else (1 - self.level) / self.rate

    def idle_full(self) -> bool:
        """Whether the bucket has refilled completely (forgetting it changes nothing)."""
        with self.lock:
            self._refill()
            return self.level >= self.burst


class RateLimits:
    """One :class:`TokenBucket` per key, created on first use with that key's ``(rate, burst)``.

    ``max_keys``: when more keys than this are held, the full (idle) buckets
    are forgotten, so a flood of source addresses cannot grow memory without
    bound. A key whose limits change gets a new bucket.
    """

    def __init__(self, *, clock=time.monotonic, max_keys: int = 100_000) -> None:
        self.clock, self.max_keys = clock, max_keys
        self.buckets: dict[str, TokenBucket] = {}
        self.lock = threading.Lock()

    def find(self, key: str) -> TokenBucket | None:
        """The bucket of ``key`` if one was made, else None (nothing is created)."""
        with self.lock:
            return self.buckets.get(key)

    def bucket(self, key: str, rate: float, burst: float) -> TokenBucket:
        """The bucket of ``key`` (a new, full one if unknown or its limits changed)."""
        with self.lock:
            bucket = self.buckets.get(key)
            if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
                if len(self.buckets) >= self.max_keys:
                    self.buckets = {k: b for k, b in self.buckets.items() if not b.idle_full()}
                bucket = self.buckets[key] = TokenBucket(rate, burst, clock=self.clock)
            return bucket
