"""Durable agent-side sending to a gateway: a disk spool, ordered delivery, retries with backoff.

Every batch an agent sends is first written to the spool directory as
``<seq>.ndjson.gz`` (20-digit sequence number, written to a temporary name
and renamed, so a crash never leaves half a batch), then a sender thread
POSTs the spooled batches to the gateway strictly in sequence order, one at
a time, with headers ``X-Producer-Id`` (the agent's id, kept in the spool as
``agent.id``) and ``X-Producer-Seq``. A batch leaves the spool when the
gateway answered 200 (durable) or 400 with per-event reasons (invalid events
quarantined, the rest durable). A 401 (the token is missing, wrong, expired
or revoked) keeps every batch spooled and retried, with a warning, until
the token is fixed. Any other 4xx (the gateway will never take
this batch as it is: 403 another server's events for this token, 409
reused sequence, 413 too large, a 400 for an unreadable body...) moves it to ``dead-letter/`` in the spool, beside a
``.answer.json`` holding the status and answer, so one bad batch never
blocks the ones behind it and nothing is thrown away. On 408, 429, 5xx or a
connection error it is retried with exponential backoff and full jitter (``sleep = random(0, min(cap, base * 2**attempt))``,
from "Exponential Backoff And Jitter", AWS Architecture Blog, 2015), so
agents that lost a gateway do not come back in lockstep.

Because a retry carries the same producer id and sequence, the gateway
appends each batch once even if an earlier attempt became durable but its
answer was lost. Batches left in the spool when an agent stops are sent by
the next run with the same spool directory.

An import (:func:`metrics_lake.agents.file_import.import_jsonl`) sends with
a :class:`~metrics_lake.core.log.producer.Source` per chunk: its batches
then get sequence numbers derived from the chunk's
(``(chunk + 1) * SEQS_PER_CHUNK + i``), and batches up to the last one
already spooled are skipped, so an import re-run with the same spool (the
CLI gives each import its own, ``<spool>/imports/<import id>``, with the
import id as producer id) sends nothing twice.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import requests

from metrics_lake.core.log.producer import Sent, Source
from metrics_lake.lake_schemas.errors import ConfigError

log = logging.getLogger(__name__)

SPOOL_SUFFIX = ".ndjson.gz"
MAX_EVENTS_PER_REQUEST = 5_000
#: Sequence numbers reserved per import chunk (a 32 MiB chunk holds far fewer batches of 5,000 lines).
SEQS_PER_CHUNK = 100_000
#: Sub-folder of the spool holding batches the gateway refused for good (with its answer).
DEAD_LETTER_DIR = "dead-letter"
#: Answers worth retrying: the request timed out, the gateway is busy or failing.
RETRY_STATUSES = frozenset({408, 425, 429})


@dataclass
class SenderStats:
    """Counters since the sender started: events spooled, acknowledged, rejected, dead-lettered; retries."""

    records: int = 0
    acked: int = 0
    rejected: int = 0
    dead_lettered: int = 0  # batches moved to the dead-letter folder
    retries: int = 0
    segments: int = 0  # requests acknowledged (named like Producer's counter, for the CLI summary)


def table_to_payloads(records: pa.Table) -> list[str]:
    """:data:`metrics_lake.lake_schemas.log_records.LOG_RECORD` rows as event-contract JSON lines (rejected rows as their raw text).

    ``ts`` goes out as exact epoch milliseconds (from the int64 column, not
    via float seconds, which would round some values down by 1 ms).
    """
    ts_ms = records.column("ts").cast(pa.int64()).to_pylist()
    lines = []
    for ts, row in zip(ts_ms, records.drop_columns(["ts"]).to_pylist(), strict=True):
        if row["reason"] is not None:
            lines.append(row["raw"])
            continue
        event = {"ts": ts, "server": row["server"], "metric": row["metric"], "value": row["value"]}
        if row["tags"]:
            event["tags"] = dict(row["tags"])
        lines.append(json.dumps(event, separators=(",", ":")))
    return lines


class GatewaySender:
    """Sends events to a gateway through a disk spool; see the module docstring.

    Duck-types the parts of :class:`metrics_lake.core.log.producer.Producer` agents use
    (``send``, ``send_payloads``, ``flush``, ``close``, ``stats``).
    ``backoff_base``/``backoff_cap`` are seconds; ``timeout`` is the HTTP
    request timeout in seconds; ``token`` is sent as ``Authorization:
    Bearer``; ``ca``: a PEM CA file the gateway's certificate must chain to
    (default: the system's).
    """

    def __init__(
        self,
        url: str,
        spool_dir: str | os.PathLike,
        *,
        backoff_base: float = 0.2,
        backoff_cap: float = 10.0,
        timeout: float = 30.0,
        agent_id: str | None = None,
        token: str | None = None,
        ca: str | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/v1/events"
        self.spool = Path(spool_dir)
        self.spool.mkdir(parents=True, exist_ok=True)
        self.backoff_base, self.backoff_cap, self.timeout = backoff_base, backoff_cap, timeout
        self.agent_id = self._load_agent_id(agent_id)
        self.stats = SenderStats()
        self._session = requests.Session()
        if token is not None:
            self._session.headers["Authorization"] = f"Bearer {token}"
        # Passed per request: a Session's own verify loses to REQUESTS_CA_BUNDLE (psf/requests#3829).
        self._verify = ca if ca is not None else True
        self._lock = threading.Lock()
        self._next_seq = self._last_seq() + 1
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send_loop, name="gateway-sender", daemon=True)
        self._thread.start()

    def _load_agent_id(self, wanted: str | None) -> str:
        path = self.spool / "agent.id"
        if not path.exists():
            temp = path.with_suffix(".tmp")
            temp.write_text(wanted or f"agent-{uuid.uuid4().hex}")
            os.replace(temp, path)
        agent_id = path.read_text().strip()
        if wanted is not None and agent_id != wanted:
            raise ConfigError(
                f"spool {self.spool} belongs to producer {agent_id!r}, not {wanted!r}; "
                "give each agent its own LAKE_SPOOL_DIR"
            )
        return agent_id

    def _spooled(self) -> list[Path]:
        return sorted(self.spool.glob(f"*{SPOOL_SUFFIX}"))

    def _last_seq(self) -> int:
        marker = self.spool / "last.seq"
        last = int(marker.read_text()) if marker.exists() else 0
        files = self._spooled()
        return max(last, int(files[-1].name.removesuffix(SPOOL_SUFFIX)) if files else 0)

    def pending_batches(self) -> int:
        """Batches in the spool not yet acknowledged."""
        return len(self._spooled())

    def send(self, records: pa.Table, *, source: Source | None = None) -> Sent:
        """Spool :data:`metrics_lake.lake_schemas.log_records.LOG_RECORD` rows for sending (see the module docstring for ``source``).

        Returns a :class:`~metrics_lake.core.log.producer.Sent` without
        futures (delivery is asynchronous; :meth:`flush` waits for it),
        counting the rows skipped because an earlier run spooled them.
        """
        payloads = table_to_payloads(records)
        if source is None:
            self.send_payloads(payloads)
            return Sent([], records=len(payloads))
        skipped = 0
        for i, start in enumerate(range(0, len(payloads), MAX_EVENTS_PER_REQUEST)):
            batch = payloads[start : start + MAX_EVENTS_PER_REQUEST]
            seq = (source.seq + 1) * SEQS_PER_CHUNK + i
            if seq < self._next_seq:  # spooled (and maybe delivered) by an earlier run of this import
                skipped += len(batch)
                continue
            self._spool_batch(batch, seq)
        return Sent([], records=len(payloads) - skipped, duplicates=skipped)

    def send_payloads(self, payloads: list[str | dict]) -> None:
        """Spool raw events (JSON text or dicts), in requests of at most :data:`MAX_EVENTS_PER_REQUEST`."""
        lines = [p if isinstance(p, str) else json.dumps(p) for p in payloads]
        for start in range(0, len(lines), MAX_EVENTS_PER_REQUEST):
            self._spool_batch(lines[start : start + MAX_EVENTS_PER_REQUEST])

    def _spool_batch(self, lines: list[str], seq: int | None = None) -> None:
        """Write one batch to the spool under ``seq`` (default: the next sequence number)."""
        if not lines:
            return
        with self._lock:
            seq = self._next_seq if seq is None else seq
            self._next_seq = seq + 1
            target = self.spool / f"{seq:020d}{SPOOL_SUFFIX}"
            temp = target.with_name(f".{target.name}.tmp")
            with open(temp, "wb") as handle:
                handle.write(gzip.compress(("\n".join(lines) + "\n").encode(), compresslevel=1))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
            (self.spool / "last.seq").write_text(str(seq))  # survives the spool emptying
            self.stats.records += len(lines)
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the spool is empty (or ``timeout`` s pass); True if everything was acknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._spooled():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            self._wake.set()
            time.sleep(0.05)
        return True

    def close(self, timeout: float | None = 60.0) -> None:
        """Try to deliver the spool for up to ``timeout`` s, then stop; what is left is sent by the next run."""
        drained = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if not drained:
            log.warning("%d batches left in the spool %s; the next run sends them", self.pending_batches(), self.spool)

    def __enter__(self) -> GatewaySender:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _send_loop(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            files = self._spooled()
            if not files:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            if self._post(files[0]):
                files[0].unlink(missing_ok=True)  # a dead-lettered batch was moved already
                attempt = 0
                continue
            self.stats.retries += 1
            delay = random.uniform(0, min(self.backoff_cap, self.backoff_base * 2**attempt))
            attempt += 1
            self._stop.wait(delay)

    def _post(self, path: Path) -> bool:
        """POST one spooled batch; True if it left the spool (acknowledged or dead-lettered)."""
        seq = int(path.name.removesuffix(SPOOL_SUFFIX))
        headers = {
            "Content-Type": "application/x-ndjson",
            "Content-Encoding": "gzip",
            "X-Producer-Id": self.agent_id,
            "X-Producer-Seq": str(seq),
        }
        try:
            answer = self._session.post(
                self.url, data=path.read_bytes(), headers=headers, timeout=self.timeout, verify=self._verify
            )
        except requests.RequestException as exc:
            log.info("gateway unreachable (%s); batch %d stays spooled", exc.__class__.__name__, seq)
            return False
        body = _json_or_text(answer)
        if answer.status_code == 200 or (answer.status_code == 400 and "errors" in body):
            self.stats.acked += body.get("accepted", 0)
            self.stats.rejected += body.get("rejected", 0)
            self.stats.segments += 1
            return True
        if answer.status_code == 401:
            log.warning(
                "gateway refused the token (%s); batch %d stays spooled until it is fixed", body.get("error"), seq
            )
            return False
        if 400 <= answer.status_code < 500 and answer.status_code not in RETRY_STATUSES:
            self._dead_letter(path, answer.status_code, body)
            return True
        log.info("gateway answered %d for batch %d; retrying", answer.status_code, seq)
        return False

    def _dead_letter(self, path: Path, status: int, body: dict) -> None:
        """Move a refused batch to the dead-letter folder with the gateway's answer (answer first: no orphan batch)."""
        folder = self.spool / DEAD_LETTER_DIR
        folder.mkdir(exist_ok=True)
        name = path.name.removesuffix(SPOOL_SUFFIX)
        note = {"status": status, "answer": body, "producer_id": self.agent_id, "seq": int(name), "at": time.time()}
        (folder / f"{name}.answer.json").write_text(json.dumps(note, indent=1))
        os.replace(path, folder / path.name)
        self.stats.dead_lettered += 1
        log.warning("gateway refused batch %s for good (%d: %s); moved to %s", name, status, body.get("error"), folder)


def _json_or_text(answer: requests.Response) -> dict:
    try:
        body = answer.json()
    except ValueError:
        return {"error": answer.text[:500]}
    return body if isinstance(body, dict) else {"error": str(body)[:500]}
