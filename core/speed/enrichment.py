"""Enrichment: each event joined with the server inventory in force at its log position (a temporal join).

The inventory (:mod:`metrics_lake.core.inventory`) is another topic, so "in
force at the event's position" needs a decision that every later reader —
a retried batch, a table catching up after a crash, a batch after a lost
checkpoint, ``lake replay`` — finds again instead of remaking. That decision
is a *pin*: "from offset ``starts[p]`` of each partition ``p`` on, events
are joined with the inventory's first ``inventory_end`` records". A batch
that finds the inventory grown since the newest pin creates a pin for the
new end, starting where no table of the speed layer has read yet (the
highest of their positions), with a create-if-absent write: the first
writer's pin stands, so one record is never joined two ways. An event then
gets the labels of the newest pin starting at or before its offset; before
the first pin, none. Pins are immutable objects beside the consumer group's
offsets (:func:`metrics_lake.core.keys.inventory_pin_key`); there is one per
inventory change a batch saw, so they stay few.

This is Flink's and Kafka Streams' stream-table join, made repeatable the
way Kafka Streams makes state repeatable: by logging the decision. The
inventory's compaction keeps every version an event still in the log may be
pinned to (its minimum compaction lag is the log's retention).

The labels are looked up in a local copy of the inventory's changelog, kept
per process and read incrementally (``InventoryCache``): a Spark worker
reads the topic once and then only its new records.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metrics_lake.core import keys
from metrics_lake.core.inventory import Inventory, fold
from metrics_lake.core.log.consumer import KEYED_ROW
from metrics_lake.core.storage import ObjectExistsError, Store
from metrics_lake.lake_schemas.types import TAGS

__all__ = ["InventoryCache", "Pin", "expected_servers", "labels_at", "pin_inventory", "read_pins"]


@dataclass(frozen=True)
class Pin:
    """Events at or after ``starts[partition]`` are joined with the inventory's records below ``inventory_end``."""

    inventory_end: int
    starts: dict[int, int]


def read_pins(store: Store, group: str, topic: str) -> tuple[Pin, ...]:
    """The pins of consumer group ``group`` on ``topic``, oldest first."""
    pins = []
    prefix = keys.inventory_pins_prefix(group, topic)
    for name in store.list(prefix):
        if name.endswith(".json"):
            doc = json.loads(store.read(f"{prefix}/{name}"))
            pins.append(Pin(int(doc["inventory_end"]), {int(p): int(o) for p, o in doc["starts"].items()}))
    return tuple(sorted(pins, key=lambda pin: pin.inventory_end))


def pin_inventory(store: Store, group: str, topic: str, unread: dict[int, int], inventory_end: int) -> tuple[Pin, ...]:
    """The pins to join with, after pinning ``inventory_end`` from ``unread`` (per partition, the first offset no
    table has read) if the inventory grew past the newest pin."""
    pins = read_pins(store, group, topic)
    newest = pins[-1].inventory_end if pins else 0
    if inventory_end <= newest:
        return pins
    doc = {
        "inventory_end": inventory_end,
        "starts": {str(p): o for p, o in unread.items()},
        "at": int(time.time() * 1000),
    }
    try:
        store.create(keys.inventory_pin_key(group, topic, inventory_end), json.dumps(doc).encode())
    except ObjectExistsError:
        pass  # an earlier attempt of this batch pinned it
    return read_pins(store, group, topic)


class InventoryCache:
    """A process-local copy of the inventory's changelog, grown incrementally, and its folds by end offset.

    It keeps every record it has read even after the topic's compaction removed
    them: a superset of the history, which gives the same fold at any offset.
    """

    _by_root: dict[str, InventoryCache] = {}

    def __init__(self, store: Store) -> None:
        self.inventory = Inventory(store)
        self.records = KEYED_ROW.empty_table()
        self.end = 0
        self.folds: dict[int, tuple[pa.Table, pa.Array, pa.Array]] = {}

    @classmethod
    def of(cls, store: Store) -> InventoryCache:
        """The cache of ``store``'s lake in this process."""
        cache = cls._by_root.get(store.root)
        if cache is None:
            cache = cls._by_root[store.root] = cls(store)
        return cache

    def folded(self, end: int) -> pa.Table:
        """The inventory as of its records below ``end`` (:func:`metrics_lake.core.inventory.fold`)."""
        return self._fold(end)[0]

    def labelled(self, end: int) -> tuple[pa.Array, pa.Array]:
        """(servers sorted, their labels followed by one empty label set) as of the inventory's records below
        ``end``."""
        return self._fold(end)[1:]

    def _fold(self, end: int) -> tuple[pa.Table, pa.Array, pa.Array]:
        if end not in self.folds:
            if end > self.end:  # the records below a pin's end were committed before the pin was made
                new = self.inventory.records(self.end)
                self.records = pa.concat_tables([self.records, new]).combine_chunks()
                newest = pc.max(new.column("offset")).as_py() if new.num_rows else None
                self.end = max(end, -1 if newest is None else newest + 1)
            table = fold(self.records, end)
            if len(self.folds) >= 8:  # a batch needs one or two; keep a few for chunks of older pins
                self.folds.pop(next(iter(self.folds)))
            # One empty label set after the servers' own: where unknown servers point.
            labels = pa.concat_arrays([table.column("labels").combine_chunks(), pa.array([[]], TAGS)])
            self.folds[end] = (table, table.column("server").combine_chunks(), labels)
        return self.folds[end]


def labels_at(
    store: Store, pins: tuple[Pin, ...], partition: int, offsets: np.ndarray, servers
) -> tuple[pa.Array, np.ndarray]:
    """Each event's inventory labels (``labels`` map array; empty for a server the inventory does not hold) and
    whether the inventory holds its server (bool array).

    ``offsets`` (int64) and ``servers`` (string array) are the events' log
    offsets in ``partition`` and their servers; events before the first pin
    get empty labels and count as known (there was no inventory to know them).
    """
    n = len(offsets)
    known = np.ones(n, bool)
    if not pins or n == 0:
        return _empty(n), known
    starts = np.array([pin.starts.get(partition, 0) for pin in pins], np.int64)
    which = np.searchsorted(starts, offsets, side="right") - 1  # the newest pin starting at or before each offset
    pieces, order = [], []
    in_use = np.flatnonzero(np.bincount(which + 1)) - 1  # the pins used, ascending (-1: none): a count, not a sort
    for k in in_use:
        rows = np.flatnonzero(which == k)
        if k < 0:
            pieces.append(_empty(len(rows)))
        else:
            names, values = InventoryCache.of(store).labelled(pins[k].inventory_end)
            chosen = servers if len(rows) == n else pc.take(servers, pa.array(rows))
            index = pc.index_in(chosen, value_set=names)
            if index.null_count:
                known[rows] = np.asarray(index.is_valid())
            taken = values.take(pc.fill_null(index, len(names)))
            pieces.append(taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken)
        order.append(rows)
    if len(pieces) == 1:
        return pieces[0], known
    labels = pa.concat_arrays(pieces)
    return labels.take(pa.array(np.argsort(np.concatenate(order), kind="stable"))), known


def _empty(n: int) -> pa.Array:
    """``n`` empty label sets."""
    return pa.array([[]], TAGS).take(pa.array(np.zeros(n, np.int64)))


def expected_servers(store: Store) -> pa.Table | None:
    """The servers the inventory holds now, expected to report: ``server`` (string) and ``since`` (timestamp µs
    UTC, when its record was appended); None if the lake has no inventory."""
    end = Inventory(store).end_offset()
    if end == 0:
        return None
    table = InventoryCache.of(store).folded(end)
    return pa.table(
        {"server": table.column("server"), "since": table.column("ingested_at").cast(pa.timestamp("us", "UTC"))}
    )
