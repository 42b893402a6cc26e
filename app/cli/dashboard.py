"""``lake dashboard``: the stored queries, freshness and pipeline health as a web page and a JSON API."""

from __future__ import annotations

from typing import Annotated

import typer

from metrics_lake.app.cli.options import settings, stop_on_signals
from metrics_lake.app.console import err

__all__ = ["dashboard"]


def dashboard(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Listen port (0: any free port).")] = 8050,
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    refresh: Annotated[int, typer.Option(min=0, help="The page's default auto-refresh, seconds (0: off).")] = 10,
) -> None:
    """Serve the dashboard (one panel per stored query, freshness, pipeline) and its JSON API until Ctrl-C."""
    from metrics_lake.app.dashboard import DashboardReader, serve

    config = settings()
    reader = DashboardReader(config)
    reader.freshness()  # fails here, in one line, on a wrong root or missing read access
    stop = stop_on_signals()

    def ready(address) -> None:
        err.print(f"dashboard on http://{address[0]}:{address[1]}/ (API under /api/); Ctrl-C stops it")

    serve(reader, host, port, stop, refresh_seconds=refresh, ready=ready)
