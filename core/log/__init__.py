"""The partitioned log of immutable segment objects: append, read, compact, retain.

- :mod:`.segment`: segment encoding (Parquet with offsets in the footer);
- :mod:`.index`: the per-partition index, swapped by compare-and-swap;
- :mod:`.log`: :class:`SegmentLog` (topics, partitions) and :class:`PartitionWriter` (the append path,
  holding the partition's lease from :mod:`metrics_lake.core.leases`);
- :mod:`.producer`: the batching, idempotent :class:`Producer`;
- :mod:`.consumer`: offset-range reads; :mod:`.consumer_groups`: committed offsets and lag;
- :mod:`.segment_compaction`, :mod:`.segment_retention`: log maintenance that never moves offsets.
"""

from __future__ import annotations

from metrics_lake.core.log.consumer import end_offsets, read_range, start_offsets
from metrics_lake.core.log.log import AppendResult, PartitionWriter, SegmentLog
from metrics_lake.core.log.producer import Producer, producer_for

__all__ = [
    "AppendResult",
    "PartitionWriter",
    "Producer",
    "SegmentLog",
    "end_offsets",
    "producer_for",
    "read_range",
    "start_offsets",
]
