"""Every schema of metrics-lake, declared once as pyarrow schemas.

The log record schema (what a segment holds) and each Delta table's schema are
module constants here; Spark ``StructType`` versions are derived with
:func:`spark_schema` so the two can never drift apart.

Units: every timestamp is UTC. Event time in the log is millisecond precision;
Delta tables store microseconds because that is the Delta protocol's
``timestamp`` type (Delta PROTOCOL.md, "Primitive Types").
"""

from __future__ import annotations

import pyarrow as pa

UTC_MS = pa.timestamp("ms", tz="UTC")
UTC_US = pa.timestamp("us", tz="UTC")
TAGS = pa.map_(pa.string(), pa.string())

#: One metric event as producers hand it to the log (before an offset exists).
#: Valid events have ``reason`` null; rejected ones keep the ``raw`` payload and
#: a ``reason`` and may have any other field null, so nothing is dropped.
LOG_RECORD = pa.schema(
    [
        pa.field("ts", UTC_MS),
        pa.field("server", pa.string()),
        pa.field("metric", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("tags", TAGS),
        pa.field("raw", pa.string()),
        pa.field("reason", pa.string()),
    ]
)

#: What the consumer API and the Spark log source yield: a log record plus its
#: position. ``offset`` is dense per (topic, partition); ``ingested_at`` is the
#: wall-clock time its segment was appended.
LOG_ROW = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        *LOG_RECORD,
        pa.field("ingested_at", UTC_MS, nullable=False),
    ]
)

#: ``tables/bronze_events``: every valid event exactly once.
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
    ]
)
BRONZE_EVENTS_PARTITION_BY = ["event_date"]

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
QUARANTINE_EVENTS_PARTITION_BY = ["ingest_date"]

#: ``tables/metric_windows_1m``: one row per (metric, server, window_start) of
#: a 1-minute event-time tumbling window. ``sketch`` is a serialized Apache
#: DataSketches KLL doubles sketch (Spark's ``kll_sketch_agg_double``, k=200),
#: mergeable across windows and servers; p50/p95/p99 are read from it.
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
    ]
)
METRIC_WINDOWS_1M_PARTITION_BY = ["event_date"]
METRIC_WINDOWS_1M_KEY = ["event_date", "metric", "server", "window_start"]

#: ``tables/metric_rollup_1h`` and ``tables/metric_rollup_1d``: the same
#: columns as the 1-minute windows, one row per (metric, server, hour or UTC
#: day), built from the finer table by summing count and sum, taking min and
#: max, and merging the KLL sketches (``kll_merge_agg_double``), so p50/p95/p99
#: are those of all the period's events within the sketch's rank error
#: (the downsampling of Thanos and Mimir, with mergeable percentiles).
METRIC_ROLLUP_1H = METRIC_WINDOWS_1M
METRIC_ROLLUP_1D = METRIC_WINDOWS_1M

#: ``tables/query_results``: the stored queries of
#: ``lake_schemas/stored_queries.toml`` evaluated per UTC day, long format:
#: one row per (query, window, server, aggregate). ``server`` is null for a
#: fleet-wide row (the query's servers merged). ``event_date`` is the day
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
LAMBDA_RECONCILIATION_PARTITION_BY = ["event_date"]

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

#: Table name -> (schema, partition columns), for creating and listing tables.
TABLES: dict[str, tuple[pa.Schema, list[str]]] = {
    "bronze_events": (BRONZE_EVENTS, BRONZE_EVENTS_PARTITION_BY),
    "quarantine_events": (QUARANTINE_EVENTS, QUARANTINE_EVENTS_PARTITION_BY),
    "metric_windows_1m": (METRIC_WINDOWS_1M, METRIC_WINDOWS_1M_PARTITION_BY),
    "lambda_reconciliation": (LAMBDA_RECONCILIATION, LAMBDA_RECONCILIATION_PARTITION_BY),
    "metric_rollup_1h": (METRIC_ROLLUP_1H, ["event_date"]),
    "metric_rollup_1d": (METRIC_ROLLUP_1D, ["event_date"]),
    "query_results": (QUERY_RESULTS, ["event_date"]),
    "dq_results": (DQ_RESULTS, ["event_date"]),
}


def spark_schema(schema: pa.Schema):
    """Derive a Spark ``StructType`` from one of the pyarrow schemas above.

    Timestamps with a zone become Spark ``TIMESTAMP`` (UTC instants), not
    ``TIMESTAMP_NTZ``. Imports pyspark lazily so non-Spark users (agents,
    the log) never pay for it.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)
