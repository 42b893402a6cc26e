"""The event contract: every kind of invalid event is kept with its reason."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from metrics_lake.lake_schemas.contract import (
    EVENT_REASON_CODES,
    MAX_SERVER_LEN,
    parse_payload,
    servers_ok,
    to_log_records,
)

GOOD = {"ts": "2026-11-21T10:00:00.250Z", "server": "web-01", "metric": "app.rpc.latency_ms", "value": 12}

#: (payload, expected reason code): one per code in EVENT_REASON_CODES (tests/app/test_protocols.py: the others).
INVALID = [
    ('{"ts": 1800000000000, "server": "a", "metric": "x", "value": 1', "invalid_json"),
    ("42", "not_an_object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "server"}), "missing_field"),
    (json.dumps({**GOOD, "value": "12"}), "wrong_type"),
    ('{"ts": 1800000000000, "server": "a", "metric": "x", "value": Infinity}', "non_finite_value"),
    (json.dumps({**GOOD, "metric": "Host CPU"}), "bad_metric_name"),
    (json.dumps({**GOOD, "server": "s" * 129}), "bad_server"),
    (json.dumps({**GOOD, "ts": "2026-11-21T10:00:00"}), "bad_timestamp"),
    (json.dumps({**GOOD, "tags": {"dc": 7}}), "bad_tags"),
]


def test_every_event_reason_code_is_covered():
    assert sorted(code for _, code in INVALID) == sorted(EVENT_REASON_CODES)


@pytest.mark.parametrize(("payload", "code"), INVALID, ids=[code for _, code in INVALID])
def test_invalid_event_is_kept_with_raw_payload_and_reason(payload, code):
    table = to_log_records([json.dumps(GOOD), payload, json.dumps(GOOD)])
    rows = table.to_pylist()
    assert [r["reason"] is None for r in rows] == [True, False, True]
    assert rows[1]["raw"] == payload
    assert rows[1]["reason"].startswith(f"{code}: ")
    assert rows[0]["value"] == rows[2]["value"] == 12.0  # neighbours unaffected


@pytest.mark.parametrize(
    "ts",
    ["2026-11-21T10:00:00.250Z", "2026-11-21T11:00:00.250+01:00", 1795255200250],
)
def test_timestamps_iso_with_zone_or_epoch_ms_mean_the_same_instant(ts):
    assert parse_payload({**GOOD, "ts": ts})["ts"] == 1795255200250


def test_seconds_sent_as_milliseconds_are_rejected_not_misread():
    with pytest.raises(ValueError, match="bad_timestamp"):
        parse_payload({**GOOD, "ts": 1795255200})


def test_booleans_are_not_numbers():
    with pytest.raises(ValueError, match="wrong_type"):
        parse_payload({**GOOD, "value": True})


def test_tags_and_unknown_fields():
    event = parse_payload({**GOOD, "tags": {"dc": "eu"}, "extra": 1})
    assert event["tags"] == [("dc", "eu")]
    assert to_log_records([{**GOOD, "tags": {"dc": "eu"}}]).column("tags").to_pylist() == [[("dc", "eu")]]


def test_non_utf8_bytes_are_quarantined_escaped():
    table = to_log_records([b'{"ts": \xff}'])
    row = table.to_pylist()[0]
    assert row["reason"].startswith("invalid_json")
    assert row["raw"] == '{"ts": \\xff}'


def test_raw_text_cuts_long_payloads_once():
    from metrics_lake.lake_schemas.contract import MAX_RAW_BYTES, raw_text

    payload = b'{"server": "' + "é".encode() * MAX_RAW_BYTES + b'"}'
    cut = raw_text(payload)
    assert cut.endswith(f"…[{len(payload) - len(cut.split('…[')[0].encode())} more bytes]")
    assert len(cut.split("…[")[0].encode()) <= MAX_RAW_BYTES
    assert raw_text(cut) == cut and raw_text(cut.encode()) == cut  # re-sent through a gateway: unchanged
    assert raw_text("x" * MAX_RAW_BYTES + "…[5 more bytes]") == "x" * MAX_RAW_BYTES + "…[5 more bytes]"
    assert raw_text("x" * (MAX_RAW_BYTES + 1) + "…[5 more bytes]").endswith("…[18 more bytes]")  # 1 + the old marker


def test_the_vectorised_server_rule_counts_characters_not_bytes():
    longest, longer = MAX_SERVER_LEN, MAX_SERVER_LEN + 1
    servers = ["", "a", "é" * longest, "é" * longer, "a" * longest, "a" * longer, None]
    assert servers_ok(pa.array(servers)).to_pylist() == [False, True, True, False, True, False, None]
    assert servers_ok(pa.array(["a", "é" * 100])).to_pylist() == [True, True]  # 200 bytes, 100 characters
