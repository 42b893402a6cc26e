"""``lake dashboard``: the stored queries, freshness and pipeline health as a web page and a JSON API."""

from __future__ import annotations

from typing import Annotated

import typer

from metrics_lake.app.cli.options import (
    InsecureOption,
    TlsCertOption,
    TlsClientCaOption,
    TlsKeyOption,
    server_tls,
    settings,
    stop_on_signals,
)
from metrics_lake.app.console import err

__all__ = ["dashboard"]


def dashboard(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Listen port (0: any free port).")] = 8050,
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    refresh: Annotated[int, typer.Option(min=0, help="The page's default auto-refresh, seconds (0: off).")] = 10,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    insecure: InsecureOption = False,
) -> None:
    """Serve the dashboard (one panel per stored query, freshness, pipeline) and its JSON API until Ctrl-C; once
    the lake has tokens, a read token signs in (admin to edit)."""
    from metrics_lake.app.dashboard import DashboardReader, serve
    from metrics_lake.app.http_server import check_exposure
    from metrics_lake.core.tokens import TokenStore

    config = settings()
    tls = server_tls(config, tls_cert, tls_key, tls_client_ca)
    reader = DashboardReader(config)
    reader.freshness()  # fails here, in one line, on a wrong root or missing read access
    tokens = bool(TokenStore(reader.store).active())
    warning = check_exposure("the dashboard", host, tls, tokens, insecure)
    if warning:
        err.print(f"[bold red]{warning}[/]")
    stop = stop_on_signals()
    scheme = "https" if tls else "http"
    access = "read token required" if tokens else "open: the lake has no tokens"

    def ready(address) -> None:
        err.print(f"dashboard on {scheme}://{address[0]}:{address[1]}/ (API under /api/, {access}); Ctrl-C stops it")

    serve(reader, host, port, stop, refresh_seconds=refresh, ready=ready, tls=tls)
