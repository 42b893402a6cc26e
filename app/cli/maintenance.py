"""``lake compact``, ``lake retain``: keeping the log and the tables small and within their retention."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer
from rich import table as rich_table

from metrics_lake.app.cli.options import settings
from metrics_lake.app.console import err, out
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.errors import InputError

__all__ = ["compact", "print_retention", "retain"]


def compact(
    tables: Annotated[
        str | None, typer.Option(help="Comma-separated tables to compact (default: every table).")
    ] = None,
    z_order: Annotated[
        bool,
        typer.Option("--z-order", help="Z-order rewritten partitions by metric, server (slower, better skipping)."),
    ] = False,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster",
            help="Instead of bin-packing, sort new files by metric, server, time (files of 1 Mi rows): "
            "queries on a series or a metric skip most files.",
        ),
    ] = False,
    log_only: Annotated[bool, typer.Option("--log-only", help="Compact only the log's segments.")] = False,
    tables_only: Annotated[bool, typer.Option("--tables-only", help="Compact only Delta tables.")] = False,
) -> None:
    """Compaction: merge small log segments (offsets unchanged) and bin-pack (or cluster) small Delta files."""
    from metrics_lake.core.log.segment_compaction import compact_log
    from metrics_lake.core.maintenance.clustering import cluster_table
    from metrics_lake.core.maintenance.table_compaction import compact_table
    from metrics_lake.core.tables.delta import list_tables

    config = settings()
    store = open_store(config)
    if not tables_only:
        view = rich_table.Table(
            "topic", "partition", "segments", "after", "avg KiB", "after", "runs merged", "objects deleted"
        )
        results = compact_log(
            SegmentLog(store),
            target_bytes=config.log_compaction_target_bytes,
            delete_delay_ms=int(config.segment_delete_delay_seconds * 1000),
            **config.keyed_compaction,
        )
        for r in results:
            view.add_row(
                r.topic,
                str(r.partition),
                f"{r.segments_before:,}",
                f"{r.segments_after:,}",
                f"{r.bytes_before / max(r.segments_before, 1) / 1024:,.1f}",
                f"{r.bytes_after / max(r.segments_after, 1) / 1024:,.1f}",
                str(r.runs),
                str(r.deleted),
            )
        out.print(view)
    if log_only:
        return
    existing = list_tables(store)
    chosen = existing if tables is None else [t.strip() for t in tables.split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(existing))
    if unknown:
        raise InputError(f"--tables: no such table(s) {', '.join(unknown)} (existing: {', '.join(existing)})")
    if cluster and z_order:
        raise InputError("--cluster and --z-order are two layouts: choose one")
    if cluster:
        print_clustering([cluster_table(store, name, progress=err.print) for name in chosen])
        return
    view = rich_table.Table("table", "files", "after", "avg KiB", "after", "partitions rewritten", "version", "seconds")
    for name in chosen:
        r = compact_table(
            store,
            name,
            target_bytes=config.table_compaction_target_bytes,
            z_order=z_order,
            progress=err.print,
        )
        view.add_row(
            name,
            f"{r.files_before:,}",
            f"{r.files_after:,}",
            f"{r.avg_bytes_before / 1024:,.1f}",
            f"{r.avg_bytes_after / 1024:,.1f}",
            str(r.partitions_rewritten),
            str(r.version),
            f"{r.seconds:.1f}",
        )
    out.print(view)


def print_clustering(results) -> None:
    """Render :class:`metrics_lake.core.maintenance.clustering.TableClustering` results as a table on stdout."""
    view = rich_table.Table("table", "files read", "files written", "rows", "partitions", "version", "seconds")
    for r in results:
        view.add_row(
            r.table,
            f"{r.files_read:,}",
            f"{r.files_written:,}",
            f"{r.rows:,}",
            str(r.partitions),
            str(r.version),
            f"{r.seconds:.1f}",
        )
    out.print(view)


def print_retention(plan, applied: bool) -> None:
    """Render a :class:`metrics_lake.core.maintenance.retention.RetentionPlan` as tables on stdout, warnings on stderr."""
    verb = "deleted" if applied else "would delete"
    view = rich_table.Table("topic", "partition", f"segments {verb}", "records", "MiB", "start offset", "new start")
    for p in plan.log:
        if p.segments:
            view.add_row(
                p.topic,
                str(p.partition),
                f"{p.segments:,}",
                f"{p.records:,}",
                f"{p.size_bytes / 2**20:,.2f}",
                f"{p.old_start:,}",
                f"{p.new_start:,}",
            )
    out.print(view if view.row_count else f"log: nothing past retention ({len(plan.log)} partitions checked)")
    view = rich_table.Table("table", "keeps from", f"days {verb}", "files", "rows", "MiB")
    for t in plan.tables:
        days = f"{t.days[0]} .. {t.days[-1]} ({len(t.days)})" if t.days else "-"
        view.add_row(t.table, str(t.cutoff), days, f"{t.files:,}", f"{t.rows:,}", f"{t.size_bytes / 2**20:,.2f}")
    out.print(view)
    vacuumed = [(v.table, len(v.files)) for v in plan.vacuum if v.files]
    out.print(f"VACUUM {verb}: " + (", ".join(f"{t}: {n:,} files" for t, n in vacuumed) if vacuumed else "no files"))
    for group, topic, partition, committed, start in plan.groups_behind:
        err.print(
            f"[bold red]consumer group {group!r} is behind retention on {topic}/{partition}:[/] it committed "
            f"offset {committed:,}, retention {'moved' if applied else 'moves'} the log start to {start:,}, "
            f"so {start - committed:,} records it never read {'are' if applied else 'will be'} gone"
        )


def retain(
    yes: Annotated[bool, typer.Option("--yes", help="Really delete; without it, only show what would go.")] = False,
) -> None:
    """Retention per resolution: old log segments, old table partitions, VACUUM. Dry run unless --yes.

    Exits 1 when a consumer group has unread records past retention.
    """
    from metrics_lake.core.maintenance.retention import apply_retention, plan_retention

    config = settings()
    store = open_store(config)
    now = dt.datetime.now(dt.UTC)
    plan = apply_retention(config, store, now) if yes else plan_retention(config, store, now)
    print_retention(plan, applied=yes)
    if not yes:
        err.print("dry run: nothing was deleted; run with --yes to delete")
    if plan.groups_behind:
        raise typer.Exit(1)
