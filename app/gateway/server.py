"""The gateway's HTTP server: a Starlette app on uvicorn (httptools, uvloop when installed).

uvicorn parses HTTP/1.1 (keep-alive, chunked bodies, malformed framing
answered 400 and the connection closed) and bounds open connections
(``LAKE_GATEWAY_MAX_CONNECTIONS``, 503 above it). This module adds what an
ingest endpoint exposed to many agents needs on top:

- the body is read as a stream into a :class:`~metrics_lake.app.gateway.body.BodyDecoder`,
  refused with 413 once the received or the decompressed bytes pass
  ``LAKE_GATEWAY_MAX_BODY_BYTES`` (a declared ``Content-Length`` over it is
  refused before reading), and the connection is closed after it;
- a request must arrive whole within ``LAKE_GATEWAY_REQUEST_TIMEOUT_SECONDS``:
  headers (:class:`HeaderDeadlineProtocol`, which uvicorn lacks) and body
  (408), so slow or abandoned clients do not hold connections forever; an
  idle keep-alive connection is closed after ``LAKE_GATEWAY_IDLE_TIMEOUT_SECONDS``;
- validation runs on a small thread pool (Arrow releases the GIL), and the
  wait for the group commit is a callback, not a blocked thread;
- the caller's token is checked before the body is read
  (:mod:`metrics_lake.app.auth`), its ingestion limit before and after
  decoding (the events counted), and events of servers outside its glob
  are quarantined (:func:`~metrics_lake.app.gateway.service.forbid_servers`);
- a client that half-closes before its body is complete gets a 400
  (:meth:`HeaderDeadlineProtocol.eof_received`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from http import HTTPStatus

import prometheus_client as prom
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from metrics_lake.app.auth import Caller
from metrics_lake.app.gateway.body import BodyDecoder, BodyError
from metrics_lake.app.gateway.endpoints import Endpoint, endpoints
from metrics_lake.app.gateway.protocols import Decoded
from metrics_lake.app.gateway.service import Accepted, Gateway, forbid_servers
from metrics_lake.app.http_server import TlsFiles, serve_asgi
from metrics_lake.core.tokens import Scope
from metrics_lake.lake_schemas.errors import SequenceConflictError, TokenError

__all__ = ["HeaderDeadlineProtocol", "build_app", "serve"]

log = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
#: Threads validating request bodies at once (each holds one decoded body). Decoding holds the GIL about half
#: the time, so more threads only take turns: with 32 remote-write senders two took 242-261 k samples/s, three
#: 238-245 k and four 226-229 k (bench/ingest_protocols.py, 2026-11-29, one flush thread, three runs each).
VALIDATION_THREADS = 2
#: Largest inventory change accepted (one server's labels: at most 30 of 1 KiB values, with room to spare).
MAX_INVENTORY_BODY = 64 * 1024


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request headers take longer than ``header_timeout`` s,
    and closing lingeringly after a malformed request.

    uvicorn times out idle keep-alive connections but not a client that
    connects and sends nothing, or sends its headers a byte at a time
    (slowloris). The deadline starts when the connection opens and when a
    request's first byte arrives, and ends when its headers are complete.

    On malformed framing (say ``Content-Length: abc``) uvicorn answers 400
    and closes at once; a client still sending its body then gets a TCP
    reset that can destroy the unread answer. Like nginx's
    ``lingering_close``, the 400 is sent, the write side shut, and what the
    client still sends is read and dropped for up to ``linger_seconds`` or
    ``linger_bytes`` before the connection closes.
    """

    header_timeout = 30.0
    linger_seconds = 2.0
    linger_bytes = 64 << 20

    def connection_made(self, transport) -> None:  # noqa: D102 (asyncio.Protocol API)
        super().connection_made(transport)
        self._lingering: int | None = None  # bytes dropped since the 400, once lingering
        self._deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def data_received(self, data: bytes) -> None:  # noqa: D102 (asyncio.Protocol API)
        if self._lingering is None:
            super().data_received(data)
            return
        self._lingering += len(data)
        if self._lingering > self.linger_bytes:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:  # noqa: D102 (uvicorn's answer to a parse error)
        body = msg.encode("ascii", errors="replace")
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self._cancel_deadline()
        if self._lingering is not None or not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = 0
        self.transport.write_eof()
        self.loop.call_later(self.linger_seconds, self.transport.close)

    def eof_received(self) -> None:
        """The client half-closed: a request whose body has not all arrived is answered 400 before closing.

        uvicorn closes without an answer (the app sees a disconnect and
        its response goes nowhere), so a client that sent fewer bytes than
        its ``Content-Length`` and shut its write side waits for nothing.
        """
        cycle = self.cycle
        if cycle is None or cycle.response_started or cycle.response_complete or not cycle.more_body:
            return
        body = b"the request body ended before its Content-Length; nothing of it was taken"
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        cycle.disconnected = True  # the app's receive() now says so, and its answer is dropped
        cycle.message_event.set()

    def on_message_begin(self) -> None:  # noqa: D102 (httptools callback)
        super().on_message_begin()
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def on_headers_complete(self) -> None:  # noqa: D102 (httptools callback)
        self._cancel_deadline()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:  # noqa: D102 (asyncio.Protocol API)
        self._cancel_deadline()
        super().connection_lost(exc)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        log.info("closing a connection whose request headers took over %.0f s", self.header_timeout)
        self.transport.close()


def _producer_of(request: Request) -> tuple[str, int] | None:
    """(producer id, sequence) from ``X-Producer-Id``/``X-Producer-Seq``; :class:`BodyError` (400) if malformed."""
    producer_id, seq = request.headers.get("x-producer-id"), request.headers.get("x-producer-seq")
    if producer_id is None and seq is None:
        return None
    if not producer_id or len(producer_id) > 256 or not producer_id.isprintable():
        raise BodyError(400, "X-Producer-Id must be 1-256 printable characters")
    if seq is None or not seq.isascii() or not seq.isdigit() or len(seq) > 19:
        raise BodyError(400, "X-Producer-Seq must be a non-negative integer below 2**63 sent with X-Producer-Id")
    return producer_id, int(seq)


def _declared_length(request: Request) -> int | None:
    """The ``Content-Length`` header as an int; :class:`BodyError` (400) unless it is a plain non-negative integer."""
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise BodyError(400, f"Content-Length {value[:40]!r} is not a non-negative integer")
    return int(value)


class _Ingest:
    """The ingest endpoints (:mod:`~metrics_lake.app.gateway.endpoints`) over one :class:`Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.settings = gateway.settings
        self.limit = gateway.settings.gateway_max_body_bytes
        self.pool = ThreadPoolExecutor(max_workers=VALIDATION_THREADS, thread_name_prefix="validate")
        self.receiving = 0  # decoded bytes of bodies being received, counted against the buffer limit

    def answer(
        self, response: Response, *, close: bool = False, caller: Caller | None = None, retry_after: float = 0
    ) -> Response:
        """``response`` with ``Retry-After`` on 429/503 and ``Connection: close`` if ``close``; counted by status
        (and by ``caller``'s token when known). ``retry_after``: seconds, rounded up (default 1)."""
        status = response.status_code
        if status in (HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.SERVICE_UNAVAILABLE):
            response.headers["Retry-After"] = str(max(RETRY_AFTER_SECONDS, math.ceil(retry_after)))
        if status == HTTPStatus.UNAUTHORIZED:
            response.headers["WWW-Authenticate"] = 'Bearer realm="metrics-lake"'
        if close:  # the rest of the body was not read: the connection cannot carry another request
            response.headers["Connection"] = "close"
        self.gateway.metrics.requests.labels(code=str(status)).inc()
        if caller is not None:
            self.gateway.metrics.token_requests.labels(token=caller.name, code=str(status)).inc()
        return response

    def route(self, endpoint: Endpoint) -> Route:
        """The Starlette route of ``endpoint``."""

        async def post(request: Request) -> Response:
            return await self.post(request, endpoint)

        return Route(endpoint.path, post, methods=["POST"])

    async def post(self, request: Request, endpoint: Endpoint) -> Response:
        """Authenticate, read, decode, limit, buffer and answer one request to ``endpoint``."""
        caller: Caller | None = None

        def fail(status: int, message: str, *, close: bool = False, retry_after: float = 0) -> Response:
            response = endpoint.error(status, message, request)
            return self.answer(response, close=close, caller=caller, retry_after=retry_after)

        declared, received = None, _Received()
        try:
            declared = _declared_length(request)
            if declared is not None and declared > self.limit:
                raise BodyError(413, f"body over {self.limit:,} bytes; send smaller batches")
            caller = await self.gateway.auth.authenticate_request(
                request, Scope.WRITE, _query_password(request, endpoint)
            )
            wait = self.gateway.limit_wait(caller, 0)
            if wait:
                raise _Limited(wait, f"token {caller.name!r} is over its ingestion rate; retry in {wait:.1f} s")
            producer = _producer_of(request)
            options = endpoint.options(request)
            if self.gateway.buffer_full(self.receiving):
                drained = await self._drain(request, received)
                return fail(HTTPStatus.TOO_MANY_REQUESTS, "gateway buffer full, retry later", close=not drained)
            encoding = request.headers.get("content-encoding", "")
            if encoding.strip().lower() in endpoint.passthrough:
                encoding = ""
            decoder = BodyDecoder(encoding, self.limit)
            body = await self._read(request, decoder, received)
        except (BodyError, TokenError, _Limited) as exc:
            drained = (declared is None or declared <= 2 * self.limit) and await self._drain(request, received)
            wait = getattr(exc, "retry_after", None) or 0
            return fail(exc.status, str(exc), close=not drained, retry_after=wait)
        except TimeoutError:
            timeout = self.settings.gateway_request_timeout_seconds
            return fail(HTTPStatus.REQUEST_TIMEOUT, f"body not received within {timeout:g} s", close=True)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it; the events were not taken
        with self.gateway.metrics.pending_requests.track_inprogress():
            return await self._ingest(request, endpoint, caller, producer, options, body, fail)

    async def _ingest(
        self,
        request: Request,
        endpoint: Endpoint,
        caller: Caller,
        producer: tuple[str, int] | None,
        options: dict,
        body: bytes,
        fail: Callable[..., Response],
    ) -> Response:
        """Decode, limit, buffer and answer ``body``, which :meth:`post` received whole for ``endpoint`` from
        ``caller`` (``producer``: its id and sequence, if sent; ``options``: the endpoint's; ``fail(status,
        message)``: the error answer)."""
        loop = asyncio.get_running_loop()
        content_type = request.headers.get("content-type", "")
        started = time.monotonic()

        def accept() -> tuple[Decoded, int, Accepted]:
            decoded = endpoint.decode(body, content_type, options, self.limit)
            records, forbidden = forbid_servers(decoded.records, caller)
            wait = self.gateway.limit_wait(caller, records.num_rows)
            if wait:
                self.gateway.metrics.token_events.labels(token=caller.name, outcome="limited").inc(records.num_rows)
                raise _Limited(wait, f"{records.num_rows:,} events are over token {caller.name!r}'s ingestion rate")
            self.gateway.metrics.skipped.labels(protocol=endpoint.protocol).inc(decoded.skipped)
            decoded = dataclasses.replace(decoded, records=records)
            retried_by = caller.name if endpoint.retried_whole else None
            accepted = self.gateway.accept_records(records, body, producer, started=started, retried_by=retried_by)
            return decoded, forbidden, accepted

        try:
            with self.gateway.producer.incoming():  # its records are on their way: the group commit waits for them
                decoded, forbidden, accepted = await loop.run_in_executor(self.pool, accept)
        except (BodyError, _Limited) as exc:  # found while decoding (a snappy body declaring too many bytes)
            return fail(exc.status, str(exc), retry_after=getattr(exc, "retry_after", 0))
        except SequenceConflictError as exc:
            return fail(HTTPStatus.CONFLICT, str(exc))
        except Exception as exc:  # an inline flush failed: the records stay pending, a retry finds them
            log.warning("batch not made durable: %s", exc)
            return fail(HTTPStatus.SERVICE_UNAVAILABLE, f"not durable: {exc}")
        if not await _all_done(accepted.sent.futures, self.settings.gateway_ack_timeout_seconds):
            return fail(HTTPStatus.SERVICE_UNAVAILABLE, "batch not durable in time; retry it")
        try:
            outcome = self.gateway.settle(accepted)
        except Exception as exc:  # storage down, lease lost: the client retries (with the same sequence)
            log.warning("batch not made durable: %s", exc)
            return fail(HTTPStatus.SERVICE_UNAVAILABLE, f"not durable: {exc}")
        counts = self.gateway.metrics.token_events
        counts.labels(token=caller.name, outcome="accepted").inc(outcome.accepted)
        counts.labels(token=caller.name, outcome="rejected").inc(len(outcome.errors))
        if forbidden and forbidden == decoded.records.num_rows:  # every event was another server's
            return fail(HTTPStatus.FORBIDDEN, f"{forbidden} events quarantined: {outcome.errors[0][1]}")
        return self.answer(endpoint.success(outcome, decoded, request), caller=caller)

    async def _read(self, request: Request, decoder: BodyDecoder, received: _Received) -> bytes:
        """The decoded body, within the request timeout; its bytes count against the buffer while read.

        Reads the ASGI messages itself (not ``request.stream()``), so a body
        refused half-way can still be drained by :meth:`_drain`.
        """
        counted = 0
        try:
            async with asyncio.timeout(self.settings.gateway_request_timeout_seconds):
                while not received.ended:
                    decoder.feed(await received.next(request))
                    self.receiving += decoder.decoded_bytes - counted
                    counted = decoder.decoded_bytes
            return decoder.finish()
        finally:
            self.receiving -= counted

    async def _drain(self, request: Request, received: _Received) -> bool:
        """Read and discard the rest of a refused body, up to twice the limit; True if it ended.

        A client still sending when the server closes gets a reset and may
        never see the answer (what nginx's "lingering close" avoids); once
        drained, the connection can even be kept.
        """
        discarded = 0
        try:
            async with asyncio.timeout(self.settings.gateway_request_timeout_seconds):
                while not received.ended:
                    discarded += len(await received.next(request))
                    if discarded > 2 * self.limit:
                        return False
        except (TimeoutError, ClientDisconnect):
            return False
        return True


class _Limited(Exception):
    """A request over its token's ingestion rate: answered 429 with ``Retry-After`` (``retry_after`` s)."""

    status = HTTPStatus.TOO_MANY_REQUESTS

    def __init__(self, retry_after: float, message: str) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _query_password(request: Request, endpoint: Endpoint) -> str | None:
    """The InfluxDB 1.x ``p`` query parameter of ``/write`` (its clients' way to send a token), else None."""
    return request.query_params.get("p") if endpoint.path == "/write" else None


class _Received:
    """Where a request's body stands: ``ended`` once its last ASGI message arrived."""

    def __init__(self) -> None:
        self.ended = False

    async def next(self, request: Request) -> bytes:
        """The next chunk of the body; :class:`ClientDisconnect` if the client went away."""
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        self.ended = not message.get("more_body", False)
        return message.get("body", b"")


async def _all_done(futures: list[Future], timeout: float) -> bool:
    """Wait until every (thread) future is done, or ``timeout`` s; True if all are done.

    The futures are shared by every request of a group commit, so they are
    watched through callbacks and never cancelled here (``asyncio.wrap_future``
    would cancel them when this wait is).
    """
    pending = [f for f in futures if not f.done()]
    if not pending:
        return True
    loop = asyncio.get_running_loop()
    watchers = []
    for future in pending:
        watcher = loop.create_future()
        future.add_done_callback(lambda _, w=watcher: _settle_from_thread(loop, w))
        watchers.append(watcher)
    _, not_done = await asyncio.wait(watchers, timeout=timeout)
    return not not_done


def _settle_from_thread(loop: asyncio.AbstractEventLoop, watcher: asyncio.Future) -> None:
    """Mark ``watcher`` done on ``loop`` from a flush thread; nothing if the server has stopped since."""
    if not loop.is_closed():  # a flush finishing after shutdown has no request left to answer
        try:
            loop.call_soon_threadsafe(_settle, watcher)
        except RuntimeError:  # closed between the check and the call
            pass


def _settle(watcher: asyncio.Future) -> None:
    if not watcher.done():
        watcher.set_result(None)


def build_app(gateway: Gateway) -> Starlette:
    """The Starlette app: the ingest endpoints (:func:`~metrics_lake.app.gateway.endpoints.endpoints`, a write
        token), ``PUT``/``DELETE /v1/inventory/{server}`` (:meth:`Gateway.change_inventory`, a write token for
    that server),
        ``GET /healthz`` (open), ``GET /metrics`` (a read token once the lake has tokens); other paths 404/405 in JSON."""
    ingest = _Ingest(gateway)

    async def refused(request: Request, needed: Scope, server: str | None = None) -> Response | None:
        """None if the request's token allows ``needed`` (for ``server``), else the JSON 401/403/429 answer."""
        try:
            caller = await gateway.auth.authenticate_request(request, needed)
            if server is not None and not caller.may_write(server):
                raise TokenError(403, f"token {caller.name!r} may not change server {server[:128]!r}")
        except TokenError as exc:
            answer = JSONResponse({"error": str(exc)}, status_code=exc.status)
            return ingest.answer(answer, retry_after=exc.retry_after or 0)
        return None

    async def health(request: Request) -> Response:
        status, body = gateway.health()
        return ingest.answer(JSONResponse(body, status_code=int(status)))

    async def metrics(request: Request) -> Response:
        if gateway.auth.enabled and (denied := await refused(request, Scope.READ)) is not None:
            return denied
        return _metrics_text(gateway)

    async def inventory(request: Request) -> Response:
        server = request.path_params["server"]
        body = None
        if (denied := await refused(request, Scope.WRITE, server)) is not None:
            return denied
        if request.method == "PUT":
            declared = _declared_length(request)
            if declared is not None and declared > MAX_INVENTORY_BODY:
                return ingest.answer(JSONResponse({"error": "body over 64 KiB"}, status_code=413), close=True)
            body = await request.body()
            if len(body) > MAX_INVENTORY_BODY:
                return ingest.answer(JSONResponse({"error": "body over 64 KiB"}, status_code=413))
        loop = asyncio.get_running_loop()
        status, answer = await loop.run_in_executor(ingest.pool, gateway.change_inventory, server, body)
        return ingest.answer(JSONResponse(answer, status_code=int(status)))

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return ingest.answer(
            JSONResponse({"error": f"{exc.detail}: {request.method} {request.url.path}"}, status_code=exc.status_code)
        )

    app = Starlette(
        routes=[
            *(ingest.route(endpoint) for endpoint in endpoints()),
            Route("/v1/inventory/{server}", inventory, methods=["PUT", "DELETE"]),
            Route("/healthz", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.pool = ingest.pool
    return app


def _metrics_text(gateway: Gateway) -> Response:
    gateway.metrics.buffered_bytes.set(gateway.producer.buffered_bytes())
    return Response(prom.generate_latest(gateway.metrics.registry), media_type=prom.CONTENT_TYPE_LATEST)


def build_ops_app(gateway: Gateway) -> Starlette:
    """``GET /healthz`` and ``GET /metrics`` without credentials, for the ops listener (probes, Prometheus)."""

    async def health(request: Request) -> Response:
        status, body = gateway.health()
        return JSONResponse(body, status_code=int(status))

    async def metrics(request: Request) -> Response:
        return _metrics_text(gateway)

    return Starlette(routes=[Route("/healthz", health), Route("/metrics", metrics)])


def serve(
    gateway: Gateway,
    host: str,
    port: int,
    stop: threading.Event,
    *,
    ready=None,
    otlp_port: int | None = None,
    tls: TlsFiles | None = None,
    ops: tuple[str, int] | None = None,
    ops_ready=None,
) -> None:
    """Serve ``gateway`` on ``host:port`` until ``stop`` is set; then flush and release the leases.

    ``otlp_port``: also listen there (OTLP/HTTP's conventional port is 4318;
    every route is served on both ports). ``tls``: serve HTTPS (both
    ports). ``ops``: ``(host, port)`` of a plain-HTTP listener serving only
    :func:`build_ops_app` (``ops_ready((host, port))`` once it listens).

    ``ready((host, port))`` is called once the socket listens (``port`` 0
    picks a free port). uvicorn runs on its own thread and event loop, so
    the caller keeps its signal handlers (``lake gateway`` sets ``stop`` on
    SIGINT/SIGTERM); requests in flight are answered before it returns.
    """
    settings = gateway.settings
    app = build_app(gateway)
    protocol = type("Protocol", (HeaderDeadlineProtocol,), {"header_timeout": settings.gateway_request_timeout_seconds})
    ops_thread = None
    if ops is not None:
        ops_thread = threading.Thread(
            target=serve_asgi,
            args=(build_ops_app(gateway), *ops, stop),
            kwargs={"name": "gateway-ops", "ready": ops_ready, "timeout_graceful_shutdown": 2},
            name="gateway-ops",
            daemon=True,
        )
        ops_thread.start()
    try:
        serve_asgi(
            app,
            host,
            port,
            stop,
            name="gateway-http",
            ready=ready,
            extra_ports=() if otlp_port is None else (otlp_port,),
            tls=tls,
            http=protocol,
            loop="auto",
            timeout_keep_alive=int(settings.gateway_idle_timeout_seconds),
            limit_concurrency=settings.gateway_max_connections,
            timeout_graceful_shutdown=int(settings.gateway_ack_timeout_seconds) + 1,
        )
    finally:
        stop.set()
        if ops_thread is not None:
            ops_thread.join()
        app.state.pool.shutdown()
        gateway.close()
