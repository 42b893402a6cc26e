"""Spark computes here: layer 3, over the core (never agents, quality or the application).

- :mod:`.session`: :func:`~.session.build_session`, the SparkSession with the lake's data sources;
- :mod:`.sources`: the ``lakelog`` streaming source over the segment log;
- :mod:`.sinks`: the ``lakebronze`` exactly-once streaming sink;
- :mod:`.readers`: the ``lakedelta`` batch reader over Delta snapshots (time travel);
- :mod:`.jobs`: the speed layer, recompute, rollups, stored queries, replay, SQL.
"""

__all__ = ["jobs", "readers", "session", "sinks", "sources"]
