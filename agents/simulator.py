"""A seeded fleet simulator: realistic metric events from many fake servers.

Each (server, metric) series emits ``rate`` samples per second for
``seconds`` seconds. Shapes follow what real fleets show:

- utilisation metrics (``*.utilization``) are bounded to [0, 100]: a per-server
  base load plus a slow daily-like sine and noise, clipped;
- latencies (``*_ms``) are log-normal, the usual model for RPC latency
  (heavy right tail, strictly positive);
- counters (``*.count``, ``*_bytes``, ``*.errors``) are monotonic cumulative
  sums of Poisson increments;
- gauges (``app.queue.depth``, ``host.load.1m``) are non-negative random walks.

The same seed always yields the same events (numpy ``default_rng``), so tests
and benchmarks are reproducible. Output is an Arrow table in
:data:`metrics_lake.lake_schemas.log_records.LOG_RECORD` order by event time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.log_records import LOG_RECORD

#: (metric name, shape) in the order ``--metrics N`` takes them.
METRIC_CATALOG: list[tuple[str, str]] = [
    ("host.cpu.utilization", "bounded"),
    ("app.rpc.latency_ms", "lognormal"),
    ("app.rpc.count", "counter"),
    ("host.memory.utilization", "bounded"),
    ("app.queue.depth", "walk"),
    ("host.disk.read_bytes", "counter"),
    ("host.net.recv_bytes", "counter"),
    ("app.rpc.errors", "counter"),
    ("host.load.1m", "walk"),
    ("app.gc.pause_ms", "lognormal"),
]
REGIONS = ["eu-west-1", "us-east-1", "ap-south-1"]


def metric_names(count: int) -> list[tuple[str, str]]:
    """The first ``count`` catalog metrics; beyond the catalog, numbered gauges."""
    names = list(METRIC_CATALOG[:count])
    for i in range(len(METRIC_CATALOG), count):
        names.append((f"app.custom.gauge_{i:03d}", "walk"))
    return names


@dataclass(frozen=True)
class FleetSimulator:
    """Generate ``servers x metrics x seconds x rate`` events.

    Attributes: ``servers`` fake hosts (named ``sim-0000``...), ``metrics``
    series per host, ``seconds`` of event time, ``rate`` samples per second
    per series, ``seed`` for the RNG, ``start_ms`` first event time in epoch
    milliseconds (default: ``seconds`` before now, so data ends "now"),
    ``silence``: ``(server index, from s, to s)``, a server that sends
    nothing in that part of the run (an outage, for absence alerts).
    Raises ``ValueError`` for non-positive sizes.
    """

    servers: int = 10
    metrics: int = 5
    seconds: int = 60
    rate: float = 1.0
    seed: int = 42
    start_ms: int | None = None
    silence: tuple[int, float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("servers", "metrics", "seconds"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.rate > 0:
            raise InputError(f"rate must be > 0 samples/s, got {self.rate}")

    @property
    def total_events(self) -> int:
        """Events :meth:`generate` returns (without ``silence``: it depends on the jitter then)."""
        return self.servers * self.metrics * self._samples_per_series

    @property
    def _samples_per_series(self) -> int:
        return max(1, int(round(self.seconds * self.rate)))

    def _start(self) -> int:
        if self.start_ms is not None:
            return self.start_ms
        return int(time.time() * 1000) - self.seconds * 1000

    def generate(self) -> pa.Table:
        """All events, sorted by event time, as a :data:`LOG_RECORD` table."""
        rng = np.random.default_rng(self.seed)
        k = self._samples_per_series
        series = metric_names(self.metrics)
        s, m = self.servers, len(series)
        step_ms = 1000.0 / self.rate
        # offsets within the span: a regular grid plus per-sample jitter < 1 step
        grid = np.arange(k) * step_ms
        jitter = rng.uniform(0, step_ms * 0.9, size=(s, m, k))
        ts = self._start() + (grid[None, None, :] + jitter).astype(np.int64)
        t_sec = (ts - ts.min()) / 1000.0
        values = np.empty((s, m, k))
        for j, (_, shape) in enumerate(series):
            values[:, j, :] = _series(shape, rng, t_sec[:, j, :], s, k, self.rate)

        order = np.argsort(ts.reshape(-1), kind="stable")
        server_of = np.repeat(np.arange(s), m * k)  # server index of each sample of the (s, m, k) layout
        if self.silence is not None:  # the silent server's samples inside its outage are never sent
            server, lo, hi = self.silence
            offset_s = (ts.reshape(-1)[order] - self._start()) / 1000.0
            order = order[~((server_of[order] == server) & (offset_s >= lo) & (offset_s < hi))]
        ts_flat = ts.reshape(-1)[order]
        server_idx = server_of[order]
        metric_idx = np.broadcast_to(np.arange(m)[None, :, None], (s, m, k)).reshape(-1)[order]
        n = ts_flat.size

        server_dict = pa.array([f"sim-{i:04d}" for i in range(s)])
        metric_dict = pa.array([name for name, _ in series])
        region_dict = pa.array([REGIONS[i % len(REGIONS)] for i in range(s)])
        tags = pa.MapArray.from_arrays(
            pa.array(np.arange(n + 1, dtype=np.int32)),
            pa.array(np.full(n, "region", dtype=object), pa.string()),
            region_dict.take(pa.array(server_idx)),
        )
        null_strings = pa.nulls(n, pa.string())
        return pa.table(
            [
                pa.array(ts_flat, pa.int64()).cast(LOG_RECORD.field("ts").type),
                server_dict.take(pa.array(server_idx)),
                metric_dict.take(pa.array(metric_idx)),
                pa.array(values.reshape(-1)[order], pa.float64()),
                tags,
                null_strings,
                null_strings,
            ],
            schema=LOG_RECORD,
        )

    def second_batches(self) -> Iterator[tuple[float, pa.Table]]:
        """Yield ``(seconds since start, events of that second)`` in time order.

        Used for real-time pacing: the caller sends each slice when the wall
        clock reaches it.
        """
        table = self.generate()
        if table.num_rows == 0:
            return
        ts = table.column("ts").cast(pa.int64()).to_numpy()
        first = int(ts[0])
        bucket = (ts - first) // 1000
        bounds = np.flatnonzero(np.diff(bucket)) + 1
        starts = np.concatenate([[0], bounds])
        ends = np.concatenate([bounds, [len(ts)]])
        for lo, hi in zip(starts, ends, strict=False):
            yield float(bucket[lo]), table.slice(int(lo), int(hi - lo))


def send_in_real_time(
    simulator: FleetSimulator, send: Callable[[pa.Table], None], stop: threading.Event | None = None
) -> None:
    """Hand each second of ``simulator``'s events to ``send`` when the wall clock reaches it.

    Returns early, sending nothing more, once ``stop`` is set.
    """
    stop = stop or threading.Event()
    started = time.monotonic()
    for offset, batch in simulator.second_batches():
        if stop.wait(max(0.0, started + offset - time.monotonic())):
            return
        send(batch)


def _series(shape: str, rng: np.random.Generator, t_sec: np.ndarray, s: int, k: int, rate: float) -> np.ndarray:
    """Values for one metric across servers, shape ``(s, k)``."""
    if shape == "bounded":
        base = rng.uniform(5, 60, size=(s, 1))
        phase = rng.uniform(0, 2 * np.pi, size=(s, 1))
        wave = 15 * np.sin(2 * np.pi * t_sec / 3600.0 + phase)
        return np.clip(base + wave + rng.normal(0, 6, size=(s, k)), 0.0, 100.0)
    if shape == "lognormal":
        mu = np.log(rng.uniform(5, 40, size=(s, 1)))
        return rng.lognormal(mean=mu, sigma=0.6, size=(s, k))
    if shape == "counter":
        per_sample = rng.uniform(10, 1000, size=(s, 1)) / rate
        start = rng.integers(0, 10**6, size=(s, 1))
        return (start + np.cumsum(rng.poisson(per_sample, size=(s, k)), axis=1)).astype(np.float64)
    if shape == "walk":
        steps = rng.normal(0, 1.0, size=(s, k))
        return np.abs(rng.uniform(0, 20, size=(s, 1)) + np.cumsum(steps, axis=1))
    raise ValueError(f"unknown series shape {shape!r}")  # programming error
