"""Nightly batch layer: recompute yesterday's windows from bronze, then rollups, then stored queries, then alert rules
over the day's final stored query results.

Quality gates (Great Expectations, ``lake quality``) run after the data they
check lands: bronze, the windows and the reconciliation after the recompute,
the rollups after they are built. A failed critical expectation fails the
gate without retries and stops the steps after it for that day; its error
names the expectations, observed values and a sample of failing values.

Runs at 00:30 UTC for the previous UTC day (late events up to then
included). Each step replaces that day in its table in one Delta commit and
is idempotent, so retries and re-runs are safe. Each step declares the table
it writes as an Asset outlet, so asset-scheduled DAGs (compaction, quality)
run when the nightly data has landed.
"""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from metrics_lake.app.orchestration import (
    ALERTS,
    DEFAULT_ARGS,
    QUALITY,
    QUERIES,
    RECOMPUTE,
    ROLLUP,
    START_DATE,
    checked_tables,
    outlets,
    previous_day,
)


@dag(
    dag_id="lake_nightly",
    schedule="30 0 * * *",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["metrics-lake", "batch-layer"],
    doc_md=__doc__,
)
def lake_nightly():
    @task
    def target_day() -> str:
        """The UTC day before this run's logical date."""
        return previous_day(get_current_context()["logical_date"])

    @task(outlets=outlets(RECOMPUTE))
    def recompute(day: str) -> list[dict]:
        """Rebuild the day's 1-minute windows from bronze and reconcile them with the speed layer's."""
        from metrics_lake.app.operations import recompute_days
        from metrics_lake.core.config import load_settings

        return recompute_days(load_settings(), [day])

    def gate(day: str, tables: list[str]) -> dict:
        from metrics_lake.app.operations import check_quality
        from metrics_lake.core.config import load_settings
        from metrics_lake.lake_schemas.errors import QualityGateError

        try:
            return check_quality(load_settings(), day, tables)
        except QualityGateError as exc:
            raise AirflowFailException(str(exc)) from None  # bad data: retrying cannot fix it

    @task(outlets=outlets(QUALITY))
    def quality_gate(day: str) -> dict:
        """Validate the day's bronze, windows and reconciliation; stop the rollups on a critical failure."""
        return gate(day, checked_tables(RECOMPUTE))

    @task(outlets=outlets(QUALITY))
    def rollup_quality_gate(day: str) -> dict:
        """Validate the day's rollups; stop the stored queries on a critical failure."""
        return gate(day, checked_tables(ROLLUP, written_only=True))

    @task(outlets=outlets(ROLLUP))
    def rollups(day: str) -> list[dict]:
        """Roll the day's windows up into 1-hour and 1-day rows by merging sketches."""
        from metrics_lake.app.operations import rollup_days
        from metrics_lake.core.config import load_settings

        return rollup_days(load_settings(), [day])

    @task(outlets=outlets(QUERIES))
    def stored_queries(day: str) -> list[dict]:
        """Evaluate the config store's stored queries for the day into the stored query results."""
        from metrics_lake.app.operations import evaluate_queries
        from metrics_lake.core.config import load_settings

        return evaluate_queries(load_settings(), [day])

    @task(outlets=outlets(ALERTS))
    def alert_rules(day: str) -> list[dict]:
        """Evaluate the threshold rules over the day's final query results; record the episodes live missed."""
        from metrics_lake.app.operations import evaluate_alert_days
        from metrics_lake.core.config import load_settings

        return evaluate_alert_days(load_settings(), [day])

    day = target_day()
    (
        recompute(day)
        >> quality_gate(day)
        >> rollups(day)
        >> rollup_quality_gate(day)
        >> stored_queries(day)
        >> alert_rules(day)
    )


lake_nightly()
