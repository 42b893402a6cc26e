"""Progress output for streaming queries: one line per micro-batch that read data."""

from __future__ import annotations

import time

from pyspark.sql.streaming import StreamingQueryListener
from rich.console import Console


class BatchProgressPrinter(StreamingQueryListener):
    """Prints ``[query] batch N: rows, rows/s, duration`` for every non-empty micro-batch."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def _say(self, message: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}", highlight=False)

    def onQueryStarted(self, event) -> None:
        """Announce the query (name and id)."""
        self._say(f"[bold]{event.name}[/] started (id {event.id})")

    def onQueryProgress(self, event) -> None:
        """One line per micro-batch with input rows."""
        progress = event.progress
        rows = progress.numInputRows
        if rows == 0:
            return
        seconds = progress.batchDuration / 1000.0
        rate = rows / seconds if seconds else 0.0
        self._say(
            f"[cyan]{progress.name}[/] batch {progress.batchId}: {rows:,} rows in {seconds:.1f} s ({rate:,.0f} rows/s)"
        )

    def onQueryIdle(self, event) -> None:
        """Nothing to report while idle."""

    def onQueryTerminated(self, event) -> None:
        """Report failures; a clean stop is silent."""
        if event.exception:
            self._say(f"[red]query {event.id} failed:[/] {event.exception.splitlines()[0]}")
