"""The speed layer's commits, one module per table, in the order a micro-batch takes them.

Each table's commit (:class:`~metrics_lake.core.speed.table_commits.batch.TableCommit`) takes what it needs from the
processed batch (:class:`~metrics_lake.core.speed.table_commits.batch.ProcessedBatch`: the plan and the tasks'
chunk results) and commits it with the table's log positions
(:func:`~metrics_lake.core.speed.table_commits.positions.commit_with_positions`, exactly once):

- :mod:`~metrics_lake.core.speed.table_commits.log_files`: ``bronze_events`` and ``quarantine_events``, the files
  the tasks wrote;
- :mod:`~metrics_lake.core.speed.table_commits.windows`: ``metric_windows_1m``, the batch's window states merged
  into the files they touch;
- :mod:`~metrics_lake.core.speed.table_commits.query_results`: ``query_results``, the stored queries kept live;
- :mod:`~metrics_lake.core.speed.table_commits.last_seen`: ``last_seen``, when each watched series was last heard;
- :mod:`~metrics_lake.core.speed.table_commits.alerts`: ``alerts``, the alert rules' transitions.

:func:`metrics_lake.core.speed.micro_batch.commit_batch` runs them in that order: each reads the tables the
earlier ones committed.
"""
