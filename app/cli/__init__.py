"""The ``lake`` command line: thin commands over library functions, and its one error boundary.

Commands live in modules by group (:mod:`.ingest`, :mod:`.speed`,
:mod:`.batch`, :mod:`.queries`, :mod:`.alerts`, :mod:`.inventory`, :mod:`.maintenance`, :mod:`.analysis`,
:mod:`.dashboard`, :mod:`.local`; what they share in :mod:`.options` and :mod:`.config_edits`) and are registered on
:data:`app` here. Configuration comes from ``LAKE_*``
variables or ``lake.toml`` (:mod:`metrics_lake.core.config`); flags cover
per-run choices.

The error boundary is :class:`LakeGroup`, the class of :data:`app`: whatever
a command raises is printed as one line (:func:`metrics_lake.app.cli.boundary.explain`)
and turned into the exit code of its :class:`~metrics_lake.lake_schemas.errors.LakeError`
class (2 bad input, configuration or access; 1 a failed check; 75 another
writer won, run again; 65 data not as the lake wrote it); 130 interrupted;
70 a bug. An access error names what the command's operation needs of the
store and the identity that has it. ``--debug`` (or ``LAKE_DEBUG=1``)
lets the traceback through instead; ``--verbose`` shows third-party logs.
:func:`main`, the ``lake`` console script, accepts both flags anywhere on the
command line.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape
from typer.core import TyperGroup

from metrics_lake.app.cli import analysis, batch, dashboard, ingest, maintenance, speed
from metrics_lake.app.cli.alerts import alerts_app
from metrics_lake.app.cli.boundary import explain, first_line, translate
from metrics_lake.app.cli.inventory import inventory_app
from metrics_lake.app.cli.local import airflow_standalone, infra_app
from metrics_lake.app.cli.options import settings
from metrics_lake.app.cli.queries import queries_app
from metrics_lake.app.cli.tokens import tokens_app
from metrics_lake.app.console import configure_output, err
from metrics_lake.core.arrow_memory import use_system_allocator
from metrics_lake.core.keys import grants
from metrics_lake.infra.seaweedfs import least_privileged_identity
from metrics_lake.lake_schemas.errors import EXIT_BUG, EXIT_INTERRUPTED, AccessDeniedError
from metrics_lake.lake_schemas.table_access import (
    ALERTS,
    ANALYSIS,
    COMPACT,
    CONSUMERS,
    DEMO,
    INVENTORY,
    PRODUCE,
    QUALITY,
    QUERIES,
    RECOMPUTE,
    REPLAY,
    RETAIN,
    ROLLUP,
    STREAM,
    TOKENS,
    Operation,
)

__all__ = ["COMMAND_OPERATIONS", "LakeGroup", "app", "main", "report"]

#: The operation each command runs (:mod:`metrics_lake.lake_schemas.table_access`), for the hint on access errors.
COMMAND_OPERATIONS: dict[str, Operation] = {
    "produce": PRODUCE,
    "agent": PRODUCE,
    "gateway": PRODUCE,
    "stream": STREAM,
    "replay": REPLAY,
    "consumers": CONSUMERS,
    "recompute": RECOMPUTE,
    "rollup": ROLLUP,
    "queries": QUERIES,
    "alerts": ALERTS,
    "inventory": INVENTORY,
    "quality": QUALITY,
    "sql": ANALYSIS,
    "sql-server": ANALYSIS,
    "history": ANALYSIS,
    "tables": ANALYSIS,
    "dashboard": ANALYSIS,
    "compact": COMPACT,
    "retain": RETAIN,
    "tokens": TOKENS,
    "demo": DEMO,
}

GLOBAL_FLAGS = ("--debug", "--verbose")


def _access_hint(command: str | None) -> str:
    """What ``command`` needs of the store and the `lake infra` identity that has it, derived from its operation."""
    if command not in COMMAND_OPERATIONS:
        return ""
    needed = grants(COMMAND_OPERATIONS[command])
    what = ", ".join(f"{verb} {prefix}/" for verb, prefix in sorted(needed, key=lambda g: (g[1], g[0])))
    return (
        f"; `lake {command}` needs {what}: use credentials that may, e.g. with the local server "
        f'eval "$(lake infra up --identity {least_privileged_identity(needed)})"'
    )


def report(exc: BaseException, command: str | None) -> int:
    """Print ``exc`` as one line on stderr (see :func:`~metrics_lake.app.cli.boundary.explain`); returns the exit code."""
    explained = explain(exc)
    if explained is None:
        err.print(
            f"[red]error:[/] unexpected {exc.__class__.__name__}: {escape(first_line(str(exc)))} "
            "(a bug in metrics-lake: run again with --debug for the traceback, and report it)",
            soft_wrap=True,
        )
        return EXIT_BUG
    message, code = explained
    if isinstance(translate(exc), AccessDeniedError):
        message += _access_hint(command)
    err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    return code


class LakeGroup(TyperGroup):
    """The ``lake`` group: runs a command and turns any error it raises into one line and an exit code."""

    def invoke(self, ctx):
        """Invoke the subcommand; report failures (module docstring) unless ``--debug``."""
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # click's own: usage errors (exit 2) and explicit exits
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            raise typer.Exit(report(exc, ctx.invoked_subcommand)) from None


app = typer.Typer(
    cls=LakeGroup,
    help="metrics-lake: a lambda-style data lake for machine and application metrics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def global_options(
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show third-party logs and progress bars (Spark, GX, botocore).")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", envvar="LAKE_DEBUG", help="Let an error's full traceback through.")
    ] = False,
) -> None:
    """metrics-lake: a lambda-style data lake for machine and application metrics."""
    configure_output(verbose=verbose)


for command in (ingest.produce, ingest.agent, ingest.gateway):
    app.command()(command)
for command in (speed.stream, speed.replay, speed.consumers):
    app.command()(command)
for command in (batch.recompute, batch.rollup):
    app.command()(command)
app.add_typer(queries_app, name="queries")
app.add_typer(alerts_app, name="alerts")
app.add_typer(inventory_app, name="inventory")
app.add_typer(tokens_app, name="tokens")
for command in (maintenance.compact, maintenance.retain):
    app.command()(command)
for command in (analysis.sql, analysis.tables, analysis.history, analysis.series, analysis.quality):
    app.command()(command)
app.command("sql-server")(analysis.sql_server)
app.command()(dashboard.dashboard)
app.command("airflow")(airflow_standalone)
app.add_typer(infra_app, name="infra")


@app.command()
def demo(
    seconds: Annotated[int, typer.Option(min=5, help="How long the agents produce, in seconds.")] = 60,
    servers: Annotated[int, typer.Option(min=1, help="Simulated servers beside this host.")] = 20,
    metrics: Annotated[int, typer.Option(min=1, help="Metrics per simulated server.")] = 8,
    dashboard: Annotated[
        bool, typer.Option("--dashboard", help="Then serve the dashboard on --port until Ctrl-C.")
    ] = False,
    port: Annotated[int, typer.Option(min=0, max=65535, help="The dashboard's port with --dashboard.")] = 8050,
) -> None:
    """The main job, end to end: host agent + fleet simulator -> log -> speed layer -> Spark SQL (-> dashboard)."""
    from metrics_lake.app.demo import run_demo

    run_demo(
        settings(),
        seconds=seconds,
        servers=servers,
        metrics=metrics,
        console=err,
        dashboard_port=port if dashboard else None,
    )


def main(argv: list[str] | None = None) -> None:
    """Run ``lake`` on ``argv`` (default ``sys.argv[1:]``), with the global flags moved in front of the command."""
    use_system_allocator()  # before any command allocates Arrow buffers (metrics_lake.core.arrow_memory)
    args = list(sys.argv[1:] if argv is None else argv)
    flags = [arg for arg in GLOBAL_FLAGS if arg in args]
    app(args=[*flags, *(arg for arg in args if arg not in GLOBAL_FLAGS)], prog_name="lake")
