"""The partitioned segment log: topics, partitions and the append path.

Layout under the lake root (a local directory or ``s3://bucket/prefix``)::

    log/<topic>/topic.json                  partition count and cleanup policy, created once
    log/<topic>/<partition>/lease.json      the writer's lease (metrics_lake.core.leases)
    log/<topic>/<partition>/index.json      the partition index
    log/<topic>/<partition>/<base>.parquet  immutable segments

(keys from :mod:`metrics_lake.core.keys`).

One writer per partition at a time: a :class:`PartitionWriter` holds the
partition's lease and, when it takes it, writes its epoch into the index with
a compare-and-swap (*fencing*). An append then

1. creates the segment named by the log end offset with a create-if-absent
   (``If-None-Match: *`` on S3), so no writer overwrites another's segment;
2. commits it by a compare-and-swap of the index (``If-Match`` on S3).

A segment becomes visible to consumers only in step 2, so readers never see
a partial or uncommitted segment, and offsets stay dense and monotonic. A
writer whose lease was taken over fails step 2 (the index changed and names
a higher epoch) with :class:`~metrics_lake.lake_schemas.errors.FencedError`; the segment it may
have created in step 1 is a *zombie*, never visible, deleted by the next
writer before it reuses that offset. A segment left by this writer's own
failed attempt (a crash or timeout between the steps) is adopted instead,
since the producer retries that same batch with the same sequence number.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from metrics_lake.core import keys
from metrics_lake.core.leases import Lease, acquire_lease, release_lease, renew_lease
from metrics_lake.core.log.index import PartitionIndex
from metrics_lake.core.log.segment import (
    SegmentInfo,
    encode_segment,
    parse_segment_name,
    read_segment_info,
    segment_name,
)
from metrics_lake.core.storage import ObjectExistsError, Store, VersionConflictError
from metrics_lake.lake_schemas.errors import FencedError, IntegrityError, TopicNotFoundError

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_MS = 10_000
#: A topic's cleanup policies (Kafka's ``cleanup.policy``): segments deleted by age, or compacted by key.
DELETE, COMPACT = "delete", "compact"


@dataclass(frozen=True)
class AppendResult:
    """Offsets ``[base_offset, end_offset)`` of an append; ``duplicate`` if it was a retry.

    ``size_bytes``: the new segment's object size (0 for a duplicate).
    """

    base_offset: int
    end_offset: int
    duplicate: bool = False
    size_bytes: int = 0


class SegmentLog:
    """A partitioned log of segment objects in one store (:class:`metrics_lake.core.storage.Store`)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def ensure_topic(self, topic: str, partitions: int, *, compacted: bool = False) -> int:
        """Create ``topic`` with ``partitions`` partitions unless it exists.

        ``compacted``: its cleanup policy is log compaction by key (Kafka's
        ``cleanup.policy=compact``: :mod:`metrics_lake.core.log.keyed_compaction`)
        instead of deletion by age (:mod:`metrics_lake.core.log.segment_retention`).
        Returns the topic's actual partition count: an existing topic keeps
        its count (re-partitioning would break per-server ordering).
        """
        key = keys.topic_key(topic)
        doc = {
            "topic": topic,
            "partitions": partitions,
            "cleanup_policy": COMPACT if compacted else DELETE,
            "created_at": int(time.time() * 1000),
        }
        try:
            self.store.create(key, json.dumps(doc).encode())
        except ObjectExistsError:
            pass
        return self.partitions(topic)

    def _topic_doc(self, topic: str) -> dict:
        try:
            return json.loads(self.store.read(keys.topic_key(topic)))
        except FileNotFoundError:
            raise TopicNotFoundError(f"topic {topic!r} does not exist under {self.store.root}/log") from None

    def partitions(self, topic: str) -> int:
        """Partition count of ``topic``; :class:`TopicNotFoundError` if it does not exist."""
        return int(self._topic_doc(topic)["partitions"])

    def compacted(self, topic: str) -> bool:
        """Whether ``topic`` is cleaned up by key compaction rather than by age; :class:`TopicNotFoundError` if absent."""
        return self._topic_doc(topic).get("cleanup_policy", DELETE) == COMPACT

    def topics(self) -> list[str]:
        """Names of existing topics."""
        return [
            name
            for name in self.store.list(keys.LOG_PREFIX)
            if keys.is_name(name) and self.store.exists(keys.topic_key(name))
        ]

    def index(self, topic: str, partition: int) -> PartitionIndex:
        """The committed index of one partition (what consumers may read)."""
        return PartitionIndex.load(self.store, topic, partition)

    def _check_partition(self, topic: str, partition: int) -> None:
        count = self.partitions(topic)
        if not 0 <= partition < count:
            raise IndexError(f"partition {partition} out of range for topic {topic!r} with {count} partitions")

    def writer(
        self,
        topic: str,
        partition: int,
        owner: str,
        *,
        ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        wait_s: float = 0.0,
    ) -> PartitionWriter:
        """Take the partition's lease for ``owner`` (waiting up to ``wait_s`` s) and return its writer.

        Raises :class:`~metrics_lake.lake_schemas.errors.LeaseHeldError` if another writer
        keeps the lease, ``IndexError`` for a partition out of range.
        """
        self._check_partition(topic, partition)
        lease = acquire_lease(self.store, topic, partition, owner, ttl_ms=ttl_ms, wait_s=wait_s)
        return PartitionWriter(self.store, lease, ttl_ms=ttl_ms)

    def append(
        self,
        topic: str,
        partition: int,
        records: pa.Table,
        *,
        producer_id: str | None = None,
        producer_seq: int | None = None,
        wait_s: float = 30.0,
    ) -> AppendResult:
        """Append ``records`` as one segment under a lease taken for this call only.

        For one-off appends; a :class:`~metrics_lake.core.log.producer.Producer` keeps
        its writers instead. See :meth:`PartitionWriter.append`.
        """
        writer = self.writer(topic, partition, producer_id or uuid.uuid4().hex, wait_s=wait_s)
        try:
            return writer.append(records, producer_id=producer_id, producer_seq=producer_seq)
        finally:
            writer.release()


class PartitionWriter:
    """The single writer of one partition while it holds ``lease``.

    It keeps the partition index in memory (the lease makes it the only
    writer) and renews the lease whenever less than two thirds of the TTL
    is left. Not thread-safe: one append at a time.
    """

    def __init__(self, store: Store, lease: Lease, *, ttl_ms: int = DEFAULT_LEASE_TTL_MS) -> None:
        self.store = store
        self.lease = lease
        self.ttl_ms = ttl_ms
        self.topic, self.partition = lease.topic, lease.partition
        self.prefix = keys.partition_prefix(self.topic, self.partition)
        self.index = self._fence()
        self._stale = False  # an append failed: re-read the index before the next one

    @property
    def epoch(self) -> int:
        """This writer's lease epoch."""
        return self.lease.epoch

    def _load(self) -> PartitionIndex:
        index = PartitionIndex.load(self.store, self.topic, self.partition)
        if index.epoch > self.epoch:
            raise FencedError(
                f"{self.topic}/{self.partition}: index was committed by epoch {index.epoch}, "
                f"this writer holds epoch {self.epoch}"
            )
        return index

    def _fence(self) -> PartitionIndex:
        """Write this epoch into the index, so older writers can no longer commit; adopt or drop strays."""
        while True:
            index = self._load()
            self._settle_strays(index)
            index.epoch = self.epoch
            try:
                index.save(self.store, self.topic, self.partition)
                return index
            except VersionConflictError:
                continue  # an older writer committed in between; look again

    def _settle_strays(self, index: PartitionIndex) -> bool:
        """Adopt segments past the index end that this epoch wrote; delete older epochs' zombies.

        Returns True if ``index`` gained segments (the caller must save it).
        """
        adopted = False
        for name in self.store.list(self.prefix):
            base = parse_segment_name(name)
            if base is None or base < index.next_offset:
                continue
            key = keys.partition_key(self.topic, self.partition, name)
            info = self._stored_info(key)
            if info.epoch == self.epoch and base == index.next_offset:
                index.add(info)
                adopted = True
            elif info.epoch < self.epoch:
                log.info("%s: deleting uncommitted segment %s of fenced epoch %d", self.prefix, name, info.epoch)
                self.store.delete(key)
            else:
                raise FencedError(
                    f"{key} was written past the index end by epoch {info.epoch}; this writer holds {self.epoch}"
                )
        return adopted

    def renew(self) -> None:
        """Renew the lease now; :class:`~metrics_lake.lake_schemas.errors.FencedError` if it was taken over."""
        self.lease = renew_lease(self.store, self.lease, self.ttl_ms)

    def renew_if_due(self) -> None:
        """Renew the lease if less than two thirds of its TTL is left."""
        if self.lease.remaining_ms() < self.ttl_ms * 2 / 3:
            self.renew()

    def release(self) -> None:
        """Give the lease up so the next writer need not wait for it to expire."""
        release_lease(self.store, self.lease)

    def append(
        self,
        records: pa.Table,
        *,
        producer_id: str | None = None,
        producer_seq: int | None = None,
        sources: dict[str, int] | None = None,
        digests: dict[str, str] | None = None,
        requests: list[str] | None = None,
    ) -> AppendResult:
        """Append ``records`` (:data:`metrics_lake.lake_schemas.log_records.LOG_RECORD`, or for the keyed inventory
        topic :data:`~metrics_lake.lake_schemas.log_records.INVENTORY_RECORD`, whose ``offset`` column this
        fills) as one new segment.

        With ``producer_id``/``producer_seq``, a call whose sequence is not
        above the last one committed for that producer is a retry: nothing
        is written and the original offsets are returned with
        ``duplicate=True``. ``sources`` (producer id -> sequence) records
        the upstream producers (agents) whose batches are in ``records``,
        ``digests`` (producer id -> digest) their bodies' digests;
        ``requests`` the request keys of the requests ``records`` hold, kept
        in the segment's footer at its append time
        (:func:`~metrics_lake.core.log.segment.read_segment_requests`).

        Raises :class:`~metrics_lake.lake_schemas.errors.FencedError` if another writer took
        the lease, ``ValueError`` for empty or mis-shaped records, and the
        store's ``OSError``/``botocore`` errors when storage fails; after a
        failure the next call re-reads the index, so retrying is safe.
        """
        if self._stale:
            index = self._load()
            if self._settle_strays(index):
                index.save(self.store, self.topic, self.partition)  # commit before it can count as a duplicate
            self.index, self._stale = index, False
        if producer_id is not None and producer_seq is not None:
            last = self.index.producers.get(producer_id)
            if last is not None and producer_seq <= last["seq"]:
                return AppendResult(last["base_offset"], last["end_offset"], duplicate=True)
        self.renew_if_due()
        producers = dict(sources or {})
        if producer_id is not None and producer_seq is not None:
            producers[producer_id] = producer_seq
        base = self.index.next_offset
        if "offset" in records.schema.names:  # a keyed topic's records carry their offsets
            offsets = pa.array(np.arange(base, base + records.num_rows, dtype=np.int64))
            records = records.set_column(records.schema.get_field_index("offset"), "offset", offsets)
        appended_at = int(time.time() * 1000)
        data, info = encode_segment(
            records,
            base_offset=base,
            appended_at=appended_at,
            epoch=self.epoch,
            producers=producers,
            digests=digests,
            requests={appended_at: list(requests)} if requests else None,
        )
        key = keys.partition_key(self.topic, self.partition, segment_name(base))
        try:
            self._create(key, data)
            self.index.add(info)
            self.index.save(self.store, self.topic, self.partition)
        except VersionConflictError:
            self._stale = True
            self.index, self._stale = self._recover(info), False
        except BaseException:
            self._stale = True
            raise
        return AppendResult(info.base_offset, info.end_offset, size_bytes=info.size_bytes)

    def _create(self, key: str, data: bytes) -> None:
        try:
            self.store.create(key, data)
        except ObjectExistsError:
            existing = self._stored_info(key)
            if existing.epoch < self.epoch:  # a zombie of a fenced writer
                log.info("%s: deleting uncommitted segment of fenced epoch %d", key, existing.epoch)
                self.store.delete(key)
                self.store.create(key, data)
            elif existing.epoch > self.epoch:
                raise FencedError(
                    f"{key} was written by epoch {existing.epoch}; this writer holds {self.epoch}"
                ) from None
            # else: this very attempt, retried by the S3 client after a lost response

    def _stored_info(self, key: str) -> SegmentInfo:
        """The :class:`~metrics_lake.core.log.segment.SegmentInfo` of a stored segment (one GET; its size is the bytes read)."""
        data = self.store.read(key)
        return read_segment_info(pa.BufferReader(data), len(data)).for_index()

    def _recover(self, info) -> PartitionIndex:
        """After a failed index swap: find out whether the append of ``info`` committed, and finish it if not.

        Only this writer appends under its epoch, so a stored index of the
        same epoch ending at ``info.end_offset`` holds this append (a lost
        response). One still ending at ``info.base_offset`` was changed by
        compaction or retention, which never move the log end: the append
        is committed on top of it. Anything else is a broken invariant.
        Raises :class:`~metrics_lake.lake_schemas.errors.FencedError` if a newer epoch committed.
        """
        while True:
            index = self._load()
            if index.epoch == self.epoch and index.next_offset == info.end_offset:
                return index
            if index.epoch == self.epoch and index.next_offset == info.base_offset:
                index.add(info)
                try:
                    index.save(self.store, self.topic, self.partition)
                    return index
                except VersionConflictError:
                    continue
            raise IntegrityError(
                f"{self.prefix}: the index changed under the lease holder (epoch {self.epoch}) in a way neither "
                "an append, compaction nor retention makes; the append was not committed"
            )
