"""``lake queries …``: the config store of stored queries (add, rm, list, show, history, a declarations file), their
backfill, and their evaluation over whole days.

Every edit is one new config version (:mod:`metrics_lake.core.config_store`),
recorded with ``--by`` (default ``LAKE_AUTHOR`` or the OS user); a running
``lake stream`` picks it up on its next micro-batch. ``lake queries
--date D`` evaluates the config store's queries over whole days (the nightly
run); ``lake queries backfill`` fills a new or changed query's past windows.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich import table as rich_table
from rich.markup import escape

from metrics_lake.app.cli.config_edits import (
    ByOption,
    FromFileOption,
    YesOption,
    group_callback,
    open_config_store,
    print_history,
)
from metrics_lake.app.cli.options import DateOption, FromOption, ToOption, open_tables, settings
from metrics_lake.app.console import err, out
from metrics_lake.lake_schemas.errors import StoredQueryError
from metrics_lake.lake_schemas.table_access import QUERIES
from metrics_lake.lake_schemas.tables import Table

__all__ = ["queries_app"]

queries_app = typer.Typer(
    help="Stored queries: manage the config store (add, rm, list, show, history, --from-file), backfill, and evaluate "
    "days (--date).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@queries_app.callback()
def queries(
    ctx: typer.Context,
    date: DateOption = None,
    from_day: FromOption = None,
    to_day: ToOption = None,
    from_file: FromFileOption = None,
    yes: YesOption = False,
    by: ByOption = None,
) -> None:
    """Evaluate the config store's stored queries over days into query_results (--date, or --from/--to), or apply a file."""
    from metrics_lake.core.config_store import QUERY

    group_callback(
        ctx,
        "queries",
        QUERY,
        date=date,
        from_day=from_day,
        to_day=to_day,
        from_file=from_file,
        yes=yes,
        by=by,
        hint=_backfill_hint,
        evaluate=_evaluate_days,
    )


def _evaluate_days(chosen: list) -> None:
    from metrics_lake.spark.jobs.evaluate_queries import evaluate_queries_for_day
    from metrics_lake.spark.session import build_session

    config = settings()
    open_tables(config, *QUERIES.tables)
    declared = open_config_store().current().queries()
    err.print(f"evaluating {len(declared)} stored queries over {len(chosen)} day(s) into {Table.QUERY_RESULTS} ...")
    spark = build_session(config, "lake-queries")
    for day in chosen:
        result = evaluate_queries_for_day(spark, config, declared, day)
        err.print(f"{day}: {result.queries} queries -> {result.rows:,} rows ({result.seconds:.1f} s)")


def _backfill_hint(changes) -> str:
    if any(c.action == "put" for c in changes):
        return "; live from the stream's next micro-batch, past windows with `lake queries backfill`"
    return ""


@queries_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Name: a-z, 0-9, _ (at most 64).")],
    query: Annotated[str, typer.Argument(help='"FROM <selector> SELECT <metric> WINDOW <d> [EVERY <s>] COMPUTE …"')],
    description: Annotated[str | None, typer.Option("--description", help="What the query is for.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Change the query if the name exists.")] = False,
    by: ByOption = None,
) -> None:
    """Add a stored query (or change one with --replace); the stream evaluates it from its next micro-batch."""
    from metrics_lake.core.config_store import Change

    config_store = open_config_store()
    current = config_store.current()
    if name in current.entries and not replace:
        raise StoredQueryError(
            f"stored query {name!r} exists ({current.entries[name].query}); change it with --replace"
        )
    new = config_store.apply([Change("put", name, query, description)], by=by, expected=current.version)
    if new.version == current.version:
        err.print(f"{name}: unchanged (config version {new.version})")
        return
    entry = new.entry(name)
    err.print(f"{name}: revision {entry.revision}, config version {new.version}{_backfill_hint(new.changes)}")


@queries_app.command("rm")
def rm(
    name: Annotated[str, typer.Argument(help="The stored query to remove.")],
    purge: Annotated[
        bool,
        typer.Option("--purge", help=f"Also delete its rows from {Table.QUERY_RESULTS} (else kept until retention)."),
    ] = False,
    by: ByOption = None,
) -> None:
    """Remove a stored query: its rows stop being updated and are kept until retention, or deleted with --purge."""
    from metrics_lake.core.config_store import Change

    config_store = open_config_store()
    new = config_store.apply([Change("delete", name)], by=by)
    err.print(f"{name}: removed, config version {new.version}")
    if purge:
        from metrics_lake.core.maintenance.query_backfill import purge_query
        from metrics_lake.core.storage import open_store

        deleted = purge_query(open_store(settings()), name)
        err.print(f"{name}: {deleted:,} rows deleted from {Table.QUERY_RESULTS}")


@queries_app.command("list")
def list_queries() -> None:
    """List the stored queries: name, revision, whether the stream and the backfill are at it, query, description."""
    config_store = open_config_store()
    current = config_store.current()
    statuses = _statuses(current)
    listing = rich_table.Table(
        "name", "revision", "status", "query", "description", title=f"config version {current.version}"
    )
    for name, entry in sorted(current.entries.items()):
        listing.add_row(name, str(entry.revision), statuses[name], entry.query, entry.description)
    out.print(listing)


def _statuses(current) -> dict[str, str]:
    """Per query: ``live, backfilled`` / ``live, backfill pending`` / ``waiting for the stream``."""
    from metrics_lake.core.speed.progress import query_progress
    from metrics_lake.core.storage import open_store
    from metrics_lake.core.tables.delta import ensure_table

    table = ensure_table(open_store(settings()), Table.QUERY_RESULTS)
    statuses = {}
    for name, entry in current.entries.items():
        progress = query_progress(table, name)
        live = "live" if progress.is_live(entry.revision) else "waiting for the stream"
        backfill = "backfilled" if progress.is_backfilled(entry.revision) else "backfill pending"
        statuses[name] = f"{live}, {backfill}"
    return statuses


@queries_app.command("show")
def show(name: Annotated[str, typer.Argument(help="The stored query.")]) -> None:
    """Show one stored query: its text, description, revision, status and the edits that touched it."""
    from metrics_lake.core.config_store import QUERY

    config_store = open_config_store()
    current = config_store.current()
    entry = current.entry(name)
    parsed = entry.parsed()
    out.print(f"[bold]{escape(name)}[/]  revision {entry.revision} ({_statuses(current)[name]})")
    out.print(f"  query        {escape(entry.query)}", soft_wrap=True)
    out.print(f"  description  {escape(entry.description)}", soft_wrap=True)
    out.print(
        f"  metric {parsed.metric}, window {parsed.duration_s}s every {parsed.slide_s}s, "
        f"servers {','.join(parsed.servers)}, aggregates {', '.join(a.label for a in parsed.aggregates)}"
        + (f", labels {','.join(map(str, parsed.matchers))}" if parsed.matchers else "")
        + (", per server" if parsed.per_server else "")
        + (f", by {','.join(parsed.group_by)}" if parsed.group_by else ""),
        soft_wrap=True,
    )
    for version in config_store.history(name, QUERY):
        for change in (c for c in version.changes if c.name == name):
            out.print(f"  v{version.version} {version.at} {escape(version.by)}: {escape(change.describe())}")


@queries_app.command("history")
def history(name: Annotated[str | None, typer.Argument(help="Only the edits of this query.")] = None) -> None:
    """List the config store's versions: who changed what, when (queries and alert rules)."""
    from metrics_lake.core.config_store import QUERY

    print_history(name, None if name is None else QUERY)


@queries_app.command("backfill")
def backfill(
    names: Annotated[list[str] | None, typer.Argument(help="Only these queries (default: every pending one).")] = None,
) -> None:
    """Fill the past windows of new or changed stored queries from the retained 1-minute windows."""
    from metrics_lake.core.maintenance.query_backfill import backfill_queries, pending_backfills
    from metrics_lake.core.storage import open_store

    config = settings()
    store = open_store(config)
    current = open_config_store().current()
    chosen = [current.entry(n).parsed() for n in names] if names else pending_backfills(store, current.queries())
    if not chosen:
        err.print(f"every stored query of config version {current.version} is backfilled")
        return
    err.print(f"backfilling {len(chosen)} stored quer{'y' if len(chosen) == 1 else 'ies'} ...")
    backfill_queries(
        store,
        config.topic,
        chosen,
        progress=lambda r: err.print(
            f"{r.query}: revision {r.revision}, {r.days} day(s) of windows -> {r.rows:,} rows ({r.seconds:.1f} s)"
        ),
    )
