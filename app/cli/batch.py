"""``lake recompute``, ``lake rollup``: the batch layer, a UTC day at a time (``lake queries --date``: :mod:`.queries`)."""

from __future__ import annotations

from metrics_lake.app.cli.options import DateOption, FromOption, ToOption, days, open_tables, settings
from metrics_lake.app.console import err
from metrics_lake.lake_schemas.table_access import RECOMPUTE, ROLLUP
from metrics_lake.lake_schemas.tables import Table

__all__ = ["recompute", "rollup"]


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
