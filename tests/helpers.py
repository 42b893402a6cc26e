"""Independent computations the tests compare the pipeline against (plain Python only)."""

from __future__ import annotations

import datetime as dt
import math
import os
import sys
from collections import defaultdict
from fnmatch import fnmatch
from pathlib import Path

import pyarrow as pa

from metrics_lake.core.kernels.sketch import RELATIVE_ERROR
from metrics_lake.infra.processes import bind_error


def expected_windows(events: pa.Table) -> dict[tuple, dict]:
    """1-minute tumbling windows per (metric, server, window_start epoch ms) of valid events.

    Returns count, sum, min, max and the sorted values (for rank checks).
    """
    valid = events.filter(events.column("reason").is_null()) if "reason" in events.column_names else events
    values: dict[tuple, list[float]] = defaultdict(list)
    for row in valid.select(["ts", "server", "metric", "value"]).to_pylist():
        ms = int(row["ts"].timestamp() * 1000)
        values[(row["metric"], row["server"], ms - ms % 60_000)].append(row["value"])
    return {
        key: {"count": len(v), "sum": math.fsum(v), "min": min(v), "max": max(v), "sorted": sorted(v)}
        for key, v in values.items()
    }


def assert_quantile_within_bound(sorted_values: list[float], q: float, estimate: float) -> None:
    """The estimate of quantile ``q`` is within the sketch's relative error of the value of rank floor(q(n-1)).

    That is the guarantee of :mod:`metrics_lake.core.kernels.sketch` (DDSketch's,
    for the bucket holding that rank), checked against the exact values.
    """
    exact = sorted_values[math.floor(q * (len(sorted_values) - 1))]
    assert abs(estimate - exact) <= RELATIVE_ERROR * abs(exact) * (1 + 1e-12), (
        f"q={q}: estimate {estimate}, exact {exact} (n={len(sorted_values)}), bound ±{RELATIVE_ERROR:.4%}"
    )


def expected_query_results(events: list[dict], queries) -> dict[tuple, float | list[float]]:
    """Stored queries evaluated over ``events`` (dicts with ts in epoch ms, server, metric, value), in plain Python.

    Returns (query, server or None, window start ms, aggregate label) ->
    the exact value, or the sorted values of the window for a percentile.
    """
    values: dict[tuple, list[float]] = defaultdict(list)
    for query in queries:
        duration, slide = query.duration_s * 1000, query.slide_s * 1000
        for e in events:
            if e["metric"] != query.metric or not any(fnmatch(e["server"], s) for s in query.servers):
                continue
            first = e["ts"] - e["ts"] % slide
            for start in range(first, first - duration, -slide):
                if start + duration > e["ts"]:
                    values[(query.name, None, start)].append(e["value"])  # the fleet (every query has it)
                    if query.per_server:
                        values[(query.name, e["server"], start)].append(e["value"])
    expected = {}
    for (name, server, start), vals in values.items():
        query = next(q for q in queries if q.name == name)
        exact = {"count": len(vals), "sum": math.fsum(vals), "min": min(vals), "max": max(vals)}
        exact["avg"] = exact["sum"] / exact["count"]
        for aggregate in query.aggregates:
            key = (name, server, start, aggregate.label)
            expected[key] = sorted(vals) if aggregate.quantile is not None else exact[aggregate.kind]
    return expected


def assert_query_results(rows: list[dict], events: list[dict], queries) -> None:
    """``query_results`` rows hold exactly the windows of :func:`expected_query_results`, once each, with its values
    (count, sum, min, max, avg to 1e-12 relative; percentiles within the sketch's bound) and its window bounds."""
    got = {(r["query"], r["server"], int(r["window_start"].timestamp() * 1000), r["aggregate"]): r for r in rows}
    assert len(got) == len(rows), "a query window is stored twice"
    expected = expected_query_results(events, queries)
    assert set(got) == set(expected), (
        f"missing {sorted(set(expected) - set(got))[:3]}, extra {sorted(set(got) - set(expected))[:3]}"
    )
    for key, want in expected.items():
        row = got[key]
        duration_s = next(q for q in queries if q.name == key[0]).duration_s
        assert (row["window_end"] - row["window_start"]).total_seconds() == duration_s
        assert row["event_date"] == (row["window_end"] - dt.timedelta(minutes=1)).date()  # its last minute's day
        if isinstance(want, list):
            assert_quantile_within_bound(want, float(key[3][1:]) / 100, row["value"])
        else:
            assert math.isclose(row["value"], want, rel_tol=1e-12), (key, row["value"], want)


LAKE = str(Path(sys.executable).with_name("lake"))


def ephemeral_port_floor() -> int:
    """The lowest port the kernel hands to outgoing connections (``ip_local_port_range``; 32768 if unknown).

    A server port chosen at or above it can be taken by any client socket between the check and the bind.
    """
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(offsets: tuple[int, ...], lowest: int) -> int:
    """A base port ``b`` at or above ``lowest`` such that a server can bind every ``b + offset`` on 127.0.0.1.

    Every port stays below the ephemeral range; the start depends on the PID so that parallel runs
    rarely probe the same ports. Raises RuntimeError when no block is free.
    """
    low, high = lowest - min(offsets), ephemeral_port_floor() - max(offsets)
    span = max(high - low, 1)
    start = low + os.getpid() * 37 % span
    for base in [*range(start, high, 13), *range(low, start, 13)]:
        if all(bind_error(base + offset) is None for offset in offsets):
            return base
    raise RuntimeError(f"no free block of loopback ports {offsets} between {lowest} and {high + max(offsets)}")


def free_port_pair() -> tuple[int, int]:
    """Free S3 and master ports for SeaweedFS (volume = master - 1253, filer = master - 445, each + 10000 gRPC)."""
    service_offsets = (0, -1253, -445, 5)
    master = free_port_block((*service_offsets, *(offset + 10000 for offset in service_offsets)), lowest=10000)
    return master + 5, master


def positions(rows: pa.Table | list[dict]) -> list[tuple[str, int, int]]:
    """``(topic, partition, offset)`` of every row (a table or a list of row dicts), in row order."""
    if isinstance(rows, pa.Table):
        rows = rows.select(["topic", "partition", "offset"]).to_pylist()
    return [(r["topic"], r["partition"], r["offset"]) for r in rows]


def wait_for(condition, what: str, timeout: float = 120) -> float:
    """Poll ``condition()`` every 0.2 s until true; returns the seconds it took. Fails the test after ``timeout``."""
    import time

    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)
    return time.monotonic() - started


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 collecting what Alertmanager's webhook receiver POSTs (one JSON body each).

    :meth:`seen` lists ``(status, alertname, server)`` per alert of every
    notification, in arrival order. Use as a context manager (closes the server).
    """

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        bodies = self.bodies = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def seen(self) -> list[tuple[str, str, str | None]]:
        """``(status, alertname, server)`` of every alert of every notification so far."""
        return [
            (alert["status"], alert["labels"]["alertname"], alert["labels"].get("server"))
            for body in list(self.bodies)
            for alert in body["alerts"]
        ]

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
