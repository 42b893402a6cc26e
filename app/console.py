"""Where the application writes: rich consoles, and quiet logging unless ``--verbose``.

Commands print their own progress and summary on stderr (:data:`err`) and
results on stdout (:data:`out`), so ``lake sql ... --format csv > file`` and
``eval "$(lake infra up)"`` get only data on stdout. Third-party libraries
(Spark's py4j, Great Expectations, botocore, Airflow) log at INFO and draw
progress bars; by default only their warnings and errors show, ``--verbose``
lets everything through.
"""

from __future__ import annotations

import logging
import os

from rich.console import Console
from rich.logging import RichHandler

from metrics_lake.lake_schemas.tables import Table

__all__ = ["configure_output", "err", "out", "print_batch", "verbose_output"]

#: Progress, summaries and errors (stderr).
err = Console(stderr=True)
#: Results (stdout).
out = Console()

#: Loggers that chatter at INFO in normal operation: shown only with --verbose.
NOISY_LOGGERS = (
    "py4j",
    "great_expectations",
    "botocore",
    "urllib3",
    "filelock",
    "matplotlib",
    "airflow",
    "asyncio",
)
#: Where the libraries' Python warnings (deprecations...) go once one of them turns on ``logging.captureWarnings``,
#: as Great Expectations does on import: shown only with --verbose, they are the libraries' business, not the user's.
WARNINGS_LOGGER = "py.warnings"


_verbose = False


def verbose_output() -> bool:
    """Whether this run was asked for ``--verbose`` output."""
    return _verbose


def configure_output(*, verbose: bool = False) -> None:
    """Set up logging for one CLI run: our own INFO notices, third-party only from WARNING (all with ``verbose``).

    Python warnings that a library routes to logging are shown only with ``verbose``.

    Also disables tqdm progress bars (Great Expectations draws one per
    expectation) through tqdm's ``TQDM_DISABLE`` variable unless ``verbose``.
    """
    global _verbose
    _verbose = verbose
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=verbose, markup=False)],
        force=True,
    )
    logging.getLogger("metrics_lake").setLevel(logging.INFO)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger(WARNINGS_LOGGER).setLevel(logging.INFO if verbose else logging.ERROR)
    if not verbose:
        os.environ.setdefault("TQDM_DISABLE", "1")
        # GX warns about its own usage statistics and analytics on every context; it sends nothing here.
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def print_batch(outcome) -> None:
    """One line per committed speed-layer micro-batch (a :class:`~metrics_lake.core.speed.micro_batch.BatchOutcome`)."""
    import time

    rate = outcome.records / outcome.seconds if outcome.seconds else 0.0
    late = f", {outcome.late_events:,} later than the watermark" if outcome.late_events else ""
    transitions = outcome.rows.get(Table.ALERTS, 0)
    alerts = f", {transitions} alert transition{'s' * (transitions != 1)}" if transitions else ""
    unknown = outcome.unknown_servers
    alerts += f", {unknown:,} events of servers not in the inventory (unlabelled)" if unknown else ""
    if outcome.limited:
        limits = ", ".join(f"{count:,} {name}" for name, count in sorted(outcome.limited.items()))
        alerts += f", over cardinality limits: {limits}"
    err.print(
        f"[dim]{time.strftime('%H:%M:%S')}[/] batch: {outcome.records:,} records in {outcome.seconds:.1f} s "
        f"({rate:,.0f}/s) -> {outcome.rows[Table.BRONZE_EVENTS]:,} bronze, {outcome.rows[Table.QUARANTINE_EVENTS]:,} "
        f"quarantined, {outcome.windows_written:,} windows{late}{alerts}",
        highlight=False,
        soft_wrap=True,
    )
    if verbose_output() and outcome.stages:  # where the batch's time went
        stages = ", ".join(f"{name} {seconds:.2f}" for name, seconds in outcome.stages.items())
        err.print(f"  stages (s): {stages}", highlight=False, soft_wrap=True)
