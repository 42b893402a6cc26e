"""Backfill / replay a date range on demand (manual trigger with params).

Steps, in order, each idempotent (re-running a range changes nothing twice):

- ``replay``: re-read the log's events of those days into bronze; rows
  already there are skipped (for data lost from bronze, or events that
  reached the log after a bronze outage);
- ``recompute``: rebuild the days' 1-minute windows from bronze;
- ``rollups``: rebuild the days' 1h/1d rollups;
- ``queries``: re-evaluate the stored queries for the days.

Trigger from the UI or ``airflow dags trigger lake_backfill --conf
'{"from_date": "2026-11-01", "to_date": "2026-11-07", "steps": ["recompute", "rollups"]}'``.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from metrics_lake.app.orchestration import (
    DEFAULT_ARGS,
    QUERIES,
    RECOMPUTE,
    REPLAY,
    ROLLUP,
    START_DATE,
    days_between,
    outlets,
)

STEPS = ["replay", "recompute", "rollups", "queries"]


def _skip_unless_chosen(step: str) -> None:
    if step not in get_current_context()["params"]["steps"]:
        raise AirflowSkipException(f"{step} is not among the chosen steps")


@dag(
    dag_id="lake_backfill",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["metrics-lake", "backfill"],
    params={
        "from_date": Param("2026-01-01", type="string", format="date", description="First UTC day."),
        "to_date": Param("2026-01-01", type="string", format="date", description="Last UTC day (inclusive)."),
        "steps": Param(
            ["recompute", "rollups", "queries"],
            type="array",
            items={"type": "string", "enum": STEPS},
            description="Steps to run, in this order: replay, recompute, rollups, queries.",
        ),
    },
    doc_md=__doc__,
)
def lake_backfill():
    @task
    def check_range() -> list[str]:
        """The range's days; a reversed or malformed range fails the run at once, without retries."""
        params = get_current_context()["params"]
        try:
            return days_between(params["from_date"], params["to_date"])
        except ValueError as exc:
            raise AirflowFailException(f"bad range: {exc}") from None

    @task(outlets=outlets(REPLAY))
    def replay(days: list[str]) -> dict:
        """Replay the range's events from the log into bronze, skipping rows already present."""
        _skip_unless_chosen("replay")
        from metrics_lake.app.operations import replay_days
        from metrics_lake.core.config import load_settings

        return replay_days(load_settings(), days[0], days[-1])

    @task(
        trigger_rule="none_failed",
        outlets=outlets(RECOMPUTE),
    )
    def recompute(days: list[str]) -> list[dict]:
        """Rebuild the range's 1-minute windows from bronze."""
        _skip_unless_chosen("recompute")
        from metrics_lake.app.operations import recompute_days
        from metrics_lake.core.config import load_settings

        return recompute_days(load_settings(), days)

    @task(trigger_rule="none_failed", outlets=outlets(ROLLUP))
    def rollups(days: list[str]) -> list[dict]:
        """Rebuild the range's rollups."""
        _skip_unless_chosen("rollups")
        from metrics_lake.app.operations import rollup_days
        from metrics_lake.core.config import load_settings

        return rollup_days(load_settings(), days)

    @task(trigger_rule="none_failed", outlets=outlets(QUERIES))
    def queries(days: list[str]) -> list[dict]:
        """Re-evaluate the stored queries for the range."""
        _skip_unless_chosen("queries")
        from metrics_lake.app.operations import evaluate_queries
        from metrics_lake.core.config import load_settings

        return evaluate_queries(load_settings(), days)

    days = check_range()
    replay(days) >> recompute(days) >> rollups(days) >> queries(days)


lake_backfill()
