"""Spark computes here: layer 3, over the core (never agents, quality or the application).

- :mod:`.session`: :func:`~.session.build_session`, the SparkSession with the lake's data sources;
- :mod:`.jvm_archive`: the driver's class-data sharing archive (faster JVM start); :mod:`.worker_daemon`;
- :mod:`.sources`: the ``lakelog`` streaming source over the segment log (how far each micro-batch reads);
- :mod:`.readers`: the ``lakedelta`` batch reader over Delta snapshots (time travel);
- :mod:`.jobs`: the speed layer, recompute, rollups, stored queries, replay, SQL.
"""

__all__ = ["jobs", "jvm_archive", "readers", "session", "sources", "worker_daemon"]
