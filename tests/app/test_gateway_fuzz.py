"""Seeded fuzz of ``lake gateway`` (a real process, a fresh lake): 10,000 requests, then exact accounting.

Thirty-two agents, one per thread, send valid, hostile and malformed requests
(see :mod:`tests.fuzz_events` for the event shapes; requests are NDJSON,
gzip, chunked, JSON arrays, retries, reused sequences, bodies too large or
compressed bombs, truncated gzip, malformed headers and framing). Every
answer is checked against what the generator knows of its request; then the
speed layer turns the log into bronze and quarantine, and:

- every event of a request answered 200/400 is in bronze exactly once (its
  unique id is its value), every event of any other answer is nowhere;
- quarantine holds exactly the rejected lines, each with a reason;
- the gateway is alive, answered /healthz, counted exactly the accepted
  events, and its RSS stayed under 1 GiB.
"""

from __future__ import annotations

import gzip
import json
import random
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field

import pytest
import requests
from deltalake import DeltaTable
from prometheus_client.parser import text_string_to_metric_families

from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import table_uri
from tests.app.gateway_process import fan_out, running_gateway
from tests.fuzz_events import FuzzEvents, Lines

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUESTS = 10_000
THREADS = 32
AGENTS_PER_THREAD = 1
MAX_BODY = 256 * 1024
KINDS = {  # request shape -> weight
    "ndjson": 45,
    "gzip": 15,
    "chunked": 8,
    "array": 10,
    "retry": 7,
    "reuse": 4,
    "bomb": 2,
    "truncated_gzip": 2,
    "bad_header": 2,
    "bad_encoding": 1,
    "bad_length": 2,
    "anonymous": 2,
}


@dataclass
class Ledger:
    """What the lake must hold afterwards, from the answers the fuzzer checked."""

    stored: list[int] = field(default_factory=list)  # ids of valid events in requests answered 200/400
    rejected: int = 0  # rejected lines in those requests
    refused: list[int] = field(default_factory=list)  # ids of valid events in requests refused whole
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


@dataclass
class Sent:
    seq: int
    body: bytes
    headers: dict
    status: int
    answer: dict


def _expect_events(answer: requests.Response, lines: Lines, what: str, failures: list[str]) -> bool:
    """Check a 200/400 answer against the generator's accounting; True if it matched."""
    want = 400 if lines.invalid else 200
    body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
    got = (
        answer.status_code,
        body.get("accepted"),
        body.get("rejected", 0),
        [e["index"] for e in body.get("errors", [])],
    )
    expected = (want, len(lines.valid_ids), lines.invalid, lines.invalid_at)
    if got != expected:
        failures.append(
            f"{what}: got {got[:3]} (errors at {got[3][:10]}), expected {expected[:3]} ({expected[3][:10]})"
        )
        return False
    return True


def _array_body(gen: FuzzEvents, rng: random.Random) -> tuple[bytes, Lines]:
    lines = Lines()
    events = []
    for _ in range(rng.randrange(1, 20)):
        if rng.random() < 0.3:
            lines.invalid_at.append(len(events))
            events.append(gen.invalid_event())
        else:
            event, event_id = gen.valid_event()
            lines.valid_ids.append(event_id)
            events.append(event)
    return json.dumps(events, allow_nan=True).encode(), lines


def _raw_request(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def fuzz_agent(url: str, thread: int, count: int, ledger: Ledger, lock: threading.Lock) -> None:
    """Send ``count`` seeded requests as this thread's agents; record the outcome in ``ledger``."""
    current = ["before the first request"]
    try:
        _fuzz_agent(url, thread, count, ledger, lock, current)
    except Exception as exc:  # noqa: BLE001 - a failed request fails the test, with what happened
        with lock:
            ledger.failures.append(f"{current[0]}: {exc!r}")


def _fuzz_agent(url: str, thread: int, count: int, ledger: Ledger, lock: threading.Lock, current: list[str]) -> None:
    rng = random.Random(1000 + thread)
    gen = FuzzEvents(2000 + thread, first_id=thread * 10**9 + 1, heavy_share=0.01)
    session = requests.Session()
    agents = [f"fuzz-agent-{thread}-{i}" for i in range(AGENTS_PER_THREAD)]
    seqs = dict.fromkeys(agents, 0)
    sent: dict[str, list[Sent]] = {a: [] for a in agents}
    local = Ledger()
    names, weights = list(KINDS), list(KINDS.values())
    for n in range(count):
        agent = agents[n % len(agents)]
        kind = rng.choices(names, weights)[0]
        if kind in ("retry", "reuse") and not sent[agent]:
            kind = "ndjson"
        what = current[0] = f"thread {thread} request {n} ({kind})"
        headers = {"X-Producer-Id": agent}
        if kind == "retry":
            previous = rng.choice(sent[agent][-3:]) if rng.random() < 0.3 else sent[agent][-1]
            answer = session.post(f"{url}/v1/events", data=previous.body, headers=previous.headers, timeout=60)
            body = answer.json()
            if (answer.status_code, body.get("accepted")) != (previous.status, previous.answer["accepted"]) or not (
                body.get("duplicate")
            ):
                local.failures.append(f"{what}: retry answered {answer.status_code} {str(body)[:200]}")
            local.statuses[answer.status_code] += 1
            continue
        if kind == "reuse":
            previous = rng.choice(sent[agent])
            lines = gen.lines(rng.randrange(1, 10))
            answer = session.post(
                f"{url}/v1/events",
                data=lines.body(),
                headers=headers | {"X-Producer-Seq": str(previous.seq)},
                timeout=60,
            )
            if answer.status_code != 409:
                local.failures.append(f"{what}: reused sequence answered {answer.status_code} {answer.text[:200]}")
            local.refused += lines.valid_ids
            local.statuses[answer.status_code] += 1
            continue
        seqs[agent] += 1
        headers["X-Producer-Seq"] = str(seqs[agent])
        if kind == "anonymous":  # no producer headers: not idempotent, never retried
            headers = {}
        if kind == "array":
            data, lines = _array_body(gen, rng)
            headers["Content-Type"] = "application/json"
        else:
            lines = gen.lines(rng.randrange(1, 20))
            data = lines.body()
            headers["Content-Type"] = "application/x-ndjson"
        # Statuses a request refused whole may get (a body too large may be found so before another fault).
        refuse: set[int] = {413} if len(data) > MAX_BODY else set()
        if kind in ("gzip", "truncated_gzip", "bomb"):
            plain = data + (b"\n" * (MAX_BODY * 8) if kind == "bomb" else b"")
            data = gzip.compress(plain, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
            if kind == "truncated_gzip":
                data = data[: len(data) // 2]
                refuse = {400} | refuse
            if kind == "bomb":
                refuse = {413}
        if kind == "bad_header":
            headers["X-Producer-Seq"] = rng.choice(["abc", "-1", "1e3", "99999999999999999999", ""])
            refuse = {400} | ({413} if len(data) > MAX_BODY else set())
        if kind == "bad_encoding":
            headers["Content-Encoding"] = "br"
            refuse = {415} | ({413} if len(data) > MAX_BODY else set())
        if kind == "bad_length":
            length = rng.choice([b"abc", b"-1", b"1e3", b"0x10"])
            raw = _raw_request(
                url, b"POST /v1/events HTTP/1.1\r\nHost: fuzz\r\nContent-Length: " + length + b"\r\n\r\n" + data
            )
            status = int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else 0
            if status not in ({400, 413} if len(data) > MAX_BODY else {400}):
                local.failures.append(f"{what}: Content-Length {length!r} answered {raw[:100]!r}")
            local.refused += lines.valid_ids
            local.statuses[status] += 1
            continue
        if kind == "chunked":
            pieces = [data[i : i + 997] for i in range(0, len(data), 997)]
            answer = session.post(f"{url}/v1/events", data=iter(pieces), headers=headers, timeout=60)
        else:
            answer = session.post(f"{url}/v1/events", data=data, headers=headers, timeout=60)
        local.statuses[answer.status_code] += 1
        if refuse:
            if answer.status_code not in refuse:
                local.failures.append(f"{what}: expected {refuse}, got {answer.status_code} {answer.text[:200]}")
            local.refused += lines.valid_ids
            session = requests.Session()  # the gateway closed the connection
            continue
        if _expect_events(answer, lines, what, local.failures):
            local.stored += lines.valid_ids
            local.rejected += lines.invalid
            if "X-Producer-Id" in headers and (lines.valid_ids or lines.invalid):
                sent[agent].append(Sent(seqs[agent], data, headers, answer.status_code, answer.json()))
                sent[agent] = sent[agent][-20:]
    with lock:
        ledger.stored += local.stored
        ledger.rejected += local.rejected
        ledger.refused += local.refused
        ledger.statuses.update(local.statuses)
        ledger.failures += local.failures


def test_ten_thousand_hostile_requests_leave_an_exact_lake(tmp_path):
    env = {"LAKE_ROOT": str(tmp_path / "lake"), "LAKE_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY)}
    ledger, lock = Ledger(), threading.Lock()
    with running_gateway(env, "--linger-ms", "10") as gateway:
        fan_out(fuzz_agent, gateway.url, REQUESTS, THREADS, ledger, lock)
        assert gateway.alive() and requests.get(f"{gateway.url}/healthz", timeout=10).status_code == 200
        metrics = {
            s.name: s.value
            for family in text_string_to_metric_families(requests.get(f"{gateway.url}/metrics", timeout=10).text)
            for s in family.samples
        }
    print(
        f"statuses {dict(sorted(ledger.statuses.items()))}; {len(ledger.stored):,} events stored, "
        f"{ledger.rejected:,} quarantined, {len(ledger.refused):,} refused whole; "
        f"peak RSS {gateway.peak_rss / 2**20:.0f} MiB"
    )
    assert not ledger.failures, "\n".join(ledger.failures[:20])
    assert sum(ledger.statuses.values()) == REQUESTS
    assert gateway.peak_rss < 1 << 30
    assert metrics["lake_gateway_events_accepted_total"] == len(ledger.stored)
    assert metrics["lake_gateway_events_rejected_total"] == ledger.rejected

    settings = load_settings(root=str(tmp_path / "lake"))
    store = open_store(settings)
    ends = end_offsets(SegmentLog(store), settings.topic)
    assert sum(ends.values()) == len(ledger.stored) + ledger.rejected  # the log: nothing more, nothing less
    run_batch_in_process(store, settings.topic, ends, watermark_seconds=120, clock_skew_seconds=300)
    bronze = DeltaTable(table_uri(store, "bronze_events")).to_pyarrow_table(columns=["value"])
    assert sorted(bronze.column("value").to_pylist()) == sorted(float(i) for i in ledger.stored)
    assert not set(map(float, ledger.refused)) & set(bronze.column("value").to_pylist())
    quarantine = DeltaTable(table_uri(store, "quarantine_events")).to_pyarrow_table(columns=["reason", "raw"])
    assert quarantine.num_rows == ledger.rejected
    assert quarantine.column("reason").null_count == 0 and quarantine.column("raw").null_count == 0
