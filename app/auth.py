"""Who is calling: the token of an HTTP request checked against the lake's tokens (gateway and dashboard).

Credentials are read in the forms each protocol's clients send
(:func:`credential_of`):

- ``Authorization: Bearer <token>``: our agents, OTLP exporters
  (``OTEL_EXPORTER_OTLP_HEADERS``), Prometheus ``authorization``, curl;
- ``Authorization: Token <token>``: InfluxDB clients;
- ``Authorization: Basic base64(user:token)``: Prometheus ``basic_auth``,
  Telegraf, InfluxDB 1.x clients (the user name is not checked);
- ``?p=<token>`` on InfluxDB 1.x ``/write`` (its ``u``/``p`` parameters).

:class:`Authenticator` answers with a :class:`Caller` or raises
:class:`~metrics_lake.lake_schemas.errors.TokenError` (401, 403, or 429 for
an address that failed too often). A lake with no active token is *open*:
requests without a credential are anonymous callers with read and write
rights (never admin), which the servers allow on loopback only
(:func:`metrics_lake.app.http_server.check_exposure`). Once a token
exists, every request needs one.

The token list is re-read every ``refresh_seconds`` by a background thread,
so a created or revoked token takes effect within that time in every
process, without restarting it. A token's secret is checked against its
record's SHA-256 hash (microseconds); a token created before that scheme has
an Argon2id hash instead, checked (~20 ms) once per process on a worker
thread. Either way the verified token is then remembered by its SHA-256, so
the next requests cost a dictionary lookup and a state check. Failed checks are
rate-limited per source address (``burst`` failures, then one per
``1/rate`` s), which bounds both guessing and the CPU a flood of bad tokens
costs. No message, log line or metric contains a token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import threading
import time
from dataclasses import dataclass

import prometheus_client as prom
from starlette.requests import Request

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.rate_limits import RateLimits
from metrics_lake.core.storage import Store
from metrics_lake.core.tokens import MAX_TOKEN_CHARS, Scope, TokenRecord, TokenStore, parse_token
from metrics_lake.lake_schemas.errors import LakeError, TokenError

__all__ = ["ANONYMOUS", "Authenticator", "Caller", "client_address", "credential_of"]

log = logging.getLogger(__name__)

#: Failed credential checks a source address may make at once, then one per second.
FAILURE_BURST = 20
FAILURE_RATE = 1.0
#: Verified tokens remembered per process (a dictionary entry each).
MAX_VERIFIED = 100_000


@dataclass(frozen=True)
class Caller:
    """Who made a request: ``name`` (a token's name, ``"anonymous"``, or ``"LAKE_ADMIN_TOKEN"``), ``scope``, and the
    token's ``record`` (None for the anonymous caller of an open lake and for the bootstrap admin token)."""

    name: str
    scope: Scope
    record: TokenRecord | None = None

    def may_write(self, server: str) -> bool:
        """Whether this caller may send events for ``server``."""
        return self.record is None or self.record.may_write(server)


#: The name of the bootstrap admin token's caller (``LAKE_ADMIN_TOKEN``).
BOOTSTRAP_ADMIN = "LAKE_ADMIN_TOKEN"
#: The caller of a request without a credential to a lake with no token (module docstring).
ANONYMOUS = Caller("anonymous", Scope.WRITE)


def client_address(request: Request) -> str:
    """The address a request came from (what failed credentials are counted against); ``"unknown"`` if none."""
    return request.client.host if request.client else "unknown"


def credential_of(authorization: str | None, query_password: str | None = None) -> str | None:
    """The token a request carries (module docstring), or None; :class:`TokenError` (401) for a malformed header."""
    if authorization is None or not authorization.strip():
        return query_password or None
    if len(authorization) > 4 * MAX_TOKEN_CHARS:
        raise TokenError(401, "the Authorization header is too long to hold a lake token")
    scheme, _, value = authorization.strip().partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme in ("bearer", "token") and value:
        return value
    if scheme == "basic" and value:
        try:
            _, colon, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise TokenError(401, "the Basic credentials are not base64 of user:token") from None
        if colon and password:
            return password
        raise TokenError(401, "Basic credentials need the token as the password (user:token)")
    raise TokenError(401, "unsupported Authorization header: send 'Bearer <token>' (or 'Token', or Basic user:token)")


def _worded_for(needed: Scope, error: TokenError) -> TokenError:
    """``error``, saying first that an admin token is required when that is what was asked (a 401 for an edit)."""
    if needed is not Scope.ADMIN or error.status != 401 or str(error).startswith("an admin token"):
        return error
    return TokenError(401, f"an admin token is required ({error})", error.retry_after)


class Authenticator:
    """Checks requests' tokens against the lake's (module docstring); :meth:`close` stops its refresh thread.

    ``registry``: where ``lake_auth_failures_total{reason}`` is counted (not
    exported if None). ``row_scope``: whether this door limits a read token
    created with ``--servers`` to its servers' rows (the SQL endpoint does:
    ``spark/jvm/metricslake/spark/LakeRowScope.java``); a door that does not
    refuses such a token (403), so it never sees rows beyond its servers.
    Raises the store's errors if the first read of the token list fails (a
    wrong root fails at start, not per request).
    """

    def __init__(
        self,
        settings: LakeSettings,
        store: Store,
        *,
        refresh_seconds: float = 2.0,
        registry: prom.CollectorRegistry | None = None,
        clock=time.time,
        row_scope: bool = False,
    ) -> None:
        self.tokens = TokenStore(store, clock=clock)
        self.row_scope = row_scope
        self.admin_token = settings.admin_token
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self.records, self.version = self.tokens.load()
        self.enabled = self._any_active()
        self.verified: dict[bytes, str] = {}  # SHA-256 of a verified token -> its id
        self.failures = RateLimits()
        self.failure_rate, self.failure_burst = FAILURE_RATE, FAILURE_BURST
        self.failed = prom.Counter(
            "lake_auth_failures", "Requests refused for their credential, by reason", ["reason"], registry=registry
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_loop, name="token-refresh", daemon=True)
        self._thread.start()

    def _any_active(self) -> bool:
        now = self.clock()
        return any(r.state(now) == "active" for r in self.records.values())

    def refresh(self) -> None:
        """Re-read the token list now (the refresh thread does it every ``refresh_seconds``).

        Also recomputes ``enabled``: whether the lake has an active token
        (then every request needs one), kept as an attribute so a request
        does not scan every token's record.
        """
        records, version = self.tokens.load()
        if version != self.version:
            self.records, self.version = records, version
        self.enabled = self._any_active()

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_seconds):
            try:
                self.refresh()
            except LakeError as exc:  # storage down: keep the last list, say so, try again
                log.warning("could not re-read the access tokens (keeping the last list): %s", exc)
            except Exception as exc:  # noqa: BLE001 (a failed refresh must not end the thread)
                log.warning("could not re-read the access tokens (keeping the last list): %r", exc)

    def close(self) -> None:
        """Stop the refresh thread."""
        self._stop.set()
        self._thread.join()

    def _fail(self, source: str | None, reason: str, status: int, message: str) -> TokenError:
        self.failed.labels(reason=reason).inc()
        if status == 401 and source is not None:
            self.failures.bucket(source, self.failure_rate, self.failure_burst).charge(1)
        return TokenError(status, message)

    async def authenticate_request(self, request: Request, needed: Scope, query_password: str | None = None) -> Caller:
        """:meth:`authenticate` the credential of ``request``'s ``Authorization`` header (or InfluxDB's ``p``,
        ``query_password``); a malformed header counts as a failed credential of its address."""
        source = client_address(request)
        try:
            credential = credential_of(request.headers.get("authorization"), query_password)
        except TokenError as exc:
            raise _worded_for(needed, self._fail(source, "malformed", exc.status, str(exc))) from None
        return await self.authenticate(credential, source, needed)

    async def authenticate(self, credential: str | None, source: str, needed: Scope) -> Caller:
        """The caller of a request carrying ``credential`` from address ``source``, allowed to do ``needed``.

        Raises :class:`TokenError`: 401 (no, malformed, unknown, wrong,
        expired or revoked token; for ``admin``, the message starts "an
        admin token is required"), 403 (the token's scope does not allow
        ``needed``), 429 (``source`` failed too often; ``retry_after`` s).
        """
        try:
            return await self._authenticate(credential, source, needed)
        except TokenError as exc:
            raise _worded_for(needed, exc) from None

    def authenticate_blocking(self, credential: str | None, source: str | None, needed: Scope) -> Caller:
        """:meth:`authenticate` on the calling thread, for callers outside an event loop (``lake sql-server``'s
        listeners ask from JVM threads): an older token's first Argon2id check (~20 ms) blocks this thread only.

        ``source`` None: the address is not known (HiveServer2 checks a login before it records the client's
        address); such failures are counted in ``lake_auth_failures_total`` but throttle no one."""
        try:
            caller = self._precheck(credential, source, needed)
            if isinstance(caller, Caller):
                return caller
            record, secret, digest = caller
            return self._verified(record, secret, digest, TokenStore.verify(record, secret), source, needed)
        except TokenError as exc:
            raise _worded_for(needed, exc) from None

    async def _authenticate(self, credential: str | None, source: str, needed: Scope) -> Caller:
        caller = self._precheck(credential, source, needed)
        if isinstance(caller, Caller):
            return caller
        record, secret, digest = caller
        if record.argon2_hashed:  # ~20 ms of CPU: off the event loop
            ok = await asyncio.to_thread(TokenStore.verify, record, secret)
        else:
            ok = TokenStore.verify(record, secret)
        return self._verified(record, secret, digest, ok, source, needed)

    def _precheck(
        self, credential: str | None, source: str | None, needed: Scope
    ) -> Caller | tuple[TokenRecord, str, bytes]:
        """The caller, when known without checking a secret; else the token's record, secret and SHA-256, to verify
        (a token this process verified before is known by its SHA-256)."""
        failed = None if source is None else self.failures.find(source)  # most never failed: no bucket for them
        wait = 0.0 if failed is None else failed.empty()
        if wait > 0:
            self.failed.labels(reason="throttled").inc()
            raise TokenError(429, f"too many failed credentials from {source}; retry in {wait:.0f} s", wait)
        if (
            credential is not None
            and self.admin_token is not None
            and hmac.compare_digest(credential.encode(), self.admin_token.get_secret_value().encode())
        ):
            return Caller(BOOTSTRAP_ADMIN, Scope.ADMIN)
        if not self.enabled:  # an open lake: anyone may read and write (clients' placeholder tokens are ignored)
            if needed is not Scope.ADMIN:
                return ANONYMOUS
            if self.admin_token is None:
                message = "writes are disabled: the lake has no admin credential (lake tokens create --scope admin, or set LAKE_ADMIN_TOKEN)"
                raise self._fail(source, "missing", 403, message)
        if credential is None:
            what = "an admin token" if needed is Scope.ADMIN else "a token"
            raise self._fail(source, "missing", 401, f"{what} is required: Authorization: Bearer <token>")
        try:
            token_id, secret = parse_token(credential)
        except TokenError as exc:
            raise self._fail(source, "malformed", 401, str(exc)) from None
        record = self.records.get(token_id)
        if record is None:
            raise self._fail(source, "unknown", 401, "unknown token (never issued by this lake, or its list is stale)")
        digest = hashlib.sha256(credential.encode()).digest()
        if self.verified.get(digest) == token_id:
            return self.check(record, source, needed)
        return record, secret, digest

    def _verified(
        self, record: TokenRecord, secret: str, digest: bytes, ok: bool, source: str | None, needed: Scope
    ) -> Caller:
        """The caller once ``record``'s check of ``secret`` answered ``ok``; remembers a verified token."""
        if not ok:
            raise self._fail(source, "wrong", 401, f"wrong secret for token {record.name!r}")
        if len(self.verified) >= MAX_VERIFIED:
            self.verified.clear()
        self.verified[digest] = record.id
        return self.check(record, source, needed)

    def check(self, record: TokenRecord, source: str | None, needed: Scope) -> Caller:
        """The caller of verified token ``record`` if it is active and its scope allows ``needed``; else raises."""
        current = self.records.get(record.id, record)  # revoked since it was verified?
        state = current.state(self.clock())
        if state != "active":
            raise self._fail(source, state, 401, f"token {current.name!r} is {state}; ask for a new one")
        if not current.scope.allows(needed):
            raise self._fail(
                source, "scope", 403, f"token {current.name!r} has scope {current.scope}; this needs {needed}"
            )
        if current.scope is Scope.READ and current.servers is not None and not self.row_scope:
            raise self._fail(
                source,
                "scope",
                403,
                f"token {current.name!r} reads only servers {current.servers}; only the SQL endpoint "
                "(lake sql-server) limits rows by server",
            )
        return Caller(current.name, current.scope, current)

    def scope_of(self, name: str) -> str | None:
        """What the active token ``name`` may read through the SQL endpoint: ``admin`` (every row and table),
        ``read`` (every row of the analysts' tables), ``read:<glob>`` (a read token created with ``--servers``: those
        servers' rows), or None if no such token is active. Any caller of a lake without tokens, and the bootstrap
        admin token, are ``admin``."""
        if not self.enabled or (name == BOOTSTRAP_ADMIN and self.admin_token):
            return "admin"  # an open lake (whatever name a JDBC login gave), or the bootstrap admin token
        now = self.clock()
        for record in self.records.values():
            if record.name == name and record.state(now) == "active":
                if record.scope is Scope.ADMIN:
                    return "admin"
                return "read" if record.servers is None else f"read:{record.servers}"
        return None
