"""Spark jobs: :mod:`.stream_metrics` (speed layer), :mod:`.recompute`, :mod:`.rollups`, :mod:`.stored_queries`, :mod:`.replay`, :mod:`.sql_query`; shared: :mod:`.day_partitions`."""

__all__ = [
    "day_partitions",
    "recompute",
    "replay",
    "rollups",
    "sql_query",
    "stored_queries",
    "stream_metrics",
]
