"""The producer: routes records to partitions, batches, and flushes segments.

Events are partitioned by a stable hash of ``server`` (CRC-32, identical in
every process and Python version, unlike ``hash()``), so one server's events
stay in one partition and in order. Rejected records (no server) hash their
raw payload instead.

Each partition has a buffer that is flushed into one segment when it holds
``roll_bytes`` of (uncompressed Arrow) data, when its oldest record is
``linger_ms`` old (a background thread checks), or on :meth:`Producer.flush`.
Every flush carries this producer's id and a per-partition sequence number,
so retrying a flush that failed half-way never appends twice (see
:meth:`lake.log.log.SegmentLog.append`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lake.config import LakeSettings
from lake.log.log import SegmentLog
from lake.storage import LocalStore, open_store
from lake_schemas import LOG_RECORD
from lake_schemas.contract import to_log_records

log = logging.getLogger(__name__)


def producer_for(settings: LakeSettings, store: LocalStore | None = None) -> Producer:
    """A :class:`Producer` for ``settings.topic`` with the configured partitions and roll size/age."""
    return Producer(
        SegmentLog(store or open_store(settings)),
        settings.topic,
        partitions=settings.partitions,
        roll_bytes=settings.segment_roll_bytes,
        linger_ms=settings.segment_roll_ms,
    )


def partition_for(key: str, partitions: int) -> int:
    """Partition of ``key`` (a server name): ``crc32(utf-8 key) mod partitions``."""
    return zlib.crc32(key.encode("utf-8")) % partitions


def assign_partitions(records: pa.Table, partitions: int) -> np.ndarray:
    """Partition number of every row of a :data:`LOG_RECORD` table (int32 array)."""
    keys = pc.coalesce(records.column("server"), records.column("raw"), pa.scalar("")).combine_chunks()
    encoded = keys.dictionary_encode()
    per_key = np.array([partition_for(k, partitions) for k in encoded.dictionary.to_pylist()], dtype=np.int32)
    return per_key[encoded.indices.to_numpy(zero_copy_only=False)]


@dataclass
class ProducerStats:
    """Counters since the producer started: records sent (rejects among them), segments appended, flush retries."""

    records: int = 0
    rejected: int = 0
    segments: int = 0
    retries: int = 0


@dataclass
class _Buffer:
    tables: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    first_at: float = 0.0


class Producer:
    """Batching, idempotent producer for one topic.

    ``roll_bytes``: flush a partition buffer at this many bytes;
    ``linger_ms``: flush at the latest this long after the first record was
    buffered; ``retries``: attempts per flush on ``OSError`` (each retry
    re-sends the same sequence number). Use as a context manager, or call
    :meth:`close`, so buffered records are flushed.
    """

    def __init__(
        self,
        log: SegmentLog,
        topic: str,
        *,
        partitions: int = 4,
        roll_bytes: int = 4 * 1024 * 1024,
        linger_ms: int = 1000,
        retries: int = 5,
        producer_id: str | None = None,
    ) -> None:
        self.log = log
        self.topic = topic
        self.partitions = log.ensure_topic(topic, partitions)
        self.roll_bytes = roll_bytes
        self.linger_ms = linger_ms
        self.retries = retries
        self.producer_id = producer_id or uuid.uuid4().hex
        self.stats = ProducerStats()
        self._seq = [0] * self.partitions
        self._buffers = [_Buffer() for _ in range(self.partitions)]
        # A flush that failed keeps its records *and* sequence number here and
        # is retried before anything newer, so a half-done append (segment
        # written, index not) is recognised as a duplicate, never re-appended.
        self._pending: list[tuple[pa.Table, int] | None] = [None] * self.partitions
        self._lock = threading.Lock()
        # One flush at a time per partition keeps sequence numbers in order.
        self._flush_locks = [threading.Lock() for _ in range(self.partitions)]
        self._closed = threading.Event()
        self._flusher = threading.Thread(target=self._flush_aged_loop, name="producer-linger", daemon=True)
        self._flusher.start()

    def send(self, records: pa.Table) -> None:
        """Buffer :data:`LOG_RECORD` rows; may flush full partitions before returning."""
        if records.num_rows == 0:
            return
        if self._closed.is_set():
            raise RuntimeError("producer is closed")
        records = records.cast(LOG_RECORD) if not records.schema.equals(LOG_RECORD) else records
        assignment = assign_partitions(records, self.partitions)
        full = []
        with self._lock:
            self.stats.records += records.num_rows
            self.stats.rejected += records.num_rows - records.column("reason").null_count
            for p in np.unique(assignment):
                part = records.filter(pa.array(assignment == p))
                buffer = self._buffers[p]
                if not buffer.tables:
                    buffer.first_at = time.monotonic()
                buffer.tables.append(part)
                buffer.nbytes += part.nbytes
                if buffer.nbytes >= self.roll_bytes:
                    full.append(int(p))
        for p in full:
            self._flush_partition(p)

    def send_payloads(self, payloads: list[str | bytes | dict]) -> None:
        """Validate raw events (JSON text or dicts) and send them; bad ones go as rejects."""
        self.send(to_log_records(payloads))

    def flush(self) -> None:
        """Write every buffered record to the log."""
        for p in range(self.partitions):
            self._flush_partition(p)

    def close(self) -> None:
        """Flush and stop the background flusher."""
        self._closed.set()
        self._flusher.join()
        self.flush()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _take(self, partition: int) -> tuple[pa.Table, int] | None:
        with self._lock:
            if self._pending[partition] is not None:
                return self._pending[partition]
            buffer = self._buffers[partition]
            if not buffer.tables:
                return None
            self._buffers[partition] = _Buffer()
            self._seq[partition] += 1
            self._pending[partition] = (pa.concat_tables(buffer.tables), self._seq[partition])
            return self._pending[partition]

    def _flush_partition(self, partition: int) -> None:
        """Append the pending batch (if a flush failed before), then the buffer."""
        with self._flush_locks[partition]:
            while (taken := self._take(partition)) is not None:
                self._append(partition, *taken)

    def _append(self, partition: int, records: pa.Table, seq: int) -> None:
        for attempt in range(self.retries + 1):
            try:
                self.log.append(self.topic, partition, records, producer_id=self.producer_id, producer_seq=seq)
                break
            except OSError:
                if attempt == self.retries:
                    raise
                self.stats.retries += 1
                time.sleep(min(0.05 * 2**attempt, 2.0))
        with self._lock:
            self._pending[partition] = None
            self.stats.segments += 1

    def _flush_aged_loop(self) -> None:
        interval = max(self.linger_ms / 4000.0, 0.005)
        while not self._closed.wait(interval):
            now = time.monotonic()
            for p, buffer in enumerate(self._buffers):
                aged = buffer.tables and (now - buffer.first_at) * 1000 >= self.linger_ms
                if aged or self._pending[p] is not None:
                    try:
                        self._flush_partition(p)
                    except OSError as exc:  # kept pending; retried on the next tick
                        log.warning("flush of %s/%d failed, will retry: %s", self.topic, p, exc)
