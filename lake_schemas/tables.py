"""The table registry: every Delta table of the lake, its name and its facts, declared once.

:class:`Table` names every table: code refers to a table as ``Table.BRONZE_EVENTS``,
never by a string literal (``tests/lake_schemas/test_tables.py`` fails on a
table-name literal anywhere else), so a table's name exists once. Each
:class:`TableSpec` holds what the rest of the lake derives from: the
schema (pyarrow; Spark's via :func:`metrics_lake.lake_schemas.types.spark_schema`),
the partition columns, the key that is unique per row, the column holding the
row's UTC day, the ``LakeSettings`` field with its retention, its window size
(window and rollup tables), the table it is rolled up from, and whether a
Great Expectations suite checks it. Retention, the Airflow assets, the
quality suites and the window jobs read these facts from :data:`TABLES`
instead of repeating them; ``tests/lake_schemas/test_tables.py`` checks that
they cover the same tables. Which operation reads and writes which table is
declared in :mod:`metrics_lake.lake_schemas.table_access`.

The module constants :data:`BRONZE_EVENTS` ... are the tables' pyarrow
schemas; the names are the members of :class:`Table`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pyarrow as pa

from metrics_lake.lake_schemas.types import TAGS, UTC_US

__all__ = [
    "ALERTS",
    "BRONZE_EVENTS",
    "DQ_RESULTS",
    "LAMBDA_RECONCILIATION",
    "LAST_SEEN",
    "METRIC_ROLLUP_1D",
    "METRIC_ROLLUP_1H",
    "METRIC_WINDOWS_1M",
    "QUARANTINE_EVENTS",
    "QUERY_RESULTS",
    "SERVERS",
    "SQL_AUDIT",
    "TABLES",
    "Table",
    "TableSpec",
    "rollup_chain",
    "table_spec",
]


class Table(StrEnum):
    """The name of every Delta table of the lake (``tables/<name>`` under the lake root).

    Members are strings (``Table.BRONZE_EVENTS == "bronze_events"``), so they
    go wherever a table name does: delta-rs, Spark options, SQL text, paths.
    """

    BRONZE_EVENTS = "bronze_events"
    QUARANTINE_EVENTS = "quarantine_events"
    METRIC_WINDOWS_1M = "metric_windows_1m"
    LAMBDA_RECONCILIATION = "lambda_reconciliation"
    METRIC_ROLLUP_1H = "metric_rollup_1h"
    METRIC_ROLLUP_1D = "metric_rollup_1d"
    QUERY_RESULTS = "query_results"
    LAST_SEEN = "last_seen"
    ALERTS = "alerts"
    SERVERS = "servers"
    DQ_RESULTS = "dq_results"
    SQL_AUDIT = "sql_audit"


#: ``tables/bronze_events``: every valid event exactly once. ``tags`` are the event's own; ``labels`` the
#: server's inventory labels in force at the event's log position (``metrics_lake.core.speed.enrichment``):
#: empty for a server the inventory does not know, null for rows written before the lake had an inventory.
BRONZE_EVENTS = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("ts", UTC_US),
        pa.field("server", pa.string()),
        pa.field("metric", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("tags", TAGS),
        pa.field("ingested_at", UTC_US),
        pa.field("event_date", pa.date32()),
        pa.field("labels", TAGS),
    ]
)

#: ``tables/quarantine_events``: every rejected payload, with its reason and
#: source position. Partitioned by the day it was ingested (event time may be
#: missing or unparseable).
QUARANTINE_EVENTS = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("raw", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("ingested_at", UTC_US),
        pa.field("ingest_date", pa.date32()),
    ]
)

#: ``tables/metric_windows_1m``: one row per (metric, server, window_start) of
#: a 1-minute event-time tumbling window. ``sketch`` is the window's values as
#: a log-bucketed histogram (``metrics_lake.core.kernels.sketch``: the OpenTelemetry
#: exponential-histogram layout at scale 6, packed (key int32, count int64)
#: pairs), mergeable across windows and servers by adding bucket counts;
#: p50/p95/p99 are read from it within 0.54 % relative error, clamped to [min, max]. ``labels``: the
#: series' labels as of its newest event (highest log position) in the window: the event's tags with its
#: server's inventory labels over them (a label wins over a tag of the same name).
METRIC_WINDOWS_1M = pa.schema(
    [
        pa.field("metric", pa.string()),
        pa.field("server", pa.string()),
        pa.field("window_start", UTC_US),
        pa.field("window_end", UTC_US),
        pa.field("count", pa.int64()),
        pa.field("sum", pa.float64()),
        pa.field("min", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("avg", pa.float64()),
        pa.field("p50", pa.float64()),
        pa.field("p95", pa.float64()),
        pa.field("p99", pa.float64()),
        pa.field("sketch", pa.binary()),
        pa.field("updated_at", UTC_US),
        pa.field("event_date", pa.date32()),
        pa.field("labels", TAGS),
    ]
)

#: ``tables/metric_rollup_1h`` and ``tables/metric_rollup_1d``: the same
#: columns as the 1-minute windows, one row per (metric, server, hour or UTC
#: day), built from the finer table by summing count and sum, taking min and
#: max, and merging the sketches (adding bucket counts), so p50/p95/p99
#: are those of all the period's events within the sketch's relative error
#: (the downsampling of Thanos and Mimir, with mergeable percentiles).
METRIC_ROLLUP_1H = METRIC_WINDOWS_1M
METRIC_ROLLUP_1D = METRIC_WINDOWS_1M

#: ``tables/query_results``: the stored queries of
#: ``lake_schemas/stored_queries.toml`` evaluated per UTC day, long format:
#: one row per (query, window, server or group, aggregate). ``server`` is null for a
#: fleet-wide row (the query's servers merged; PER SERVER queries have both) and for a group of a ``BY``
#: query, whose label values are in ``labels`` (a per-server row has its series' labels there, a fleet row
#: null; rows written before labels existed read null). ``event_date`` is the day
#: the window's last minute falls in, so a window is computed once both days
#: it may span are complete.
QUERY_RESULTS = pa.schema(
    [
        pa.field("query", pa.string()),
        pa.field("metric", pa.string()),
        pa.field("server", pa.string()),
        pa.field("window_start", UTC_US),
        pa.field("window_end", UTC_US),
        pa.field("aggregate", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("computed_at", UTC_US),
        pa.field("event_date", pa.date32()),
        pa.field("labels", TAGS),
    ]
)

#: ``tables/lambda_reconciliation``: one row per (event_date, metric) from
#: each nightly recompute: the speed layer's count and sum for that day
#: before the recompute replaced its windows, the batch layer's, and
#: ``late_events`` = batch_count - speed_count (events the speed layer missed,
#: mostly arrivals later than its watermark). The fingerprints identify the
#: bronze files the recompute read and the window files it wrote, so a re-run
#: with nothing changed is skipped.
LAMBDA_RECONCILIATION = pa.schema(
    [
        pa.field("event_date", pa.date32()),
        pa.field("metric", pa.string()),
        pa.field("speed_count", pa.int64()),
        pa.field("speed_sum", pa.float64()),
        pa.field("batch_count", pa.int64()),
        pa.field("batch_sum", pa.float64()),
        pa.field("late_events", pa.int64()),
        pa.field("computed_at", UTC_US),
        pa.field("bronze_fingerprint", pa.string()),
        pa.field("windows_fingerprint", pa.string()),
    ]
)

#: ``tables/dq_results``: one row per expectation per data-quality run
#: (``lake quality``): which table and day it checked, whether it passed, what
#: was observed, the threshold, and a sample of failing values (JSON).
#: ``critical`` expectations gate downstream steps. Partitioned by the day
#: checked.
DQ_RESULTS = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("run_at", UTC_US),
        pa.field("table", pa.string()),
        pa.field("expectation", pa.string()),
        pa.field("column", pa.string()),
        pa.field("critical", pa.bool_()),
        pa.field("success", pa.bool_()),
        pa.field("observed_value", pa.string()),
        pa.field("unexpected_count", pa.int64()),
        pa.field("unexpected_percent", pa.float64()),
        pa.field("threshold", pa.string()),
        pa.field("sample", pa.string()),
        pa.field("rows", pa.int64()),
        pa.field("event_date", pa.date32()),
    ]
)


#: ``tables/sql_audit``: one row per statement a client ran through the SQL endpoint (``lake sql-server``:
#: ``client`` ``connect`` or ``jdbc``) or ``lake sql`` (``client`` ``lake sql``), recorded once when it ended.
#: ``kind``: ``statement`` (JDBC), ``query`` (a plan run for its rows: Spark Connect, ``lake sql``) or
#: ``command`` (Spark Connect: ``spark.sql`` sends its SQL as a command first, which only analyses a query; the
#: query then runs as a ``query``); ``caller``: the token's name (the endpoint) or the OS user (``lake sql``);
#: ``statement``: the SQL text (a Spark Connect plan without SQL: the plan as text), at most 65,536 characters; ``duration_ms``: start to end in milliseconds;
#: ``rows``: rows returned (null where the server does not report them: JDBC); ``files``: data files the lake
#: tables' scans read after pruning; ``outcome``: ``ok``, ``error`` (with ``error``), ``canceled`` or
#: ``closed`` (the client went away first). Partitioned by the UTC day the statement started.
SQL_AUDIT = pa.schema(
    [
        pa.field("statement_id", pa.string()),
        pa.field("session_id", pa.string()),
        pa.field("client", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("caller", pa.string()),
        pa.field("statement", pa.string()),
        pa.field("started_at", UTC_US),
        pa.field("duration_ms", pa.int64()),
        pa.field("rows", pa.int64()),
        pa.field("files", pa.int64()),
        pa.field("outcome", pa.string()),
        pa.field("error", pa.string()),
        pa.field("started_date", pa.date32()),
    ]
)

#: ``tables/last_seen``: when each server was last heard from, the state of absence alerts and of the
#: dashboard's server status. One row per server with ``metric`` null (any metric), and one per (metric,
#: server) for the metrics that absence rules watch: ``last_seen_at`` is the append time of its newest valid
#: record (the lake's clock, immune to agents' clock skew), ``last_event_at`` the newest event time. The
#: speed layer rewrites the whole table with every micro-batch and keeps the rows seen within the absence
#: lookback (``LAKE_ALERT_ABSENCE_LOOKBACK_SECONDS``); partitioned by the day of ``last_seen_at``.
LAST_SEEN = pa.schema(
    [
        pa.field("server", pa.string()),
        pa.field("metric", pa.string()),
        pa.field("last_seen_at", UTC_US),
        pa.field("last_event_at", UTC_US),
        pa.field("seen_date", pa.date32()),
    ]
)

#: ``tables/alerts``: every state transition of every alert, appended once (``metrics_lake.core.kernels.alert_rules``):
#: ``state`` is pending, firing or resolved and ``previous_state`` inactive, pending or firing; ``at`` the
#: evaluation time it happened at (threshold rules: the event clock minus the evaluation delay; absence rules:
#: the lake's append clock), ``active_since`` when the condition began to hold (pending since, or the moment a
#: silence reached FOR). ``value``: the aggregate, or seconds of silence; ``threshold``: the rule's number, or
#: its FOR in seconds; ``window_start``/``window_end``: the query window that decided, or (absence) the last
#: time the server was seen and null. ``labels``: the alert's labels as Alertmanager gets them (``alertname``,
#: ``server`` where per server, the rule's LABELS), ``fingerprint`` Alertmanager's hash of them. ``source``:
#: ``live`` (the speed layer) or ``nightly`` (episodes the batch layer found that the live evaluation missed);
#: ``id`` is unique; ``recorded_at`` and ``seq`` order the rows as they were committed. Partitioned by the day
#: of ``at``.
ALERTS = pa.schema(
    [
        pa.field("rule", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("server", pa.string()),
        pa.field("fingerprint", pa.string()),
        pa.field("labels", TAGS),
        pa.field("state", pa.string()),
        pa.field("previous_state", pa.string()),
        pa.field("at", UTC_US),
        pa.field("active_since", UTC_US),
        pa.field("value", pa.float64()),
        pa.field("threshold", pa.float64()),
        pa.field("window_start", UTC_US),
        pa.field("window_end", UTC_US),
        pa.field("summary", pa.string()),
        pa.field("rule_text", pa.string()),
        pa.field("rule_revision", pa.int64()),
        pa.field("source", pa.string()),
        pa.field("id", pa.string()),
        pa.field("seq", pa.int32()),
        pa.field("recorded_at", UTC_US),
        pa.field("event_date", pa.date32()),
    ]
)

#: ``tables/servers``: the server inventory's current state (the ``inventory`` topic folded: one row per server
#: it holds, ``metrics_lake.core.inventory``): its ``labels``, the inventory ``offset`` its record has (its
#: labels are valid from there on), when the change was made (``changed_at``) and appended (``appended_at``).
#: Rewritten whole by whoever folds new inventory records (``lake stream``, ``lake inventory``).
SERVERS = pa.schema(
    [
        pa.field("server", pa.string()),
        pa.field("labels", TAGS),
        pa.field("valid_from_offset", pa.int64()),
        pa.field("changed_at", UTC_US),
        pa.field("appended_at", UTC_US),
    ]
)


@dataclass(frozen=True)
class TableSpec:
    """One Delta table's facts (module docstring).

    ``partition_by``: Delta partition columns, the day column first (none: a table of current state);
    ``key``: columns unique per row (the merge key of upserted tables);
    ``day_column``: partition column with the row's UTC day (retention and
    quality work a day at a time); ``retention_setting``: name of the
    ``LakeSettings`` field giving the days kept (``None``: kept until deleted
    by hand); ``window_seconds``: tumbling window length in seconds (window
    and rollup tables); ``rollup_of``: the finer table it is downsampled from;
    ``quality_suite``: whether ``lake quality`` validates it;
    ``vacuum_hours``: how long VACUUM keeps files the table no longer
    references, when shorter than ``LAKE_VACUUM_RETENTION_HOURS`` (a table
    rewritten whole by every micro-batch and never read in the past).
    """

    name: Table
    schema: pa.Schema
    partition_by: tuple[str, ...]
    key: tuple[str, ...]
    description: str
    retention_setting: str | None = None
    window_seconds: int | None = None
    rollup_of: Table | None = None
    quality_suite: bool = False
    vacuum_hours: int | None = None

    @property
    def day_column(self) -> str | None:
        """The partition column holding the row's UTC day; None for a table of current state (not by day)."""
        return self.partition_by[0] if self.partition_by else None

    @property
    def asset_uri(self) -> str:
        """The table's Airflow Asset URI (``lake://tables/<name>``)."""
        return f"lake://tables/{self.name}"


_WINDOW_KEY = ("event_date", "metric", "server", "window_start")

#: Every table of the lake, by name.
TABLES: dict[Table, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(
            Table.BRONZE_EVENTS,
            BRONZE_EVENTS,
            ("event_date",),
            ("topic", "partition", "offset"),
            "every valid event exactly once, with its log position",
            retention_setting="retention_bronze_days",
            quality_suite=True,
        ),
        TableSpec(
            Table.QUARANTINE_EVENTS,
            QUARANTINE_EVENTS,
            ("ingest_date",),
            ("topic", "partition", "offset"),
            "every rejected payload with its reason and log position",
            retention_setting="retention_bronze_days",
        ),
        TableSpec(
            Table.METRIC_WINDOWS_1M,
            METRIC_WINDOWS_1M,
            ("event_date",),
            _WINDOW_KEY,
            "1-minute tumbling windows per (metric, server) with a mergeable quantile sketch",
            retention_setting="retention_windows_days",
            window_seconds=60,
            quality_suite=True,
        ),
        TableSpec(
            Table.LAMBDA_RECONCILIATION,
            LAMBDA_RECONCILIATION,
            ("event_date",),
            ("event_date", "metric"),
            "speed vs batch layer counts per day and metric",
            retention_setting="retention_windows_days",
            quality_suite=True,
        ),
        TableSpec(
            Table.METRIC_ROLLUP_1H,
            METRIC_ROLLUP_1H,
            ("event_date",),
            _WINDOW_KEY,
            "1-hour rollups of the 1-minute windows (merged sketches)",
            retention_setting="retention_rollup_1h_days",
            window_seconds=3600,
            rollup_of=Table.METRIC_WINDOWS_1M,
            quality_suite=True,
        ),
        TableSpec(
            Table.METRIC_ROLLUP_1D,
            METRIC_ROLLUP_1D,
            ("event_date",),
            _WINDOW_KEY,
            "1-day rollups of the 1-hour rollups (merged sketches)",
            retention_setting="retention_rollup_1d_days",
            window_seconds=86_400,
            rollup_of=Table.METRIC_ROLLUP_1H,
            quality_suite=True,
        ),
        TableSpec(
            Table.QUERY_RESULTS,
            QUERY_RESULTS,
            ("event_date",),
            ("event_date", "query", "server", "labels", "window_start", "aggregate"),
            "stored queries evaluated per window, long format",
            retention_setting="retention_windows_days",
        ),
        TableSpec(
            Table.LAST_SEEN,
            LAST_SEEN,
            ("seen_date",),
            ("server", "metric"),
            "when each server (and each series an absence rule watches) was last heard from",
            vacuum_hours=1,  # a new file every micro-batch, and nobody reads an old version of it
        ),
        TableSpec(
            Table.ALERTS,
            ALERTS,
            ("event_date",),
            ("event_date", "id"),
            "every state transition of every alert (pending, firing, resolved), exactly once",
            retention_setting="retention_windows_days",
        ),
        TableSpec(
            Table.SERVERS,
            SERVERS,
            (),
            ("server",),
            "the server inventory's current labels, with the log position they are valid from",
            vacuum_hours=24,  # rewritten whole on every inventory change
        ),
        TableSpec(
            Table.DQ_RESULTS,
            DQ_RESULTS,
            ("event_date",),
            ("run_id", "table", "expectation", "column", "threshold"),
            "one row per expectation per data-quality run",
        ),
        TableSpec(
            Table.SQL_AUDIT,
            SQL_AUDIT,
            ("started_date",),
            ("statement_id",),
            "one row per statement run through the SQL endpoint or lake sql: who, what, how long, the outcome",
            retention_setting="retention_sql_audit_days",
        ),
    )
}


def table_spec(name: str) -> TableSpec:
    """The declared :class:`TableSpec` of ``name``; ``KeyError`` naming the declared tables if unknown."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no declared table {str(name)!r}; declared: {', '.join(TABLES)}") from None


def rollup_chain() -> list[TableSpec]:
    """Rollup tables in build order (each after the table it is rolled up from)."""
    ordered: list[TableSpec] = []
    pending = [spec for spec in TABLES.values() if spec.rollup_of]
    built = {spec.name for spec in TABLES.values() if not spec.rollup_of}
    while pending:
        ready = [spec for spec in pending if spec.rollup_of in built]
        if not ready:
            raise ValueError(f"rollup sources missing or cyclic: {[s.name for s in pending]}")  # programming error
        for spec in ready:
            ordered.append(spec)
            built.add(spec.name)
            pending.remove(spec)
    return ordered
