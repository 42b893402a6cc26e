"""``lake sql``, ``lake tables``, ``lake quality``: reading and checking what the lake holds."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import sys
import time
from enum import StrEnum
from typing import Annotated

import pyarrow as pa
import typer
from rich import table as rich_table
from rich.markup import escape
from rich.text import Text

from metrics_lake.app.cli.boundary import first_line
from metrics_lake.app.cli.options import InsecureOption, day, settings
from metrics_lake.app.console import err, out, verbose_output
from metrics_lake.core.config import default_author
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.tables import Table

__all__ = ["OutputFormat", "history", "quality", "series", "sql", "sql_server", "tables"]


class OutputFormat(StrEnum):
    """``lake sql`` output formats."""

    table = "table"
    csv = "csv"
    json = "json"


def print_arrow(result: pa.Table, fmt: OutputFormat) -> None:
    """Write query results to stdout: a rich table (row count on stderr), CSV with a header, or JSON Lines.

    Binary columns (sketches) print as hex in CSV/JSON and as their size in the table.
    """
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
        table = rich_table.Table(*result.column_names, show_lines=False)
        for row in rows:
            table.add_row(*(Text("" if v is None else str(v)) for v in row.values()))
        out.print(table)
        err.print(f"{len(rows):,} row(s)")


def sql(
    query: Annotated[str, typer.Argument(help="A Spark SQL query over the lake's tables.")],
    version: Annotated[
        list[str] | None, typer.Option(help="Time travel: N (every table) or TABLE=N; repeatable.")
    ] = None,
    format: Annotated[OutputFormat, typer.Option("--format", help="Output format.")] = OutputFormat.table,
    limit: Annotated[int, typer.Option(min=1, help="Most rows to print.")] = 1000,
) -> None:
    """Run Spark SQL over every table (bronze_events, quarantine_events, metric_windows_1m, ...).

    Time travel: ``FROM t VERSION AS OF 12`` or ``TIMESTAMP AS OF '2026-11-20 10:00'`` (UTC), or ``--version``.
    With the global ``--verbose``, each table scan prints the files it read of the files in its snapshot.
    """
    from metrics_lake.core.tables.delta import list_tables, open_table
    from metrics_lake.spark.catalog import rewrite_time_travel
    from metrics_lake.spark.datasources.delta_reader import SCAN_REPORT_ENV
    from metrics_lake.spark.jobs.sql_query import parse_versions, referenced_tables, run_sql
    from metrics_lake.spark.session import build_session, stop_session
    from metrics_lake.spark.sql_audit import append_statement

    config = settings()
    versions = parse_versions(version or [])
    store = open_store(config)
    names = referenced_tables(query, list_tables(store))
    for name in names:  # fail on access, and on a malformed time-travel clause, before the JVM starts
        open_table(store, name)
    rewrite_time_travel(query, names)

    def audit(rows: int | None = None, error: str | None = None) -> None:
        """Record the statement in sql_audit; a failure to is a warning, never the command's outcome."""
        try:
            append_statement(
                store,
                caller=default_author(),
                client="lake sql",
                statement=query,
                started=started,
                seconds=time.monotonic() - clock,
                rows=rows,
                error=error,
            )
        except Exception as audit_error:  # noqa: BLE001 - the query's answer stands either way
            err.print(f"[yellow]warning:[/] the statement was not recorded in {Table.SQL_AUDIT}: {audit_error}")

    if verbose_output():
        os.environ[SCAN_REPORT_ENV] = "1"  # inherited by Spark's Python workers, which plan the scans
    spark = build_session(config, "lake-sql")
    started, clock = dt.datetime.now(dt.UTC), time.monotonic()
    try:
        result = run_sql(spark, config, query, versions).limit(limit).toArrow()
    except Exception as exc:
        audit(error=first_line(str(exc)) or type(exc).__name__)
        raise
    finally:
        stop_session(spark)
    print_arrow(result, format)
    audit(rows=result.num_rows)


def history(
    table: Annotated[str, typer.Argument(help=f"A lake table, e.g. {Table.BRONZE_EVENTS}.")],
    limit: Annotated[int, typer.Option(min=1, help="Most versions to list, newest first.")] = 20,
) -> None:
    """List a table's versions: when, which operation, files and rows added and removed (for time travel)."""
    from metrics_lake.core.tables.delta import list_tables
    from metrics_lake.core.tables.time_travel import table_history

    store = open_store(settings())
    existing = list_tables(store)
    if table not in existing:
        raise InputError(f"no table {table!r}; tables: {', '.join(existing)}")
    view = rich_table.Table("version", "committed (UTC)", "operation", "files +", "files -", "rows +", "rows -")
    for v in table_history(store, table, limit):
        removed = "?" if v.rows_removed is None else f"{v.rows_removed:,}"
        view.add_row(
            str(v.version),
            f"{v.at:%Y-%m-%d %H:%M:%S}",
            v.operation,
            f"{v.files_added:,}",
            f"{v.files_removed:,}",
            f"{v.rows_added:,}",
            removed,
        )
    out.print(view)


def sql_server(
    host: Annotated[str, typer.Option(help="Address both listeners bind.")] = "127.0.0.1",
    connect_port: Annotated[int, typer.Option(min=1, max=65535, help="Spark Connect (gRPC) port.")] = 15002,
    jdbc_port: Annotated[int, typer.Option(min=1, max=65535, help="JDBC/ODBC (HiveServer2 Thrift) port.")] = 10000,
    tls_cert: Annotated[
        str | None, typer.Option(help="Serve both listeners over TLS with this PEM certificate chain (LAKE_TLS_CERT).")
    ] = None,
    tls_key: Annotated[str | None, typer.Option(help="PEM private key of --tls-cert (default LAKE_TLS_KEY).")] = None,
    insecure: InsecureOption = False,
) -> None:
    """Serve every lake table to Spark Connect clients and JDBC/ODBC (HiveServer2) clients until Ctrl-C; once the
    lake has tokens, a read or admin token connects (Connect: ;token=..., JDBC: user = its name, password = it);
    with --tls-cert/--tls-key both listeners speak TLS only (Connect: ;use_ssl=true, JDBC: ;ssl=true). A read
    token created with --servers reads only those servers' rows. Every statement is recorded in sql_audit, which
    only admin tokens read; the global --verbose also prints one line each."""
    from metrics_lake.app.auth import Authenticator
    from metrics_lake.app.http_server import TlsFiles, check_exposure
    from metrics_lake.core.tokens import Scope, TokenStore
    from metrics_lake.infra.processes import bind_error
    from metrics_lake.spark.jobs.sql_server import serve_sql

    for port, listener in ((connect_port, "--connect-port"), (jdbc_port, "--jdbc-port")):
        if (error := bind_error(port, host)) is not None:
            raise InputError(f"{listener} {port} on {host} is not free ({error.strerror}): choose another port")
    if connect_port == jdbc_port:
        raise InputError("--connect-port and --jdbc-port must differ")
    config = settings()
    if tls_cert is None and tls_key is None:
        tls_cert, tls_key = config.tls_cert, config.tls_key
    tls = TlsFiles.of(tls_cert, tls_key)  # mutual TLS is the gateway's and dashboard's: not asked of SQL clients
    store = open_store(config)
    tokens = bool(TokenStore(store).active())
    warning = check_exposure("the SQL server", host, tls, tokens, insecure)
    if warning:
        err.print(f"[bold red]{warning}[/]")
    access = "a read token required" if tokens else "open: the lake has no tokens"

    def ready(names: list[str]) -> None:
        err.print(f"serving {len(names)} lake tables read-only ({access}): {', '.join(names)}", highlight=False)
        if tls is None:
            err.print(f"  Spark Connect: sc://{host}:{connect_port}", highlight=False)
            err.print(f"  JDBC/ODBC:     jdbc:hive2://{host}:{jdbc_port}/default", highlight=False)
        else:
            err.print(f"  Spark Connect (TLS): sc://{host}:{connect_port}/;use_ssl=true", highlight=False)
            err.print(f"  JDBC/ODBC (TLS):     jdbc:hive2://{host}:{jdbc_port}/default;ssl=true", highlight=False)
        err.print("Ctrl-C stops the server")

    auth = Authenticator(config, store, row_scope=True)

    def authenticate(credential: str | None, address: str | None) -> str:
        return auth.authenticate_blocking(credential, address, Scope.READ).name

    try:
        serve_sql(
            config,
            host=host,
            connect_port=connect_port,
            jdbc_port=jdbc_port,
            ready=ready,
            authenticate=authenticate,
            tls=None if tls is None else (tls.cert, tls.key),
            verbose=verbose_output(),
            scope_of=auth.scope_of,
        )
    finally:
        auth.close()


def series(
    metric: Annotated[str, typer.Option("--metric", help="The metric, e.g. app.rpc.latency_ms.")],
    hours: Annotated[float, typer.Option(min=0.0167, help="Hours of windows to look at, up to the newest.")] = 1.0,
    top: Annotated[int, typer.Option(min=1, help="Values shown per label.")] = 10,
) -> None:
    """A metric's series (servers) and its labels' top values by series count, beside the cardinality limits."""
    from metrics_lake.core.kernels.cardinality import top_label_values
    from metrics_lake.core.speed.cardinality_gate import series_report
    from metrics_lake.core.speed.progress import CONSUMER

    config = settings()
    report = series_report(open_store(config), CONSUMER, config.topic, metric, hours)
    if report.hi_us is None:
        raise InputError(f"{Table.METRIC_WINDOWS_1M} is empty: run `lake stream` first")
    if report.series.num_rows == 0:
        raise InputError(f"no windows of {metric!r} in the last {hours:g} h: check the name (`lake sql` lists metrics)")
    since = dt.datetime.fromtimestamp(report.lo_us / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M")
    err.print(
        f"{metric}: {report.series.num_rows:,} series (servers) in {Table.METRIC_WINDOWS_1M} since {since} UTC",
        highlight=False,
    )
    if report.admitted is None:
        err.print("  (the limit states are under log/_consumers/, which this identity may not read)")
    for partition, (hour, count, limits) in sorted((report.admitted or {}).items()):
        at = dt.datetime.fromtimestamp(hour / 1e6, dt.UTC).strftime("%Y-%m-%d %H:00")
        limit = f"of {limits.series_per_metric:,}" if limits.series_per_metric else "(no limit)"
        err.print(f"  partition {partition}: {count:,} series admitted {limit} in the hour from {at} UTC")
    view = rich_table.Table("label", "values", "value", "series", "share")
    for row in top_label_values(report.series, top).to_pylist():
        share = row["series"] / report.series.num_rows
        view.add_row(row["label"], f"{row['values']:,}", row["value"], f"{row['series']:,}", f"{share:.0%}")
    out.print(view)


def tables() -> None:
    """List the lake's tables with their Delta version, active files, rows and size."""
    from metrics_lake.core.tables.delta import summarize_tables

    summaries = summarize_tables(open_store(settings()))
    table = rich_table.Table("table", "version", "files", "rows", "MiB")
    for s in summaries:
        table.add_row(s.name, str(s.version), f"{s.files:,}", f"{s.rows:,}", f"{s.size_bytes / 2**20:.2f}")
    out.print(table)


def quality(
    table: Annotated[str | None, typer.Option(help="Only this table (default: every table with a suite).")] = None,
    date: Annotated[str | None, typer.Option("--date", help="UTC day to check, YYYY-MM-DD (default: today).")] = None,
) -> None:
    """Data quality: run the Great Expectations checkpoints for a day, record dq_results, publish data docs.

    Exits 1 when a critical expectation fails (the gate for rollups and stored queries).
    """
    from metrics_lake.core.tables.delta import list_tables, open_table
    from metrics_lake.quality.checkpoint import run_quality
    from metrics_lake.quality.suites import SUITE_TABLES
    from metrics_lake.spark.session import build_session

    checked = day("--date", date) if date else dt.datetime.now(dt.UTC).date()
    if table is not None and table not in SUITE_TABLES:
        raise InputError(f"--table {table}: no quality suite for it; suites exist for {', '.join(SUITE_TABLES)}")
    config = settings()
    store = open_store(config)
    for name in set(list_tables(store)) & ({table} if table else set(SUITE_TABLES)):
        open_table(store, name)  # fail on access before the JVM starts
    err.print(f"checking {table or 'every table'} for {checked} with Great Expectations ...")
    spark = build_session(config, "lake-quality")
    report = run_quality(spark, config, checked, [table] if table else None)
    view = rich_table.Table("suite", "rows", "expectations", "passed", "failed", "worst failure")
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
        err.print(f"no rows on {checked} in the checked tables")
    err.print(f"checked in {report.seconds:.1f} s; report: {report.docs_index}", soft_wrap=True)
    err.print(f"trend: {config.quality_path / 'trend.html'}", soft_wrap=True)
    query = f"SELECT * FROM {Table.DQ_RESULTS} WHERE run_id = '{report.run_id}' AND NOT success"
    err.print(f'failing rows: lake sql "{query}"', soft_wrap=True, highlight=False)
    if report.critical_failures():
        err.print("[red]critical expectations failed:[/]\n" + escape(report.describe_failures()))
        raise typer.Exit(1)
