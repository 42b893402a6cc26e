"""The gateway's ingest endpoints, one per protocol: how each decodes a body and words its answers.

The HTTP mechanics (bounded reads, timeouts, backpressure, group commit)
are the same for all and live in :mod:`~metrics_lake.app.gateway.server`;
an :class:`Endpoint` supplies what differs:

=======================  ======================  =====================================  ===========================
route                    protocol                success                                some points rejected
=======================  ======================  =====================================  ===========================
``POST /v1/events``      the lake's JSON         200 ``{"accepted": n}``                400 with per-event reasons
``POST /v1/metrics``     OTLP/HTTP               200 ``ExportMetricsServiceResponse``   200, ``partial_success``
``POST /api/v1/write``   remote-write 1.0        204                                    400 text (not retried)
``POST /api/v2/write``   InfluxDB v2 line proto  204                                    400 ``{"code", "message"}``
``POST /write``          InfluxDB v1 line proto  204                                    400 ``{"error"}``
=======================  ======================  =====================================  ===========================

Rejected points are always stored for quarantine before the answer; the
valid ones are durable as for a success. Errors that take nothing (400 for
an unreadable request, 401/403 for a refused token, 408, 413, 415, 429,
503) use each protocol's error
body: JSON ``{"error"}``, OTLP's ``google.rpc.Status`` (protobuf or JSON as
the request), plain text for remote-write, InfluxDB's JSON. 429 and 503
carry ``Retry-After`` and are what these clients retry.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from metrics_lake.app.gateway.body import BodyError, records_from_body
from metrics_lake.app.gateway.protocols import Decoded, influx, otlp, remote_write
from metrics_lake.app.gateway.protocols.series_catalog import RecentSeries
from metrics_lake.app.gateway.protocols.temporality import SeriesMemory
from metrics_lake.app.gateway.service import Outcome, events_answer

__all__ = ["Endpoint", "EventsEndpoint", "InfluxEndpoint", "OtlpEndpoint", "RemoteWriteEndpoint", "endpoints"]

#: Reasons quoted in an answer that has no per-point list, at most.
QUOTED_REASONS = 3
# gRPC status codes for OTLP's Status body (https://grpc.github.io/grpc/core/md_doc_statuscodes.html).
_GRPC_CODE = {400: 3, 401: 16, 403: 7, 408: 4, 409: 6, 413: 3, 415: 3, 429: 8, 503: 14}


class Endpoint:
    """One protocol's route. Subclasses set ``path``/``protocol`` and override what differs from the JSON API.

    ``passthrough``: ``Content-Encoding`` values the decoder handles itself
    (snappy for remote-write), kept compressed by the HTTP layer.
    ``retried_whole``: the protocol's senders retry a failed request with
    the same body and carry no sequence number, and the same body can only
    mean the same points (they carry their timestamps): the gateway then
    appends a body's points once per token however often it arrives within
    ``gateway_request_window_seconds`` (:meth:`~metrics_lake.app.gateway.service.Gateway.accept_records`).
    """

    path = ""
    protocol = ""
    passthrough: tuple[str, ...] = ()
    retried_whole = False

    def options(self, request: Request) -> dict:
        """Query parameters the decoder needs, read before the body; :class:`BodyError` (400) if malformed."""
        return {}

    def decode(self, body: bytes, content_type: str, options: dict, limit: int) -> Decoded:
        """The body's log records; runs on a worker thread; never raises for bad input but :class:`BodyError`."""
        raise NotImplementedError

    def success(self, outcome: Outcome, decoded: Decoded, request: Request) -> Response:
        """The answer once everything is durable (rejected points stored for quarantine)."""
        raise NotImplementedError

    def error(self, status: int, message: str, request: Request) -> Response:
        """The answer to a request of which nothing was taken."""
        return JSONResponse({"error": message}, status_code=int(status))


def _summary(outcome: Outcome) -> str:
    """'N points rejected: reason; reason...' with the first few distinct reasons."""
    reasons = list(dict.fromkeys(reason for _, reason in outcome.errors))
    more = f" (+{len(reasons) - QUOTED_REASONS} more reasons)" if len(reasons) > QUOTED_REASONS else ""
    return f"{len(outcome.errors)} points rejected and quarantined: {'; '.join(reasons[:QUOTED_REASONS])}{more}"


class EventsEndpoint(Endpoint):
    """``POST /v1/events``: the lake's JSON events (see :mod:`metrics_lake.app.gateway`)."""

    path, protocol = "/v1/events", "json"

    def decode(self, body, content_type, options, limit):  # noqa: D102
        return Decoded(records_from_body(body, content_type))

    def success(self, outcome, decoded, request):  # noqa: D102
        status, answer = events_answer(outcome)
        return JSONResponse(answer, status_code=int(status))


class OtlpEndpoint(Endpoint):
    """``POST /v1/metrics``: OTLP/HTTP (:mod:`~.protocols.otlp`); the series memory lives as long as the gateway."""

    path, protocol = "/v1/metrics", "otlp"

    def __init__(self) -> None:
        self.memory = SeriesMemory()
        self.recent = RecentSeries()

    def decode(self, body, content_type, options, limit):  # noqa: D102
        return otlp.decode(body, content_type, self.memory, self.recent)

    def success(self, outcome, decoded, request):  # noqa: D102
        content_type = request.headers.get("content-type", "")
        if decoded.unreadable:  # OTLP: a body that cannot be decoded is a 400, not retried (it was quarantined)
            return self.error(HTTPStatus.BAD_REQUEST, decoded.unreadable, request)
        message = _summary(outcome) if outcome.errors else ""
        body, media_type = otlp.response_body(len(outcome.errors), message, content_type)
        return Response(body, media_type=media_type)

    def error(self, status, message, request):  # noqa: D102
        status_message = Status(code=_GRPC_CODE.get(int(status), 2), message=message)
        if otlp.is_json(request.headers.get("content-type", "")):
            body = json_format.MessageToJson(status_message, indent=None)
            return Response(body, status_code=int(status), media_type=otlp.JSON_TYPE)
        return Response(status_message.SerializeToString(), status_code=int(status), media_type=otlp.PROTOBUF_TYPE)


class RemoteWriteEndpoint(Endpoint):
    """``POST /api/v1/write``: Prometheus remote-write 1.0 (:mod:`~.protocols.remote_write`)."""

    path, protocol = "/api/v1/write", "remote_write"
    passthrough = ("snappy",)
    retried_whole = True  # Prometheus resends a batch on 5xx, 429 and lost connections; samples carry timestamps

    def __init__(self) -> None:
        self.decoder = remote_write.Decoder()

    def options(self, request):  # noqa: D102
        content_type = request.headers.get("content-type", "")
        if "proto=io.prometheus.write.v2" in content_type.replace(" ", ""):  # 2.0 receivers answer this way
            raise BodyError(415, "remote-write 2.0 is not supported; send remote-write 1.0 (protobuf_message v1)")
        encoding = request.headers.get("content-encoding", "snappy").strip().lower()
        if encoding != "snappy":
            raise BodyError(415, f"remote-write bodies are snappy-compressed, not {encoding!r}")
        return {}

    def decode(self, body, content_type, options, limit):  # noqa: D102
        try:
            return self.decoder.decode(body, limit)
        except remote_write.SnappyTooLarge as exc:
            raise BodyError(413, str(exc)) from None

    def success(self, outcome, decoded, request):  # noqa: D102
        if outcome.errors:
            return PlainTextResponse(_summary(outcome), status_code=400)
        return Response(status_code=204)

    def error(self, status, message, request):  # noqa: D102
        return PlainTextResponse(message, status_code=int(status))


class InfluxEndpoint(Endpoint):
    """``POST /api/v2/write`` (``version=2``) or ``POST /write`` (v1): line protocol (:mod:`~.protocols.influx`)."""

    protocol = "influx"

    def __init__(self, version: int) -> None:
        self.version = version
        self.recent = RecentSeries()
        self.path = "/api/v2/write" if version == 2 else "/write"

    def options(self, request):  # noqa: D102
        try:
            return {"precision": influx.precision_divisor(request.query_params.get("precision"))}
        except ValueError as exc:
            raise BodyError(400, str(exc)) from None

    def decode(self, body, content_type, options, limit):  # noqa: D102
        return influx.decode(body, options["precision"], recent=self.recent)

    def success(self, outcome, decoded, request):  # noqa: D102
        if outcome.errors:
            return self.error(HTTPStatus.BAD_REQUEST, f"partial write: {_summary(outcome)}", request)
        return Response(status_code=204)

    def error(self, status, message, request):  # noqa: D102
        if self.version == 1:
            return JSONResponse({"error": message}, status_code=int(status))
        code = {
            400: "invalid",
            401: "unauthorized",
            403: "forbidden",
            413: "request too large",
            429: "too many requests",
            503: "unavailable",
        }
        return Response(
            json.dumps({"code": code.get(int(status), "internal error"), "message": message}),
            status_code=int(status),
            media_type="application/json; charset=utf-8",
        )


def endpoints() -> list[Endpoint]:
    """A fresh set of the gateway's ingest endpoints (each with its own per-series state)."""
    return [EventsEndpoint(), OtlpEndpoint(), RemoteWriteEndpoint(), InfluxEndpoint(2), InfluxEndpoint(1)]
