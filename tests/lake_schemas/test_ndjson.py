"""The vectorised JSON Lines path gives exactly what the per-line validator gives, on any input, without crashing."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from metrics_lake.lake_schemas import ndjson, ndjson_columns
from metrics_lake.lake_schemas.contract import MAX_RAW_BYTES, to_log_records
from metrics_lake.lake_schemas.log_records import CODED_LOG_RECORD, LOG_RECORD
from metrics_lake.lake_schemas.ndjson import MAX_BRACKETS, records_from_lines
from tests.lake_schemas.test_contract import INVALID

GOOD = [
    '{"ts": 1763600000000, "server": "web-01", "metric": "host.cpu.utilization", "value": 12.5}',
    '{"ts": 1763600000001, "server": "web-02", "metric": "app.rpc.count", "value": 7, "tags": {"dc": "eu", "az": "b"}}',
    '{"ts": "2025-11-20T01:33:20.250Z", "server": "db", "metric": "x", "value": -1e-300}',
    '{"ts": "2025-11-20T02:33:20.123456+01:00", "server": "é", "metric": "y_1.z", "value": 1e300, "extra": [1]}',
    '{"value": 3, "metric": "m", "server": "s", "ts": 1763600000002, "tags": {"az": "a", "dc": "us"}}',
    '{"ts": 1763600000003, "server": "s", "metric": "m", "value": 123456789012345678901234567890}',
    '{"ts": 1763600000004, "server": "s", "metric": "m", "value": 1, "tags": {}}',
    '{"ts": 1763600000005, "server": "a\u2028b\u0085c\\u000bd", "metric": "m", "value": 1}',
    '{"ts": 1763600000006, "server": "s", "metric": "m", "value": 1, "tags": null}',
]
NASTY = [
    '{"ts": 1763600000000, "server": "s\\ud800", "metric": "m", "value": 1}',  # lone surrogate
    '{"ts": 1763600000000, "server": "s", "metric": "m", "value": ' + "9" * 400 + "}",
    '{"ts": 1763600000000, "server": "s", "metric": "m", "value": ' + "9" * 5001 + "}",
    '{"ts": ' + "1" * 30 + ', "server": "s", "metric": "m", "value": 1}',
    '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # crashes Arrow's parser if it ever reached it
    '{"ts": 1763600000000, "server": "s", "metric": "m", "value": 1} {"second": "object"}',
    '{"ts": 1763600000000, "server": "s", "metric": "m", "value": 1, "value": 2}',
    '{"ts": 1763600000000, "server": "s", "metric": "m", "value": 1e400}',
    '{"ts": 1763600000000.0, "server": "s", "metric": "m", "value": 1}',
    '{"ts": "2025-11-20T01:33:20", "server": "s", "metric": "m", "value": 1}',
    '{"ts": "2025-W47-1T00:00:00Z", "server": "s", "metric": "m", "value": 1}',
    '{"ts": 1763600000000, "server": "s", "metric": "m", "value": 1, "tags": {"k": {"nested": "x"}}}',
    '{"ts": 1763600000000, "server": "' + "x" * (MAX_RAW_BYTES + 10) + '", "metric": "m", "value": 1}',
    "{}",  # an object without fields: Arrow gives rows without columns
    "{ }",
    "[" * (MAX_BRACKETS + 1),
    "\x00\x01binary",
    "",
    "   ",
]


def normalise(table):
    rows = table.to_pylist()
    for row in rows:
        if row["tags"] is not None:
            row["tags"] = dict(row["tags"])  # a map's key order carries no meaning
    return rows


def assert_same(lines: list[bytes]) -> None:
    """Both ways of giving the rows (plain and dictionary-encoded strings) hold what the per-line validator gives."""
    data = b"\n".join(lines) + b"\n"
    expected = normalise(to_log_records([line for line in lines if line.strip()]))
    for dictionaries, schema in ((False, LOG_RECORD), (True, CODED_LOG_RECORD)):
        fast = records_from_lines(data, few_lines=0, dictionaries=dictionaries)  # Arrow however few the lines
        assert fast.records.schema == schema
        assert normalise(fast.records) == expected
        assert fast.lines == len(lines) and fast.blank == sum(1 for line in lines if not line.strip())


def test_contract_cases_good_and_nasty_lines_match_the_per_line_validator():
    lines = [*GOOD, *(raw for raw, _ in INVALID), *NASTY, *GOOD]
    assert_same([line.encode("utf-8", "surrogatepass") for line in lines])


@pytest.mark.parametrize("names", [("dc",), ("dc", "az"), ("dc", "az", "rack")])
@pytest.mark.parametrize("rejects", [False, True])
def test_blocks_whose_lines_all_carry_the_same_tag_names_match_the_per_line_validator(monkeypatch, names, rejects):
    """The usual block (every accepted line the same tag names, in either order) is laid out without ranks or a
    sort, also when some lines are rejected (with or without tags); its maps hold what the per-line validator
    gives."""
    calls = {"_tags": 0, "_fields_in_order": 0}
    for name in calls:
        real = getattr(ndjson_columns, name)

        def counted(*args, name=name, real=real):
            calls[name] += 1
            return real(*args)

        monkeypatch.setattr(ndjson_columns, name, counted)
    lines = []
    for i in range(300):
        tags = {name: f"{name}-{i % 7}" for name in (names if i % 2 else reversed(names))}
        event = {"ts": 1763600000000 + i, "server": f"s{i % 5}", "metric": "m", "value": i, "tags": tags}
        if rejects and i % 10 == 3:
            event["metric"] = "Not A Metric"
        if rejects and i % 10 == 7:
            del event["ts"], event["tags"]
        lines.append(json.dumps(event).encode())
    assert_same(lines)
    assert calls["_tags"] and calls["_fields_in_order"] == calls["_tags"]  # every block laid out directly


def test_lines_are_split_on_newline_only_with_crlf_and_no_final_newline():
    data = (GOOD[0] + "\r\n\r\n" + GOOD[7] + "\n" + GOOD[1]).encode()
    result = records_from_lines(data)
    assert (result.lines, result.blank, result.records.num_rows, result.rejected) == (4, 1, 3, 0)
    assert result.records.column("server").to_pylist()[1] == "a\u2028b\u0085c\x0bd"  # one event, not three


def test_objects_without_fields_are_quarantined_not_lost():
    assert_same([b"{}"] * 300)  # Arrow reads them as rows without columns
    assert_same([b"{}", b"{ }", GOOD[0].encode()] * 100)


def test_no_bytes_are_no_lines_and_a_lone_newline_one_blank_line():
    assert (records_from_lines(b"").lines, records_from_lines(b"").records.num_rows) == (0, 0)
    assert (records_from_lines(b"\n").lines, records_from_lines(b"\n").blank) == (1, 1)


def test_invalid_utf8_is_quarantined_with_its_bytes_escaped():
    line = b'{"ts": 1763600000000, "server": "a\xffb", "metric": "m", "value": 1}'
    result = records_from_lines(GOOD[0].encode() + b"\n" + line)
    assert result.rejected == 1
    assert result.records.column("reason").to_pylist()[1].startswith("invalid_json")
    assert "\\xff" in result.records.column("raw").to_pylist()[1]


MUTATIONS = (
    lambda s, r: s[: r.randrange(max(len(s), 1))],  # truncated
    lambda s, r: s.replace('"', "", 1),
    lambda s, r: s.replace("1763600000000", r.choice(["-1", "1.5", '"x"', "true", "null", "1e3", "[]"])),
    lambda s, r: s.replace('"m"', r.choice(['"M"', '""', '"a b"', "1", '"' + "m" * 129 + '"', "null"])),
    lambda s, r: s.replace('"s"', r.choice(['""', "7", '"' + "s" * 129 + '"', '"\\ud800"', '"\u2028"', "{}"])),
    lambda s, r: s.replace("12.5", r.choice(["NaN", "Infinity", '"12"', "false", "1e999", "-0", "9" * 30])),
    lambda s, r: s.replace("}", ', "tags": ' + r.choice(['{"a": 1}', '{"a": "b"}', '"t"', "[]", '{"a": null}']) + "}"),
    lambda s, r: s[: (i := r.randrange(len(s) + 1))] + r.choice(["\x00", "\u2028", "\\", "{", "]", ",", "é"]) + s[i:],
    lambda s, r: "[" + s + "]",
    lambda s, r: s + " " + s,
)


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_lines_match_the_per_line_validator(seed):
    rng = random.Random(seed)
    base = '{"ts": 1763600000000, "server": "s", "metric": "m", "value": 12.5}'
    lines = []
    for _ in range(4000):
        line = base
        for _ in range(rng.randint(0, 3)):
            line = rng.choice(MUTATIONS)(line, rng)
        encoded = line.encode("utf-8", "surrogatepass")
        if rng.random() < 0.05:  # bytes that are not UTF-8
            cut = rng.randrange(len(encoded) + 1)
            encoded = encoded[:cut] + bytes([rng.randrange(0x80, 0x100)]) + encoded[cut:]
        lines.append(encoded)
    assert_same(lines)
    assert json.loads(base)  # the base line itself is valid JSON


def test_long_inputs_with_sparse_errors_new_tag_keys_and_long_lines_match_the_per_line_validator():
    """Past the first (probe) block, errors are found by streaming: rows before an error, fields the
    stream's first block lacked, lines longer than a stream block, CRLF and lines sent one by one in between."""
    rng = random.Random(7)
    lines = []
    for i in range(30_000):
        tags = rng.choice(["", ', "tags": {"dc": "eu"}', f', "tags": {{"k{rng.randrange(50)}": "v"}}'])
        line = f'{{"ts": 17636000{i:05d}, "server": "s{i % 7}", "metric": "m", "value": {i}.5{tags}}}'
        roll = rng.random()
        if roll < 0.002:
            line = line.replace("17636000", '"yesterday', 1).replace(', "server"', '", "server"', 1)  # ts a string
        elif roll < 0.0025:
            line = line[: len(line) // 2]  # truncated: it does not end an object, so it goes line by line up front
        elif roll < 0.003:
            line = line.replace(', "server"', ' "server"', 1)  # a comma missing: ends like an object, fails to parse
        elif roll < 0.004:
            line = line.replace('"s', '"s}{', 1)  # "}{" inside a string: one valid event, checked line by line
        elif roll < 0.005:
            line = line.replace('"m"', '"m", "note": "' + "x" * 70_000 + '"')  # longer than a stream block
        elif roll < 0.006:
            line = "   "  # blank
        elif roll < 0.007:
            line = line + " " + line  # two objects
        elif roll < 0.008:
            line = line + " \t"  # a valid event followed by whitespace
        elif roll < 0.02:  # an ISO time among epoch milliseconds: both valid, parsed as two groups
            line = line.replace(f"17636000{i:05d}", f'"2025-11-20T01:{i % 60:02d}:{i % 59:02d}.{i % 1000:03d}Z"', 1)
        lines.append(line.encode() + (b"\r" if roll > 0.99 else b""))
    assert_same(lines)


@pytest.mark.parametrize("with_parse_error", [False, True])
def test_two_objects_on_one_line_in_clean_blocks_are_one_reject_each(with_parse_error):
    """Lines holding two objects are looked for only in blocks that do not read cleanly: a block whose only
    anomaly is such a line (its whole read gives one row too many), or one with a parse error after it (the
    streamed rows must not be matched to the wrong lines)."""
    lines = [f'{{"ts": 17636000{i:05d}, "server": "s{i % 5}", "metric": "m", "value": {i}}}' for i in range(9000)]
    lines[100] = lines[100] + lines[101]  # "}{"
    lines[4000] = lines[4000] + " \t" + lines[4001]  # "} \t{"
    lines[4500] = lines[4500].replace('"s0"', '"s}{0"')  # inside a string: one valid event
    if with_parse_error:
        lines[6000] = lines[6000].replace(', "server"', ' "server"')  # ends like an object, fails to parse
    data = [line.encode() for line in lines]
    assert_same(data)
    result = records_from_lines(b"\n".join(data))
    assert result.rejected == (3 if with_parse_error else 2)
    assert result.records.num_rows == 9000


@pytest.mark.parametrize("size", [0, 1, 6, 7, 8, 14, 15, 50])
def test_newlines_are_found_a_step_at_a_time_across_step_ends(size, monkeypatch):
    monkeypatch.setattr(ndjson, "NEWLINE_STEP_BYTES", 7)
    data = bytes(random.Random(size).choice(b"\nab") for _ in range(size))
    found = ndjson._newlines(np.frombuffer(data, dtype=np.uint8))
    assert found.tolist() == [i for i, byte in enumerate(data) if byte == 10]
