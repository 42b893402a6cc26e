"""The gateway's state and ingest logic, independent of HTTP: validate, route, append, answer.

See :mod:`metrics_lake.app.gateway` for the HTTP API this serves. A request
goes through two steps so the HTTP server never blocks a thread while a
batch waits for its group commit: :meth:`Gateway.accept` validates and
buffers the events (CPU work, run on a worker thread) and returns the
futures of the partition flushes; :meth:`Gateway.answer` turns them, once
resolved, into the HTTP answer. :meth:`Gateway.ingest` does both, blocking.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from concurrent.futures import wait
from dataclasses import dataclass
from http import HTTPStatus

import numpy as np
import prometheus_client as prom
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.app.auth import Authenticator, Caller
from metrics_lake.app.gateway.body import records_from_body
from metrics_lake.app.process_metrics import register_process_metrics
from metrics_lake.core.arrow_memory import FreedMemoryBudget
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.inventory import Change, Inventory, check_labels
from metrics_lake.core.log.log import AppendResult
from metrics_lake.core.log.producer import Producer, Sent, Source, producer_for
from metrics_lake.core.log.segment_compaction import compact_partition
from metrics_lake.core.rate_limits import RateLimits
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.contract import ACCESS_REASON_CODE, raw_text
from metrics_lake.lake_schemas.errors import InputError, SequenceConflictError

__all__ = ["Accepted", "Gateway", "GatewayMetrics", "Outcome", "body_digest", "events_answer", "forbid_servers"]

log = logging.getLogger(__name__)


class GatewayMetrics:
    """The gateway's Prometheus metrics, in their own registry."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        register_process_metrics(self.registry)  # resident size, CPU seconds, malloc and Arrow bytes
        self.accepted = prom.Counter(
            "lake_gateway_events_accepted",
            "Valid events appended to the log (retried duplicates not counted).",
            registry=self.registry,
        )
        self.rejected = prom.Counter(
            "lake_gateway_events_rejected",
            "Invalid events appended as rejects, for quarantine (retried duplicates not counted).",
            registry=self.registry,
        )
        self.duplicates = prom.Counter(
            "lake_gateway_events_duplicate",
            "Events of retried requests already in the log or on their way, not appended again.",
            registry=self.registry,
        )
        self.requests = prom.Counter(
            "lake_gateway_requests", "HTTP requests by status code.", ["code"], registry=self.registry
        )
        self.ack_seconds = prom.Histogram(
            "lake_gateway_ack_seconds",
            "Time from a POST's body being received to its durable acknowledgement.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10),
            registry=self.registry,
        )
        self.flush_seconds = prom.Histogram(
            "lake_gateway_flush_seconds",
            "Time to append one segment (create + index commit).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.segment_bytes = prom.Histogram(
            "lake_gateway_segment_bytes",
            "Size of the segment objects written.",
            buckets=(16e3, 64e3, 256e3, 1e6, 4e6, 16e6),
            registry=self.registry,
        )
        self.skipped = prom.Counter(
            "lake_gateway_points_skipped",
            "Points not stored on purpose (stale markers, no recorded value, a cumulative histogram's baseline).",
            ["protocol"],
            registry=self.registry,
        )
        self.pending_requests = prom.Gauge(
            "lake_gateway_requests_pending",
            "Ingest requests received whole and not answered yet: being decoded, waiting for a validation thread, "
            "or waiting for their durable flush (the gateway's queue depth).",
            registry=self.registry,
        )
        self.buffered_bytes = prom.Gauge(
            "lake_gateway_buffered_bytes", "Bytes waiting for a durable flush.", registry=self.registry
        )
        self.owned_partitions = prom.Gauge(
            "lake_gateway_owned_partitions", "Partitions this gateway holds leases on.", registry=self.registry
        )
        self.index_segments = prom.Gauge(
            "lake_gateway_index_segments",
            "Segments in an owned partition's index after the gateway's last log compaction.",
            ["partition"],
            registry=self.registry,
        )
        self.token_events = prom.Counter(
            "lake_gateway_token_events",
            "Events per token (its name; 'anonymous' on an open lake) by outcome: accepted, rejected (quarantined, "
            "forbidden servers included), limited (refused with 429 by the token's rate limit).",
            ["token", "outcome"],
            registry=self.registry,
        )
        self.token_requests = prom.Counter(
            "lake_gateway_token_requests",
            "Ingest requests per token by status code (requests refused before a token was known are not here).",
            ["token", "code"],
            registry=self.registry,
        )
        self.inventory_changes = prom.Counter(
            "lake_gateway_inventory_changes",
            "Server inventory changes appended (PUT and DELETE /v1/inventory/{server}).",
            registry=self.registry,
        )

    def observe_append(self, partition: int, result: AppendResult, seconds: float) -> None:
        """Producer hook: one segment appended in ``seconds``."""
        if not result.duplicate:
            self.flush_seconds.observe(seconds)
            self.segment_bytes.observe(result.size_bytes)


def body_digest(body: bytes) -> str:
    """Digest of a decoded request body (BLAKE2b, 128 bits, hex): what tells a retry from a reused sequence."""
    return hashlib.blake2b(body, digest_size=16).hexdigest()


def request_digest(token: str, body: bytes) -> str:
    """Digest of ``body`` as ``token`` sent it (BLAKE2b, 128 bits, hex): the key of a request retried whole
    (:meth:`Gateway.accept_records`); the token's name is hashed in so one token's bodies never stand for another's."""
    digest = hashlib.blake2b(token.encode(), digest_size=16)
    digest.update(b"\0")
    digest.update(body)
    return digest.hexdigest()


@dataclass(frozen=True)
class Accepted:
    """A request validated and buffered: its records (LOG_RECORD), what the producer did, and when it started."""

    records: pa.Table
    sent: Sent
    started: float


@dataclass(frozen=True)
class Outcome:
    """A request made durable: valid events ``accepted``, ``errors`` as (record index, reason) of the rejected
    ones (appended for quarantine), and whether it was a ``duplicate`` retry."""

    accepted: int
    errors: list[tuple[int, str]]
    duplicate: bool


def forbid_servers(records: pa.Table, caller: Caller) -> tuple[pa.Table, int]:
    """``records`` with the valid events of servers ``caller`` may not write turned into rejects; and their count.

    A forbidden event keeps its fields and gets ``reason``
    ``forbidden_server: …`` and ``raw`` (the event as JSON), so it lands
    in ``quarantine_events`` like any reject.
    """
    if caller.record is None or caller.record.servers is None or records.num_rows == 0:
        return records, 0
    servers, reasons = records.column("server"), records.column("reason")
    names = [s for s in pc.unique(servers).to_pylist() if s is not None]
    denied = [s for s in names if not caller.may_write(s)]
    if not denied:
        return records, 0
    mask = pc.and_(pc.is_in(servers, pa.array(denied, pa.string())), pc.is_null(reasons)).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(mask)
    if len(rows) == 0:
        return records, 0
    glob = caller.record.servers
    reason = list(reasons.to_pylist())
    raw = list(records.column("raw").to_pylist())
    picked = records.take(pa.array(rows)).to_pylist()
    for i, event in zip(rows, picked, strict=True):
        server = event["server"]
        reason[i] = f"{ACCESS_REASON_CODE}: token {caller.name!r} may write servers {glob!r}, not {server!r}"
        ts = event["ts"]
        document = {
            "ts": None if ts is None else int(ts.timestamp() * 1000),
            "server": server,
            "metric": event["metric"],
            "value": event["value"],
        }
        if event["tags"]:
            document["tags"] = dict(event["tags"])
        raw[i] = raw_text(json.dumps(document, separators=(",", ":")).encode())
    records = records.set_column(records.schema.get_field_index("reason"), "reason", pa.array(reason, pa.string()))
    records = records.set_column(records.schema.get_field_index("raw"), "raw", pa.array(raw, pa.string()))
    return records, len(rows)


def events_answer(outcome: Outcome) -> tuple[int, dict]:
    """``POST /v1/events``'s (status, JSON answer): 200 ``{"accepted"}``, or 400 with each rejected event's reason."""
    answer: dict = {"accepted": outcome.accepted}
    if outcome.duplicate:
        answer["duplicate"] = True  # a retry: what it holds was appended by an earlier attempt
    if outcome.errors:
        errors = [{"index": i, "reason": reason} for i, reason in outcome.errors]
        return HTTPStatus.BAD_REQUEST, answer | {"rejected": len(errors), "errors": errors}
    return HTTPStatus.OK, answer


class Gateway:
    """The gateway's state: a producer over its owned partitions, and its metrics.

    ``owned``: partitions to lease (default all); ``linger_ms``/``roll_bytes``:
    group-commit window and size (defaults from ``settings``); ``flush_when_idle``:
    the producer's adaptive group commit (:class:`~metrics_lake.core.log.producer.Producer`:
    a batch is flushed once no request is on its way to the buffer, waiting
    at most ``linger_ms`` for those that are). Thread-safe.

    Every ``gateway_log_compaction_seconds`` a background thread compacts
    the owned partitions (:func:`~metrics_lake.core.log.segment_compaction.compact_partition`):
    a gateway that flushes every few milliseconds writes hundreds of
    segments a minute per partition, and the partition index, rewritten
    whole on every append, would grow with them. The merged segments are
    written beside the flushes; only their swap into the index holds the
    partition's flush lock, so this gateway's appends never race it (the
    append after it finds the index changed and re-applies on top). A round
    that fails is logged and tried at the next.

    Every second another thread gives the memory malloc keeps free back once
    the resident size has grown ``LAKE_FREED_MEMORY_KEEP_BYTES`` above its low
    (:class:`~metrics_lake.core.arrow_memory.FreedMemoryBudget`): requests and
    log compaction free their buffers, malloc keeps them for reuse, and
    without it the process would keep its highest peak for good.
    """

    #: Seconds between the memory thread's checks (one read of /proc/self/statm each).
    MEMORY_CHECK_SECONDS = 1.0

    def __init__(
        self,
        settings: LakeSettings,
        *,
        owned: list[int] | None = None,
        linger_ms: int | None = None,
        roll_bytes: int | None = None,
        flush_when_idle: bool = True,
    ) -> None:
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.gateway_id = f"gateway-{uuid.uuid4().hex[:12]}"
        self.producer: Producer = producer_for(
            settings,
            owned=owned,
            producer_id=self.gateway_id,
            lease_wait_s=2 * settings.lease_ttl_seconds + 5,
            on_append=self.metrics.observe_append,
            flush_when_idle=flush_when_idle,
            request_window_ms=int(settings.gateway_request_window_seconds * 1000),
            **({"linger_ms": linger_ms} if linger_ms else {}),
            **({"roll_bytes": roll_bytes} if roll_bytes else {}),
        )
        store = open_store(settings)
        self.inventory = Inventory(store)
        self.auth = Authenticator(settings, store, registry=self.metrics.registry)
        self.limits = RateLimits()
        # Take every lease before serving: a predecessor's lease expires within its TTL.
        self.producer.acquire()
        self.metrics.owned_partitions.set(len(self.producer.owned))
        self._stop = threading.Event()
        self._compactor = None
        if settings.gateway_log_compaction_seconds > 0:
            self._compactor = threading.Thread(target=self._compact_loop, name="log-compaction", daemon=True)
            self._compactor.start()
        self._memory = FreedMemoryBudget(settings.freed_memory_keep_bytes)
        self._memory_thread = threading.Thread(target=self._memory_loop, name="memory-release", daemon=True)
        self._memory_thread.start()

    def compact_log(self) -> int:
        """Compact each owned partition once (class docstring); returns the segments merged away."""
        merged = 0
        for partition in self.producer.owned:
            result = compact_partition(
                self.producer.log,
                self.producer.topic,
                partition,
                target_bytes=self.settings.log_compaction_target_bytes,
                delete_delay_ms=int(self.settings.segment_delete_delay_seconds * 1000),
                swap_lock=self.producer.flush_lock(partition),
            )
            merged += result.segments_before - result.segments_after
            self.metrics.index_segments.labels(partition=str(partition)).set(result.segments_after)
        return merged

    def stop_compacting(self) -> None:
        """End the background log compaction (after its round in progress) and the memory thread; :meth:`compact_log`
        still works."""
        self._stop.set()
        if self._compactor is not None:
            self._compactor.join()
        self._memory_thread.join()

    def _memory_loop(self) -> None:
        while not self._stop.wait(self.MEMORY_CHECK_SECONDS):
            self._memory.check()

    def _compact_loop(self) -> None:
        while not self._stop.wait(self.settings.gateway_log_compaction_seconds):
            try:
                self.compact_log()
            except Exception as exc:  # noqa: BLE001 - storage down, or appends won every swap: the next round
                log.warning(
                    "compacting the gateway's partitions failed (tried again in %.0f s): %s",
                    self.settings.gateway_log_compaction_seconds,
                    exc,
                )

    def limit_wait(self, caller: Caller, events: int) -> float:
        """Take ``events`` from ``caller``'s ingestion limit: 0.0 if within it, else seconds to wait (nothing taken).

        The limit is the token's ``rate``/``burst`` (shared by its tenant),
        else ``gateway_token_rate``/``gateway_token_burst``; no rate: unlimited.
        ``events`` 0 only checks that the bucket is not empty.
        """
        record = caller.record
        rate = record.rate if record is not None and record.rate else self.settings.gateway_token_rate
        if rate is None:
            return 0.0
        burst = (record.burst if record is not None and record.rate else None) or self.settings.gateway_token_burst
        key = record.limit_key if record is not None else f"token:{caller.name}"
        bucket = self.limits.bucket(key, rate, burst or 5 * rate)
        return bucket.take(events) if events else bucket.empty()

    def buffer_full(self, incoming_bytes: int = 0) -> bool:
        """Whether the producer's buffer, plus ``incoming_bytes`` being received, reached ``gateway_buffer_bytes``."""
        return self.producer.buffered_bytes() + incoming_bytes >= self.settings.gateway_buffer_bytes

    def accept(self, body: bytes, content_type: str, producer: tuple[str, int] | None) -> Accepted:
        """Validate one decoded JSON request body and buffer its events for appending.

        ``producer``: the request's (producer id, sequence), which makes a
        retry idempotent. Raises
        :class:`~metrics_lake.lake_schemas.errors.SequenceConflictError` if the
        sequence was used for another body (nothing is buffered then).
        """
        started = time.monotonic()
        return self.accept_records(records_from_body(body, content_type), body, producer, started=started)

    def accept_records(
        self,
        records: pa.Table,
        body: bytes,
        producer: tuple[str, int] | None,
        *,
        started: float | None = None,
        retried_by: str | None = None,
    ) -> Accepted:
        """Buffer LOG_RECORD rows decoded from ``body`` (any protocol) for appending; see :meth:`accept`.

        ``body`` is only digested, to tell a retry from a reused sequence.
        ``started``: when the work on the request began (``time.monotonic()``), default now.
        ``retried_by``: for a protocol whose senders retry whole bodies without a sequence (remote-write), the
        token name: a body that token sent before, whose rows are buffered or were appended within
        ``gateway_request_window_seconds``, is a retry and not appended again
        (:meth:`~metrics_lake.core.log.producer.Producer.send`'s ``request_key``: the token name and the body's
        digest), also after this gateway's predecessor was killed between its append and its answer.
        """
        started = time.monotonic() if started is None else started
        source = Source(producer[0], producer[1], body_digest(body)) if producer else None
        request_key = None
        if retried_by is not None and source is None:
            request_key = request_digest(retried_by, body)
        sent = self.producer.send(records, source=source, request_key=request_key)
        return Accepted(records, sent, started)

    def settle(self, accepted: Accepted) -> Outcome:
        """The :class:`Outcome` of a request whose flush futures are all resolved; counts it in the metrics.

        Raises what a failed flush raised (storage down, lease lost): the
        server answers 503 and the client retries.
        """
        for future in accepted.sent.futures:
            future.result()
        self.metrics.ack_seconds.observe(time.monotonic() - accepted.started)
        self.metrics.buffered_bytes.set(self.producer.buffered_bytes())
        sent, records = accepted.sent, accepted.records
        self.metrics.accepted.inc(sent.valid)
        self.metrics.rejected.inc(sent.records - sent.valid)
        self.metrics.duplicates.inc(sent.duplicates)
        reasons = records.column("reason")
        rejected = np.flatnonzero(reasons.is_valid().to_numpy(zero_copy_only=False))
        texts = reasons.take(pa.array(rejected)).to_pylist() if len(rejected) else []
        errors = [(int(i), reason) for i, reason in zip(rejected, texts, strict=True)]
        return Outcome(records.num_rows - len(rejected), errors, sent.duplicates > 0)

    def answer(self, accepted: Accepted) -> tuple[int, dict]:
        """The HTTP (status, JSON answer) of ``POST /v1/events`` once its flushes are resolved; see :meth:`settle`."""
        return events_answer(self.settle(accepted))

    def ingest(self, body: bytes, content_type: str, producer: tuple[str, int] | None) -> tuple[int, dict]:
        """:meth:`accept` then :meth:`answer`, waiting up to ``gateway_ack_timeout_seconds``.

        Returns 409 for a reused sequence, 503 if the batch is not durable
        in time (it stays buffered and is flushed later), 429 if the buffer
        is full.
        """
        if self.buffer_full():
            return HTTPStatus.TOO_MANY_REQUESTS, {"error": "gateway buffer full, retry later"}
        try:
            accepted = self.accept(body, content_type, producer)
        except SequenceConflictError as exc:
            return HTTPStatus.CONFLICT, {"error": str(exc)}
        _, not_done = wait(accepted.sent.futures, timeout=self.settings.gateway_ack_timeout_seconds)
        if not_done:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"{len(not_done)} partition flushes not durable in time"}
        try:
            return self.answer(accepted)
        except Exception as exc:  # storage down, lease lost: the agent retries
            log.warning("batch not made durable: %s", exc)
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not durable: {exc}"}

    def change_inventory(self, server: str, body: bytes | None) -> tuple[int, dict]:
        """``PUT /v1/inventory/{server}`` (``body``: ``{"labels": {name: value}}``, the server's whole label set)
        or, with ``body`` None, ``DELETE``: append the change to the inventory topic, durably, before answering.

        Answers 200 with the change's offset, 400 with one line for a body or
        label that breaks the rules (:func:`metrics_lake.core.inventory.check_labels`;
        nothing appended), 404 deleting a server the inventory does not hold.
        """
        if body is None:
            if server not in self.inventory.current():
                return HTTPStatus.NOT_FOUND, {"error": f"{server!r} is not in the inventory"}
            change = Change(server, {}, deleted=True)
        else:
            try:
                doc = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return HTTPStatus.BAD_REQUEST, {"error": f"the body is not JSON: {exc}"}
            labels = doc.get("labels") if isinstance(doc, dict) else None
            if labels is None:
                return HTTPStatus.BAD_REQUEST, {"error": 'expected {"labels": {"name": "value", ...}}'}
            try:
                check_labels(server, labels)
            except InputError as exc:
                return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
            change = Change(server, labels)
        result = self.inventory.append([change])
        self.metrics.inventory_changes.inc()
        return HTTPStatus.OK, {"server": server, "deleted": change.deleted, "offset": result.base_offset}

    def health(self) -> tuple[int, dict]:
        """200 with the owned partitions while the producer holds writers for them, else 503."""
        held = self.producer.held_partitions()
        status = HTTPStatus.OK if held else HTTPStatus.SERVICE_UNAVAILABLE
        return status, {"gateway": self.gateway_id, "topic": self.producer.topic, "partitions": held}

    def close(self) -> None:
        """Stop compacting, flush what is buffered and release the leases."""
        self.stop_compacting()
        self.auth.close()
        self.producer.close()
