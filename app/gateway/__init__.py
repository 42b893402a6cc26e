"""``lake gateway``: the ingest server between agents and the log.

HTTP API (all answers are JSON, except ``/metrics``):

``POST /v1/events``
    Body: a JSON array of events, or NDJSON (one event per line, split on
    ``\\n`` only; used when the body does not start with ``[`` or
    ``Content-Type`` is ``application/x-ndjson``), optionally
    ``Content-Encoding: gzip`` (or ``deflate``), with a ``Content-Length``
    or chunked. Headers ``X-Producer-Id`` and ``X-Producer-Seq`` (an agent's
    id and a per-agent sequence number, increasing by batch) make a retried
    request idempotent: a batch already durable, or already buffered, is not
    appended again (the answer then says ``"duplicate": true``).

    - ``200 {"accepted": n}``: every event is durable in the log (the
      segment holding it is committed), so it will not be lost.
    - ``400 {"accepted": n, "rejected": m, "errors": [{"index": i,
      "reason": "..."}]}``: the invalid events went to the log as rejects
      (and so to ``quarantine_events``, raw payload kept up to
      :data:`~metrics_lake.lake_schemas.contract.MAX_RAW_BYTES`); the valid ones
      are durable as for 200. Also ``400 {"error"}`` for a request that
      cannot be read (malformed headers, a corrupt or truncated compressed
      body): nothing of it was taken. Do not retry a 400.
    - ``401``: no token, or a malformed, unknown, wrong, expired or revoked
      one, once the lake has tokens (:mod:`metrics_lake.app.auth`);
      ``403``: a token of another scope, or a request whose every event
      is for a server outside the token's ``--servers`` glob (they are
      quarantined as ``forbidden_server``; in a mixed request only those
      are). Nothing of a 401 or a scope 403 is stored.
    - ``408``: the body did not arrive within the request timeout.
    - ``409``: this producer id already sent this sequence with another
      body (or one too old to check); nothing of it was stored. Send new
      batches with new sequence numbers.
    - ``413``: body over ``LAKE_GATEWAY_MAX_BODY_BYTES``, received or
      decompressed. ``415``: an unsupported ``Content-Encoding``.
    - ``429`` + ``Retry-After``: the gateway's buffer is full (backpressure),
      the token is over its ingestion rate (nothing stored), or the client's
      address sent too many bad credentials.
    - ``503`` + ``Retry-After``: the batch could not be made durable in
      time (object store down, partition lease lost), or too many
      connections; retry the same request (same producer id and sequence).

``POST /v1/metrics``, ``POST /api/v1/write``, ``POST /api/v2/write``, ``POST /write``
    OTLP/HTTP, Prometheus remote-write 1.0 and InfluxDB line protocol (v2
    and v1), through the same bounded reads, group commit and quarantine;
    answers in each protocol's terms (:mod:`~metrics_lake.app.gateway.endpoints`),
    decoders in :mod:`~metrics_lake.app.gateway.protocols`.

``GET /healthz``: 200 with the partitions this gateway owns, 503 if none.
``GET /metrics`` (a read token once the lake has tokens; both also on the
credential-free ``--ops-port``): Prometheus text format (events accepted/rejected/duplicate,
requests by status, body-received-to-durable-ack latency, flush latency,
segment sizes, buffered bytes, requests received and not yet answered).

A gateway owns a set of partitions through their leases
(:mod:`metrics_lake.core.leases`) and routes every event to one of them
(CRC-32 of the server over the owned partitions), so several gateways can
run side by side on disjoint partitions; retries are recognised per
gateway's partitions, so an agent should keep sending to the same gateway.
Records are batched per partition (group commit): a batch is flushed once no
other request is on its way to the buffer, after at most ``linger_ms``
otherwise, or at ``roll_bytes`` (the producer's ``flush_when_idle``): a lone
sender waits for no linger, and under load many requests share one segment,
which keeps objects large and the PUT rate low.

Modules: :mod:`~metrics_lake.app.gateway.body` (bounded decoding, events
from a body), :mod:`~metrics_lake.app.gateway.service` (validation,
idempotence, answers), :mod:`~metrics_lake.app.gateway.endpoints` (one per
protocol), :mod:`~metrics_lake.app.gateway.protocols` (their decoders),
:mod:`~metrics_lake.app.gateway.server` (HTTP).
"""

from metrics_lake.app.gateway.server import build_app, serve
from metrics_lake.app.gateway.service import Gateway, GatewayMetrics

__all__ = ["Gateway", "GatewayMetrics", "build_app", "serve"]
