"""Seeded hostile input for the front door: event lines whose fate (accepted or rejected) is known by construction.

Every valid event carries a unique id as its ``value`` (an integer-valued
float), so a test can check that each accepted event reached bronze exactly
once and nothing else did. Invalid lines are the shapes found by fuzzing the
gateway and the importer (issue 12): lone surrogates, integers of 400 and
5,001 digits, deep nesting, invalid UTF-8, raw control characters, line
separators that ``str.splitlines`` would split on, NaN, oversized payloads,
two objects on one line, and every contract rule broken once.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

START_MS = 1_750_000_000_000  # 2025-06-15: in the past, so the watermark never clamps it
METRICS = ["host.cpu.utilization", "host.mem.used", "rpc.latency.ms", "queue.depth"]
# Legal inside a JSON string, but line breaks to str.splitlines (issue 12, item 6).
ODD_CHARACTERS = ["\u2028", "\u2029", "\u0085", "\u00e9", "\U0001f600"]
ESCAPED_CONTROLS = ["\\u000b", "\\u000c", "\\u001c", "\\u001d", "\\u001e", "\\n", "\\r"]


@dataclass
class Lines:
    """Generated lines (bytes without the newline) and what must become of them."""

    lines: list[bytes] = field(default_factory=list)
    valid_ids: list[int] = field(default_factory=list)  # value of every valid event, in line order
    invalid_at: list[int] = field(default_factory=list)  # event index (blank lines not counted) of each reject
    blank: int = 0  # whitespace-only lines (skipped, neither accepted nor rejected)

    @property
    def invalid(self) -> int:
        """Lines the contract rejects."""
        return len(self.invalid_at)

    def body(self) -> bytes:
        """The lines as an NDJSON body."""
        return b"\n".join(self.lines) + b"\n"


class FuzzEvents:
    """Seeded generator of event lines; ids are unique across everything one instance generates."""

    def __init__(self, seed: int, *, hostile_share: float = 0.35, heavy_share: float = 0.01, first_id: int = 1) -> None:
        self.rng = random.Random(seed)
        self.next_id = first_id
        self.hostile_share = hostile_share
        # Share of hostile lines of the large shapes (deep nesting, 5,001 digits, payloads over 64 KiB).
        self.heavy_share = heavy_share

    def valid_event(self) -> tuple[dict, int]:
        """A valid event (dict) and its id."""
        rng, event_id = self.rng, self.next_id
        self.next_id += 1
        server = f"srv-{rng.randrange(40):02d}"
        if rng.random() < 0.15:
            server += rng.choice(ODD_CHARACTERS)
        event = {"ts": START_MS + rng.randrange(3_600_000), "server": server, "metric": rng.choice(METRICS)}
        event["value"] = float(event_id)
        if rng.random() < 0.3:
            event["tags"] = {"region": rng.choice(["eu", "us", "ap\u2028x"]), "az": str(rng.randrange(3))}
        if rng.random() < 0.1:
            event["ts"] = "2025-06-15T10:00:00.123+00:00"
        return event, event_id

    def valid_line(self) -> tuple[bytes, int]:
        """A valid event as one JSON line (sometimes with escaped control characters in a tag)."""
        event, event_id = self.valid_event()
        text = json.dumps(event, ensure_ascii=self.rng.random() < 0.5)
        if self.rng.random() < 0.1:
            text = text[:-1] + f', "note": "a{self.rng.choice(ESCAPED_CONTROLS)}b"}}'
        return text.encode(), event_id

    def invalid_line(self) -> bytes:
        """One line the contract rejects, of a randomly chosen shape."""
        rng = self.rng
        ts, good = START_MS + rng.randrange(3_600_000), '"server": "s", "metric": "m", "value": 1'
        shapes = [
            lambda: f'{{"ts": {ts}, "server": "s\\ud800", "metric": "m", "value": 1}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s", "metric": "m", "value": {"9" * 400}}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s", "metric": "m", "value": NaN}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s", "metric": "m", "value": Infinity}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s\xff\xfe", "metric": "m", "value": 1}}'.encode("latin-1"),
            lambda: f'{{"ts": {ts}, "server": "s\x0bt", "metric": "m", "value": 1}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s", "metric": "m"}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": 5, "metric": "m", "value": 1}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s", "metric": "Bad Name", "value": 1}}'.encode(),
            lambda: f'{{"ts": 5, {good}}}'.encode(),
            lambda: f'{{"ts": true, {good}}}'.encode(),
            lambda: f'{{"ts": "yesterday", {good}}}'.encode(),
            lambda: f'{{"ts": "2025-06-15T10:00:00", {good}}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "{"x" * 129}", "metric": "m", "value": 1}}'.encode(),
            lambda: f'{{"ts": {ts}, {good}, "tags": {{"a": 1}}}}'.encode(),
            lambda: f'{{"ts": {ts}, {good}, "tags": ["a"]}}'.encode(),
            lambda: f'{{"ts": {ts}, {good}, "value": "12"}}'.encode(),
            lambda: f'{{"ts": {ts}, {good}}} {{"ts": {ts}, {good}}}'.encode(),
            lambda: f'{{"ts": {ts}, "server": "s"'.encode(),
            lambda: rng.choice([b"[1, 2]", b'"text"', b"42", b"null", b"true", b"not json at all"]),
            lambda: bytes(rng.randrange(33, 256) for _ in range(rng.randrange(1, 40))).replace(b"\n", b"?"),
        ]
        heavy = [
            lambda: f'{{"ts": {ts}, "server": "s", "metric": "m", "value": {"7" * 5001}}}'.encode(),
            lambda: b'{"a": ' * rng.choice([40, 20_000, 100_000]) + b"1" + b"}" * 10,
            lambda: f'{{"ts": {ts}, "server": "{"y" * 70_000}", "metric": "m", "value": 1}}'.encode(),
        ]
        return rng.choice(heavy if rng.random() < self.heavy_share else shapes)()

    def invalid_event(self) -> dict:
        """An event object the contract rejects (for JSON array bodies)."""
        ts = START_MS + self.rng.randrange(3_600_000)
        return self.rng.choice(
            [
                {"ts": ts, "server": "s", "metric": "m"},
                {"ts": ts, "server": 5, "metric": "m", "value": 1},
                {"ts": ts, "server": "s", "metric": "m", "value": float("nan")},
                {"ts": "soon", "server": "s", "metric": "m", "value": 1},
                {"ts": ts, "server": "s\ud800", "metric": "m", "value": 1},
                {"ts": ts, "server": "s", "metric": "m", "value": 10**400},
                {"ts": ts, "server": "s", "metric": "m", "value": 1, "tags": {"a": [1]}},
            ]
        )

    def lines(self, count: int) -> Lines:
        """``count`` lines: valid events, hostile ones (``hostile_share`` of them) and a few blank lines."""
        out = Lines()
        for _ in range(count):
            roll = self.rng.random()
            if roll < 0.02:
                out.lines.append(self.rng.choice([b"", b"   ", b"\t", b"\r"]))
                out.blank += 1
            elif roll < 0.02 + self.hostile_share:
                out.invalid_at.append(len(out.lines) - out.blank)
                out.lines.append(self.invalid_line())
            else:
                line, event_id = self.valid_line()
                out.lines.append(line)
                out.valid_ids.append(event_id)
        return out
