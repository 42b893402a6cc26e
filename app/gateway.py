"""``lake gateway``: the stateless ingest server between agents and the log.

HTTP API (all answers are JSON, except ``/metrics``):

``POST /v1/events``
    Body: a JSON array of events, or NDJSON (one event per line; used when
    the body does not start with ``[`` or ``Content-Type`` is
    ``application/x-ndjson``), optionally ``Content-Encoding: gzip``.
    Headers ``X-Producer-Id`` and ``X-Producer-Seq`` (an agent's id and a
    per-agent sequence number, increasing by batch) make a retried request
    idempotent: a batch already durable, or already buffered, is not
    appended again.

    - ``200 {"accepted": n}``: every event is durable in the log (the
      segment holding it is committed), so it will not be lost.
    - ``400 {"accepted": n, "rejected": m, "errors": [{"index": i,
      "reason": "..."}]}``: the invalid events went to the log as rejects
      (and so to ``quarantine_events``); the valid ones are durable as for
      200. Do not retry a 400.
    - ``413``: body larger than :data:`MAX_BODY_BYTES`.
    - ``429`` + ``Retry-After``: the gateway's buffer is full (backpressure).
    - ``503`` + ``Retry-After``: the batch could not be made durable in
      time (object store down, partition lease lost); retry the same
      request (same producer id and sequence).

``GET /healthz``: 200 with the partitions this gateway owns, 503 if none.
``GET /metrics``: Prometheus text format (events accepted/rejected,
requests by status, POST-to-durable-ack latency, flush latency, segment
sizes, buffered bytes).

A gateway owns a set of partitions through their leases
(:mod:`metrics_lake.core.log.lease`) and routes every event to one of them (CRC-32 of the
server over the owned partitions), so several gateways can run side by
side on disjoint partitions. Records are batched per partition and flushed
every ``linger_ms`` or ``roll_bytes`` (group commit): many requests share
one segment, which keeps objects large and the PUT rate low.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
import uuid
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import prometheus_client as prom

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.log.log import AppendResult
from metrics_lake.core.log.producer import Producer, producer_for
from metrics_lake.schemas.contract import to_log_records

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024
RETRY_AFTER_SECONDS = 1


class GatewayMetrics:
    """The gateway's Prometheus metrics, in their own registry."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.accepted = prom.Counter(
            "lake_gateway_events_accepted", "Valid events made durable.", registry=self.registry
        )
        self.rejected = prom.Counter(
            "lake_gateway_events_rejected", "Invalid events sent to quarantine.", registry=self.registry
        )
        self.requests = prom.Counter(
            "lake_gateway_requests", "HTTP requests by status code.", ["code"], registry=self.registry
        )
        self.ack_seconds = prom.Histogram(
            "lake_gateway_ack_seconds",
            "Time from receiving a POST to its durable acknowledgement.",
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
        self.buffered_bytes = prom.Gauge(
            "lake_gateway_buffered_bytes", "Bytes waiting for a durable flush.", registry=self.registry
        )
        self.owned_partitions = prom.Gauge(
            "lake_gateway_owned_partitions", "Partitions this gateway holds leases on.", registry=self.registry
        )

    def observe_append(self, partition: int, result: AppendResult, seconds: float) -> None:
        """Producer hook: one segment appended in ``seconds``."""
        if not result.duplicate:
            self.flush_seconds.observe(seconds)
            self.segment_bytes.observe(result.size_bytes)


def parse_body(body: bytes, content_type: str) -> list[str | dict]:
    """Split a request body into event payloads (see the module docstring).

    A body that starts with ``[`` but is not valid JSON is kept whole as one
    invalid payload, so it is quarantined with the parser's reason.
    """
    text = body.decode("utf-8", errors="replace")
    if text.lstrip().startswith("[") and "ndjson" not in content_type:
        try:
            events = json.loads(text)
        except json.JSONDecodeError:
            return [text]
        return list(events)
    return [line for line in text.splitlines() if line.strip()]


class Gateway:
    """The gateway's state: a producer over its owned partitions, and its metrics.

    ``owned``: partitions to lease (default all); ``linger_ms``/``roll_bytes``:
    group-commit window and size (defaults from ``settings``).
    """

    def __init__(
        self,
        settings: LakeSettings,
        *,
        owned: list[int] | None = None,
        linger_ms: int | None = None,
        roll_bytes: int | None = None,
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
            **({"linger_ms": linger_ms} if linger_ms else {}),
            **({"roll_bytes": roll_bytes} if roll_bytes else {}),
        )
        # Take every lease before serving: a predecessor's lease expires within its TTL.
        self.producer.acquire()
        self.metrics.owned_partitions.set(len(self.producer.owned))

    def ingest(self, body: bytes, content_type: str, source: tuple[str, int] | None) -> tuple[int, dict]:
        """Validate, route and durably append one request's events; returns (HTTP status, JSON answer)."""
        if self.producer.buffered_bytes() >= self.settings.gateway_buffer_bytes:
            return HTTPStatus.TOO_MANY_REQUESTS, {"error": "gateway buffer full, retry later"}
        records = to_log_records(parse_body(body, content_type))
        started = time.monotonic()
        futures = self.producer.send(records, source=source)
        done, not_done = wait(futures, timeout=self.settings.gateway_ack_timeout_seconds)
        if not_done:
            raise FutureTimeout(f"{len(not_done)} partition flushes not durable in time")
        for future in done:
            future.result()
        self.metrics.ack_seconds.observe(time.monotonic() - started)
        self.metrics.buffered_bytes.set(self.producer.buffered_bytes())
        reasons = records.column("reason").to_pylist()
        errors = [{"index": i, "reason": reason} for i, reason in enumerate(reasons) if reason is not None]
        accepted = records.num_rows - len(errors)
        self.metrics.accepted.inc(accepted)
        self.metrics.rejected.inc(len(errors))
        if errors:
            return HTTPStatus.BAD_REQUEST, {"accepted": accepted, "rejected": len(errors), "errors": errors}
        return HTTPStatus.OK, {"accepted": accepted}

    def health(self) -> tuple[int, dict]:
        """200 with the owned partitions while the producer holds writers for them, else 503."""
        held = self.producer.held_partitions()
        status = HTTPStatus.OK if held else HTTPStatus.SERVICE_UNAVAILABLE
        return status, {"gateway": self.gateway_id, "topic": self.producer.topic, "partitions": held}

    def close(self) -> None:
        """Flush what is buffered and release the leases."""
        self.producer.close()


def _handler_for(gateway: Gateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: agents reuse their connection

        def log_message(self, format: str, *args) -> None:  # access log at debug level, not stderr
            log.debug("%s " + format, self.address_string(), *args)

        def _answer(self, status: int, body: dict | bytes, content_type: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if status in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE):
                self.send_header("Retry-After", str(RETRY_AFTER_SECONDS))
            self.end_headers()
            self.wfile.write(data)
            gateway.metrics.requests.labels(code=str(status)).inc()

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._answer(*gateway.health())
            elif self.path == "/metrics":
                gateway.metrics.buffered_bytes.set(gateway.producer.buffered_bytes())
                self._answer(HTTPStatus.OK, prom.generate_latest(gateway.metrics.registry), prom.CONTENT_TYPE_LATEST)
            else:
                self._answer(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/v1/events":
                self._answer(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"body over {MAX_BODY_BYTES} bytes"})
                return
            body = self.rfile.read(length)
            try:
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                source = None
                if self.headers.get("X-Producer-Id"):
                    source = (self.headers["X-Producer-Id"], int(self.headers.get("X-Producer-Seq", "")))
            except (OSError, EOFError, ValueError) as exc:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": f"unreadable request: {exc}"})
                return
            try:
                status, answer = gateway.ingest(body, self.headers.get("Content-Type", ""), source)
            except Exception as exc:  # storage down, lease lost, flush timed out: the agent retries
                log.warning("batch not made durable: %s", exc)
                status, answer = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not durable: {exc}"}
            self._answer(status, answer)

    return Handler


def serve(gateway: Gateway, host: str, port: int, stop: threading.Event, *, ready=None) -> None:
    """Serve ``gateway`` on ``host:port`` until ``stop`` is set; then flush and release the leases.

    ``ready(server_address)`` is called once the socket listens.
    """
    server = ThreadingHTTPServer((host, port), _handler_for(gateway))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    if ready is not None:
        ready(server.server_address)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        gateway.close()
