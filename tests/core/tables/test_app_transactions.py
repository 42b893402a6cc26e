"""A kept table's ``txn`` versions, followed commit by commit, equal delta-rs's own answer after any sequence of
commits: its own, another writer's, metadata changes, and commits cleaned up before it could read them."""

from __future__ import annotations

import random

import pytest
from deltalake import Transaction

from metrics_lake.core.tables.app_transactions import TXN_RETENTION, FollowedTable
from metrics_lake.core.tables.commits import commit_changes
from metrics_lake.core.tables.delta import LOG_RETENTION, LatestTables, open_table
from metrics_lake.lake_schemas.tables import Table

BRONZE = Table.BRONZE_EVENTS
APPS = [f"speed-layer/events/{p}" for p in range(4)]


def _commit(table, rng: random.Random) -> None:
    """One commit without files on ``table`` setting up to two apps' txn versions."""
    transactions = [Transaction(app, rng.randint(0, 1000)) for app in rng.sample(APPS, rng.randint(0, 2))]
    commit_changes(table, BRONZE, [], [], transactions=transactions, operation="TEST")


@pytest.mark.parametrize("seed", range(4))
def test_followed_versions_equal_delta_rs_after_any_sequence_of_commits(store, seed) -> None:
    rng = random.Random(seed)
    tables = LatestTables()
    kept = tables.latest(store, BRONZE)
    assert isinstance(kept, FollowedTable)
    followed_commits = cleaned = 0
    for _ in range(60):
        step = rng.choice(["own", "other", "other", "other", "properties", "clean up"])
        if step == "own":
            _commit(kept, rng)
        elif step == "other":
            _commit(open_table(store, BRONZE), rng)
        elif step == "properties":  # a metaData action: what was followed is forgotten
            value = rng.choice(["interval 1 hours", "interval 0 seconds"])
            open_table(store, BRONZE).alter.set_table_properties({LOG_RETENTION: value})
        else:  # other writers commit, then a checkpoint and the log cleaned up to it: the kept table skipped them
            for _ in range(rng.randint(1, 3)):
                _commit(open_table(store, BRONZE), rng)
            writer = open_table(store, BRONZE)
            writer.alter.set_table_properties({LOG_RETENTION: "interval 0 seconds"})
            writer = open_table(store, BRONZE)
            writer.create_checkpoint()
            writer.cleanup_metadata()
            cleaned += 1
        kept = tables.latest(store, BRONZE)
        fresh = open_table(store, BRONZE)
        assert kept.version() == fresh.version()
        asked = rng.sample(APPS, rng.randint(1, len(APPS)))
        assert [kept.transaction_version(a) for a in asked] == [fresh.transaction_version(a) for a in asked]
        followed_commits += bool(kept._known)
    assert cleaned and followed_commits > 30  # the paths were taken: followed most of the time, and reset


def test_a_table_moved_back_or_expiring_transactions_asks_delta_rs(store) -> None:
    rng = random.Random(7)
    kept = LatestTables().latest(store, BRONZE)
    for _ in range(3):
        _commit(open_table(store, BRONZE), rng)
        kept.update_incremental()
        assert [kept.transaction_version(a) for a in APPS] == [
            open_table(store, BRONZE).transaction_version(a) for a in APPS
        ]
    kept.load_as_version(1)
    assert [kept.transaction_version(a) for a in APPS] == [
        open_table(store, BRONZE, version=1).transaction_version(a) for a in APPS
    ]
    open_table(store, BRONZE).alter.set_table_properties({TXN_RETENTION: "interval 30 days"})
    kept.update_incremental()
    assert kept.transaction_version(APPS[0]) == open_table(store, BRONZE).transaction_version(APPS[0])
    assert not kept._follows  # txn actions may expire: every answer is delta-rs's
