"""A kept Delta table whose ``txn`` versions (appId -> version) are read once, then followed commit by commit.

The speed layer records every position it holds as a Delta ``txn`` action
(:func:`metrics_lake.core.tables.commits.offset_transactions`) and reads
them back many times a batch: each table's position per log partition to
plan and again to commit, the watermark, each stored query's revisions,
the alert clocks. delta-rs 1.6 answers ``DeltaTable.transaction_version``
by replaying the table's log from its last checkpoint on every call. A
micro-batch asks 46 times; following the commits instead took 26-48 ms
(16-20 %) off a 10-event batch and 16-44 ms off a 5,000-event one
(``bench/delta_log_length.py``, docs/performance.md "App transactions
followed").

A :class:`FollowedTable` asks delta-rs once per appId, then keeps the
answer current by reading the ``txn`` actions of each commit the table
moves past (Delta versions are consecutive and each commit is an
immutable object, ``_delta_log/<version>.json``). The latest ``txn`` of an
appId in log order is its version (Delta protocol, "Transaction
Identifiers"). When a commit between cannot be read (cleaned up, or the
table moved back) or changes the table's metadata or protocol, it forgets
everything and asks delta-rs again. Tables with
``delta.setTransactionRetentionDuration`` (which expires ``txn`` actions)
are always asked directly; the lake never sets it.
"""

from __future__ import annotations

import json

from deltalake import DeltaTable

from metrics_lake.core import keys
from metrics_lake.core.storage import Store

__all__ = ["TXN_RETENTION", "FollowedTable", "followed"]

#: A table property under which delta-rs expires ``txn`` actions: their versions cannot be followed by commits.
TXN_RETENTION = "delta.setTransactionRetentionDuration"


class FollowedTable(DeltaTable):
    """A ``DeltaTable`` answering :meth:`transaction_version` from what it has followed (module docstring).

    Made by :func:`followed`; every other method is delta-rs's. Not for concurrent use, like the table itself.
    """

    _store: Store
    _name: str
    _known: dict[str, int | None]
    _known_at: int
    _follows: bool

    def transaction_version(self, app_id: str) -> int | None:
        """The latest ``txn`` version of ``app_id`` at this table's version, or None if it has none."""
        if not self._follows:
            return super().transaction_version(app_id)
        version = self.version()
        if version != self._known_at:
            self._follow(version)
        if app_id not in self._known:
            self._known[app_id] = super().transaction_version(app_id)
        return self._known[app_id]

    def _follow(self, version: int) -> None:
        """Bring what is known from :attr:`_known_at` to ``version``: each commit's ``txn`` actions, in order."""
        known = dict(self._known) if version > self._known_at else {}
        for commit in range(self._known_at + 1, version + 1) if known else ():
            try:
                changed = _transactions(self._store.read(keys.table_commit_key(self._name, commit)))
            except FileNotFoundError:  # cleaned up by log retention: ask delta-rs again
                changed = None
            if changed is None:
                known = {}
                break
            known.update(changed)
        self._known, self._known_at = known, version
        if not known:
            self._follows = TXN_RETENTION not in self.metadata().configuration


def _transactions(commit: bytes) -> dict[str, int] | None:
    """The ``txn`` versions a commit sets, by appId; None if it also changes the table's metadata or protocol
    (a property such as :data:`TXN_RETENTION` may have changed: what was followed is forgotten)."""
    found = {}
    for line in commit.splitlines():  # one action per line; only lines that may hold one of these are parsed
        if b'"txn"' in line or b'"metaData"' in line or b'"protocol"' in line:
            action = json.loads(line)
            if "metaData" in action or "protocol" in action:
                return None
            if "txn" in action:
                found[action["txn"]["appId"]] = int(action["txn"]["version"])
    return found


def followed(store: Store, name: str, table: DeltaTable) -> FollowedTable:
    """``table`` (table ``name`` of ``store``, as delta-rs opened it) as a :class:`FollowedTable`; no I/O but the
    table's metadata, already loaded."""
    kept = FollowedTable.__new__(FollowedTable)
    kept.__dict__.update(table.__dict__)  # delta-rs's state: the RawDeltaTable and the storage options
    kept._store, kept._name = store, name
    kept._known, kept._known_at = {}, table.version()
    kept._follows = TXN_RETENTION not in table.metadata().configuration
    return kept
