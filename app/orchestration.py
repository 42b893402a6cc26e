"""What every metrics-lake DAG under ``dags/`` shares: the tables as Airflow Assets, default arguments, helpers.

Only the DAG files import this module (it needs Airflow, an optional extra:
``pip install metrics-lake[airflow]``). Kept free of heavy imports (Spark, delta-rs, GX): the DAG processor
parses these files every few seconds, so tasks import what they need when
they run. The one exception is the table registry (pyarrow schemas, about
0.3 s to import), from which the Assets are derived so that they cannot drift
from the tables. Configuration reaches tasks the way it reaches the CLI, through
``LAKE_*`` environment variables (or ``lake.toml``) on the worker; nothing
secret is read at parse time.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Asset

from metrics_lake.schemas import TABLES

#: One Asset per Delta table of the registry; a task that commits to a table
#: lists it in ``outlets``, so DAGs scheduled on it run when new data lands.
TABLE_ASSETS = {name: Asset(name=name, uri=spec.asset_uri, group="metrics-lake") for name, spec in TABLES.items()}

#: Every DAG starts from this fixed UTC date with catchup off: no surprise backfills on deploy.
START_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

DEFAULT_ARGS = {
    "owner": "metrics-lake",
    "retries": 2,
    "retry_delay": dt.timedelta(minutes=2),
    "retry_exponential_backoff": True,
}


def days_between(first: str, last: str) -> list[str]:
    """ISO dates from ``first`` to ``last`` inclusive; raises ``ValueError`` if the range is empty or malformed."""
    start, end = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    if end < start:
        raise ValueError(f"to_date {end} is before from_date {start}")
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def previous_day(logical_date: dt.datetime) -> str:
    """The UTC day a nightly run at ``logical_date`` works on: the day before (complete by then)."""
    return (logical_date.astimezone(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
