"""The dashboard's HTTP server: the page, Plotly's bundle (from the ``plotly`` package: works offline), the JSON API.

Once the lake has tokens, every route but ``/login``, ``/logout`` and
``/healthz`` needs a read token, as a session cookie or an
``Authorization`` header (:mod:`~metrics_lake.app.dashboard.login`).

Routes (JSON errors are ``{"error": message, "parameter": name}``):

- ``GET /`` the dashboard page; ``GET /static/plotly.min.js``;
- ``GET /api/queries``: the stored queries (name, text, description, window,
  step, aggregates, per_server, revision, live, backfilled) and the config store
  version;
- ``GET /api/queries/{name}``: one stored query's definition, status and
  edits (404 if unknown); the config version is its ``ETag``;
- ``PUT /api/queries/{name}`` (JSON ``{"query": …, "description": …}``) adds
  or changes a stored query, ``DELETE /api/queries/{name}`` removes it; both
  need an admin token in ``Authorization: Bearer …`` (``lake tokens create
  --scope admin``, or ``LAKE_ADMIN_TOKEN``): 401 without one, 403 for a
  token of another scope or a lake with no admin credential at all (the
  dashboard is never an open write endpoint). A bad query is a 400 whose error names the clause; an
  ``If-Match: <config version>`` that is not the current one a 412, an
  edit that lost a race a 409 (nothing applied either way);
- ``GET /api/alerts``: the alert rules (with how many of their alerts fire
  or pend), the active alerts and the latest transitions
  (:meth:`~metrics_lake.app.dashboard.reader.DashboardReader.alerts`);
- ``GET /api/alerts/{name}``: one rule, its active alerts and edits;
  ``PUT`` (JSON ``{"rule": …, "description": …}``) and ``DELETE`` as for
  stored queries, admin token and all; a bad rule (or one naming an unknown
  query or aggregate) is a 400 whose error names the clause;
- ``GET /api/servers?select=``: every server's status, ``up``, ``silent`` or
  ``never seen``, with when it was last heard from and its inventory labels
  (:meth:`~metrics_lake.app.dashboard.reader.DashboardReader.servers`);
  ``select`` is the label filter, a selector as in a stored query's FROM
  (``dc=eu-*,role=web``; :mod:`~metrics_lake.core.kernels.selectors`), a
  malformed one a 400;
- ``POST /api/preview`` (JSON ``{"query": …, "from": …, "to": …}``): a query
  text evaluated from the windows without storing it (the form's live
  preview; 400 naming the clause for a bad text);
- ``GET /api/queries/{name}/series?from=&to=&step=&top=&select=``: one query's series
  (:meth:`~metrics_lake.app.dashboard.reader.DashboardReader.series`);
  ``from``/``to`` are ISO-8601 times with a zone or epoch milliseconds
  (default: the last hour), ``step`` seconds (default: the finest that
  keeps a series under 1,500 points), ``select`` the label filter on its
  servers and groups. Unknown query: 404; a malformed or inverted range, a
  bad step or a malformed selector: 400 naming the parameter;
- ``GET /api/pipeline?from=&to=``: consumer lag, quarantine by reason, the
  latest data-quality run;
- ``GET /api/health``: freshness (``stale`` when the newest window is older
  than ``LAKE_QUALITY_FRESHNESS_LAG_SECONDS``), 200 either way;
- ``POST /api/v1/read``: Prometheus remote-read (snappy protobuf, ``SAMPLES``)
  over bronze and the windows (:mod:`~metrics_lake.app.dashboard.remote_read`);
  a bad matcher or body is a 400 in plain text, which Prometheus shows;
- ``/quality/...``: the data-quality docs, when the quality project is local.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from metrics_lake.app.auth import Authenticator, client_address
from metrics_lake.app.dashboard.login import ReadGate
from metrics_lake.app.dashboard.reader import RANGES, DashboardReader
from metrics_lake.app.dashboard.remote_read import RemoteReader
from metrics_lake.app.http_server import TlsFiles, serve_asgi
from metrics_lake.core.config_store import ALERT, QUERY, Change
from metrics_lake.core.kernels.selectors import Selector, parse_selector
from metrics_lake.core.tokens import Scope
from metrics_lake.lake_schemas.errors import (
    AlertRuleError,
    ConfigConflictError,
    NotFoundError,
    RangeError,
    RemoteReadError,
    SelectorError,
    StoredQueryError,
    TokenError,
)

__all__ = ["build_app", "parse_time", "serve"]

PLOTLY_JS = Path(str(resources.files("plotly").joinpath("package_data", "plotly.min.js")))
PAGE = Path(__file__).with_name("page.html")


def parse_time(parameter: str, text: str | None, default: float) -> int:
    """``text`` (ISO-8601 with a zone, or epoch milliseconds) as epoch seconds; ``default`` when absent.

    Raises :class:`RangeError` naming ``parameter`` otherwise.
    """
    if text is None or text == "":
        return int(default)
    if text.lstrip("-").isdigit():
        return int(text) // 1000
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RangeError(parameter, f"{parameter}={text[:40]!r} is neither epoch milliseconds nor ISO-8601") from None
    if moment.tzinfo is None:
        raise RangeError(parameter, f"{parameter}={text[:40]!r} needs a time zone (e.g. Z)")
    return int(moment.timestamp())


def _error(status: int, message: str, parameter: str | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "parameter": parameter}, status_code=status)


def _range(request: Request, reader: DashboardReader) -> tuple[int, int]:
    now = reader.clock()
    hi = parse_time("to", request.query_params.get("to"), now)
    lo = parse_time("from", request.query_params.get("from"), hi - 3600)
    if hi <= lo:
        raise RangeError("from", "from must be before to")
    if hi - lo > 400 * 86_400:
        raise RangeError("from", "a range may span 400 days at most")
    return lo, hi


def _int_param(request: Request, name: str, default: int | None) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit() or int(text) <= 0:
        raise RangeError(name, f"{name} must be a positive whole number")
    return int(text)


#: Largest remote-read request body (bytes, compressed): a request is a few queries of matchers.
MAX_READ_BODY = 1 << 20


def _select_param(request: Request) -> Selector | None:
    """The ``select`` parameter (the label filter) parsed; None if absent or empty."""
    text = (request.query_params.get("select") or "").strip()
    if not text:
        return None
    try:
        return parse_selector(text.replace(" ", ""))
    except SelectorError as exc:
        raise RangeError("select", f"select={text[:80]!r}: {exc}") from None


def build_app(reader: DashboardReader, *, refresh_seconds: int = 10, auth: Authenticator | None = None) -> ReadGate:
    """The dashboard application over ``reader`` behind its :class:`~metrics_lake.app.dashboard.login.ReadGate`;
    ``refresh_seconds`` is the page's default auto-refresh; ``auth`` checks tokens (default: a new
    :class:`~metrics_lake.app.auth.Authenticator` over the reader's store)."""
    page = PAGE.read_text().replace("__REFRESH_SECONDS__", str(refresh_seconds))
    auth = auth or Authenticator(reader.settings, reader.store)

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def plotly_js(request: Request) -> Response:
        return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    async def list_queries(request: Request) -> Response:
        return JSONResponse(
            {
                "queries": [
                    {
                        "name": q.name,
                        "text": q.text,
                        "description": q.description,
                        "metric": q.metric,
                        "window_seconds": q.duration_s,
                        "step_seconds": q.slide_s,
                        "aggregates": [a.label for a in q.aggregates],
                        "per_server": q.per_server,
                        **reader.query_status(q),
                    }
                    for q in reader.queries.values()
                ],
                "ranges": RANGES,
                "config_version": reader.config_version().version,
            }
        )

    async def query_definition(request: Request) -> Response:
        if request.method == "GET":
            return await run_in_threadpool(_definition, reader, request.path_params["name"])
        return await _edit(request, reader, QUERY, auth)

    async def alert_rule(request: Request) -> Response:
        if request.method == "GET":
            return await run_in_threadpool(_rule_definition, reader, request.path_params["name"])
        return await _edit(request, reader, ALERT, auth)

    async def alerts(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(reader.alerts))

    async def servers(request: Request) -> Response:
        try:
            select = _select_param(request)
        except RangeError as exc:
            return _error(400, str(exc), exc.parameter)
        return JSONResponse(await run_in_threadpool(reader.servers, select))

    async def preview(request: Request) -> Response:
        body = await _json_body(request, "query", '{"query": "FROM …", "from": …, "to": …}')
        if isinstance(body, Response):
            return body
        now = reader.clock()
        try:
            hi = parse_time("to", None if body.get("to") is None else str(body["to"]), now)
            lo = parse_time("from", None if body.get("from") is None else str(body["from"]), hi - 3600)
            return JSONResponse(await run_in_threadpool(reader.preview, body["query"], lo, hi))
        except StoredQueryError as exc:
            return _error(400, str(exc), "query")
        except RangeError as exc:
            return _error(400, str(exc), exc.parameter)

    async def query_series(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in reader.queries:
            return _error(404, f"no stored query named {name!r}; GET /api/queries lists them", "name")
        try:
            lo, hi = _range(request, reader)
            step = _int_param(request, "step", None)
            top = _int_param(request, "top", 5)
            select = _select_param(request)
            return JSONResponse(await run_in_threadpool(reader.series, name, lo, hi, step, top, select))
        except RangeError as exc:
            return _error(400, str(exc), exc.parameter)

    async def pipeline(request: Request) -> Response:
        try:
            lo, hi = _range(request, reader)
        except RangeError as exc:
            return _error(400, str(exc), exc.parameter)
        return JSONResponse(await run_in_threadpool(reader.pipeline, lo, hi))

    async def health(request: Request) -> Response:
        facts = await run_in_threadpool(reader.freshness)
        docs = reader.settings.quality_path / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
        return JSONResponse({"status": "stale" if facts["stale"] else "ok", **facts, "quality_docs": docs.exists()})

    remote = RemoteReader(reader)

    async def remote_read(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_READ_BODY:
            return PlainTextResponse(f"a remote-read request is at most {MAX_READ_BODY:,} bytes", status_code=413)
        try:
            answer = await run_in_threadpool(remote.answer, body)
        except RemoteReadError as exc:
            return PlainTextResponse(str(exc), status_code=400)  # Prometheus shows the text in its error
        return Response(answer, media_type="application/x-protobuf", headers={"Content-Encoding": "snappy"})

    routes = [
        Route("/", index),
        Route("/static/plotly.min.js", plotly_js),
        Route("/api/queries", list_queries),
        Route("/api/preview", preview, methods=["POST"]),
        Route("/api/queries/{name}", query_definition, methods=["GET", "PUT", "DELETE"]),
        Route("/api/queries/{name}/series", query_series),
        Route("/api/alerts", alerts),
        Route("/api/alerts/{name}", alert_rule, methods=["GET", "PUT", "DELETE"]),
        Route("/api/servers", servers),
        Route("/api/pipeline", pipeline),
        Route("/api/health", health),
        Route("/api/v1/read", remote_read, methods=["POST"]),
    ]
    site = reader.settings.quality_path / "gx" / "uncommitted" / "data_docs" / "local_site"
    routes.append(Mount("/quality", StaticFiles(directory=site, html=True, check_dir=False)))
    app = Starlette(routes=routes)
    app.state.auth = auth
    return ReadGate(app, auth)


async def _json_body(request: Request, field: str, shape: str) -> dict | Response:
    """The request's JSON object with a string ``field``, or the 400 answer that shows the expected ``shape``."""
    try:
        body = json.loads(await request.body())
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get(field), str):
        return _error(400, f"send a JSON object {shape}", "body")
    return body


#: Per kind of config store entry: the JSON field holding its text, and the body a PUT expects.
_BODIES = {
    QUERY: ("query", '{"query": "FROM …", "description": "…"}'),
    ALERT: ("rule", '{"rule": "<query>.<aggregate> > <number> …", "description": "…"}'),
}


async def _edit(request: Request, reader: DashboardReader, kind: str, auth: Authenticator) -> Response:
    """PUT or DELETE of a stored query or an alert rule (module docstring): admin only, If-Match checked, a bad
    text a 400 naming the clause; answers the definition (200 changed, 201 new) or 204 (deleted)."""
    name = request.path_params["name"]
    denied = await _admin_only(request, auth)
    if denied is not None:
        return denied
    expected = request.headers.get("if-match")
    if expected is not None and not expected.strip('"').isdigit():
        return _error(400, "If-Match must be a config version (the ETag of a GET)", "If-Match")
    if request.method == "PUT":
        field, shape = _BODIES[kind]
        body = await _json_body(request, field, shape)
        if isinstance(body, Response):
            return body
        description = body.get("description")
        change = Change("put", name, body[field], description if isinstance(description, str) else None, kind)
    else:
        change = Change("delete", name, kind=kind)
    by = f"api:{client_address(request)}"
    existed = name in (await run_in_threadpool(reader.config_store.current)).of_kind(kind)
    try:
        version = await run_in_threadpool(
            reader.config_store.apply, [change], by=by, expected=None if expected is None else int(expected.strip('"'))
        )
    except StoredQueryError as exc:
        return _error(400, str(exc), "query")
    except AlertRuleError as exc:
        return _error(400, str(exc), "rule")
    except NotFoundError as exc:
        return _error(404, str(exc), "name")
    except ConfigConflictError as exc:
        return _error(412 if expected is not None else 409, str(exc), "If-Match" if expected else None)
    reader.forget_config()
    if request.method == "DELETE":
        return Response(status_code=204, headers={"ETag": f'"{version.version}"'})
    answer = await run_in_threadpool(_definition if kind == QUERY else _rule_definition, reader, name)
    answer.status_code = 200 if existed else 201
    return answer


async def _admin_only(request: Request, auth: Authenticator) -> Response | None:
    """None if the request's ``Authorization`` header holds an admin token (``lake tokens create --scope admin``
    or ``LAKE_ADMIN_TOKEN``), else the 401/403 answer. Never a cookie: a cross-site form cannot set the header."""
    try:
        await auth.authenticate_request(request, Scope.ADMIN)
    except TokenError as exc:
        return ReadGate.refusal(request, exc)
    return None


def _edits(reader: DashboardReader, name: str, kind: str) -> list[dict]:
    """The config store edits that touched entry ``name`` of ``kind``: version, when, who, what."""
    return [
        {"version": v.version, "at": v.at, "by": v.by, "change": c.describe()}
        for v in reader.config_store.history(name, kind)
        for c in v.changes
        if c.name == name and c.kind == kind
    ]


def _rule_definition(reader: DashboardReader, name: str) -> Response:
    """``GET /api/alerts/{name}``: the rule, its active alerts and the edits that touched it; ETag = config
    version."""
    version = reader.config_version()
    entry = version.rules.get(name)
    if entry is None:
        return _error(404, f"no alert rule named {name!r}; GET /api/alerts lists them", "name")
    rule = entry.rule()
    edits = _edits(reader, name, ALERT)
    body = {
        "name": name,
        "rule": rule.text,
        "kind": rule.kind,
        "description": entry.description,
        "revision": entry.revision,
        "for_seconds": rule.for_s,
        "labels": dict(rule.labels),
        "changed_at": entry.changed_at,
        "changed_by": entry.changed_by,
        "active": [a for a in reader.alerts()["active"] if a["rule"] == name],
        "config_version": version.version,
        "history": edits,
    }
    return JSONResponse(body, headers={"ETag": f'"{version.version}"'})


def _definition(reader: DashboardReader, name: str) -> Response:
    """``GET /api/queries/{name}``: the entry, its status and the edits that touched it; ETag = config version."""
    version = reader.config_version()
    query = reader.queries.get(name)  # the config store's, or the reader's fixed list (tests, benchmarks)
    if query is None:
        return _error(404, f"no stored query named {name!r}; GET /api/queries lists them", "name")
    entry = version.entries.get(name)
    edits = _edits(reader, name, QUERY)
    body = {
        "name": name,
        "query": query.text,
        "description": query.description,
        "changed_at": entry.changed_at if entry else None,
        "changed_by": entry.changed_by if entry else None,
        **reader.query_status(query),
        "config_version": version.version,
        "history": edits,
    }
    return JSONResponse(body, headers={"ETag": f'"{version.version}"'})


def serve(
    reader: DashboardReader,
    host: str,
    port: int,
    stop: threading.Event,
    *,
    refresh_seconds: int = 10,
    ready=None,
    tls: TlsFiles | None = None,
) -> None:
    """Serve the dashboard on ``host:port`` (0: any free port) until ``stop`` is set; ``tls``: over HTTPS.

    ``ready((host, port))`` is called once the socket listens (see
    :func:`~metrics_lake.app.http_server.serve_asgi`).
    """
    auth = Authenticator(reader.settings, reader.store)
    app = build_app(reader, refresh_seconds=refresh_seconds, auth=auth)
    try:
        serve_asgi(app, host, port, stop, name="dashboard-http", ready=ready, tls=tls, timeout_graceful_shutdown=5)
    finally:
        auth.close()
