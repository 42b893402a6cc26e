"""``lake recompute``, ``lake rollup``, ``lake queries``: the batch layer, a UTC day at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import table as rich_table

from metrics_lake.app.cli.options import DateOption, FromOption, ToOption, days, open_tables, settings
from metrics_lake.app.console import err, out
from metrics_lake.lake_schemas.operations import QUERIES, RECOMPUTE, ROLLUP
from metrics_lake.lake_schemas.tables import Table

__all__ = ["queries", "recompute", "rollup"]


def recompute(date: DateOption = None, from_day: FromOption = None, to_day: ToOption = None) -> None:
    """Batch layer: rebuild days of metric_windows_1m from bronze (late events included) and reconcile."""
    from metrics_lake.spark.jobs.recompute import recompute as run_recompute
    from metrics_lake.spark.session import build_session

    chosen = days(date, from_day, to_day)
    config = settings()
    open_tables(config, *RECOMPUTE.tables)
    err.print(f"recomputing {len(chosen)} day(s) of {Table.METRIC_WINDOWS_1M} from {Table.BRONZE_EVENTS} ...")
    spark = build_session(config, "lake-recompute")

    def progress(result) -> None:
        if result.skipped:
            err.print(f"{result.day}: unchanged since the last recompute, skipped")
        else:
            err.print(
                f"{result.day}: {result.events:,} events -> {result.windows:,} windows, "
                f"{result.late_events:,} late events the speed layer missed ({result.seconds:.1f} s)"
            )

    run_recompute(spark, config, chosen, progress)


def rollup(date: DateOption = None, from_day: FromOption = None, to_day: ToOption = None) -> None:
    """Downsample days of 1-minute windows into metric_rollup_1h and metric_rollup_1d (merged sketches)."""
    from metrics_lake.spark.jobs.rollups import rollup as run_rollup
    from metrics_lake.spark.session import build_session

    chosen = days(date, from_day, to_day)
    config = settings()
    open_tables(config, *ROLLUP.tables)
    chain = " -> ".join([ROLLUP.reads[0], *ROLLUP.writes])
    err.print(f"rolling up {len(chosen)} day(s): {chain} ...")
    spark = build_session(config, "lake-rollup")
    run_rollup(spark, config, chosen, lambda r: err.print(f"{r.day}: {r.table}: {r.rows:,} rows ({r.seconds:.1f} s)"))


def queries(
    date: DateOption = None,
    from_day: FromOption = None,
    to_day: ToOption = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", help="Stored query declarations (default: the shipped stored_queries.toml)."),
    ] = None,
    list_only: Annotated[bool, typer.Option("--list", help="Only parse and list the stored queries.")] = False,
) -> None:
    """Evaluate the stored queries (FROM … SELECT … WINDOW … COMPUTE …) for days into query_results."""
    from metrics_lake.core.kernels.stored_queries import load_stored_queries

    declared = load_stored_queries(file)
    if list_only:
        listing = rich_table.Table("name", "query", "description")
        for query in declared:
            listing.add_row(query.name, query.text, query.description)
        out.print(listing)
        return
    from metrics_lake.spark.jobs.evaluate_queries import evaluate_day
    from metrics_lake.spark.session import build_session

    chosen = days(date, from_day, to_day)
    config = settings()
    open_tables(config, *QUERIES.tables)
    err.print(f"evaluating {len(declared)} stored queries over {len(chosen)} day(s) into {Table.QUERY_RESULTS} ...")
    spark = build_session(config, "lake-queries")
    for day in chosen:
        result = evaluate_day(spark, config, declared, day)
        err.print(f"{day}: {result.queries} queries -> {result.rows:,} rows ({result.seconds:.1f} s)")
