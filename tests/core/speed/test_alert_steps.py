"""Threshold rules at evaluation steps: the alerts table is a function of the log, whatever the batches.

A seeded property test: random time-ordered event streams, processed in one
batch, one batch per event and random batches, give the same transitions,
equal to a step-by-step reference evaluation written here from the rules'
definition (Prometheus's alerting state machine at every evaluation step).
"""

from __future__ import annotations

import random
import time

import pyarrow.compute as pc
import pytest

import metrics_lake.core.speed.micro_batch as speed_layer
from metrics_lake.core.kernels.alert_rules import parse_rule
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer, partition_for
from metrics_lake.core.speed.alerting import AlertOptions, forget_alert_logs
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import Table

TOPIC = "metrics"
M = 60_000  # ms
BASE_MS = int(time.time() * 1000) // M * M - 60 * M
QUERIES = [
    parse_query("cpu_max", "FROM * SELECT host.cpu WINDOW 1m COMPUTE max PER SERVER"),
    parse_query("fleet_avg", "FROM * SELECT host.cpu WINDOW 2m EVERY 1m COMPUTE avg"),
]
RULES = [
    parse_rule("hot", "cpu_max.max > 100 FOR 1m"),
    parse_rule("busy", "fleet_avg.avg >= 90"),
    parse_rule("idle", "cpu_max.max < 20 FOR 2m LABELS severity=info"),
]
WATCHED = {"hot", "busy", "idle"}


def random_stream(seed: int) -> list[dict]:
    """Events of 3 servers over about 7 minutes, in time order, with high and low stretches."""
    assert partition_for("s0", 2) == partition_for("s1", 2) != partition_for("s4", 2)
    rng = random.Random(seed)
    events, t = [], BASE_MS + rng.randrange(0, 30_000)
    level = {s: rng.choice([10.0, 50.0, 150.0]) for s in ("s0", "s1", "s4")}  # s4 goes to the other of 2 partitions
    while t < BASE_MS + 7 * M:
        server = rng.choice(sorted(level))
        if rng.random() < 0.15:
            level[server] = rng.choice([10.0, 50.0, 95.0, 150.0])
        events.append({"ts": t, "server": server, "metric": "host.cpu", "value": level[server] + rng.randrange(0, 5)})
        t += rng.choice([1_000, 5_000, 12_000, 25_000])
    return events


def run(root, events: list[dict], cuts: list[int] | None, partitions: int = 1, rng=None) -> list[tuple]:
    """The live transitions of the watched rules after processing ``events`` in batches ending at ``cuts`` (one
    partition); with ``partitions`` and ``rng`` instead, batches that advance the partitions unevenly at random
    (one partition often read to its end while another has not started)."""
    store = LocalStore(str(root))
    log = SegmentLog(store)
    with Producer(log, TOPIC, partitions=partitions) as producer:
        producer.send_payloads(events)
    ends = end_offsets(log, TOPIC)
    assert sum(ends.values()) == len(events) and all(ends.values())
    if cuts is not None:
        batches = [{0: cut} for cut in cuts]
    else:  # each batch moves one partition ahead of the others by up to 50 s of event time (the watermark is 60 s)
        times = {q: [e["ts"] for e in events if partition_for(e["server"], partitions) == q] for q in ends}
        at, batches = dict.fromkeys(ends, 0), []

        def limit(p: int) -> int:  # how far partition p may run ahead of the others' next unread event
            return min([times[q][at[q]] for q in ends if q != p and at[q] < ends[q]], default=2**62) + 50_000

        while at != ends:
            p = rng.choice([q for q in ends if at[q] < ends[q] and times[q][at[q]] <= limit(q)])
            step, most = at[p], rng.choice([1, 3, 50])
            while step < ends[p] and step - at[p] < most and times[p][step] <= limit(p):
                step += 1
            at = {**at, p: step}
            batches.append(dict(at))
    forget_alert_logs()
    for batch_ends in batches:
        speed_layer.run_batch_in_process(
            store,
            TOPIC,
            batch_ends,
            watermark_seconds=60,
            clock_skew_seconds=300,
            queries=QUERIES,
            rules=RULES,
            alerting=AlertOptions(evaluation_interval_s=60),
        )
    rows = open_table(store, Table.ALERTS).to_pyarrow_table()
    rows = rows.filter(pc.is_in(rows.column("rule"), value_set=pc.cast(list(WATCHED), "string")))
    return sorted(
        (
            r["at"].timestamp(),
            r["rule"],
            r["server"],
            r["previous_state"],
            r["state"],
            r["active_since"].timestamp(),
            r["value"],
        )
        for r in rows.to_pylist()
    )


def reference(events: list[dict]) -> list[tuple]:
    """The transitions computed step by step from the definitions, independently of the lake's code."""
    per_minute: dict[tuple[str, int], float] = {}
    for e in events:
        key = (e["server"], e["ts"] // M * M)
        per_minute[key] = max(per_minute.get(key, float("-inf")), e["value"])
    minutes = sorted({e["ts"] // M * M for e in events})
    fleet: dict[int, float] = {}  # 2-minute windows every minute, by start: the mean of their events
    for start in range(minutes[0] - M, minutes[-1] + M, M):
        inside = [e["value"] for e in events if start <= e["ts"] < start + 2 * M]
        if inside:
            fleet[start] = sum(inside) / len(inside)
    first = min(minutes[0], min(fleet))  # the oldest stored query window
    last = max(e["ts"] for e in events) // M * M
    state: dict[tuple[str, str | None], tuple[str, int]] = {}
    out = []

    def step(rule: str, series: str | None, holds: bool, value: float | None, at: int, for_ms: int) -> None:
        current = state.get((rule, series))
        if holds:
            since = at if current is None else current[1]
            due = "firing" if at - since >= for_ms else "pending"
            if current is None or current[0] != due:
                out.append(
                    (at / 1000, rule, series, "inactive" if current is None else current[0], due, since / 1000, value)
                )
                state[(rule, series)] = (due, since)
        elif current is not None:
            out.append((at / 1000, rule, series, current[0], "resolved", current[1] / 1000, value))
            del state[(rule, series)]

    for at in range(first, last + 1, M):
        for server in sorted({e["server"] for e in events}):
            value = per_minute.get((server, at - M))  # the 1-minute window that ended at this step
            step("hot", server, value is not None and value > 100, value, at, M)
            step("idle", server, value is not None and value < 20, value, at, 2 * M)
        value = fleet.get(at - 2 * M)  # the 2-minute window ending at this step
        step("busy", None, value is not None and value >= 90, value, at, 0)
    return sorted(out, key=lambda r: (r[0], r[1], r[2] or "", r[3], r[4], r[5], r[6] or 0))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_alerts_are_the_same_for_any_batching_and_equal_a_step_by_step_reference(tmp_path, seed):
    events = random_stream(seed)
    n = len(events)
    rng = random.Random(seed * 7)
    splits = {
        "one batch": [n],
        "one event per batch": list(range(1, n + 1)),
        "random": sorted({*rng.sample(range(1, n), k=min(6, n - 1)), n}),
    }
    want = sorted(reference(events))
    assert any(r[4] == "firing" for r in want) and any(r[4] == "resolved" for r in want)  # the stream exercises both
    for name, cuts in splits.items():
        got = run(tmp_path / name.replace(" ", "_"), events, cuts)
        assert got == want, name
    # Two partitions read unevenly (within the watermark, so the windows are the same): a window is only evaluated
    # once every partition's events before its end are in.
    assert run(tmp_path / "uneven", events, None, partitions=2, rng=random.Random(seed)) == want


def test_a_one_batch_catch_up_fires_an_episode_that_holds_for_its_for(tmp_path):
    """The issue's case: six minutes, one server at 150 for its last four; one batch fires, as six batches do."""
    events = [
        {"ts": BASE_MS + minute * M + s * 1000, "server": "web-1", "metric": "host.cpu", "value": value}
        for minute, value in enumerate([50.0, 50.0, 150.0, 150.0, 150.0, 150.0])
        for s in range(0, 60, 10)
    ]
    one = run(tmp_path / "one", events, [len(events)])
    six = run(tmp_path / "six", events, [6 * (i + 1) for i in range(6)])
    assert one == six
    hot = [(r[3], r[4], r[0] - BASE_MS / 1000) for r in one if r[1] == "hot"]
    assert hot == [("inactive", "pending", 180.0), ("pending", "firing", 240.0)]
