"""Spark jobs, one per operation of :mod:`metrics_lake.lake_schemas.table_access` that runs on Spark.

- :mod:`.stream_metrics`: the speed layer (a streaming query, or ``--once``);
- :mod:`.recompute`: the batch layer's day rebuild of the windows, and reconciliation;
- :mod:`.rollups`: 1-hour and 1-day rollups;
- :mod:`.evaluate_queries`: the stored queries over whole days;
- :mod:`.sql_query`: Spark SQL over the tables;
- :mod:`.day_partitions`: what the batch jobs share: a day rebuilt in two stages and replaced in one commit.
"""

__all__ = ["day_partitions", "evaluate_queries", "recompute", "rollups", "sql_query", "stream_metrics"]
