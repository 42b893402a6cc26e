"""Access tokens of the gateway and the dashboard: created once, stored as salted hashes, revoked by name.

A token is ``mlk_<id>_<secret>``: ``id`` (12 lower-case base32 characters)
names its record, ``secret`` (32 random bytes, URL-safe base64) proves it.
The lake keeps only the record, never the secret: a SHA-256 hash of it
(:func:`secret_hash`), and who created it and when.
All records live in one object, :data:`~metrics_lake.core.keys.TOKENS_KEY`,
replaced by compare-and-swap, so a ``create`` and a ``revoke`` racing each
other are both kept, and readers (every gateway and dashboard process)
see a whole list or the previous one.

A token's **scope** says what it may do: ``write`` (send events to the
gateway), ``read`` (the dashboard and its API, the gateway's ``/metrics``),
``admin`` (both, plus changing stored queries, alert rules and the
inventory). ``servers`` (a glob, :func:`fnmatch.fnmatchcase`: ``web-*``)
limits the servers a write token may send events for, and the servers
whose rows a read token reads through the SQL endpoint (``*`` and ``?``
only there). ``tenant`` groups
tokens under one ingestion limit; ``rate``/``burst`` (events/s, events)
set that limit (:mod:`metrics_lake.core.rate_limits`).

Why a fast hash, not a password hash: a token's secret has 256 random bits,
so no guessing, online or against a leaked tokens file, gets anywhere; a
slow, salted hash (Argon2id) only protects secrets people choose. NIST SP
800-63B, section 5.1.2.2, draws that line for generated look-up secrets:
those of at least 112 bits "SHALL be hashed with an approved one-way
function", salted key derivation being for fewer bits. A token is reused
where a look-up secret is used once, but the line is drawn by the entropy
an offline attack faces, which is the same. A check then takes microseconds, so a
server's first connection or request pays nothing for it. Tokens created
before this scheme keep their Argon2id hashes (``$argon2id$...``, OWASP's
minimum cost: m=19 MiB, t=2, p=1, about 20 ms a check) and are still
accepted; :meth:`TokenStore.verify` reads both.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import re
import secrets
import socket
import time
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from metrics_lake.core.config import default_author
from metrics_lake.core.keys import TOKENS_KEY
from metrics_lake.core.storage import Store, VersionConflictError
from metrics_lake.lake_schemas.errors import ConflictError, InputError, IntegrityError, NotFoundError, TokenError

__all__ = [
    "TOKEN_PREFIX",
    "Scope",
    "TokenRecord",
    "TokenStore",
    "parse_token",
    "secret_hash",
]

#: Every token starts with this (secret scanners can recognise leaked ones).
TOKEN_PREFIX = "mlk_"
#: How a record's ``hash`` starts when it is :func:`secret_hash`'s (else it is an older token's Argon2id hash).
SHA256_PREFIX = "$sha256$"
FORMAT = 1
_TOKEN = re.compile(r"^mlk_([a-z2-7]{12})_([A-Za-z0-9_-]{43})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
#: Checks the Argon2id hashes of tokens created before :func:`secret_hash` (their parameters are in the hash).
_ARGON2 = PasswordHasher()
#: Longest credential looked at; anything longer is malformed without being parsed (tokens are 61 characters).
MAX_TOKEN_CHARS = 256


class Scope(StrEnum):
    """What a token may do (module docstring); ``admin`` includes ``read`` and ``write``."""

    WRITE = "write"
    READ = "read"
    ADMIN = "admin"

    def allows(self, needed: Scope) -> bool:
        """Whether a token of this scope may do what needs ``needed``."""
        return self is needed or self is Scope.ADMIN


@dataclass(frozen=True)
class TokenRecord:
    """One token as the lake stores it (no secret). Times are epoch seconds; ``rate`` events/s, ``burst`` events.

    ``servers``: glob of the servers a write token may send for, or a read token read the rows of (None: all);
    ``tenant``: the group whose ingestion limit it shares (None: its own);
    ``rate``/``burst`` None: the gateway's defaults.
    """

    id: str
    name: str
    scope: Scope
    hash: str
    created_at: float
    created_by: str
    servers: str | None = None
    tenant: str | None = None
    expires_at: float | None = None
    rate: float | None = None
    burst: int | None = None
    revoked_at: float | None = None
    revoked_by: str | None = None

    @property
    def argon2_hashed(self) -> bool:
        """Whether its hash is an older token's Argon2id hash, whose check takes ~20 ms (module docstring)."""
        return not self.hash.startswith(SHA256_PREFIX)

    def state(self, now: float) -> str:
        """``"active"``, ``"expired"`` or ``"revoked"`` at ``now`` (epoch s)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def may_write(self, server: str) -> bool:
        """Whether this token may send events for ``server`` (its ``servers`` glob, case-sensitive)."""
        return self.servers is None or fnmatch.fnmatchcase(server, self.servers)

    @property
    def limit_key(self) -> str:
        """The key of the ingestion limit it counts against: its tenant's, or its own."""
        return f"tenant:{self.tenant}" if self.tenant else f"token:{self.name}"


def parse_token(text: str) -> tuple[str, str]:
    """``(id, secret)`` of a token; :class:`TokenError` (401) if it is not one this lake issues."""
    match = _TOKEN.match(text) if len(text) <= MAX_TOKEN_CHARS else None
    if match is None:
        raise TokenError(401, "malformed token: lake tokens look like mlk_<12 characters>_<43 characters>")
    return match.group(1), match.group(2)


def secret_hash(secret: str) -> str:
    """How the lake stores a token's ``secret``: ``$sha256$`` and the hex SHA-256 of its UTF-8 bytes (64 characters).

    Unsalted on purpose: the secret is 256 random bits (module docstring, NIST SP 800-63B 5.1.2.2)."""
    return SHA256_PREFIX + hashlib.sha256(secret.encode()).hexdigest()


def _who() -> str:
    """``author@host``: who made or revoked a token, and on which machine."""
    return f"{default_author()}@{socket.gethostname()}"


class TokenStore:
    """The tokens of the lake at ``store`` (module docstring). Raises the store's errors as they come."""

    def __init__(self, store: Store, *, clock=time.time) -> None:
        self.store = store
        self.clock = clock

    def load(self) -> tuple[dict[str, TokenRecord], str | None]:
        """Every record by id, and the object's version (None when no token was ever created).

        Raises :class:`IntegrityError` if the object is not one this lake wrote.
        """
        try:
            data, version = self.store.read_versioned(TOKENS_KEY)
        except FileNotFoundError:
            return {}, None
        try:
            doc = json.loads(data)
            version_ok = doc.get("format") == FORMAT
            records = [TokenRecord(**{**each, "scope": Scope(each["scope"])}) for each in doc["tokens"]]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise IntegrityError(f"{TOKENS_KEY} is not a token list this lake wrote ({exc}); restore it") from None
        if not version_ok:
            raise IntegrityError(f"{TOKENS_KEY} has format {doc.get('format')!r}, not {FORMAT}; restore it")
        return {r.id: r for r in records}, version

    def active(self) -> list[TokenRecord]:
        """The tokens neither expired nor revoked now (a lake with none is open on loopback)."""
        now = self.clock()
        return [r for r in self.load()[0].values() if r.state(now) == "active"]

    def _update(self, change) -> TokenRecord:
        """Apply ``change(records) -> (records, result)`` by compare-and-swap, retrying when another edit won."""
        for _ in range(20):
            records, version = self.load()
            records, result = change(records)
            doc = {"format": FORMAT, "tokens": [asdict(r) for r in records.values()]}
            try:
                self.store.replace_if(TOKENS_KEY, json.dumps(doc, indent=1).encode(), version)
            except VersionConflictError:
                continue
            return result
        raise ConflictError(f"{TOKENS_KEY} kept changing under this edit (20 tries); run it again")

    def create(
        self,
        name: str,
        scope: Scope,
        *,
        servers: str | None = None,
        tenant: str | None = None,
        expires_at: float | None = None,
        rate: float | None = None,
        burst: int | None = None,
    ) -> tuple[str, TokenRecord]:
        """Create a token; returns ``(token, record)``. The token is shown once: the lake keeps only its hash.

        Raises :class:`InputError` for a bad name, glob, tenant, expiry or
        limit, or a name an active token already has.
        """
        if not _NAME.match(name):
            raise InputError(f"--name {name!r}: use 1-64 letters, digits, '_', '.', '@', '-' (e.g. web-agents)")
        if tenant is not None and not _NAME.match(tenant):
            raise InputError(f"--tenant {tenant!r}: use 1-64 letters, digits, '_', '.', '@', '-'")
        if servers is not None and (not servers or len(servers) > 128 or not servers.isprintable()):
            raise InputError(
                f"--servers {servers!r}: give a glob of server names such as web-* (128 characters at most)"
            )
        if scope is Scope.ADMIN and servers is not None:
            raise InputError("--servers limits a write token's events or a read token's rows; an admin token has all")
        if scope is Scope.READ and servers is not None and ("[" in servers or "]" in servers):
            raise InputError(
                f"--servers {servers!r}: a read token's glob takes * and ? only (the SQL endpoint's row filter)"
            )
        now = self.clock()
        if expires_at is not None and expires_at <= now:
            raise InputError("--expires is in the past; give a duration such as 90d or a future time")
        if (rate is None) != (burst is None) or (rate is not None and (rate <= 0 or burst < 1)):
            raise InputError("--rate and --burst go together: events per second > 0 and a burst of at least 1")
        token_id = base64.b32encode(secrets.token_bytes(10)).decode().lower()[:12]
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        record = TokenRecord(
            id=token_id,
            name=name,
            scope=scope,
            hash=secret_hash(secret),
            created_at=now,
            created_by=_who(),
            servers=servers,
            tenant=tenant,
            expires_at=expires_at,
            rate=rate,
            burst=burst,
        )

        def add(records: dict[str, TokenRecord]):
            if any(r.name == name and r.state(now) == "active" for r in records.values()):
                raise InputError(f"an active token is already named {name!r}; revoke it first or pick another name")
            return {**records, token_id: record}, record

        return f"{TOKEN_PREFIX}{token_id}_{secret}", self._update(add)

    def revoke(self, name_or_id: str) -> list[TokenRecord]:
        """Revoke the active tokens named (or with the id) ``name_or_id``; returns them revoked.

        Raises :class:`NotFoundError` if no active token matches.
        """
        now = self.clock()
        by = _who()

        def revoke(records: dict[str, TokenRecord]):
            hits = [r for r in records.values() if name_or_id in (r.name, r.id) and r.state(now) == "active"]
            if not hits:
                raise NotFoundError(f"no active token named {name_or_id!r}; `lake tokens list` shows them")
            done = [replace(r, revoked_at=now, revoked_by=by) for r in hits]
            return {**records, **{r.id: r for r in done}}, done

        return self._update(revoke)

    @staticmethod
    def verify(record: TokenRecord, secret: str) -> bool:
        """Whether ``secret`` is the one ``record`` was created with: a SHA-256 comparison in constant time
        (microseconds), or for a token created before it, an Argon2id check (~20 ms)."""
        if not record.argon2_hashed:
            return hmac.compare_digest(record.hash, secret_hash(secret))
        try:
            return _ARGON2.verify(record.hash, secret)
        except (VerificationError, InvalidHashError):
            return False
