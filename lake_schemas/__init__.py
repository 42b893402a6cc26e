"""Contracts, declared once: the bottom layer of metrics-lake (imports nothing of ours).

What every other layer agrees on: the shape of data, the names of things, the errors.

- :mod:`.errors`: :class:`~.errors.LakeError` and every subclass with its exit code (the hierarchy is drawn there);
- :mod:`.types`: UTC timestamp and tag types; :func:`spark_schema` derives Spark schemas;
- :mod:`.log_records`: :data:`LOG_RECORD` (what a segment holds) and :data:`LOG_ROW` (with its position);
- :mod:`.tables`: every Delta table's name (:class:`~.tables.Table`), schema and facts in the registry :data:`TABLES`;
- :mod:`.operations`: what each operation (command, Airflow task, job) reads and writes;
- :mod:`.contract`: the event contract and its validator (quarantine reasons);
  :mod:`.ndjson`: the same contract checked on whole blocks of JSON Lines, vectorised;
- ``stored_queries.toml``: the stored query declarations shipped with the lake
  (parsed by :mod:`metrics_lake.core.kernels.stored_queries`).
"""

from __future__ import annotations

from metrics_lake.lake_schemas.log_records import LOG_RECORD, LOG_ROW
from metrics_lake.lake_schemas.tables import (
    BRONZE_EVENTS,
    DQ_RESULTS,
    LAMBDA_RECONCILIATION,
    METRIC_ROLLUP_1D,
    METRIC_ROLLUP_1H,
    METRIC_WINDOWS_1M,
    QUARANTINE_EVENTS,
    QUERY_RESULTS,
    TABLES,
    Table,
    TableSpec,
    rollup_chain,
    table_spec,
)
from metrics_lake.lake_schemas.types import TAGS, UTC_MS, UTC_US, spark_schema

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
    "Table",
    "UTC_MS",
    "UTC_US",
    "TableSpec",
    "rollup_chain",
    "spark_schema",
    "table_spec",
]
