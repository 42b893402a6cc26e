"""Log compaction of the keyed inventory topic: newest record per key, tombstones, offsets preserved."""

from __future__ import annotations

import random

import pytest

from metrics_lake.core.inventory import INVENTORY_TOPIC, Change, Inventory, fold
from metrics_lake.core.log.keyed_compaction import compact_keyed_partition

DAY_MS = 86_400_000


def history(inventory: Inventory, seed: int, appends: int = 12) -> dict[str, dict[str, str]]:
    """Random upserts and tombstones over 30 keys in ``appends`` segments; returns the final state as a dict."""
    rng = random.Random(seed)
    state: dict[str, dict[str, str]] = {}
    for _ in range(appends):
        changes = {}
        for server in rng.sample([f"srv-{i:02d}" for i in range(30)], rng.randint(1, 8)):
            if server in state and rng.random() < 0.3:
                changes[server] = Change(server, {}, deleted=True)
            else:
                changes[server] = Change(server, {"dc": rng.choice("abc"), "v": str(rng.randint(0, 99))})
        inventory.append(list(changes.values()))
        for change in changes.values():
            if change.deleted:
                state.pop(change.server, None)
            else:
                state[change.server] = change.labels
    return state


def as_dict(table) -> dict[str, dict[str, str]]:
    return {row["server"]: dict(row["labels"]) for row in table.to_pylist()}


@pytest.mark.parametrize("seed", range(8))
def test_a_consumer_from_offset_0_rebuilds_the_table_after_compaction(store, seed):
    inventory = Inventory(store)
    state = history(inventory, seed)
    before = inventory.records()
    index = inventory.log.index(INVENTORY_TOPIC, 0)
    start, end = index.start_offset, index.next_offset

    result = compact_keyed_partition(
        inventory.log, INVENTORY_TOPIC, 0, min_lag_ms=0, tombstone_retention_ms=0, delete_delay_ms=0
    )

    after = inventory.records()
    index = inventory.log.index(INVENTORY_TOPIC, 0)
    assert (index.start_offset, index.next_offset) == (start, end)  # offsets preserved, the log end unchanged
    assert result.segments_after == 1 and result.runs == 1
    assert as_dict(fold(after)) == state == inventory.current()
    assert after.num_rows == len(state)  # one record per live key, tombstones gone (retention 0)
    original = {row["offset"]: row for row in before.to_pylist()}
    for row in after.to_pylist():  # every kept record is the original record at its offset, append time included
        assert row == original[row["offset"]]
    appended = inventory.append([Change("srv-new", {"dc": "z"})])
    assert appended.base_offset == end  # appends continue at the log end
    assert as_dict(fold(inventory.records())) == {**state, "srv-new": {"dc": "z"}}


def test_tombstones_and_superseded_versions_wait_for_their_retention_and_lag(store):
    inventory = Inventory(store)
    inventory.append([Change("a", {"v": "1"}), Change("b", {"v": "1"})])
    inventory.append([Change("a", {"v": "2"}), Change("b", {}, deleted=True)])
    log = inventory.log
    compact_keyed_partition(log, INVENTORY_TOPIC, 0, min_lag_ms=DAY_MS, tombstone_retention_ms=0, delete_delay_ms=0)
    assert inventory.records().num_rows == 4  # every version is younger than the lag: all are kept
    compact_keyed_partition(log, INVENTORY_TOPIC, 0, min_lag_ms=0, tombstone_retention_ms=DAY_MS, delete_delay_ms=0)
    kept = inventory.records().to_pylist()
    assert [(r["offset"], r["server"], r["deleted"]) for r in kept] == [(2, "a", False), (3, "b", True)]
    assert fold(inventory.records(), before=2).num_rows == 0  # as-of reads before the superseding records lost them
    compact_keyed_partition(log, INVENTORY_TOPIC, 0, min_lag_ms=0, tombstone_retention_ms=0, delete_delay_ms=0)
    assert [r["offset"] for r in inventory.records().to_pylist()] == [2]
    assert inventory.current() == {"a": {"v": "2"}}
    assert inventory.end_offset() == 4


def test_lake_compact_runs_keyed_compaction_and_retention_leaves_the_inventory_alone(store, settings):
    import datetime as dt

    from metrics_lake.core.log.segment_compaction import compact_log
    from metrics_lake.core.maintenance.retention import apply_retention

    inventory = Inventory(store)
    inventory.append([Change("a", {"v": "1"})])
    inventory.append([Change("a", {"v": "2"})])
    results = compact_log(
        inventory.log, target_bytes=1 << 20, delete_delay_ms=0, min_lag_ms=0, tombstone_retention_ms=0
    )
    assert [(r.topic, r.segments_before, r.segments_after) for r in results] == [(INVENTORY_TOPIC, 2, 1)]
    apply_retention(settings, store, dt.datetime.now(dt.UTC) + dt.timedelta(days=365))
    assert inventory.current() == {"a": {"v": "2"}}  # a keyed topic is never deleted by age
