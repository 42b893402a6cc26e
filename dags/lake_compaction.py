"""Compaction after the nightly data lands: merge small log segments, bin-pack small Delta files, checkpoint.

Scheduled on the 1-day rollups and the stored query results together
(Airflow's ``&`` of Assets: both updated since the last run). The rollups
change only in the nightly and backfill runs, and the stored query results
follow them as those runs' last step (the speed layer's micro-batches update
the query results too, but never the rollups), so it runs once after each
night, when its rewrites are done and the speed layer is the only writer
left. Both compactions are safe while the stream writes (offsets and rows
never change; Delta conflicts are retried), see
``metrics_lake.core.log.segment_compaction`` and ``metrics_lake.core.maintenance.table_compaction``.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, get_current_context, task

from metrics_lake.app.orchestration import DEFAULT_ARGS, START_DATE, TABLE_ASSETS, Table


@dag(
    dag_id="lake_compaction",
    schedule=TABLE_ASSETS[Table.METRIC_ROLLUP_1D] & TABLE_ASSETS[Table.QUERY_RESULTS],
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["metrics-lake", "maintenance"],
    params={
        "z_order": Param(False, type="boolean", description="Z-order rewritten partitions by metric, server."),
        "tables": Param([], type="array", items={"type": "string"}, description="Tables to compact; empty: all."),
    },
    doc_md=__doc__,
)
def lake_compaction():
    @task
    def compact_log() -> list[dict]:
        """Merge runs of small segments in every partition; offsets stay the same."""
        from metrics_lake.app.operations import compact_log
        from metrics_lake.core.config import load_settings

        return compact_log(load_settings())

    @task
    def compact_tables() -> list[dict]:
        """OPTIMIZE every table (or the chosen ones) partition by partition, then write a checkpoint."""
        from metrics_lake.app.operations import compact_tables
        from metrics_lake.core.config import load_settings

        params = get_current_context()["params"]
        return compact_tables(load_settings(), params["tables"] or None, params["z_order"])

    compact_log()
    compact_tables()


lake_compaction()
