"""The partitioned log of immutable segment objects: append, read, lease, compact, retain.

- :mod:`.segment`: segment encoding (Parquet with offsets in the footer);
- :mod:`.index`: the per-partition index, swapped by compare-and-swap;
- :mod:`.lease`: partition leases with fencing epochs;
- :mod:`.log`: :class:`SegmentLog` (topics, partitions) and :class:`PartitionWriter` (the append path);
- :mod:`.producer`: the batching, idempotent :class:`Producer`;
- :mod:`.consumer`: offset-range reads; :mod:`.consumer_groups`: committed offsets and lag;
- :mod:`.compaction`, :mod:`.retention`: log maintenance that never moves offsets.
"""

from __future__ import annotations

from metrics_lake.core.log.consumer import end_offsets, read_range, start_offsets
from metrics_lake.core.log.lease import FencedError, LeaseHeldError
from metrics_lake.core.log.log import AppendResult, PartitionWriter, SegmentLog, TopicNotFoundError
from metrics_lake.core.log.producer import Producer, producer_for

__all__ = [
    "AppendResult",
    "FencedError",
    "LeaseHeldError",
    "PartitionWriter",
    "Producer",
    "SegmentLog",
    "TopicNotFoundError",
    "end_offsets",
    "producer_for",
    "read_range",
    "start_offsets",
]
