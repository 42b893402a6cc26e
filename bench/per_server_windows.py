"""Benchmark: a ``PER SERVER`` stored query's evaluation through the quarter hour, its settled minutes kept merged.

The stream evaluates ``server_cpu_15m`` (``WINDOW 15m ... PER SERVER``)
again in every batch that touches its window. Each server's window state is
the merge of its minutes so far, so merging them all again costs more as
the quarter hour goes on: the 2-hour soak's batches took 0.65 s at the
start of each quarter hour and 1.05 s at its end (2,000 servers). The
driver now keeps the window's settled minutes (all but the last two) merged
per server (:meth:`metrics_lake.core.speed.open_windows.OpenWindows.settled_minutes`)
and merges only the minutes after them onto that.

This run builds ``--servers`` servers' 1-minute CPU windows for a quarter
hour (the simulator, one event per server per second), one window file per
minute, and at each minute ``k`` times what a batch of minute ``k`` does
for the query: take the window's per-server states
(:func:`~metrics_lake.core.kernels.stored_queries.window_states`) and merge
them into one row per server
(:func:`~metrics_lake.core.kernels.windows.merge_states`), ``--repeats``
batches a minute. The peer is the same evaluation merging every minute
again (the code before), in the same run; both give the same rows (checked).
Run: ``python bench/per_server_windows.py [--servers 2000] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from common import print_table

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.stored_queries import parse_query, window_span, window_states
from metrics_lake.core.kernels.windows import aggregate_events, merge_states
from metrics_lake.core.speed.open_windows import MINUTE_US, OpenWindows, minute_files
from metrics_lake.core.tables.snapshots import DataFile

QUERY = "FROM * SELECT host.cpu.utilization WINDOW 15m COMPUTE avg, max, percentile(99) PER SERVER"


def quarter_hour(servers: int) -> tuple[int, list[pa.Table]]:
    """(the quarter hour's start in epoch µs, the CPU metric's 1-minute window rows of each of its 15 minutes)."""
    start_ms = int(time.time() * 1000) // 900_000 * 900_000 - 3_600_000
    fleet = FleetSimulator(servers=servers, metrics=1, seconds=900, seed=15, start_ms=start_ms)
    events = fleet.generate()
    states = aggregate_events(events.filter(pc.is_null(events.column("reason"))), 60)
    minute = pc.cast(states.column("window_start"), pa.int64())
    start_us = start_ms * 1000
    return start_us, [states.filter(pc.equal(minute, start_us + m * MINUTE_US)) for m in range(15)]


def evaluate(query, start_us: int, minutes: list[pa.Table], kept: OpenWindows | None) -> tuple[float, pa.Table]:
    """(seconds, the window's rows merged per server) of one evaluation over ``minutes``, one file each."""
    files = [
        DataFile(f"m{m}", f"m{m}", 0, (), t.num_rows, (start_us + m * MINUTE_US,) * 2) for m, t in enumerate(minutes)
    ]
    starts = np.array([start_us], np.int64)
    rows = pa.concat_tables(minutes)
    began = time.perf_counter()
    if kept is None:
        states = window_states(rows, query, starts)
    else:
        coverage = minute_files(files, *window_span(query, starts))
        memo = partial(kept.merged_minutes, coverage=coverage), partial(kept.settled_minutes, coverage=coverage)
        states = window_states(rows, query, starts, *memo)
    merged = merge_states(states)
    return time.perf_counter() - began, merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2000, help="servers (one CPU series each)")
    parser.add_argument("--repeats", type=int, default=5, help="evaluations timed per minute of the quarter hour")
    args = parser.parse_args()
    query = parse_query("server_cpu_15m", QUERY)
    start_us, minutes = quarter_hour(args.servers)
    kept, rows = OpenWindows(), []
    for minute in range(1, 16):
        timings = {"kept": [], "anew": []}
        for _ in range(args.repeats):
            seconds, through_memo = evaluate(query, start_us, minutes[:minute], kept)
            timings["kept"].append(seconds)
            seconds, anew = evaluate(query, start_us, minutes[:minute], None)
            timings["anew"].append(seconds)
            if not through_memo.equals(anew):
                raise SystemExit(f"minute {minute}: the kept merge differs from merging anew")
        kept_ms, anew_ms = (np.median(timings[k]) * 1000 for k in ("kept", "anew"))
        rows.append((str(minute), f"{anew_ms:.1f}", f"{kept_ms:.1f}", f"{anew_ms / kept_ms:.2f}x"))
    print(f"{args.servers:,} servers, median of {args.repeats} evaluations per minute\n")
    print_table(("minutes in the window", "merging every minute ms", "settled minutes kept ms", "speed-up"), rows)


if __name__ == "__main__":
    main()
