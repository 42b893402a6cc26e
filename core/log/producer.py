"""The producer: routes records to partitions, batches, and flushes segments.

Events are partitioned by a stable hash of ``server`` (CRC-32, identical in
every process and Python version, unlike ``hash()``), so one server's events
stay in one partition and in order. Rejected records (no server) hash their
raw payload instead. A producer may be limited to a subset of the partitions
(a gateway owns some, see :mod:`metrics_lake.app.gateway`): it then routes over those.

Each partition has a buffer that is flushed into one segment when it holds
``roll_bytes`` of (uncompressed Arrow) data, when its oldest record is
``linger_ms`` old (a background thread checks), or on :meth:`Producer.flush`.
Every flush carries this producer's id and a per-partition sequence number,
so retrying a flush that failed half-way never appends twice (see
:meth:`metrics_lake.core.log.log.PartitionWriter.append`).

To write a partition the producer holds its lease (:mod:`metrics_lake.core.leases`),
taken at the first flush (waiting up to ``lease_wait_s`` for another
producer to finish), renewed by the background thread and released on
:meth:`Producer.close`. If the lease is lost (this process stalled past the
TTL and another writer took over), the flush is retried under a newly taken
lease, with the same sequence number.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.keys import partition_key
from metrics_lake.core.log.index import PartitionIndex
from metrics_lake.core.log.log import AppendResult, PartitionWriter, SegmentLog
from metrics_lake.core.log.segment import read_segment_requests
from metrics_lake.core.storage import Store, open_store
from metrics_lake.lake_schemas.contract import to_log_records
from metrics_lake.lake_schemas.errors import FencedError, InputError, SequenceConflictError, StorageError
from metrics_lake.lake_schemas.log_records import CODED_LOG_RECORD, LOG_RECORD

log = logging.getLogger(__name__)

#: Longest the background flusher sleeps: lease renewals and retries of failed flushes are checked this often.
TICK_SECONDS = 0.05
#: Recent (sequence -> digest) kept in memory per upstream producer, to check retries of older batches.
SOURCE_HISTORY = 64
#: Upstream producers remembered in memory (least recently sending forgotten first).
MAX_SOURCES = 65_536


@dataclass(frozen=True)
class Source:
    """The upstream batch a :meth:`Producer.send` carries: who sent it, its sequence, its body's digest.

    ``producer_id``: an agent's id, an import's id; ``seq``: increasing per
    batch of that producer; ``digest``: a hash of the batch's body (hex
    text), which tells a retry (same body) from a reused sequence (another
    body). ``strict``: a sequence older than the last one recorded whose
    digest is no longer known is a conflict (an agent never re-sends an
    older batch after a newer one was acknowledged) rather than a duplicate
    (an import re-sending its deterministic chunks after a crash).
    """

    producer_id: str
    seq: int
    digest: str | None = None
    strict: bool = True


@dataclass(frozen=True)
class Sent:
    """What :meth:`Producer.send` did: one future per partition written, and the rows it buffered.

    ``records``/``valid``: rows buffered for appending (valid ones among
    them); ``duplicates``: rows not buffered because their upstream batch
    is already in the log or on its way (a retry).
    """

    futures: list[Future]
    records: int = 0
    valid: int = 0
    duplicates: int = 0


def producer_for(settings: LakeSettings, store: Store | None = None, **options) -> Producer:
    """A :class:`Producer` for ``settings.topic`` with the configured partitions, roll size/age and lease TTL.

    ``options`` are passed on to :class:`Producer` (``owned``, ``lease_wait_s``...).
    """
    defaults = dict(
        partitions=settings.partitions,
        roll_bytes=settings.segment_roll_bytes,
        linger_ms=settings.segment_roll_ms,
        lease_ttl_ms=int(settings.lease_ttl_seconds * 1000),
    )
    return Producer(SegmentLog(store or open_store(settings)), settings.topic, **(defaults | options))


def partition_for(key: str, partitions: int) -> int:
    """Partition of ``key`` (a server name): ``crc32(utf-8 key) mod partitions``."""
    return zlib.crc32(key.encode("utf-8")) % partitions


def hash_partitions(keys: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """:func:`partition_for` of every value of the string array ``keys`` (no nulls; plain or dictionary-encoded),
    as an int32 array.

    Hashes each distinct key once (Arrow's dictionary encoding, or the
    dictionary ``keys`` has), so the cost follows the number of keys, not of
    rows.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()  # dictionary chunks: one dictionary for all (Arrow unifies them)
    encoded = keys if pa.types.is_dictionary(keys.type) else keys.dictionary_encode()
    per_key = np.array([partition_for(k, partitions) for k in encoded.dictionary.to_pylist()], dtype=np.int32)
    return per_key[encoded.indices.to_numpy(zero_copy_only=False)]


def group_by_partition(table: pa.Table, assignment: np.ndarray, order: np.ndarray | None = None) -> dict[int, pa.Table]:
    """The rows of ``table`` per partition (``assignment``: a non-negative int per row), ascending by partition.

    Each partition's rows keep their order in ``table``, or follow ``order``
    (a sort key per row, their line numbers say) if given. One copy of the
    rows (none if they all go to one partition, in order), then slices.
    """
    counts = np.bincount(assignment)
    owned = np.flatnonzero(counts)
    if len(owned) == 1 and order is None:
        return {int(owned[0]): table}
    # Two stable sorts, 3x faster than a lexsort: by order (rows come in a few sorted runs, which timsort merges),
    # then by partition as 16-bit keys (numpy sorts those stably with a radix sort).
    permutation = np.arange(len(assignment)) if order is None else np.argsort(order, kind="stable")
    keys = assignment[permutation]
    permutation = permutation[np.argsort(keys.astype(np.uint16) if len(counts) <= 1 << 16 else keys, kind="stable")]
    grouped = pc.take(table, pa.array(permutation), boundscheck=False)  # a permutation: in bounds
    starts = np.cumsum(counts) - counts
    return {int(p): grouped.slice(int(starts[p]), int(counts[p])) for p in owned.tolist()}


def assign_partitions(records: pa.Table, partitions: int) -> np.ndarray:
    """Partition number of every row of a :data:`LOG_RECORD` table, or one with a dictionary-encoded ``server``
    (int32 array): by its server, or for a reject without one by its raw payload (or ``""``)."""
    server = records.column("server")
    if not server.null_count:  # the usual batch: every row names its server
        return hash_partitions(server, partitions)
    unnamed = np.flatnonzero(server.is_null().to_numpy(zero_copy_only=False))
    assignment = hash_partitions(server.fill_null(""), partitions)  # a dictionary stays one: "" joins it
    raw = records.column("raw").take(pa.array(unnamed))
    assignment[unnamed] = hash_partitions(pc.fill_null(raw, ""), partitions)
    return assignment


@dataclass
class ProducerStats:
    """Counters since the producer started: records sent (rejects among them), segments appended, flush retries."""

    records: int = 0
    rejected: int = 0
    segments: int = 0
    retries: int = 0
    segment_bytes: int = 0


@dataclass
class _Batch:
    """Records buffered (or being flushed) for one partition, and the future their flush resolves."""

    tables: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    first_at: float = 0.0
    sources: dict[str, int] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    requests: set[str] = field(default_factory=set)
    done: Future = field(default_factory=Future)
    seq: int = 0


class Producer:
    """Batching, idempotent producer for one topic.

    ``roll_bytes``: flush a partition buffer at this many bytes;
    ``linger_ms``: flush at the latest this long after the first record was
    buffered; ``retries``: attempts per flush on a retryable ``OSError``
    (not a :class:`~metrics_lake.lake_schemas.errors.StorageError` that says retrying cannot help; each retry
    re-sends the same sequence number); ``owned``: the partitions this
    producer writes (default all); ``lease_ttl_ms``/``lease_wait_s``: lease
    time-to-live, and how long to wait for a partition leased to another
    writer before raising :class:`~metrics_lake.lake_schemas.errors.LeaseHeldError`;
    ``on_append(partition, result, seconds)`` is called after every
    successful flush with the time the append took. Use as a
    context manager, or call :meth:`close`, so buffered records are flushed.

    ``flush_when_idle``: an adaptive group commit for a server that takes
    many requests at once (the gateway). It wraps each request's work up to
    :meth:`send` in :meth:`incoming`; a partition's records are then flushed
    as soon as no request is on its way to the buffer, and wait at most
    ``linger_ms`` for those that are. A lone sender's batch is flushed at once
    instead of after the linger, and under load one flush takes everything
    that arrived meanwhile: fewer, larger segments, the way a database's
    group commit waits only while more commits are coming (MySQL's
    ``binlog_group_commit_sync_no_delay_count``). A flush under way still
    delays a partition's next flush. The partitions' background appends run
    side by side (up to the store's ``parallel_appends``), except on a store
    whose appends hold the GIL (``appends_hold_the_gil``: a local disk),
    where they take turns while a request is on its way: beside the threads
    decoding requests they would only take turns at the GIL.

    ``request_window_ms``: how long the request keys of :meth:`send` are
    remembered after their records were appended (0, the default: only
    while they are buffered or being flushed; nothing is read back when a
    lease is taken).
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
        owned: list[int] | None = None,
        lease_ttl_ms: int = 10_000,
        lease_wait_s: float = 60.0,
        on_append: Callable[[int, AppendResult, float], None] | None = None,
        flush_when_idle: bool = False,
        request_window_ms: int = 0,
    ) -> None:
        self.log = log
        self.topic = topic
        self.partitions = log.ensure_topic(topic, partitions)
        self.owned = sorted(set(owned)) if owned is not None else list(range(self.partitions))
        if not self.owned or not all(0 <= p < self.partitions for p in self.owned):
            raise InputError(f"owned partitions {owned} must be a non-empty subset of 0..{self.partitions - 1}")
        self.roll_bytes = roll_bytes
        self.linger_ms = linger_ms
        self.retries = retries
        self.lease_ttl_ms = lease_ttl_ms
        self.lease_wait_s = lease_wait_s
        self.on_append = on_append
        self.flush_when_idle = flush_when_idle
        self._incoming = 0  # requests between incoming() and their send(), when flush_when_idle
        self.producer_id = producer_id or uuid.uuid4().hex
        self.stats = ProducerStats()
        self._seq = [0] * self.partitions
        self._history: OrderedDict[str, OrderedDict[int, str | None]] = OrderedDict()
        self.request_window_ms = request_window_ms
        # Per partition, the request keys whose records are in the log: key -> append time (epoch ms), oldest first.
        self._requests: list[OrderedDict[str, int]] = [OrderedDict() for _ in range(self.partitions)]
        self._buffers = [_Batch() for _ in range(self.partitions)]
        # A flush that failed keeps its records *and* sequence number here and
        # is retried before anything newer, so a half-done append (segment
        # written, index not) is recognised as a duplicate, never re-appended.
        self._pending: list[_Batch | None] = [None] * self.partitions
        self._writers: list[PartitionWriter | None] = [None] * self.partitions
        self._lock = threading.Lock()
        # One flush at a time per partition keeps sequence numbers in order.
        self._flush_locks = [threading.Lock() for _ in range(self.partitions)]
        self._lease_lock = threading.Lock()  # leases are taken one producer thread at a time, in partition order
        # Background flush failures per partition and when to try again (backoff, so a dead store is not hammered).
        self._failures = [0] * self.partitions
        self._retry_at = [0.0] * self.partitions
        self._closed = threading.Event()
        self._wake = threading.Event()  # set when a partition's buffer starts a batch or a flush ends
        self._full_pool = ThreadPoolExecutor(max_workers=min(4, len(self.owned)), thread_name_prefix="producer-full")
        self._flush_threads = min(log.store.parallel_appends, len(self.owned))
        self._appending = 0  # background appends under way (_append_turn)
        self._append_turns = threading.Condition()
        self._flusher = threading.Thread(target=self._flush_aged_loop, name="producer-linger", daemon=True)
        self._flusher.start()

    def writer(self, partition: int) -> PartitionWriter:
        """This producer's writer of ``partition``, taking the lease if not held (call under the flush lock).

        Leases are taken in partition order: the lease of ``partition`` only
        with those of the owned partitions below it. Two producers of one
        topic then never each hold a lease the other waits for (a cycle that
        lasts until the wait times out, since holders keep renewing).
        """
        if self._writers[partition] is None:
            with self._lease_lock:
                for p in self.owned:
                    if p <= partition and self._writers[p] is None:
                        writer = self.log.writer(
                            self.topic, p, self.producer_id, ttl_ms=self.lease_ttl_ms, wait_s=self.lease_wait_s
                        )
                        self._load_requests(p, writer.index)
                        self._writers[p] = writer
        return self._writers[partition]

    def _load_requests(self, partition: int, index: PartitionIndex) -> None:
        """Remember the request keys of ``partition``'s segments appended within the request window (by any writer:
        a predecessor killed before it answered). Reads the newest segments' footers, newest first, until one is
        older than the window."""
        if self.request_window_ms <= 0:
            return
        horizon = int(time.time() * 1000) - self.request_window_ms
        found: list[tuple[int, str]] = []
        for info in reversed(index.segments):
            if info.appended_at < horizon:  # a compacted segment's is its newest part's
                break
            with self.log.store.open_arrow(partition_key(self.topic, partition, info.name)) as source:
                found += [
                    (at, key) for at, batch in read_segment_requests(source).items() if at >= horizon for key in batch
                ]
        with self._lock:
            known = self._requests[partition]
            for at, key in sorted(found):
                known.setdefault(key, at)

    def flush_lock(self, partition: int) -> threading.Lock:
        """The lock every flush of ``partition`` holds: held by another thread, no append of this producer runs
        (a log compaction swapping segments into the partition's index takes it; hold it briefly)."""
        return self._flush_locks[partition]

    def held_partitions(self) -> list[int]:
        """Partitions whose lease this producer currently holds."""
        return [p for p in self.owned if self._writers[p] is not None]

    def acquire(self) -> None:
        """Take the leases of all owned partitions now rather than at their first flush."""
        for p in self.owned:
            with self._flush_locks[p]:
                self.writer(p)

    def route(self, records: pa.Table) -> np.ndarray:
        """Partition of every row of a :data:`LOG_RECORD` table, among the owned partitions (int32 array)."""
        slot = assign_partitions(records, len(self.owned))
        return np.asarray(self.owned, dtype=np.int32)[slot]

    def split(self, records: pa.Table, order: np.ndarray | None = None) -> dict[int, pa.Table]:
        """:data:`LOG_RECORD` rows by partition (:meth:`route`), each partition's rows in their order.

        ``order``: a sort key per row giving the rows' order (their line
        numbers, say), when ``records`` are not in it. Safe to call from any
        thread, for :meth:`send`: a caller that validates on several threads
        splits there too, so the thread that sends does not copy the rows.
        Rows of :data:`CODED_LOG_RECORD` (the importer's) stay so: the
        segment writer takes their dictionaries as they are.
        """
        if not any(records.schema.equals(schema) for schema in (LOG_RECORD, CODED_LOG_RECORD)):
            records = records.cast(LOG_RECORD)
        return group_by_partition(records, self.route(records), order)

    def send(
        self, records: pa.Table | dict[int, pa.Table], *, source: Source | None = None, request_key: str | None = None
    ) -> Sent:
        """Buffer :data:`LOG_RECORD` rows (a table, or one :meth:`split` made); may flush full partitions first.

        Returns :class:`Sent`, with one future per partition written,
        resolved with the :class:`~metrics_lake.core.log.log.AppendResult`
        once the records are durable in the log. A flush that keeps failing
        stays pending and is retried by the background thread, so wait on
        the futures with a timeout.

        ``source`` names the upstream batch (an agent's request, an import's
        chunk). Per partition, rows of a batch whose sequence is already in
        the log or buffered, with the same digest, are not buffered again
        (a retry; the future then resolves when that earlier copy is
        durable). A sequence already recorded with another digest, or (with
        ``source.strict``) older than the last recorded and no longer
        checkable, raises :class:`SequenceConflictError` and nothing of
        ``records`` is buffered.

        ``request_key`` names a request that has no producer sequence (a
        Prometheus remote-write body: its digest). Per partition, rows of a
        request whose key is buffered, or was appended within
        ``request_window_ms``, are not buffered again; the future is that
        earlier copy's. The keys go into each segment's footer
        (:func:`~metrics_lake.core.log.segment.read_segment_requests`), and a
        producer that takes a partition's lease reads those of the window
        back, so a retry after the previous writer was killed between its
        append and its answer is recognised too (once this producer holds the
        lease: :meth:`acquire`).
        """
        parts = records if isinstance(records, dict) else self.split(records) if records.num_rows else {}
        if not parts:
            return Sent([])
        if self._closed.is_set():
            raise RuntimeError("producer is closed")  # programming error
        # Committed state of partitions without a writer now (a lost lease), read before taking the lock.
        indexes = {p: self.log.index(self.topic, p) for p in self.owned if source and self._writers[p] is None}
        futures, full = [], []
        buffered = valid = duplicates = 0
        with self._lock:
            # Decide for the whole batch before buffering any of it, so a conflict stores nothing.
            if source:
                self._check_source(source, indexes)
            waits = {p: self._earlier_copy(p, source, indexes.get(p)) for p in parts} if source else {}
            if request_key is not None:
                waits |= {p: copy for p in parts if (copy := self._request_copy(p, request_key)) is not None}
            for p, part in parts.items():
                if waits.get(p) is not None:
                    futures.append(waits[p])
                    duplicates += part.num_rows
                    continue
                rejected = part.num_rows - part.column("reason").null_count
                buffered += part.num_rows
                valid += part.num_rows - rejected
                self.stats.records += part.num_rows
                self.stats.rejected += rejected
                buffer = self._buffers[p]
                if not buffer.tables:
                    buffer.first_at = time.monotonic()
                    self._wake.set()
                buffer.tables.append(part)
                buffer.nbytes += part.nbytes
                if request_key is not None:
                    buffer.requests.add(request_key)
                if source:
                    buffer.sources[source.producer_id] = source.seq
                    if source.digest is not None:
                        buffer.digests[source.producer_id] = source.digest
                    else:
                        buffer.digests.pop(source.producer_id, None)
                futures.append(buffer.done)
                if buffer.nbytes >= self.roll_bytes:
                    full.append(p)
            if source:
                self._remember(source)
        if len(full) > 1:  # encode and append the full partitions side by side (Arrow releases the GIL)
            list(self._full_pool.map(self._flush_partition, full))
        elif full:
            self._flush_partition(full[0])
        return Sent(futures, buffered, valid, duplicates)

    def _last_batch(self, partition: int, producer_id: str, committed: PartitionIndex | None):
        """(sequence, digest) of ``producer_id``'s newest batch in ``partition``, buffered or committed, or None."""
        for batch in (self._buffers[partition], self._pending[partition]):  # the buffer is the newer
            if batch is not None and producer_id in batch.sources:
                return batch.sources[producer_id], batch.digests.get(producer_id)
        writer = self._writers[partition]
        index = writer.index if writer is not None else committed
        return index.last_batch(producer_id) if index is not None else None

    def _check_source(self, source: Source, indexes: dict[int, PartitionIndex]) -> None:
        """Raise :class:`SequenceConflictError` unless ``source`` is a new batch or a retry of one with the same body.

        Looks at every owned partition, not only those this batch routes to:
        a reused sequence with another body may route elsewhere. The digest
        of an older sequence comes from the partitions whose newest batch it
        is, or from the in-memory history. Call under ``self._lock``.
        """
        lasts = [b for p in self.owned if (b := self._last_batch(p, source.producer_id, indexes.get(p)))]
        if not lasts or source.seq > max(seq for seq, _ in lasts):
            return
        digests = {digest for seq, digest in lasts if seq == source.seq and digest is not None}
        remembered = self._history.get(source.producer_id, {}).get(source.seq)
        if remembered is not None:
            digests.add(remembered)
        if not digests and not any(seq == source.seq for seq, _ in lasts):
            if source.strict:
                newest = max(seq for seq, _ in lasts)
                raise SequenceConflictError(
                    f"producer {source.producer_id!r} sent sequence {source.seq}, older than its last "
                    f"recorded sequence {newest}, with a body that cannot be checked; use a new sequence number"
                )
            return  # a re-run import: its chunks are the same by construction
        if source.digest is not None and digests and digests != {source.digest}:
            raise SequenceConflictError(
                f"producer {source.producer_id!r} reused sequence {source.seq} with a different body; "
                f"a new batch needs a new sequence number"
            )

    def _earlier_copy(self, partition: int, source: Source, committed: PartitionIndex | None) -> Future | None:
        """``None`` if ``source``'s rows are new in ``partition``, else a future for the copy already there.

        Only for a ``source`` that passed :meth:`_check_source`. Call under ``self._lock``.
        """
        last = self._last_batch(partition, source.producer_id, committed)
        if last is None or source.seq > last[0]:
            return None
        for batch in (self._buffers[partition], self._pending[partition]):  # still on its way: ack when durable
            if batch is not None and source.producer_id in batch.sources:
                return batch.done
        return _resolved(AppendResult(0, 0, duplicate=True))

    def _request_copy(self, partition: int, key: str) -> Future | None:
        """``None`` if request ``key`` has no rows in ``partition`` yet, else a future for the copy already there
        (buffered, being flushed, or appended within the window). Call under ``self._lock``."""
        for batch in (self._buffers[partition], self._pending[partition]):
            if batch is not None and key in batch.requests:
                return batch.done
        appended = self._requests[partition].get(key)
        if appended is not None and appended >= time.time() * 1000 - self.request_window_ms:
            return _resolved(AppendResult(0, 0, duplicate=True))
        return None

    def _remember(self, source: Source) -> None:
        """Record ``source``'s digest in the bounded in-memory history (call under ``self._lock``)."""
        seqs = self._history.pop(source.producer_id, None) or OrderedDict()
        seqs[source.seq] = source.digest
        while len(seqs) > SOURCE_HISTORY:
            seqs.popitem(last=False)
        self._history[source.producer_id] = seqs
        while len(self._history) > MAX_SOURCES:
            self._history.popitem(last=False)

    @contextlib.contextmanager
    def incoming(self) -> Iterator[None]:
        """Mark a request on its way to :meth:`send` (being decoded or checked) for the block: with
        ``flush_when_idle``, buffered records wait (at most ``linger_ms``) while any request is marked, and are
        flushed once none is (class docstring). Without it, this changes nothing."""
        with self._lock:
            self._incoming += 1
        try:
            yield
        finally:
            with self._lock:
                self._incoming -= 1
                idle = self._incoming == 0
            if idle and self.flush_when_idle:
                self._wake.set()
                with self._append_turns:  # appends waiting for their turn may now run side by side
                    self._append_turns.notify_all()

    def _linger_s(self) -> float:
        """How long a partition's oldest buffered record waits now before its flush (seconds)."""
        if self.flush_when_idle and self._incoming == 0:
            return 0.0
        return self.linger_ms / 1000

    def send_payloads(self, payloads: list[str | bytes | dict]) -> Sent:
        """Validate raw events (JSON text or dicts) and send them; bad ones go as rejects."""
        return self.send(to_log_records(payloads))

    def buffered_bytes(self) -> int:
        """Bytes buffered and not yet durable (pending flushes included)."""
        with self._lock:
            pending = sum(b.nbytes for b in self._pending if b is not None)
            return pending + sum(b.nbytes for b in self._buffers)

    def flush(self) -> None:
        """Write every buffered record to the log."""
        for p in self.owned:
            self._flush_partition(p)

    def close(self) -> None:
        """Flush, stop the background flusher and release the leases."""
        self._closed.set()
        self._wake.set()
        self._flusher.join()
        try:
            self.flush()
        finally:
            self._full_pool.shutdown()
            for p, writer in enumerate(self._writers):
                if writer is not None:
                    try:
                        writer.release()
                    except Exception as exc:  # the lease then just expires after its TTL
                        log.warning("could not release lease on %s/%d: %s", self.topic, p, exc)
                    self._writers[p] = None

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _take(self, partition: int) -> _Batch | None:
        with self._lock:
            if self._pending[partition] is not None:
                return self._pending[partition]
            buffer = self._buffers[partition]
            if not buffer.tables:
                return None
            self._buffers[partition] = _Batch()
            self._seq[partition] += 1
            buffer.seq = self._seq[partition]
            self._pending[partition] = buffer
            return buffer

    def _flush_partition(self, partition: int) -> None:
        """Append the pending batch (if a flush failed before), then the buffer as it is now.

        Records that arrive during the append wait for their own linger (or
        roll size): under load, flushing them at once would only make more,
        smaller segments.
        """
        with self._flush_locks[partition]:
            if (pending := self._pending[partition]) is not None:
                self._append(partition, pending)
            if (batch := self._take(partition)) is not None:
                self._append(partition, batch)

    def _append(self, partition: int, batch: _Batch) -> None:
        records = pa.concat_tables(batch.tables)
        for attempt in range(self.retries + 1):
            started = time.monotonic()
            try:
                result = self.writer(partition).append(
                    records,
                    producer_id=self.producer_id,
                    producer_seq=batch.seq,
                    sources=batch.sources,
                    digests=batch.digests,
                    requests=sorted(batch.requests),
                )
                break
            except (OSError, FencedError) as exc:
                if isinstance(exc, StorageError) and not exc.retryable:
                    raise  # access denied, bad credentials, a full disk: trying again cannot help
                if isinstance(exc, FencedError):
                    log.warning("%s; taking the lease again", exc)
                    self._writers[partition] = None
                if attempt == self.retries:
                    raise
                self.stats.retries += 1
                time.sleep(min(0.05 * 2**attempt, 2.0))
        with self._lock:
            self._pending[partition] = None  # its request keys move to the appended ones in the same step
            self._remember_requests(partition, batch.requests)
            self.stats.segments += 1
            self.stats.segment_bytes += result.size_bytes
        if self.on_append is not None:
            self.on_append(partition, result, time.monotonic() - started)
        batch.done.set_result(result)

    def _remember_requests(self, partition: int, appended: set[str]) -> None:
        """Remember the request keys of an append, forgetting those older than the window (call under the lock)."""
        if self.request_window_ms <= 0:
            return
        now = int(time.time() * 1000)
        known = self._requests[partition]
        for key in appended:
            known[key] = now
            known.move_to_end(key)
        while known and next(iter(known.values())) < now - self.request_window_ms:
            known.popitem(last=False)

    def _flush_aged_loop(self) -> None:
        # Sleep until the next batch is exactly linger_ms old (send() wakes the loop when a batch starts), and
        # flush each due partition on a pool thread without waiting for the others: on S3 an append is a few
        # round trips, and one slow partition must not hold back the rest (_append_turn says how many run at once
        # on a local disk). Every partition is also ticked at least every TICK_SECONDS, for lease renewals and
        # retries of failed flushes.
        running: dict[int, Future] = {}
        ticked = dict.fromkeys(self.owned, 0.0)
        with ThreadPoolExecutor(max_workers=self._flush_threads, thread_name_prefix="producer-flush") as pool:
            while not self._closed.is_set():
                self._wake.clear()
                now = time.monotonic()
                wake_at = now + TICK_SECONDS
                for p in self.owned:
                    if p in running and not running[p].done():
                        continue
                    buffer = self._buffers[p]
                    due = max(buffer.first_at + self._linger_s() if buffer.tables else math.inf, self._retry_at[p])
                    if due <= now or now - ticked[p] >= TICK_SECONDS:
                        ticked[p] = now
                        running[p] = pool.submit(self._tick, p)
                        running[p].add_done_callback(lambda _: self._wake.set())
                    else:
                        wake_at = min(wake_at, due)
                self._wake.wait(max(wake_at - time.monotonic(), 0.0005))

    def _tick(self, partition: int) -> None:
        if time.monotonic() < self._retry_at[partition]:
            return
        buffer = self._buffers[partition]
        aged = buffer.tables and time.monotonic() - buffer.first_at >= self._linger_s()
        try:
            if aged or self._pending[partition] is not None:
                with self._append_turn():
                    self._flush_partition(partition)
            else:
                self._renew(partition)
            self._failures[partition] = 0
        except Exception as exc:  # kept pending; retried after a backoff (0.1 s doubling to 5 s)
            self._failures[partition] += 1
            delay = min(0.1 * 2 ** (self._failures[partition] - 1), 5.0)
            self._retry_at[partition] = time.monotonic() + delay
            log.warning("flush of %s/%d failed, retrying in %.1f s: %s", self.topic, partition, delay, exc)

    @contextlib.contextmanager
    def _append_turn(self) -> Iterator[None]:
        """Wait for a background append's turn and hold it for the block: up to the store's
        ``parallel_appends`` side by side, but one at a time while requests are on their way (:meth:`incoming`)
        to a producer with ``flush_when_idle`` on a store whose appends hold the GIL (``appends_hold_the_gil``):
        appends beside the threads decoding those requests only take turns at the GIL."""
        with self._append_turns:
            while self._appending >= self._appends_now():
                self._append_turns.wait()
            self._appending += 1
        try:
            yield
        finally:
            with self._append_turns:
                self._appending -= 1
                self._append_turns.notify_all()

    def _appends_now(self) -> int:
        """How many background appends may run side by side now (:meth:`_append_turn`)."""
        busy = self.flush_when_idle and self._incoming and self.log.store.appends_hold_the_gil
        return 1 if busy else self._flush_threads

    def _renew(self, partition: int) -> None:
        # Skip if a flush holds the lock: an append renews the lease itself when due.
        if self._writers[partition] is None or not self._flush_locks[partition].acquire(blocking=False):
            return
        try:
            self._writers[partition].renew_if_due()
        except FencedError as exc:
            log.warning("%s; will take it again at the next flush", exc)
            self._writers[partition] = None
        finally:
            self._flush_locks[partition].release()


def _resolved(result: AppendResult) -> Future:
    future: Future = Future()
    future.set_result(result)
    return future
