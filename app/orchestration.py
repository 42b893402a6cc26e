"""What every metrics-lake DAG under ``dags/`` shares: the tables as Airflow Assets, default arguments, helpers.

Only the DAG files import this module (it needs Airflow, an optional extra:
``pip install metrics-lake[airflow]``). Kept free of heavy imports (Spark, delta-rs, GX): the DAG processor
parses these files every few seconds, so tasks import what they need when
they run. The one exception is the table registry (pyarrow schemas, about 0.3 s
to import): the Assets are derived from the tables, and each task's outlets
from the operation it runs (:mod:`metrics_lake.lake_schemas.table_access`,
re-exported here so that DAG files import this module only), so that neither
can drift from what the steps commit. Configuration reaches tasks the way it reaches the CLI, through
``LAKE_*`` environment variables (or ``lake.toml``) on the worker; nothing
secret is read at parse time.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Asset

from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.table_access import (
    ALERTS,
    QUALITY,
    QUERIES,
    RECOMPUTE,
    REPLAY,
    ROLLUP,
    STREAM,
    Operation,
)
from metrics_lake.lake_schemas.tables import TABLES, Table

__all__ = [
    "ALERTS",
    "DEFAULT_ARGS",
    "QUALITY",
    "QUERIES",
    "RECOMPUTE",
    "REPLAY",
    "ROLLUP",
    "START_DATE",
    "STREAM",
    "TABLE_ASSETS",
    "Table",
    "checked_tables",
    "days_between",
    "outlets",
    "previous_day",
]

#: One Asset per Delta table of the table registry; a task that commits to a table
#: lists it in ``outlets``, so DAGs scheduled on it run when new data lands.
TABLE_ASSETS: dict[Table, Asset] = {
    name: Asset(name=str(name), uri=spec.asset_uri, group="metrics-lake") for name, spec in TABLES.items()
}


def outlets(*operations: Operation) -> list[Asset]:
    """The Assets a task running ``operations`` updates: the tables they write, each once, in order.

    Derived from the declarations of :mod:`metrics_lake.lake_schemas.table_access`,
    so a DAG's outlets cannot drift from what its steps commit.
    """
    return [TABLE_ASSETS[name] for name in dict.fromkeys(name for op in operations for name in op.writes)]


def checked_tables(operation: Operation, *, written_only: bool = False) -> list[str]:
    """The tables ``operation`` reads or writes (only writes, if ``written_only``) that have a quality suite.

    What a quality gate after the operation validates.
    """
    names = operation.writes if written_only else operation.tables
    return [str(name) for name in names if TABLES[name].quality_suite]


#: Every DAG starts from this fixed UTC date with catchup off: no surprise backfills on deploy.
START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

DEFAULT_ARGS = {
    "owner": "metrics-lake",
    "retries": 2,
    "retry_delay": dt.timedelta(minutes=2),
    "retry_exponential_backoff": True,
}


def days_between(first: str, last: str) -> list[str]:
    """ISO dates from ``first`` to ``last`` inclusive.

    Raises :class:`~metrics_lake.lake_schemas.errors.InputError` (a ``ValueError``) if the range is empty
    or a date is malformed.
    """
    try:
        start, end = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    except ValueError as exc:
        raise InputError(f"{exc}; dates are YYYY-MM-DD") from None
    if end < start:
        raise InputError(f"to_date {end} is before from_date {start}")
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def previous_day(logical_date: dt.datetime) -> str:
    """The UTC day a nightly run at ``logical_date`` works on: the day before (complete by then)."""
    return (logical_date.astimezone(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
