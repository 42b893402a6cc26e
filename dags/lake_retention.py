"""Retention per resolution, daily at 03:00 UTC: old log segments, old table partitions, VACUUM.

Horizons come from ``LAKE_RETENTION_*`` on the worker (log and bronze 7 days,
1-minute windows 30 days, 1-hour rollups 1 year, 1-day rollups forever). The
``dry_run`` param plans without deleting. A consumer group with unread
records past retention fails the task after retention ran, so it is seen.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from metrics_lake.app.orchestration import DEFAULT_ARGS, START_DATE


@dag(
    dag_id="lake_retention",
    schedule="0 3 * * *",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args={**DEFAULT_ARGS, "retries": 1},
    tags=["metrics-lake", "maintenance"],
    params={"dry_run": Param(False, type="boolean", description="Only report what would be deleted.")},
    doc_md=__doc__,
)
def lake_retention():
    @task
    def retain() -> dict:
        """Delete (or with dry_run, list) everything past its retention; returns what went."""
        from metrics_lake.app.operations import retain
        from metrics_lake.core.config import load_settings

        context = get_current_context()  # horizons count back from the run's logical date, so re-runs agree
        return retain(load_settings(), apply=not context["params"]["dry_run"], now=context["logical_date"])

    retain()


lake_retention()
