"""The dashboard's door: once the lake has tokens, every page and API call needs a read (or admin) token.

A browser signs in at ``/login`` with its token and gets a session cookie
(``lake_session``: a random id the server maps to the token's id, never
the token itself; ``HttpOnly``, ``SameSite=Strict``, ``Secure`` over
HTTPS; 12 hours). API clients send ``Authorization: Bearer <token>`` on
every call instead. A session is checked against the token's current
record on every request, so revoking the token ends its sessions within
the token list's refresh (:class:`~metrics_lake.app.auth.Authenticator`).
``/login``, ``/logout`` and ``/healthz`` stay open. The write endpoints
additionally need an admin token in the ``Authorization`` header, never
a cookie (a cross-site form cannot send that header: no CSRF).
"""

from __future__ import annotations

import html
import math
import secrets
import time
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from metrics_lake.app.auth import Authenticator, Caller, client_address
from metrics_lake.core.tokens import Scope
from metrics_lake.lake_schemas.errors import TokenError

__all__ = ["COOKIE", "ReadGate"]

COOKIE = "lake_session"
SESSION_SECONDS = 12 * 3600
#: Paths served without a token.
OPEN_PATHS = frozenset({"/login", "/logout", "/healthz"})
_ADMIN_SESSION = "LAKE_ADMIN_TOKEN"  # a session opened with the bootstrap admin token (it has no record)

_FORM = """<!doctype html><html><head><meta charset="utf-8"><title>metrics-lake: sign in</title>
<style>body{{font-family:system-ui,sans-serif;margin:4em auto;max-width:28em}}input{{width:100%;padding:.4em}}
.error{{color:#b00}}</style></head><body><h1>metrics-lake dashboard</h1>
<p>Sign in with a read or admin token (<code>lake tokens create --scope read</code>).</p>{error}
<form method="post" action="/login"><label>token <input name="token" type="password" autocomplete="off" autofocus>
</label><p><button type="submit">sign in</button></p></form></body></html>"""


class ReadGate:
    """ASGI middleware in front of the dashboard app (module docstring); ``sessions`` maps cookie ids to
    ``(token id, expiry epoch s)``."""

    def __init__(self, app, auth: Authenticator) -> None:
        self.app, self.auth = app, auth
        self.sessions: dict[str, tuple[str, float]] = {}

    async def __call__(self, scope, receive, send) -> None:  # noqa: D102 (ASGI)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in OPEN_PATHS:
            request = Request(scope, receive)
            response = await {"/login": self.login, "/logout": self.logout, "/healthz": _healthz}[path](request)
            return await response(scope, receive, send)
        if self.auth.enabled:
            request = Request(scope, receive)
            try:
                await self.caller(request, Scope.READ)
            except TokenError as exc:
                return await self.refusal(request, exc)(scope, receive, send)
        return await self.app(scope, receive, send)

    async def caller(self, request: Request, needed: Scope) -> Caller:
        """The caller of ``request`` by its ``Authorization`` header or its session cookie; raises TokenError."""
        if request.headers.get("authorization") is not None or COOKIE not in request.cookies:
            return await self.auth.authenticate_request(request, needed)
        token_id, expires = self.sessions.get(request.cookies[COOKIE], ("", 0.0))
        if expires < time.time():
            self.sessions.pop(request.cookies[COOKIE], None)
            raise TokenError(401, "the session expired or is unknown; sign in again at /login")
        if token_id == _ADMIN_SESSION:
            return Caller(_ADMIN_SESSION, Scope.ADMIN)
        record = self.auth.records.get(token_id)
        if record is None:
            raise TokenError(401, "the session's token no longer exists; sign in again at /login")
        return self.auth.check(record, client_address(request), needed)

    @staticmethod
    def refusal(request: Request, exc: TokenError) -> Response:
        """A browser asking for the page is sent to /login; API calls get a JSON 401/403/429."""
        if request.url.path == "/" and exc.status == 401:
            return RedirectResponse("/login", status_code=303)
        headers = {"WWW-Authenticate": 'Bearer realm="metrics-lake"'} if exc.status == 401 else {}
        if exc.retry_after:
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        return JSONResponse({"error": str(exc), "parameter": "Authorization"}, status_code=exc.status, headers=headers)

    async def login(self, request: Request) -> Response:
        """``GET /login``: the form; ``POST /login`` (form field ``token``): a session cookie, then to ``/``."""
        if request.method != "POST":
            return HTMLResponse(_FORM.format(error=""))
        body = await request.body()
        token = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        try:
            if not token:
                raise TokenError(401, "enter a token")
            caller = await self.auth.authenticate(token, client_address(request), Scope.READ)
        except TokenError as exc:
            error = f'<p class="error">{html.escape(str(exc))}</p>'
            return HTMLResponse(_FORM.format(error=error), status_code=exc.status)
        now = time.time()
        self.sessions = {k: v for k, v in self.sessions.items() if v[1] > now}  # forget expired sessions
        session = secrets.token_urlsafe(32)
        self.sessions[session] = (caller.record.id if caller.record else _ADMIN_SESSION, now + SESSION_SECONDS)
        response = RedirectResponse("/", status_code=303)
        secure = request.url.scheme == "https"
        response.set_cookie(
            COOKIE, session, max_age=SESSION_SECONDS, httponly=True, samesite="strict", secure=secure, path="/"
        )
        return response

    async def logout(self, request: Request) -> Response:
        """End the session and go back to the form."""
        self.sessions.pop(request.cookies.get(COOKIE, ""), None)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
