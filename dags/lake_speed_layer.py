"""Speed layer micro-batches: every 5 minutes, process what the log holds into bronze, windows and alerts; then
deliver the alerts to Alertmanager and backfill the stored queries operators added or changed meanwhile.

For deployments that do not keep ``lake stream`` running: each run is
``lake stream --once`` (catch up, commit, stop). Exactly once across runs and
retries comes from the positions each table commits with its rows (Delta
``txn`` actions), not from a checkpoint folder, so an overlapping or retried
run, or one on another worker, cannot duplicate rows; ``max_active_runs=1``
just avoids wasted work.

The alerts each run committed are delivered right after it (``lake alerts
notify --once``, when ``LAKE_ALERTMANAGER_URL`` is set); what Alertmanager
does not accept stays in the outbox and goes with the next run, so a
deployment without a running ``lake stream`` still alerts within a run.

The backfill (``lake queries backfill``) runs after the micro-batches, off
the stream's hot path: a new or changed stored query is live from the
stream's next batch, and its past windows are filled here within a run.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import dag, task

from metrics_lake.app.orchestration import DEFAULT_ARGS, QUERIES, START_DATE, STREAM, outlets


@dag(
    dag_id="lake_speed_layer",
    schedule="*/5 * * * *",
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args={**DEFAULT_ARGS, "retry_delay": dt.timedelta(seconds=30)},
    dagrun_timeout=dt.timedelta(minutes=30),
    tags=["metrics-lake", "speed-layer"],
    doc_md=__doc__,
)
def lake_speed_layer():
    @task(outlets=outlets(STREAM))
    def micro_batches() -> dict:
        """Run the speed layer until it has caught up with the log; returns table versions and consumer lag."""
        from metrics_lake.app.operations import run_speed_layer_once
        from metrics_lake.core.config import load_settings

        return run_speed_layer_once(load_settings())

    @task(outlets=outlets(QUERIES))
    def query_backfills() -> list[dict]:
        """Backfill every stored query whose current revision query_results has not backfilled; one summary each."""
        from metrics_lake.app.operations import backfill_pending_queries
        from metrics_lake.core.config import load_settings

        return backfill_pending_queries(load_settings())

    @task
    def alert_notifications() -> dict:
        """Deliver the alerts' outbox to Alertmanager (skipped without LAKE_ALERTMANAGER_URL)."""
        from metrics_lake.app.operations import notify_alerts
        from metrics_lake.core.config import load_settings

        return notify_alerts(load_settings())

    batches = micro_batches()
    batches >> alert_notifications()
    batches >> query_backfills()


lake_speed_layer()
