"""The ingest gateway in-process: durable 200s, 400 with reasons, idempotent retries, 429/503, health, metrics."""

from __future__ import annotations

import gzip
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from prometheus_client.parser import text_string_to_metric_families

from metrics_lake.agents.gateway_client import GatewaySender, table_to_payloads
from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.app.gateway import Gateway
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.contract import to_log_records

EVENT = {"ts": 1_800_000_000_000, "server": "web-01", "metric": "host.cpu.utilization", "value": 12.5}


def log_rows(tmp_path):
    log = SegmentLog(open_store(load_settings(root=str(tmp_path / "lake"))))
    return [read_range(log, "metrics", p, 0, end) for p, end in end_offsets(log, "metrics").items()]


def test_a_200_means_the_events_are_in_the_log(start_gateway, tmp_path):
    url, _ = start_gateway()
    events = [dict(EVENT, server=f"web-{i:02d}", value=float(i)) for i in range(50)]
    answer = requests.post(f"{url}/v1/events", json=events, timeout=10)
    assert (answer.status_code, answer.json()) == (200, {"accepted": 50})
    rows = [r for table in log_rows(tmp_path) for r in table.to_pylist()]
    assert sorted(r["value"] for r in rows) == [float(i) for i in range(50)]  # committed before the answer


def test_invalid_events_get_a_400_with_reasons_and_still_reach_the_log(start_gateway, tmp_path):
    url, _ = start_gateway()
    body = "\n".join([json.dumps(EVENT), '{"ts": 1, "server": "a"', json.dumps(dict(EVENT, value="x"))])
    answer = requests.post(
        f"{url}/v1/events", data=gzip.compress(body.encode()), headers={"Content-Encoding": "gzip"}, timeout=10
    )
    assert answer.status_code == 400
    assert answer.json()["accepted"] == 1 and answer.json()["rejected"] == 2
    assert [(e["index"], e["reason"].split(":")[0]) for e in answer.json()["errors"]] == [
        (1, "invalid_json"),
        (2, "wrong_type"),
    ]
    rows = [r for table in log_rows(tmp_path) for r in table.to_pylist()]
    assert sorted(r["reason"].split(":")[0] for r in rows if r["reason"]) == ["invalid_json", "wrong_type"]
    assert len(rows) == 3


def test_a_retried_request_is_appended_once(start_gateway, tmp_path):
    url, _ = start_gateway()
    headers = {"X-Producer-Id": "agent-1", "X-Producer-Seq": "7"}
    for _ in range(3):  # the answer was lost twice
        assert requests.post(f"{url}/v1/events", json=[EVENT] * 10, headers=headers, timeout=10).status_code == 200
    assert requests.post(f"{url}/v1/events", json=[EVENT] * 10, headers=headers | {"X-Producer-Seq": "8"}).ok
    assert sum(t.num_rows for t in log_rows(tmp_path)) == 20


def test_a_full_buffer_answers_503_then_429_and_loses_nothing(start_gateway, tmp_path):
    # A flush window longer than the ack timeout: the first batch is not durable in time...
    url, gateway = start_gateway(
        linger_ms=60_000, flush_when_idle=False, gateway_ack_timeout_seconds=0.5, gateway_buffer_bytes=1024
    )
    first = requests.post(f"{url}/v1/events", json=[EVENT] * 100, timeout=10)
    assert first.status_code == 503 and first.headers["Retry-After"] == "1"
    # ...and stays buffered, so the next request meets a full buffer.
    second = requests.post(f"{url}/v1/events", json=[EVENT], timeout=10)
    assert second.status_code == 429 and second.headers["Retry-After"] == "1"
    gateway.producer.flush()
    assert gateway.producer.buffered_bytes() == 0
    assert sum(t.num_rows for t in log_rows(tmp_path)) == 100  # the batch answered 503 was kept, not dropped


def test_health_and_prometheus_metrics(start_gateway):
    url, _ = start_gateway()
    health = requests.get(f"{url}/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["partitions"] == [0, 1, 2, 3]
    requests.post(f"{url}/v1/events", json=[EVENT] * 5 + ["bad"], timeout=10)
    samples = {
        s.name + json.dumps(s.labels, sort_keys=True): s.value
        for family in text_string_to_metric_families(requests.get(f"{url}/metrics", timeout=10).text)
        for s in family.samples
    }
    assert samples["lake_gateway_events_accepted_total{}"] == 5
    assert samples["lake_gateway_events_rejected_total{}"] == 1
    assert samples['lake_gateway_requests_total{"code": "400"}'] == 1
    assert samples["lake_gateway_ack_seconds_count{}"] == 1
    assert samples["lake_gateway_segment_bytes_count{}"] >= 1


def test_requests_waiting_for_their_flush_are_the_queue_depth_in_metrics(start_gateway):
    # Flushed only when told: the linger is long, and the adaptive group commit is off.
    url, gateway = start_gateway(linger_ms=60_000, flush_when_idle=False, gateway_ack_timeout_seconds=30)

    def pending() -> float:
        text = requests.get(f"{url}/metrics", timeout=10).text
        (family,) = (f for f in text_string_to_metric_families(text) if f.name == "lake_gateway_requests_pending")
        return family.samples[0].value

    with ThreadPoolExecutor(3) as senders:
        posts = [senders.submit(requests.post, f"{url}/v1/events", json=[EVENT], timeout=30) for _ in range(3)]
        # A request counts as pending from its decoding on; flush once all three are buffered, or a request
        # still decoding would buffer after the flush and wait out the 60 s linger.
        deadline = time.monotonic() + 10
        while gateway.producer.stats.records < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pending() == 3
        gateway.producer.flush()
        assert [post.result().status_code for post in posts] == [200, 200, 200]
    assert pending() == 0


def test_two_gateways_own_disjoint_partitions(start_gateway, tmp_path):
    _, a = start_gateway(linger_ms=20)
    settings = load_settings(root=str(tmp_path / "lake"), lease_ttl_seconds=2)
    a.producer.close()  # the first gateway held all four partitions; closing releases them
    left = Gateway(settings, owned=[0, 1], linger_ms=20)
    right = Gateway(settings, owned=[2, 3], linger_ms=20)
    try:
        assert (left.health()[1]["partitions"], right.health()[1]["partitions"]) == ([0, 1], [2, 3])
        for gateway in (left, right):
            events = [json.dumps(dict(EVENT, server=f"s{i}")) for i in range(40)]
            assert gateway.ingest("\n".join(events).encode(), "application/x-ndjson", None)[0] == 200
        ends = end_offsets(SegmentLog(open_store(settings)), "metrics")
        assert ends[0] + ends[1] == 40 and ends[2] + ends[3] == 40
    finally:
        left.close()
        right.close()


def test_the_agent_spool_delivers_in_order_once_the_gateway_is_back(start_gateway, tmp_path):
    sender = GatewaySender("http://127.0.0.1:9", tmp_path / "spool", backoff_base=0.01, backoff_cap=0.05)
    sender.send_payloads([dict(EVENT, value=float(i)) for i in range(3)])
    sender.send_payloads([dict(EVENT, value=float(i)) for i in range(3, 5)])
    assert not sender.flush(timeout=0.5) and sender.pending_batches() == 2  # nobody listens: kept on disk
    sender.close(timeout=0)
    url, _ = start_gateway()
    with GatewaySender(url, tmp_path / "spool") as again:  # a restarted agent picks the spool up
        assert again.flush(timeout=20)
    values = [r["value"] for table in log_rows(tmp_path) for r in table.to_pylist()]
    assert values == [0.0, 1.0, 2.0, 3.0, 4.0]  # one server, one partition: in order, once


def test_events_cross_the_wire_exactly():
    sim = FleetSimulator(servers=3, metrics=4, seconds=30, rate=3.0, seed=5)
    table = sim.generate()
    again = to_log_records(table_to_payloads(table))
    assert again.equals(table)  # ts to the millisecond, values to the bit, tags intact


def test_the_gateway_compacts_its_partitions_while_senders_append_and_loses_nothing(start_gateway, tmp_path):
    url, gateway = start_gateway(linger_ms=2, gateway_log_compaction_seconds=0.2)
    senders, requests_each = 8, 30

    def send(sender: int) -> None:
        session = requests.Session()
        for seq in range(1, requests_each + 1):
            events = [
                dict(EVENT, server=f"s{sender}-{k}", value=float(sender * 10_000 + seq * 100 + k)) for k in range(20)
            ]
            headers = {"X-Producer-Id": f"agent-{sender}", "X-Producer-Seq": str(seq)}
            for _ in range(1 + (seq % 5 == 0)):  # every fifth request is retried, as if its answer was lost
                answer = session.post(f"{url}/v1/events", json=events, headers=headers, timeout=30)
                assert answer.status_code == 200, answer.text

    threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    appended = sum(
        sample.value
        for family in _family(url, "lake_gateway_segment_bytes")
        for sample in family.samples
        if sample.name.endswith("_count")
    )
    # A round under way may have planned before the last appends: stopped, then one more round on the quiet log.
    gateway.stop_compacting()
    gateway.compact_log()
    log = SegmentLog(open_store(load_settings(root=str(tmp_path / "lake"))))
    values = sorted(r["value"] for table in log_rows(tmp_path) for r in table.to_pylist())
    expected = sorted(
        float(s * 10_000 + q * 100 + k) for s in range(senders) for q in range(1, requests_each + 1) for k in range(20)
    )
    assert values == expected  # every acknowledged event once, retries included
    indexed = sum(len(log.index("metrics", p).segments) for p in range(4))
    assert appended >= 4 * 10 and indexed <= 4, (appended, indexed)


def _family(url: str, name: str):
    text = requests.get(f"{url}/metrics", timeout=10).text
    return [f for f in text_string_to_metric_families(text) if f.name == name]


def test_the_gateway_gives_freed_memory_back_while_it_runs(start_gateway):
    """The gateway's memory thread checks its budget every second (``LAKE_FREED_MEMORY_KEEP_BYTES``; 0: a release at
    every check), and ``/metrics`` counts the releases."""
    url, gateway = start_gateway(freed_memory_keep_bytes=0)

    def releases() -> float:
        return next(
            sample.value
            for family in _family(url, "lake_process_malloc_releases")
            for sample in family.samples
            if sample.name == "lake_process_malloc_releases_total"
        )

    before = releases()
    time.sleep(3 * gateway.MEMORY_CHECK_SECONDS)
    assert releases() >= before + 2
