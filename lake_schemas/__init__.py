"""Contracts and schemas, declared once: the bottom layer of metrics-lake (imports nothing of ours).

- :mod:`.types`: UTC timestamp and tag types; :func:`spark_schema` derives Spark schemas;
- :mod:`.log_records`: :data:`LOG_RECORD` (what a segment holds) and :data:`LOG_ROW` (with its position);
- :mod:`.tables`: every Delta table's schema and facts in the registry :data:`TABLES`;
- :mod:`.contract`: the event contract and its validator (quarantine reasons);
- ``stored_queries.toml``: the stored query declarations (parsed by ``metrics_lake.core.stored_queries``).
"""

from __future__ import annotations

from metrics_lake.schemas.log_records import LOG_RECORD, LOG_ROW
from metrics_lake.schemas.tables import (
    BRONZE_EVENTS,
    DQ_RESULTS,
    LAMBDA_RECONCILIATION,
    METRIC_ROLLUP_1D,
    METRIC_ROLLUP_1H,
    METRIC_WINDOWS_1M,
    QUARANTINE_EVENTS,
    QUERY_RESULTS,
    TABLES,
    TableSpec,
    rollup_chain,
    table_spec,
)
from metrics_lake.schemas.types import TAGS, UTC_MS, UTC_US, spark_schema

__all__ = [
    "BRONZE_EVENTS",
    "DQ_RESULTS",
    "LAMBDA_RECONCILIATION",
    "LOG_RECORD",
    "LOG_ROW",
    "METRIC_ROLLUP_1D",
    "METRIC_ROLLUP_1H",
    "METRIC_WINDOWS_1M",
    "QUARANTINE_EVENTS",
    "QUERY_RESULTS",
    "TABLES",
    "TAGS",
    "UTC_MS",
    "UTC_US",
    "TableSpec",
    "rollup_chain",
    "spark_schema",
    "table_spec",
]
