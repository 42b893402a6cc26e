"""The ``lake`` command line: thin commands over library functions.

Configuration comes from ``LAKE_*`` variables or ``lake.toml`` (see
:mod:`lake.config`); flags cover per-run choices. Known errors become a
one-line message and exit code 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import signal
import sys
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lake.config import ConfigError, LakeSettings, load_settings
from lake.log.log import SegmentLog, TopicNotFoundError
from lake.log.producer import producer_for
from lake.storage import open_store

app = typer.Typer(
    help="metrics-lake: a lambda-style data lake for machine and application metrics.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()


class OutputFormat(StrEnum):
    """``lake sql`` output formats."""

    table = "table"
    csv = "csv"
    json = "json"


def _settings(**overrides) -> LakeSettings:
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=err)])
    return load_settings(**overrides)


def _stop_on_signals() -> threading.Event:
    """An event set by SIGTERM (systemd, Kubernetes, Airflow) or Ctrl-C, for a clean stop between batches."""
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _fail(message: str) -> None:
    err.print(f"[red]error:[/] {message}")
    raise typer.Exit(2)


GatewayOption = Annotated[
    str | None,
    typer.Option(
        help="Send through the ingest gateway at this URL (e.g. http://127.0.0.1:8787), spooling to "
        "LAKE_SPOOL_DIR while it is unreachable, instead of writing the log directly."
    ),
]


def _sink(settings: LakeSettings, gateway: str | None):
    """Where agents send: a gateway (through the disk spool) or the log directly."""
    if gateway is None:
        return producer_for(settings)
    from agents.gateway_client import GatewaySender

    err.print(f"sending through {gateway} (spool {settings.spool_dir})")
    return GatewaySender(gateway, settings.spool_dir)


@app.command()
def produce(
    servers: Annotated[int, typer.Option(min=1, help="Simulated servers.")] = 10,
    metrics: Annotated[int, typer.Option(min=1, help="Metrics per server.")] = 5,
    seconds: Annotated[int, typer.Option(min=1, help="Seconds of event time to generate.")] = 60,
    rate: Annotated[float, typer.Option(min=0.001, help="Samples per second per (server, metric).")] = 1.0,
    seed: Annotated[int, typer.Option(help="RNG seed: same seed, same events.")] = 42,
    realtime: Annotated[bool, typer.Option(help="Pace sending to the wall clock instead of all at once.")] = False,
    from_file: Annotated[Path | None, typer.Option(help="Import JSON Lines (.jsonl or .jsonl.gz) instead.")] = None,
    gateway: GatewayOption = None,
) -> None:
    """Produce events to the log: a seeded fleet simulator, or a JSON Lines import."""
    from agents.file_import import import_jsonl
    from agents.simulator import FleetSimulator, send_in_real_time

    settings = _settings()
    if from_file is not None and not from_file.exists():
        _fail(f"--from-file {from_file}: no such file")
    try:
        with _sink(settings, gateway) as producer:
            if from_file is not None:
                stats = import_jsonl(producer, from_file)
                err.print(
                    f"imported {from_file}: {stats.accepted:,} events accepted, {stats.rejected:,} rejected "
                    f"(-> quarantine_events), {stats.blank:,} blank lines skipped"
                )
                return
            simulator = FleetSimulator(
                servers=servers,
                metrics=metrics,
                seconds=seconds,
                rate=rate,
                seed=seed,
                start_ms=int(time.time() * 1000) if realtime else None,
            )
            err.print(f"simulating {simulator.total_events:,} events from {servers} servers x {metrics} metrics")
            started = time.monotonic()
            if realtime:
                send_in_real_time(simulator, producer.send)
            else:
                producer.send(simulator.generate())
        elapsed = time.monotonic() - started
        unit = "acknowledged requests" if gateway else "segments"
        err.print(
            f"produced {producer.stats.records:,} events in {producer.stats.segments} {unit} "
            f"to topic {settings.topic!r} in {elapsed:.1f} s"
        )
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))


@app.command()
def agent(
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between samples.")] = 5.0,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: run until Ctrl-C).")
    ] = None,
    server: Annotated[str | None, typer.Option(help="Server name to report (default: hostname).")] = None,
    gateway: GatewayOption = None,
) -> None:
    """Run the host agent: this machine's CPU, memory, swap, disk, network, load and process metrics."""
    from agents.host import HostAgent

    settings = _settings()
    host = HostAgent(server)
    stop = threading.Event()
    err.print(
        f"host agent for {host.server!r}: sampling every {interval:g} s into topic {settings.topic!r}; Ctrl-C stops"
    )
    try:
        with _sink(settings, gateway) as producer:
            sent = host.run(producer, interval=interval, duration=duration, stop=stop)
    except KeyboardInterrupt:
        stop.set()
        err.print("stopped")
        return
    except ConfigError as exc:
        _fail(str(exc))
    err.print(f"sent {sent:,} events")


def _partition_list(text: str | None) -> list[int] | None:
    """``"0,2-3"`` -> ``[0, 2, 3]``; ``None`` stays ``None`` (all partitions)."""
    if text is None:
        return None
    owned: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise typer.BadParameter(f"{text!r}: use partition numbers and ranges such as 0,2-3")
        owned.extend(range(int(lo), int(hi or lo) + 1))
    return owned


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Listen address (default LAKE_GATEWAY_HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default LAKE_GATEWAY_PORT, 8787).")] = None,
    partitions: Annotated[
        str | None, typer.Option(help="Partitions this gateway owns, e.g. 0-1 or 0,2 (default: all).")
    ] = None,
    linger_ms: Annotated[int, typer.Option(min=1, help="Group-commit window: flush a partition this often.")] = 200,
    roll_bytes: Annotated[
        int | None, typer.Option(min=1024, help="Flush a partition early at this many buffered bytes.")
    ] = None,
) -> None:
    """Run the ingest gateway: agents POST events; 200 means durable in the log (see lake/gateway.py)."""
    from lake.gateway import Gateway, serve
    from lake.log.lease import LeaseHeldError

    settings = _settings()
    stop = _stop_on_signals()
    try:
        owned = _partition_list(partitions)
        err.print(f"gateway: taking the leases of topic {settings.topic!r} partitions {partitions or 'all'}...")
        ingest = Gateway(settings, owned=owned, linger_ms=linger_ms, roll_bytes=roll_bytes)
    except (LeaseHeldError, ValueError) as exc:
        _fail(str(exc))

    def ready(address) -> None:
        err.print(
            f"gateway {ingest.gateway_id} listening on http://{address[0]}:{address[1]} "
            f"(partitions {ingest.producer.owned}, linger {linger_ms} ms); Ctrl-C stops"
        )

    serve(ingest, host or settings.gateway_host, settings.gateway_port if port is None else port, stop, ready=ready)
    err.print(f"stopped; {ingest.producer.stats.records:,} events received")


def _time_ms(option: str, text: str | None) -> int | None:
    """``--from-time``/``--to-time``: ISO-8601 with a zone, or epoch milliseconds."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{option} {text!r}: use ISO-8601 such as 2026-11-21T10:00:00Z, or epoch ms") from None
    if moment.tzinfo is None:
        raise typer.BadParameter(f"{option} {text!r}: add a zone (Z or +01:00); event times are UTC instants")
    return int(moment.timestamp() * 1000)


@app.command()
def replay(
    from_offset: Annotated[int | None, typer.Option(min=0, help="First offset (every partition).")] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="End offset, exclusive (every partition).")] = None,
    from_time: Annotated[str | None, typer.Option(help="Events at or after this time (ISO-8601 or epoch ms).")] = None,
    to_time: Annotated[str | None, typer.Option(help="Events before this time (ISO-8601 or epoch ms).")] = None,
    partitions: Annotated[str | None, typer.Option(help="Only these partitions, e.g. 0,2-3.")] = None,
    into: Annotated[
        str | None, typer.Option(help="Write the range's events to this new table instead of bronze_events.")
    ] = None,
    topic: Annotated[str | None, typer.Option(help="Topic to replay (default LAKE_TOPIC).")] = None,
) -> None:
    """Re-read a range of the log through the bronze path; rows already in the table are skipped."""
    from spark.jobs.replay import replay as run_replay
    from spark.jobs.replay import replay_ranges

    settings = _settings()
    topic = topic or settings.topic
    from_ms, to_ms = _time_ms("--from-time", from_time), _time_ms("--to-time", to_time)
    log = SegmentLog(open_store(settings))
    try:
        ranges = replay_ranges(
            log,
            topic,
            from_offset=from_offset,
            to_offset=to_offset,
            from_time_ms=from_ms,
            to_time_ms=to_ms,
            partitions=_partition_list(partitions),
        )
    except (TopicNotFoundError, IndexError) as exc:
        _fail(str(exc))
    total = sum(r.end - r.start for r in ranges)
    err.print(
        f"replaying {total:,} records of {topic!r}: " + ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in ranges)
    )
    try:
        stats = run_replay(
            log,
            topic,
            ranges,
            into=into,
            from_time_ms=from_ms,
            to_time_ms=to_ms,
            progress=lambda r, done: err.print(f"  partition {r.partition}: {done:,}/{r.end - r.start:,}"),
        )
    except ValueError as exc:
        _fail(str(exc))
    written = ", ".join(f"{n:,} rows to {t}" for t, n in stats.written.items())
    err.print(f"read {stats.read:,} records; wrote {written}; {stats.already_present:,} already present (skipped)")


@app.command()
def consumers(
    group: Annotated[str | None, typer.Option(help="Only this consumer group.")] = None,
) -> None:
    """Consumer groups: committed offset, log end and lag per partition."""
    from lake.log.consumer_groups import lag_report

    settings = _settings()
    report = lag_report(SegmentLog(open_store(settings)), group)
    if not report:
        err.print("no consumer group has committed offsets yet (`lake stream` commits speed-bronze and speed-windows)")
        return
    view = Table("group", "topic", "partition", "committed", "log start", "log end", "lag")
    for row in report:
        lag = Text(f"{row.lag:,}", style="red" if row.behind_retention else "")
        committed = "-" if row.committed is None else f"{row.committed:,}"
        view.add_row(row.group, row.topic, str(row.partition), committed, f"{row.start:,}", f"{row.end:,}", lag)
    out.print(view)
    behind = [r for r in report if r.behind_retention]
    if behind:
        err.print(f"[red]warning:[/] {len(behind)} partition(s) have unread records already removed by retention")
        raise typer.Exit(1)


@app.command()
def compact(
    tables: Annotated[
        str | None, typer.Option(help="Comma-separated tables to compact (default: every table).")
    ] = None,
    z_order: Annotated[
        bool,
        typer.Option("--z-order", help="Z-order rewritten partitions by metric, server (slower, better skipping)."),
    ] = False,
    log_only: Annotated[bool, typer.Option("--log-only", help="Compact only the log's segments.")] = False,
    tables_only: Annotated[bool, typer.Option("--tables-only", help="Compact only Delta tables.")] = False,
) -> None:
    """Compaction: merge small log segments (offsets unchanged) and bin-pack small Delta files, then checkpoint."""
    from lake.log.compaction import compact_log
    from lake.table_compaction import compact_table
    from lake.tables import list_tables

    settings = _settings()
    store = open_store(settings)
    if not tables_only:
        view = Table("topic", "partition", "segments", "after", "avg KiB", "after", "runs merged", "objects deleted")
        results = compact_log(
            SegmentLog(store),
            target_bytes=settings.log_compaction_target_bytes,
            delete_delay_ms=int(settings.segment_delete_delay_seconds * 1000),
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
        _fail(f"no such table(s): {', '.join(unknown)} (existing: {', '.join(existing)})")
    view = Table("table", "files", "after", "avg KiB", "after", "partitions rewritten", "version", "seconds")
    for name in chosen:
        r = compact_table(
            store, name, target_bytes=settings.table_compaction_target_bytes, z_order=z_order, progress=err.print
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


def print_retention(plan, applied: bool) -> None:
    """Render a :class:`lake.retention.RetentionPlan` as tables on stdout, warnings on stderr."""
    verb = "deleted" if applied else "would delete"
    view = Table("topic", "partition", f"segments {verb}", "records", "MiB", "start offset", "new start")
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
    view = Table("table", "keeps from", f"days {verb}", "files", "rows", "MiB")
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


@app.command()
def retain(
    yes: Annotated[bool, typer.Option("--yes", help="Really delete; without it, only show what would go.")] = False,
) -> None:
    """Retention per resolution: old log segments, old table partitions, VACUUM. Dry run unless --yes.

    Exits 1 when a consumer group has unread records past retention.
    """
    from lake.retention import apply_retention, plan_retention

    settings = _settings()
    store = open_store(settings)
    now = dt.datetime.now(dt.UTC)
    plan = apply_retention(settings, store, now) if yes else plan_retention(settings, store, now)
    print_retention(plan, applied=yes)
    if not yes:
        err.print("dry run: nothing was deleted; run with --yes to delete")
    if plan.groups_behind:
        raise typer.Exit(1)


def _day(option: str, text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{option} {text!r}: expected a UTC date YYYY-MM-DD") from None


DateOption = Annotated[str | None, typer.Option("--date", help="UTC day, YYYY-MM-DD.")]
FromOption = Annotated[str | None, typer.Option("--from", help="First UTC day of a range.")]
ToOption = Annotated[str | None, typer.Option("--to", help="Last UTC day of a range (inclusive).")]


def _days(date: str | None, from_day: str | None, to_day: str | None) -> list[dt.date]:
    """The days named by ``--date`` or ``--from``/``--to``; exits with a clear error otherwise."""
    if (date is None) == (from_day is None and to_day is None):
        _fail("give --date DAY, or --from DAY --to DAY")
    if date is not None:
        return [_day("--date", date)]
    if from_day is None or to_day is None:
        _fail("a range needs both --from and --to")
    first, last = _day("--from", from_day), _day("--to", to_day)
    if last < first:
        _fail(f"--to {last} is before --from {first}")
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


@app.command()
def recompute(date: DateOption = None, from_day: FromOption = None, to_day: ToOption = None) -> None:
    """Batch layer: rebuild days of metric_windows_1m from bronze (late events included) and reconcile."""
    from spark.jobs.recompute import recompute as run_recompute
    from spark.session import build_session

    days = _days(date, from_day, to_day)
    settings = _settings()
    err.print(f"recomputing {len(days)} day(s) of metric_windows_1m from bronze_events ...")
    spark = build_session(settings, "lake-recompute")

    def progress(result) -> None:
        if result.skipped:
            err.print(f"{result.day}: unchanged since the last recompute, skipped")
        else:
            err.print(
                f"{result.day}: {result.events:,} events -> {result.windows:,} windows, "
                f"{result.late_events:,} late events the speed layer missed ({result.seconds:.1f} s)"
            )

    run_recompute(spark, settings, days, progress)


@app.command()
def rollup(date: DateOption = None, from_day: FromOption = None, to_day: ToOption = None) -> None:
    """Downsample days of 1-minute windows into metric_rollup_1h and metric_rollup_1d (merged KLL sketches)."""
    from spark.jobs.rollups import rollup as run_rollup
    from spark.session import build_session

    days = _days(date, from_day, to_day)
    settings = _settings()
    err.print(f"rolling up {len(days)} day(s): metric_windows_1m -> metric_rollup_1h -> metric_rollup_1d ...")
    spark = build_session(settings, "lake-rollup")
    run_rollup(spark, settings, days, lambda r: err.print(f"{r.day}: {r.table}: {r.rows:,} rows ({r.seconds:.1f} s)"))


@app.command()
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
    from lake_schemas.stored_queries import StoredQueryError, load_stored_queries

    try:
        declared = load_stored_queries(file)
    except StoredQueryError as exc:
        _fail(str(exc))
    if list_only:
        listing = Table("name", "query", "description")
        for query in declared:
            listing.add_row(query.name, query.text, query.description)
        out.print(listing)
        return
    from spark.jobs.stored_queries import evaluate_day
    from spark.session import build_session

    days = _days(date, from_day, to_day)
    settings = _settings()
    err.print(f"evaluating {len(declared)} stored queries over {len(days)} day(s) into query_results ...")
    spark = build_session(settings, "lake-queries")
    for day in days:
        result = evaluate_day(spark, settings, declared, day)
        err.print(f"{day}: {result.queries} queries -> {result.rows:,} rows ({result.seconds:.1f} s)")


@app.command()
def stream(
    once: Annotated[bool, typer.Option("--once", help="Process everything available, then stop.")] = False,
    trigger: Annotated[
        float | None, typer.Option(help="Micro-batch interval in seconds (LAKE_TRIGGER_SECONDS).")
    ] = None,
) -> None:
    """Run the speed layer: log -> bronze_events, quarantine_events, metric_windows_1m, exactly once."""
    from pyspark.errors import StreamingQueryException

    from spark.jobs.progress import BatchProgressPrinter
    from spark.jobs.stream_metrics import run_stream
    from spark.session import build_session

    try:
        settings = _settings(trigger_seconds=trigger)
        spark = build_session(settings, "lake-stream")
    except ConfigError as exc:
        _fail(str(exc))
    spark.streams.addListener(BatchProgressPrinter(err))
    stop = None if once else _stop_on_signals()
    mode = "until all available data is processed" if once else f"every {settings.trigger_seconds:g} s until Ctrl-C"
    err.print(f"speed layer for topic {settings.topic!r} ({mode}); checkpoints in {settings.checkpoint_path}")
    try:
        run_stream(spark, settings, once=once, stop=stop)
        if stop is not None and stop.is_set():
            err.print("stopped on signal, between micro-batches")
    except KeyboardInterrupt:
        err.print("interrupted")
    except StreamingQueryException as exc:
        _fail(f"streaming query failed: {exc.getMessage().splitlines()[0]}")
    finally:
        spark.stop()


def _print_arrow(result: pa.Table, fmt: OutputFormat) -> None:
    rows = result.to_pylist()
    for row in rows:
        for key, value in row.items():
            if isinstance(value, bytes):
                row[key] = value.hex() if fmt is not OutputFormat.table else f"<{len(value)} bytes>"
    if fmt is OutputFormat.json:
        for row in rows:
            sys.stdout.write(json.dumps(row, default=str) + "\n")
    elif fmt is OutputFormat.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=result.column_names)
        writer.writeheader()
        writer.writerows(rows)
    else:
        table = Table(*result.column_names, show_lines=False)
        for row in rows:
            table.add_row(*(Text("" if v is None else str(v)) for v in row.values()))
        out.print(table)
        err.print(f"{len(rows):,} row(s)")


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A Spark SQL query over the lake's tables.")],
    version: Annotated[
        list[str] | None, typer.Option(help="Time travel: N (every table) or TABLE=N; repeatable.")
    ] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.table,
    limit: Annotated[int, typer.Option(min=1, help="Most rows to print.")] = 1000,
) -> None:
    """Run Spark SQL over every table (bronze_events, quarantine_events, metric_windows_1m, ...)."""
    from pyspark.errors import PySparkException

    from spark.jobs.sql_query import parse_versions, run_sql
    from spark.session import build_session

    try:
        settings = _settings()
        versions = parse_versions(version or [])
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    spark = build_session(settings, "lake-sql")
    try:
        result = run_sql(spark, settings, query, versions).limit(limit).toArrow()
    except (ValueError, PySparkException) as exc:
        _fail(str(exc).splitlines()[0])
    finally:
        spark.stop()
    _print_arrow(result, format)


@app.command()
def tables() -> None:
    """List the lake's tables with their Delta version, active files, rows and size."""
    from lake.tables import summarize_tables

    try:
        summaries = summarize_tables(open_store(_settings()))
    except ConfigError as exc:
        _fail(str(exc))
    table = Table("table", "version", "files", "rows", "MiB")
    for s in summaries:
        table.add_row(s.name, str(s.version), f"{s.files:,}", f"{s.rows:,}", f"{s.size_bytes / 2**20:.2f}")
    out.print(table)


@app.command()
def quality(
    table: Annotated[str | None, typer.Option(help="Only this table (default: every table with a suite).")] = None,
    date: Annotated[str | None, typer.Option("--date", help="UTC day to check, YYYY-MM-DD (default: today).")] = None,
) -> None:
    """Data quality: run the Great Expectations checkpoints for a day, record dq_results, publish data docs.

    Exits 1 when a critical expectation fails (the gate for rollups and stored queries).
    """
    from quality.checkpoint import run_quality
    from spark.session import build_session

    day = _day("--date", date) if date else dt.datetime.now(dt.UTC).date()
    settings = _settings()
    err.print(f"checking {table or 'every table'} for {day} with Great Expectations ...")
    spark = build_session(settings, "lake-quality")
    try:
        report = run_quality(spark, settings, day, [table] if table else None)
    except KeyError as exc:
        _fail(str(exc.args[0]))
    view = Table("suite", "rows", "expectations", "passed", "failed", "worst failure")
    for name, rows in report.rows.items():
        mine = [o for o in report.outcomes if o.table == name]
        failed = [o for o in mine if not o.success]
        worst = sorted(failed, key=lambda o: not o.critical)[:1]
        text = Text("")
        if worst:
            o = worst[0]
            text = Text(
                f"{'CRITICAL' if o.critical else 'warning'} {o.expectation}({o.column or ''}): "
                f"{o.unexpected_count if o.unexpected_count is not None else o.observed_value} unexpected",
                style="red" if o.critical else "yellow",
            )
        view.add_row(name, f"{rows:,}", str(len(mine)), str(len(mine) - len(failed)), str(len(failed)), text)
    out.print(view)
    if not report.rows:
        err.print(f"no rows on {day} in the checked tables")
    err.print(f"report: {report.docs_index}  trend: {settings.quality_path / 'trend.html'}  ({report.seconds:.1f} s)")
    err.print(f"failing rows: lake sql \"SELECT * FROM dq_results WHERE run_id = '{report.run_id}' AND NOT success\"")
    if report.critical_failures():
        err.print("[red]critical expectations failed:[/]\n" + escape(report.describe_failures()))
        raise typer.Exit(1)


@app.command("airflow")
def airflow_standalone(
    home: Annotated[Path, typer.Option(help="AIRFLOW_HOME: config, SQLite DB, logs.")] = Path(".airflow"),
    port: Annotated[int, typer.Option(help="Port of the Airflow UI/API on 127.0.0.1.")] = 8080,
    dags_folder: Annotated[
        Path | None, typer.Option(help="Folder with the DAGs (default: dags/ of this checkout).")
    ] = None,
) -> None:
    """Start a local Airflow (standalone: scheduler, DAG processor, API server, triggerer; SQLite) with the lake's DAGs.

    The DAG tasks read LAKE_* from this environment, so they work on the
    same lake as the CLI. The UI is at http://127.0.0.1:PORT; the admin
    password is printed by Airflow and kept in HOME. Stop it with Ctrl-C.
    """
    import os
    import shutil

    dags = (dags_folder or Path(__file__).resolve().parents[1] / "dags").resolve()
    if not (dags / "lake_nightly.py").exists():
        _fail(f"no metrics-lake DAGs in {dags}; pass --dags-folder")
    beside = Path(sys.executable).with_name("airflow")  # the same virtualenv, even when it is not on PATH
    airflow = str(beside) if beside.exists() else shutil.which("airflow")
    if airflow is None:
        _fail("Airflow is not installed: pip install 'metrics-lake\\[airflow]' (python3 run.py installs it)")
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",  # where task runners report
        # standalone starts its components as `airflow …` subprocesses: find this one first
        "PATH": f"{Path(airflow).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    err.print(
        f"Airflow home {home}, DAGs from {dags}, UI at http://127.0.0.1:{port} (Ctrl-C stops it); "
        "DAGs start paused: unpause them in the UI or with `airflow dags unpause <dag_id>`"
    )
    os.execvpe(airflow, [airflow, "standalone"], env)


@app.command()
def demo(
    seconds: Annotated[int, typer.Option(min=5, help="How long the agents produce, in seconds.")] = 60,
    servers: Annotated[int, typer.Option(min=1, help="Simulated servers beside this host.")] = 20,
    metrics: Annotated[int, typer.Option(min=1, help="Metrics per simulated server.")] = 8,
) -> None:
    """The main job, end to end: host agent + fleet simulator -> log -> speed layer -> Spark SQL."""
    from lake.demo import run_demo

    try:
        settings = _settings()
        run_demo(settings, seconds=seconds, servers=servers, metrics=metrics, console=err)
    except (ConfigError, TopicNotFoundError) as exc:
        _fail(str(exc))


infra_app = typer.Typer(help="A local S3 server (SeaweedFS) for the lake: up, down, status.", no_args_is_help=True)
app.add_typer(infra_app, name="infra")

DataDir = Annotated[Path, typer.Option(help="Server data, logs and identities (keep it out of git).")]
# SeaweedFS also listens on every port + 10000 (gRPC), hence the upper bounds.
S3Port = Annotated[int, typer.Option(min=1024, max=55535, help="S3 port on 127.0.0.1.")]
MasterPort = Annotated[
    int, typer.Option(min=2700, max=55535, help="SeaweedFS master port (the volume and filer ports follow it).")
]


def _s3_server(data_dir: Path, s3_port: int, master_port: int, bucket: str = "lake"):
    from infra.seaweedfs import S3Server

    return S3Server(data_dir.resolve(), bucket=bucket, s3_port=s3_port, master_port=master_port)


@infra_app.command("up")
def infra_up(
    data_dir: DataDir = Path(".lake-infra/seaweedfs"),
    s3_port: S3Port = 8333,
    master_port: MasterPort = 19333,
    bucket: Annotated[str, typer.Option(help="Bucket to create.")] = "lake",
    identity: Annotated[
        str,
        typer.Option(help="Identity to export: agent, pipeline, analyst, or admin (all rights: single-user demos)."),
    ] = "pipeline",
) -> None:
    """Start SeaweedFS on 127.0.0.1 and print `export LAKE_...` lines: eval "$(lake infra up)"."""
    from infra.seaweedfs import IDENTITIES, InfraError, export_lines, start

    if identity not in IDENTITIES:
        _fail(f"--identity {identity!r}: choose one of {', '.join(IDENTITIES)}")
    server = _s3_server(data_dir, s3_port, master_port, bucket)
    try:
        start(server, log=err.print)
    except InfraError as exc:
        _fail(str(exc))
    for line in export_lines(server, identity):
        print(line)


@infra_app.command("down")
def infra_down(
    data_dir: DataDir = Path(".lake-infra/seaweedfs"),
    s3_port: S3Port = 8333,
    master_port: MasterPort = 19333,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait after SIGTERM before SIGKILL.")] = 20.0,
) -> None:
    """Stop the local S3 server (its data stays in --data-dir)."""
    from infra.seaweedfs import stop

    if not stop(_s3_server(data_dir, s3_port, master_port), timeout=timeout, log=err.print):
        err.print("not running")


@infra_app.command("status")
def infra_status(
    data_dir: DataDir = Path(".lake-infra/seaweedfs"), s3_port: S3Port = 8333, master_port: MasterPort = 19333
) -> None:
    """Say whether the local S3 server runs and answers; exit code 1 if not."""
    from infra.seaweedfs import running_pid, s3_answers

    server = _s3_server(data_dir, s3_port, master_port)
    pid = running_pid(server)
    answers = pid is not None and s3_answers(server)
    err.print(
        f"SeaweedFS {f'running (pid {pid})' if pid else 'not running'}; "
        f"S3 at {server.endpoint} {'answers' if answers else 'does not answer'}; data in {server.data_dir}"
    )
    if not answers:
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
