"""Spark computes here: layer 3, over the core (never agents, quality or the application).

- :mod:`.session`: :func:`~.session.build_session`, the SparkSession with the lake's data sources;
- :mod:`.jvm_archive`: the driver's class-data sharing archive (faster JVM start);
- :mod:`.worker_daemon`: Python workers forked with the lake's modules already imported;
- :mod:`.datasources`: ``lakelog`` (the streaming source over the segment log) and ``lakedelta``
  (a batch reader over Delta snapshots, time travel);
- :mod:`.jobs`: the speed layer, recompute, rollups, stored queries over days, SQL.

Every module here uses Spark; the engine-independent work they run lives in
:mod:`metrics_lake.core` (replay, for one, needs no Spark and lives there).
"""

__all__ = ["datasources", "jobs", "jvm_archive", "session", "worker_daemon"]
