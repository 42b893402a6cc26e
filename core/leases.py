"""Leases: one writer at a time for a log partition or a table's maintenance, with a fencing epoch.

A lease is one small object (keys from :mod:`metrics_lake.core.keys`)::

    {"owner": "<writer id>", "epoch": 7, "expires_at_ms": 1732190000000,
     "renewed_at_ms": 1732189990000}

- ``log/<topic>/<partition>/lease.json``: the partition's single writer
  (:func:`acquire_lease`, held by :class:`metrics_lake.core.log.log.PartitionWriter`);
- ``tables/_leases/<table>.json``: the table's maintenance lease
  (:func:`maintenance_lease`), held by compaction and day rewrites.

Every change is a compare-and-swap on the object's version
(:meth:`metrics_lake.core.storage.LocalStore.replace_if`; on S3 a PUT with ``If-Match`` or
``If-None-Match: *``), so two writers can never both believe they took the
same lease. Taking over a lease (first acquisition, or one that expired or
was released) increments ``epoch``; renewing keeps it.

Expiry is judged on the writer's wall clock, so hosts whose clocks disagree
by more than a fraction of the TTL may hand a partition over early or late.
Safety does not depend on clocks: the writer writes its epoch into the
partition index with a compare-and-swap when it takes the lease
(:class:`metrics_lake.core.log.log.PartitionWriter`), and a writer whose epoch is below
the index's can no longer commit an append (fencing tokens, as in
Kleppmann, *Designing Data-Intensive Applications*, ch. 8, "Fencing tokens").
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from metrics_lake.core import keys
from metrics_lake.core.storage import Store, VersionConflictError
from metrics_lake.lake_schemas.errors import FencedError, LeaseHeldError

__all__ = [
    "MAINTENANCE_LEASE_TTL_MS",
    "Lease",
    "acquire_lease",
    "acquire_lease_at",
    "maintenance_lease",
    "read_lease",
    "read_lease_at",
    "release_lease",
    "renew_lease",
    "try_acquire_lease",
    "try_acquire_lease_at",
]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Lease:
    """A lease as read or written; ``version`` is the object version it was read or written at.

    ``key`` is the lease object's key and ``name`` what it guards (for
    messages); ``topic``/``partition`` are set for a log partition's lease.
    Times are epoch milliseconds (UTC wall clock of the writer).
    """

    key: str
    name: str
    owner: str
    epoch: int
    expires_at_ms: int
    version: str
    topic: str | None = None
    partition: int | None = None

    def remaining_ms(self, now_ms: int | None = None) -> int:
        """Milliseconds until expiry (negative once expired)."""
        return self.expires_at_ms - (_now_ms() if now_ms is None else now_ms)

    def describe(self) -> str:
        """``owner (epoch N), expires in X s`` for error messages and ``lake consumers``."""
        return f"{self.owner} (epoch {self.epoch}), expires in {self.remaining_ms() / 1000:.1f} s"


def read_lease_at(store: Store, key: str, name: str, **where) -> Lease | None:
    """The lease stored at ``key``, or ``None`` if there never was one."""
    try:
        data, version = store.read_versioned(key)
    except FileNotFoundError:
        return None
    doc = json.loads(data)
    return Lease(key, name, doc["owner"], int(doc["epoch"]), int(doc["expires_at_ms"]), version, **where)


def read_lease(store: Store, topic: str, partition: int) -> Lease | None:
    """The partition's current lease, or ``None`` if it never had one."""
    return read_lease_at(
        store, keys.lease_key(topic, partition), f"{topic}/{partition}", topic=topic, partition=partition
    )


def _write(store: Store, base: Lease, owner: str, epoch: int, ttl_ms: int, version: str | None) -> Lease:
    now = _now_ms()
    expires = now + ttl_ms if ttl_ms > 0 else 0
    # renewed_at_ms changes on every write, so the content version (MD5) never repeats.
    doc = {"owner": owner, "epoch": epoch, "expires_at_ms": expires, "renewed_at_ms": now}
    new_version = store.replace_if(base.key, json.dumps(doc).encode(), version)
    return Lease(base.key, base.name, owner, epoch, expires, new_version, base.topic, base.partition)


def try_acquire_lease_at(store: Store, key: str, name: str, owner: str, ttl_ms: int, **where) -> Lease | None:
    """Take the lease at ``key`` for ``owner`` for ``ttl_ms`` if it is free; ``None`` if another holds it.

    Free means: never leased, expired, released, or already ``owner``'s.
    Taking a lease from anyone (including an expired one of ``owner``'s
    own) bumps the epoch, which fences every earlier holder.
    """
    template = Lease(key, name, owner, 0, 0, "", **where)
    while True:
        current = read_lease_at(store, key, name, **where)
        if current is not None and current.owner != owner and current.remaining_ms() > 0:
            return None
        epoch = 1 if current is None else current.epoch + 1
        try:
            return _write(store, template, owner, epoch, ttl_ms, None if current is None else current.version)
        except VersionConflictError:
            continue  # someone else wrote the lease in between: look again


def try_acquire_lease(store: Store, topic: str, partition: int, owner: str, ttl_ms: int) -> Lease | None:
    """:func:`try_acquire_lease_at` for one log partition's lease."""
    return try_acquire_lease_at(
        store, keys.lease_key(topic, partition), f"{topic}/{partition}", owner, ttl_ms, topic=topic, partition=partition
    )


def acquire_lease_at(
    store: Store, key: str, name: str, owner: str, *, ttl_ms: int, wait_s: float = 0.0, hint: str = "", **where
) -> Lease:
    """Like :func:`try_acquire_lease_at`, but wait up to ``wait_s`` seconds for the holder to release or expire.

    Raises :class:`LeaseHeldError` naming the holder (and ``hint``) when the wait runs out.
    """
    deadline = time.monotonic() + wait_s
    while True:
        lease = try_acquire_lease_at(store, key, name, owner, ttl_ms, **where)
        if lease is not None:
            return lease
        if time.monotonic() >= deadline:
            holder = read_lease_at(store, key, name, **where)
            raise LeaseHeldError(
                f"{name} is leased to {holder.describe() if holder else 'another writer'}; waited {wait_s:.0f} s. {hint}"
            )
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))


def acquire_lease(store: Store, topic: str, partition: int, owner: str, *, ttl_ms: int, wait_s: float = 0.0) -> Lease:
    """:func:`acquire_lease_at` for one log partition's lease."""
    return acquire_lease_at(
        store,
        keys.lease_key(topic, partition),
        f"{topic}/{partition}",
        owner,
        ttl_ms=ttl_ms,
        wait_s=wait_s,
        hint="Stop the other producer or gateway, or wait for its lease to expire.",
        topic=topic,
        partition=partition,
    )


def renew_lease(store: Store, lease: Lease, ttl_ms: int) -> Lease:
    """Extend ``lease`` by ``ttl_ms`` from now, keeping its epoch.

    Raises :class:`FencedError` if the lease object changed since
    ``lease`` was written (another writer took it over).
    """
    try:
        return _write(store, lease, lease.owner, lease.epoch, ttl_ms, lease.version)
    except VersionConflictError:
        now = read_lease_at(store, lease.key, lease.name, topic=lease.topic, partition=lease.partition)
        raise FencedError(
            f"lease on {lease.name} (epoch {lease.epoch}) was taken over" + (f" by {now.describe()}" if now else "")
        ) from None


def release_lease(store: Store, lease: Lease) -> None:
    """Give ``lease`` up (expire it now) so the next writer need not wait for the TTL.

    Does nothing if the lease was already taken over.
    """
    try:
        _write(store, lease, lease.owner, lease.epoch, 0, lease.version)
    except VersionConflictError:
        pass


#: How long a maintenance lease lasts without renewal (a holder that dies frees the table after this).
MAINTENANCE_LEASE_TTL_MS = 15 * 60 * 1000


@contextlib.contextmanager
def maintenance_lease(
    store: Store, name: str, *, wait_s: float = 900.0, ttl_ms: int = MAINTENANCE_LEASE_TTL_MS
) -> Iterator[Callable[[], None]]:
    """Hold table ``name``'s maintenance lease for the block; yields a function that renews it.

    Compaction and day replacements rewrite a table's files. delta-rs 1.6
    does not fail a commit that removes a file a concurrent OPTIMIZE
    (``dataChange=false``) already removed, which would leave both
    rewrites' files active: duplicated rows (Delta-Spark raises
    ``ConcurrentDeleteDeleteException`` there; verified here with delta-rs
    1.6.6). So those writers take this lease (``tables/_leases/<name>.json``,
    compare-and-swap like the log's partition leases) and never interleave;
    the speed layer instead never rewrites what compaction may touch (see
    :func:`metrics_lake.core.speed.progress.first_open_day`). Waits up to
    ``wait_s`` for another holder, then raises
    :class:`~metrics_lake.lake_schemas.errors.LeaseHeldError`. The lease
    lasts ``ttl_ms`` from each renewal: a holder killed mid-way frees the
    table after it; the renew function raises
    :class:`~metrics_lake.lake_schemas.errors.FencedError` once another
    writer has taken the lease over (commit nothing then).
    """
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    lease = acquire_lease_at(
        store,
        keys.table_lease_key(name),
        f"table {name}",
        owner,
        ttl_ms=ttl_ms,
        wait_s=wait_s,
        hint="Another compaction or day rewrite of this table is running; wait for it or for its lease to expire.",
    )
    held = [lease]

    def renew() -> None:
        held[0] = renew_lease(store, held[0], ttl_ms)

    try:
        yield renew
    finally:
        release_lease(store, held[0])
