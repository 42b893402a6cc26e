"""Keeping the lake within its size and retention: per-resolution retention with VACUUM, and Delta compaction.

- :mod:`.retention`: what is past its horizon in the log and each table, planned then deleted;
- :mod:`.table_compaction`: bin-packing (or Z-ordering) small Delta files, then a checkpoint.

Log segments have their own maintenance in :mod:`metrics_lake.core.log` (segment compaction
and retention never move offsets), which :mod:`.retention` drives for the log.
"""

__all__ = ["retention", "table_compaction"]
