"""The gateway's front door, case by case (issue 12): framing, limits, timeouts, poison events, reused sequences."""

from __future__ import annotations

import gzip
import json
import socket
import time

import pytest
import requests

from metrics_lake.agents.gateway_client import DEAD_LETTER_DIR, GatewaySender
from metrics_lake.core.log.producer import partition_for
from metrics_lake.lake_schemas.contract import MAX_RAW_BYTES
from tests.app.test_gateway import EVENT, log_rows


def events_of(*servers: str, start: float = 0.0) -> list[dict]:
    """One valid event per server, values start, start + 1, ..."""
    return [dict(EVENT, server=server, value=start + i) for i, server in enumerate(servers)]


def ndjson(events: list) -> bytes:
    return ("\n".join(e if isinstance(e, str) else json.dumps(e) for e in events) + "\n").encode()


def stored(tmp_path) -> list[dict]:
    return [row for table in log_rows(tmp_path) for row in table.to_pylist()]


def raw_exchange(url: str, request: bytes, *, wait: float = 10, half_close: bool = False) -> tuple[bytes, bool]:
    """Send raw bytes (then shut the write side if ``half_close``); the answer read until the server closes or
    ``wait`` s pass, and whether it closed."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, False
        return answer, True


def test_a_chunked_body_is_read(start_gateway, tmp_path):
    url, _ = start_gateway()
    body = ndjson(events_of(*(f"web-{i}" for i in range(30))))
    pieces = iter([body[i : i + 100] for i in range(0, len(body), 100)])  # requests sends a generator chunked
    answer = requests.post(f"{url}/v1/events", data=pieces, headers={"Content-Type": "application/x-ndjson"})
    assert (answer.status_code, answer.json()) == (200, {"accepted": 30})
    assert sorted(r["value"] for r in stored(tmp_path)) == [float(i) for i in range(30)]


@pytest.mark.parametrize("length", [b"abc", b"1e3", b"-1", b"0x10", b"99999999999999999999999"])
def test_a_malformed_content_length_is_400_and_the_connection_closed(start_gateway, tmp_path, length):
    url, _ = start_gateway()
    body = ndjson(events_of("web-1"))
    answer, closed = raw_exchange(
        url, b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Length: " + length + b"\r\n\r\n" + body
    )
    assert answer.startswith(b"HTTP/1.1 400 ") and closed
    assert stored(tmp_path) == []


def test_a_client_still_sending_after_a_malformed_header_reads_the_400_not_a_reset(start_gateway, tmp_path):
    url, _ = start_gateway()
    body = ndjson(events_of(*(f"web-{i}" for i in range(20_000))))  # megabytes the server never asked for
    for _ in range(5):  # a reset is a race; without the lingering close it shows in most tries
        answer, closed = raw_exchange(url, b"POST /v1/events HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n" + body)
        assert answer.startswith(b"HTTP/1.1 400 ") and closed
    assert stored(tmp_path) == []


@pytest.mark.parametrize("sent", [0, 1, 500])
def test_a_body_cut_short_by_a_half_close_is_answered_400_and_stores_nothing(start_gateway, tmp_path, sent):
    url, _ = start_gateway()
    body = ndjson(events_of("web-1", "web-2"))
    head = b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (len(body) + 1000)
    answer, closed = raw_exchange(url, head + body[:sent], half_close=True)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"ended before its Content-Length" in answer and closed
    assert stored(tmp_path) == []


def test_a_body_over_the_limit_is_413_before_it_is_read(start_gateway, tmp_path):
    url, _ = start_gateway(gateway_max_body_bytes=4096)
    head = b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000\r\n\r\n"
    answer, closed = raw_exchange(url, head)  # the 100 MB body is never sent: the answer must not wait for it
    assert answer.startswith(b"HTTP/1.1 413 ") and closed
    chunked = requests.post(f"{url}/v1/events", data=iter([b"x" * 1000] * 10))  # no Content-Length to check
    assert chunked.status_code == 413
    assert stored(tmp_path) == []


def test_a_compressed_bomb_is_refused_at_the_limit_without_inflating_it(start_gateway, tmp_path):
    url, gateway = start_gateway(gateway_max_body_bytes=1 << 20)
    bomb = gzip.compress(ndjson(events_of("web-1")) + b" " * (40 << 20))  # about 40 KB, 40 MB inflated
    assert len(bomb) < 100_000
    answer = requests.post(f"{url}/v1/events", data=bomb, headers={"Content-Encoding": "gzip"}, timeout=30)
    assert answer.status_code == 413 and "decompressed" in answer.json()["error"]
    assert stored(tmp_path) == []
    assert requests.post(f"{url}/v1/events", json=events_of("web-2"), timeout=10).status_code == 200  # still serving


def test_a_truncated_or_corrupt_gzip_body_is_400_and_stores_nothing(start_gateway, tmp_path):
    url, _ = start_gateway()
    body = gzip.compress(ndjson(events_of(*(f"web-{i}" for i in range(100)))))
    for data in (body[: len(body) // 2], b"\x1f\x8b" + b"garbage" * 10):
        answer = requests.post(f"{url}/v1/events", data=data, headers={"Content-Encoding": "gzip"}, timeout=10)
        assert answer.status_code == 400 and "compressed" in answer.json()["error"]
    unknown = requests.post(f"{url}/v1/events", data=body, headers={"Content-Encoding": "br"}, timeout=10)
    assert unknown.status_code == 415
    assert stored(tmp_path) == []


@pytest.mark.parametrize("seq", ["abc", "-1", "1e3", "", "99999999999999999999"])
def test_a_malformed_producer_sequence_is_400(start_gateway, tmp_path, seq):
    url, _ = start_gateway()
    headers = {"X-Producer-Id": "agent-1", "X-Producer-Seq": seq}
    answer = requests.post(f"{url}/v1/events", json=events_of("web-1"), headers=headers, timeout=10)
    assert answer.status_code == 400 and "X-Producer-Seq" in answer.json()["error"]
    assert stored(tmp_path) == []


def test_a_reused_sequence_with_another_body_is_409_and_stores_nothing(start_gateway, tmp_path):
    url, _ = start_gateway()
    # Servers in every partition, so the second body can route where the first never went.
    by_partition = {}
    for i in range(200):
        by_partition.setdefault(partition_for(f"host-{i}", 4), f"host-{i}")
    first, other = by_partition[0], [by_partition[p] for p in (1, 2, 3)]
    post = lambda events, seq: requests.post(  # noqa: E731
        f"{url}/v1/events", json=events, headers={"X-Producer-Id": "agent-1", "X-Producer-Seq": str(seq)}, timeout=10
    )
    assert post(events_of(first), 1).status_code == 200
    assert post(events_of(first, start=10), 2).status_code == 200
    for seq in (2, 1):  # the newest sequence, and an older one
        conflict = post(events_of(*other, start=100), seq)
        assert conflict.status_code == 409 and "reused sequence" in conflict.json()["error"]
    retry = post(events_of(first, start=10), 2)  # the same body again is a retry, not a conflict
    assert (retry.status_code, retry.json()) == (200, {"accepted": 1, "duplicate": True})
    assert sorted(r["value"] for r in stored(tmp_path)) == [0.0, 10.0]


def test_an_unverifiable_old_sequence_is_409(start_gateway, tmp_path):
    url, gateway = start_gateway()
    headers = {"X-Producer-Id": "agent-1"}
    for seq in (5, 6):
        answer = requests.post(
            f"{url}/v1/events", json=events_of("web-1", start=seq), headers=headers | {"X-Producer-Seq": str(seq)}
        )
        assert answer.status_code == 200
    gateway.producer._history.clear()  # as after a restart: the log knows only each partition's newest batch
    old = requests.post(f"{url}/v1/events", json=events_of("web-1", start=5), headers=headers | {"X-Producer-Seq": "5"})
    assert old.status_code == 409 and "cannot be checked" in old.json()["error"]
    assert sorted(r["value"] for r in stored(tmp_path)) == [5.0, 6.0]


def test_poison_events_are_per_event_400s_never_503(start_gateway, tmp_path):
    url, _ = start_gateway()
    poison = [
        '{"ts": 1800000000000, "server": "s\\ud800", "metric": "m", "value": 1}',
        '{"ts": 1800000000000, "server": "s", "metric": "m", "value": ' + "9" * 400 + "}",
        '{"ts": 1800000000000, "server": "s", "metric": "m", "value": ' + "9" * 5001 + "}",
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        "null",
    ]
    lines = [json.dumps(EVENT), *poison, json.dumps(dict(EVENT, value=2.0))]
    answer = requests.post(f"{url}/v1/events", data=ndjson(lines), timeout=30)
    assert answer.status_code == 400
    body = answer.json()
    assert (body["accepted"], body["rejected"]) == (2, 5)
    assert [(e["index"], e["reason"].split(":")[0]) for e in body["errors"]] == [
        (1, "bad_server"),
        (2, "non_finite_value"),
        (3, "invalid_json"),
        (4, "invalid_json"),
        (5, "not_an_object"),
    ]
    as_array = b"[" + b",".join(line.encode() for line in lines[:4]) + b"]"  # the same shapes in a JSON array
    array_answer = requests.post(f"{url}/v1/events", data=as_array, headers={"Content-Type": "application/json"})
    assert array_answer.status_code == 400 and array_answer.json()["accepted"] == 1
    rejects = [r for r in stored(tmp_path) if r["reason"]]
    assert len(rejects) == 5 + array_answer.json()["rejected"]
    assert all(len(r["raw"].encode()) <= MAX_RAW_BYTES + 40 for r in rejects)  # kept, cut with a marker
    assert any("more bytes]" in r["raw"] for r in rejects)


def test_line_separators_inside_strings_do_not_split_events(start_gateway, tmp_path):
    url, _ = start_gateway()
    odd = ["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]
    valid = [json.dumps(dict(EVENT, server=f"web{c}1"), ensure_ascii=False) for c in odd[:3]]
    escaped = [json.dumps(dict(EVENT, server=f"web{c}1")) for c in odd[3:]]  # control characters escaped: valid
    broken = '{"ts": 1800000000000, "server": "a\u2028b", "metric": "m", "value": "x"}'  # one reject, kept whole
    answer = requests.post(f"{url}/v1/events", data=ndjson([*valid, *escaped, broken]), timeout=10)
    assert answer.status_code == 400 and (answer.json()["accepted"], answer.json()["rejected"]) == (8, 1)
    rows = stored(tmp_path)
    assert sorted(r["server"] for r in rows if r["server"]) == sorted(f"web{c}1" for c in odd)
    assert [r["raw"] for r in rows if r["reason"]] == [broken]


def test_invalid_utf8_is_a_reject_as_in_the_importer(start_gateway, tmp_path):
    url, _ = start_gateway()
    line = b'{"ts": 1800000000000, "server": "s\xff\xfe", "metric": "m", "value": 1}'
    answer = requests.post(f"{url}/v1/events", data=line + b"\n" + ndjson([EVENT]), timeout=10)
    assert answer.status_code == 400 and answer.json()["errors"][0]["reason"].startswith("invalid_json")
    assert [r["raw"] for r in stored(tmp_path) if r["reason"]] == [
        '{"ts": 1800000000000, "server": "s\\xff\\xfe", "metric": "m", "value": 1}'
    ]


def test_slow_and_silent_clients_are_timed_out(start_gateway):
    url, _ = start_gateway(gateway_request_timeout_seconds=1)
    started = time.monotonic()
    answer, closed = raw_exchange(url, b"", wait=10)  # connects, sends nothing
    assert closed and answer == b"" and time.monotonic() - started < 5
    answer, closed = raw_exchange(url, b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Len", wait=10)  # half a header
    assert closed and answer == b""
    head = b"POST /v1/events HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{"  # a body that never comes
    answer, closed = raw_exchange(url, head, wait=10)
    assert closed and answer.startswith(b"HTTP/1.1 408 ")


def test_keep_alive_serves_many_requests_on_one_connection(start_gateway, tmp_path):
    url, _ = start_gateway()
    with requests.Session() as session:
        for i in range(20):
            assert session.post(f"{url}/v1/events", json=events_of("web-1", start=i), timeout=10).status_code == 200
    assert len(stored(tmp_path)) == 20


def test_retries_are_not_counted_as_accepted(start_gateway):
    url, gateway = start_gateway()
    headers = {"X-Producer-Id": "agent-1", "X-Producer-Seq": "1"}
    for _ in range(3):
        requests.post(f"{url}/v1/events", json=events_of("a", "b", "c"), headers=headers, timeout=10)
    assert gateway.metrics.accepted._value.get() == 3
    assert gateway.metrics.duplicates._value.get() == 6


def test_an_agent_dead_letters_a_refused_batch_and_keeps_draining(start_gateway, tmp_path):
    url, _ = start_gateway(gateway_max_body_bytes=2048)
    spool = tmp_path / "spool"
    with GatewaySender(url, spool, backoff_base=0.01, backoff_cap=0.05) as sender:
        big = [dict(EVENT, server=f"web-{i}-" + "x" * 100, value=float(i)) for i in range(200)]  # > 2 KiB gzipped
        sender.send_payloads(big)
        sender.send_payloads(events_of("web-1", start=1000))
        assert sender.flush(timeout=20)
        assert sender.stats.dead_lettered == 1
    dead = sorted(p.name for p in (spool / DEAD_LETTER_DIR).iterdir())
    assert dead == ["00000000000000000001.answer.json", "00000000000000000001.ndjson.gz"]
    note = json.loads((spool / DEAD_LETTER_DIR / dead[0]).read_text())
    assert note["status"] == 413 and note["seq"] == 1
    assert len(gzip.decompress((spool / DEAD_LETTER_DIR / dead[1]).read_bytes()).splitlines()) == 200  # kept whole
    assert [r["value"] for r in stored(tmp_path)] == [1000.0]
