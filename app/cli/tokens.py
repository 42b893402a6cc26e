"""``lake tokens …``: the access tokens of the gateway and the dashboard (create, list, revoke).

A token is printed once, by ``create``, on standard output (so it can be
piped into a file or a secret store); the lake keeps only its SHA-256 hash
(:mod:`metrics_lake.core.tokens`). Running gateways and dashboards see a new
or revoked token within seconds. Creating the first token turns
authentication on: from then on every request needs a token.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

import typer
from rich import table as rich_table
from rich.markup import escape

from metrics_lake.app.cli.options import settings
from metrics_lake.app.console import err, out
from metrics_lake.lake_schemas.errors import InputError

__all__ = ["parse_expiry", "tokens_app"]

tokens_app = typer.Typer(
    help="Access tokens of the gateway and the dashboard: create (printed once), list, revoke.", no_args_is_help=True
)

_DURATION = re.compile(r"^(\d{1,6})([mhdw])$")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_expiry(text: str | None, now: float) -> float | None:
    """``--expires``: a duration (``90d``, ``12h``, ``30m``, ``2w``) or an ISO-8601 time with a zone; epoch s."""
    if text is None:
        return None
    match = _DURATION.match(text.strip())
    if match:
        return now + int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"--expires {text!r}: give a duration such as 90d, 12h, 2w, or a time like 2027-01-01T00:00Z"
        ) from None
    if moment.tzinfo is None:
        raise InputError(f"--expires {text!r}: add a zone (Z or +01:00)")
    return moment.timestamp()


def _store():
    from metrics_lake.core.storage import open_store
    from metrics_lake.core.tokens import TokenStore

    return TokenStore(open_store(settings()))


def _when(epoch: float | None) -> str:
    return "" if epoch is None else dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


@tokens_app.command("create")
def create(
    name: Annotated[str, typer.Option(help="Who or what uses it (unique among active tokens), e.g. web-agents.")],
    scope: Annotated[
        str, typer.Option(help="write: send events; read: dashboard and its API; admin: both, and edit queries.")
    ],
    servers: Annotated[
        str | None,
        typer.Option(
            help="Write tokens: only events of servers matching this glob (e.g. 'web-*'); read tokens: only their rows "
            "through lake sql-server (* and ? only)."
        ),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="Share the ingestion limit with the tenant's other tokens.")
    ] = None,
    expires: Annotated[str | None, typer.Option(help="Expire after a duration (90d, 12h) or at a time.")] = None,
    rate: Annotated[
        float | None, typer.Option(help="Events/s it (or its tenant) may send (default LAKE_GATEWAY_TOKEN_RATE).")
    ] = None,
    burst: Annotated[int | None, typer.Option(help="Events it may send at once (with --rate; default 5 s).")] = None,
) -> None:
    """Create a token and print it once on standard output; the lake stores only its salted hash."""
    import time

    from metrics_lake.core.tokens import Scope

    if scope not in {s.value for s in Scope}:
        raise InputError(f"--scope {scope!r}: choose write, read or admin")
    if burst is not None and rate is None:
        raise InputError("--burst needs --rate")
    tokens = _store()
    expires_at = parse_expiry(expires, time.time())
    if rate is not None and burst is None:
        burst = max(1, int(5 * rate))
    token, record = tokens.create(
        name, Scope(scope), servers=servers, tenant=tenant, expires_at=expires_at, rate=rate, burst=burst
    )
    limits = "" if record.rate is None else f", {record.rate:g} events/s (burst {record.burst:,})"
    err.print(
        f"created token {escape(record.name)!r} (id {record.id}, scope {record.scope}"
        + (f", servers {escape(record.servers)}" if record.servers else "")
        + (f", tenant {escape(record.tenant)}" if record.tenant else "")
        + (f", expires {_when(record.expires_at)}" if record.expires_at else "")
        + f"{limits}); it is shown only now, keep it secret:"
    )
    print(token)


@tokens_app.command("list")
def list_tokens(
    all_: Annotated[bool, typer.Option("--all", help="Also list revoked and expired tokens.")] = False,
) -> None:
    """List the tokens (never their secrets): name, id, scope, servers, tenant, limits, who created it, state."""
    import time

    records, _ = _store().load()
    now = time.time()
    view = rich_table.Table("name", "id", "scope", "servers", "tenant", "limit", "created", "by", "expires", "state")
    shown = 0
    for r in sorted(records.values(), key=lambda r: r.created_at):
        state = r.state(now)
        if state != "active" and not all_:
            continue
        shown += 1
        revoked = f" {_when(r.revoked_at)} by {r.revoked_by}" if r.revoked_at else ""
        view.add_row(
            *(
                escape(str(v))
                for v in (
                    r.name,
                    r.id,
                    r.scope,
                    r.servers or "all",
                    r.tenant or "",
                    "" if r.rate is None else f"{r.rate:g}/s, burst {r.burst:,}",
                    _when(r.created_at),
                    r.created_by,
                    _when(r.expires_at) or "never",
                    state + revoked,
                )
            )
        )
    out.print(view)
    hidden = len(records) - shown
    err.print(f"{shown} tokens" + (f" ({hidden} revoked or expired: --all shows them)" if hidden else ""))


@tokens_app.command("revoke")
def revoke(name: Annotated[str, typer.Argument(help="The token's name or id.")]) -> None:
    """Revoke a token: gateways and dashboards refuse it within seconds, without restarting."""
    for record in _store().revoke(name):
        err.print(f"revoked token {escape(record.name)!r} (id {record.id}, scope {record.scope})")
