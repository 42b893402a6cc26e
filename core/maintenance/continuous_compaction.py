"""Continuous compaction of the speed layer's tables: small files merged beside the micro-batches, by size tier.

A stream at one batch a second adds files to every table it writes, each
batch: a bronze file per partition, a sealed windows and query-results file
per day, an ``alerts`` file when a rule changes state. Left alone they pile up
(about 260,000 bronze files a day), and every reader lists and plans them.
The stream therefore merges them as it runs (:func:`compact_speed_tables`,
a round every ``LAKE_COMPACTION_INTERVAL_SECONDS`` on a thread of its own,
beside the batches: a merge of a size tier of 64 MiB files takes seconds, and
run between batches it stalled the stream that long):

- Per table and day partition of its newest two days (older days are left to
  the nightly ``lake compact``), the files a compaction may touch are sorted
  into *size tiers* of factor ``F = LAKE_COMPACTION_MIN_FILES``: tier 0 below
  ``target / F²``, tier 1 below ``target / F``, tier 2 below ``target``
  (``LAKE_COMPACTION_TARGET_BYTES``); files at or above the target are done.
  A tier holding ``F`` files or more is merged into one new file (a size
  tiered policy as in Cassandra's STCS and Mimir's compactor levels): each
  byte is rewritten at most three times, and a partition keeps fewer than
  ``3·F`` small files plus its full-size ones, however many batches wrote it.
- Windowed tables (``metric_windows_1m``, ``query_results``): only files whose
  windows all ended by the watermark (statistics ``max.window_end``), the
  ones the speed layer never rewrites again. Open-window files are the
  stream's own to rewrite.
- ``last_seen`` is rewritten whole by every batch (one active file): nothing
  to merge; its removed files go with VACUUM.

Why a round merges beside the batches but commits between them: delta-rs
1.6 does not fail a commit that removes a file a concurrent
``dataChange=false`` commit removed (see
:func:`metrics_lake.core.leases.maintenance_lease`), so a round committing
while a batch that rewrites the same file plans would leave both rewrites'
rows; and it fails a round's commit after any concurrent commit that
removed a file of the table ("a concurrent transaction deleted data this
operation read": a commit without a read predicate counts as reading the
whole table), which nearly every batch does to ``metric_windows_1m`` and
``query_results``, so a merge that takes seconds would hardly ever commit.
A round therefore writes its merged files beside the batches, where its time
goes, and commits in the stream's *commit slot* (``commit_slot``: a batch
neither plans nor commits meanwhile; ``lake stream``'s batch gate) on the
table's latest snapshot, once it has checked that every file it removes is
still active there. Should the stream have rewritten one meanwhile (it never
rewrites a closed window's file, but a stored query adopted from where its
backfill stopped may: :mod:`metrics_lake.core.speed.table_commits.query_results`),
the round plans again.

Each merge is one Delta commit with ``dataChange=false`` (rows and their
positions unchanged; time travel keeps working until VACUUM). It holds the
table's maintenance lease for :data:`LEASE_TTL_MS` (renewed before each
group is written and before the commit, so a stream killed mid-merge frees
the table within that time, where the nightly's leases last 15 minutes),
tried without waiting: while the nightly
recompute, a backfill, retention or ``lake compact`` holds it, the table is left for the
next round (those writers and this one never interleave: delta-rs 1.6 does
not fail a commit that removes a file a concurrent rewrite removed,
:func:`metrics_lake.core.leases.maintenance_lease`). A commit that loses a
race to another commit re-plans on the new snapshot. Killed at any moment,
a merge leaves the table as it was (the commit is atomic; files written but
not committed are invisible and removed by VACUUM), and the next round
finds the same small files.

Every ``LAKE_VACUUM_INTERVAL_SECONDS`` the same step vacuums the speed
tables (files unreferenced for ``LAKE_VACUUM_RETENTION_HOURS``). Delta
checkpoints are written every ``delta.checkpointInterval`` commits. Every
round also cleans the Delta log of each table the stream writes every batch
(:func:`clean_delta_log`): their ``delta.logRetentionDuration`` is
``LAKE_DELTA_LOG_RETENTION_HOURS`` (set when the stream prepares the lake,
:func:`log_retention_properties`), and entries older than that (up to a
checkpoint) are deleted. A stream commits to each of them every batch, and
every open or refresh of a table on a local lake lists all the entries its
log holds: left to Delta's default 30 days (2.6 M entries a table at one
batch a second), each batch would cost more than the one before.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, remove_action, retry_on_conflict
from metrics_lake.core.tables.delta import LOG_RETENTION, TOMBSTONE_RETENTION, LatestTables
from metrics_lake.core.tables.file_merge import merge_data_files
from metrics_lake.core.tables.snapshots import DataFile, snapshot_files
from metrics_lake.lake_schemas.errors import LeaseHeldError
from metrics_lake.lake_schemas.tables import TABLES, Table

__all__ = [
    "COMPACTED_TABLES",
    "LEASE_TTL_MS",
    "CommitSlot",
    "CompactionPolicy",
    "CompactionRound",
    "clean_delta_log",
    "compact_speed_tables",
    "log_retention_properties",
    "merge_groups",
    "size_tier",
]

log = logging.getLogger(__name__)

#: The speed layer's tables whose small files are merged, and whether only their closed windows may be.
COMPACTED_TABLES = {
    Table.BRONZE_EVENTS: False,
    Table.QUARANTINE_EVENTS: False,
    Table.METRIC_WINDOWS_1M: True,
    Table.QUERY_RESULTS: True,
    Table.ALERTS: False,
}
#: The tables vacuumed by the same step (``last_seen`` sheds a file per batch).
VACUUMED_TABLES = (*COMPACTED_TABLES, Table.LAST_SEEN)
_TIERS = 3
#: Days merged: the table's newest day and the one before. Older days are left to `lake compact` (nightly).
RECENT_DAYS = 2
#: The maintenance lease's lifetime between renewals (ms): a merge group (at most ``min_files`` files below the
#: target size) is written well within it.
LEASE_TTL_MS = 30_000


@dataclass(frozen=True)
class CompactionPolicy:
    """When files are merged (module docstring): ``target_bytes`` (bytes) and the tier factor ``min_files``;
    ``vacuum_hours``: how long unreferenced files are kept (0: this step never vacuums)."""

    target_bytes: int = 64 * 1024 * 1024
    min_files: int = 8
    vacuum_hours: int = 168


@dataclass
class CompactionRound:
    """One round over the speed tables: per table, files merged away and files written; tables skipped because
    another maintenance held them; files vacuumed; seconds."""

    merged: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    vacuumed: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


#: Runs a round's commit where no batch of the stream plans or commits meanwhile (module docstring), unless the
#: stream is stopping; returns whether it ran it.
CommitSlot = Callable[[Callable[[], None]], bool]


def _at_once(commit: Callable[[], None]) -> bool:
    """The commit slot of a caller that runs a round between its batches: now."""
    commit()
    return True


def size_tier(size_bytes: int, policy: CompactionPolicy) -> int | None:
    """A file's size tier (module docstring): 0, 1 or 2; None at or above the target (never merged again)."""
    if size_bytes >= policy.target_bytes:
        return None
    for tier in range(_TIERS - 1, 0, -1):
        if size_bytes >= policy.target_bytes // policy.min_files ** (_TIERS - tier):
            return tier
    return 0


def merge_groups(
    table: DeltaTable,
    files: list[DataFile],
    policy: CompactionPolicy,
    *,
    sealed_before_us: int | None,
    day_column: str | None = None,
    since_day: str | None = None,
) -> list[list[DataFile]]:
    """The groups of ``files`` (``table``'s active files) to merge, each into one file: per partition and size
    tier, every tier holding ``policy.min_files`` files or more (module docstring).

    ``sealed_before_us``: for windowed tables, only files whose windows all
    end at or before it (epoch µs) are candidates; None: every file.
    ``day_column``/``since_day``: only partitions of that day (ISO date) or
    later; the older days are the nightly ``lake compact``'s.
    """
    closed = None
    if sealed_before_us is not None:
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows == 0 or "max.window_end" not in actions.column_names:
            return []
        paths = actions.column("path").to_pylist()
        ends = pc.cast(actions.column("max.window_end"), pa.int64()).to_pylist()
        closed = {p for p, end in zip(paths, ends, strict=True) if end is not None and end <= sealed_before_us}
    tiers: dict[tuple, list[DataFile]] = {}
    for data_file in files:
        if closed is not None and data_file.relative not in closed:
            continue
        day = dict(data_file.partition_values).get(day_column) if day_column else None
        if since_day is not None and day is not None and day < since_day:
            continue
        tier = size_tier(data_file.size, policy)
        if tier is None:
            continue
        key = (tuple(sorted(dict(data_file.partition_values).items())), tier)
        tiers.setdefault(key, []).append(data_file)
    return [
        group for _, group in sorted(tiers.items(), key=lambda item: str(item[0])) if len(group) >= policy.min_files
    ]


def _due(store: Store, tables: LatestTables, name: str, policy: CompactionPolicy, sealed_before_us: int | None):
    """The merge groups of ``name``'s latest snapshot, and that snapshot."""
    table = tables.latest(store, name)
    files = snapshot_files(store, name, table)
    day_column = TABLES[name].day_column
    days = [d for f in files if (d := dict(f.partition_values).get(day_column)) is not None] if day_column else []
    since = (dt.date.fromisoformat(max(days)) - dt.timedelta(days=RECENT_DAYS - 1)).isoformat() if days else None
    groups = merge_groups(
        table,
        files,
        policy,
        sealed_before_us=sealed_before_us,
        day_column=day_column,
        since_day=since,
    )
    return groups, table


def _merge(
    store: Store,
    tables: LatestTables,
    name: str,
    policy: CompactionPolicy,
    sealed_before_us: int | None,
    renew: Callable[[], None],
    commit_slot: CommitSlot,
) -> tuple[int, int]:
    """Merge every due group of ``name`` and commit them in one version in ``commit_slot``; returns (files merged
    away, files written), (0, 0) if the slot did not run the commit (the stream is stopping).

    ``renew`` renews the maintenance lease before each group and before the commit (raising ``FencedError``, and
    committing nothing, if another writer took it over). A file it would remove that is no longer active at the
    commit is a lost race like any other (``CommitFailedError``): planned again by :func:`retry_on_conflict`."""

    def attempt() -> tuple[int, int]:
        groups, _ = _due(store, tables, name, policy, sealed_before_us)
        if not groups:
            return 0, 0
        adds, removes = [], []
        for group in groups:
            renew()
            adds.append(merge_data_files(store, name, group))  # a row group at a time: bounded memory
            removes += [remove_action(f, data_change=False) for f in group]
        merged = {f.relative for group in groups for f in group}

        def commit() -> None:
            renew()
            latest = tables.latest(store, name)
            if not merged <= {f.relative for f in snapshot_files(store, name, latest)}:
                # A batch rewrote one of them meanwhile (its rows are in that batch's file now): the conflict
                # delta-rs does not detect for a dataChange=false remove (module docstring).
                log.info("%s continuous compaction: a batch rewrote a file it merged; planning again", name)
                raise CommitFailedError(f"{name}: a batch rewrote a file this compaction merged")
            commit_changes(
                latest, name, adds, removes, transactions=[], operation="CONTINUOUS COMPACTION", data_change=False
            )

        if not commit_slot(commit):
            return 0, 0  # the stream is stopping: nothing committed (VACUUM removes the merged files)
        return len(removes), len(adds)

    return retry_on_conflict(attempt, f"{name} continuous compaction")


def compact_speed_tables(
    store: Store,
    policy: CompactionPolicy,
    *,
    sealed_before_us: int | None,
    vacuum: bool = False,
    tables: LatestTables | None = None,
    commit_slot: CommitSlot | None = None,
    stop: threading.Event | None = None,
) -> CompactionRound:
    """One round of continuous compaction over the speed tables (module docstring); with ``vacuum``, VACUUM them too.

    ``sealed_before_us``: the watermark (epoch µs), below which windows are
    closed; None: no window is closed yet (windowed tables are left alone).
    Tables whose maintenance lease another writer holds are skipped
    (:attr:`CompactionRound.skipped`). ``commit_slot`` runs each commit
    where no batch plans or commits (module docstring); None: at once (the
    caller runs between batches). Once ``stop`` is set the round ends before
    its next table (a merge under way finishes first). Raises what the store
    or a commit raises after its retries (``CommitFailedError``).
    """
    started = time.monotonic()
    tables = tables or LatestTables()
    outcome = CompactionRound()

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    for name, windowed in COMPACTED_TABLES.items():
        if stopped():
            break
        if windowed and sealed_before_us is None:
            continue
        sealed = sealed_before_us if windowed else None
        if not _due(store, tables, name, policy, sealed)[0]:
            continue  # nothing to merge: no lease taken (a store write) for nothing
        try:
            with maintenance_lease(store, name, wait_s=0, ttl_ms=LEASE_TTL_MS) as renew:  # planned again under it
                merged, written = _merge(store, tables, name, policy, sealed, renew, commit_slot or _at_once)
        except LeaseHeldError:
            outcome.skipped.append(name)
            continue
        if merged:
            outcome.merged[name], outcome.written[name] = merged, written
    for name in VACUUMED_TABLES:
        clean_delta_log(tables.latest(store, name))
    if vacuum and policy.vacuum_hours and not stopped():
        for name in VACUUMED_TABLES:
            try:
                with maintenance_lease(store, name, wait_s=0, ttl_ms=LEASE_TTL_MS):
                    table = tables.latest(store, name)
                    deleted = table.vacuum(
                        retention_hours=policy.vacuum_hours, dry_run=False, enforce_retention_duration=False, full=True
                    )
            except LeaseHeldError:
                outcome.skipped.append(name)
                continue
            if deleted:
                outcome.vacuumed[name] = len(deleted)
    outcome.seconds = time.monotonic() - started
    if outcome.merged or outcome.vacuumed:
        log.info(
            "compaction: %s%s in %.2f s",
            ", ".join(f"{n} {outcome.merged[n]} -> {outcome.written[n]} files" for n in outcome.merged)
            or "nothing merged",
            "; vacuumed " + ", ".join(f"{n} {c} files" for n, c in outcome.vacuumed.items())
            if outcome.vacuumed
            else "",
            outcome.seconds,
        )
    return outcome


def log_retention_properties(hours: int) -> dict[str, str]:
    """The Delta table properties that keep a table's log entries, and the tombstones of the files it removed, for
    ``hours``: what the tables the stream writes every batch (:data:`VACUUMED_TABLES`) are created or upgraded with
    (:func:`~metrics_lake.core.tables.delta.ensure_table`), before the stream's first batch.

    Tombstones: every checkpoint (every 10 commits) repeats each tombstone younger than
    ``delta.deletedFileRetentionDuration``, Delta's default 7 days. Continuous compaction removes files every
    round, so at that default each checkpoint would hold a week of them: 3,848 in ``bronze_events`` after 1,000
    one-second batches of 20,000 events (a checkpoint of 420 KB, from 39 KB at version 9), growing for a week,
    and every checkpoint write and table open with it. Kept as long as the log instead, they stop growing after
    ``hours``; every version time travel still reaches (a log entry within ``hours``) keeps the files it reads,
    since a file it reads but a later version removed was removed within ``hours`` and VACUUM keeps a tombstoned
    file for its own retention. (VACUUM here is ``full``: it also deletes files no tombstone names, once they are
    older than its retention.)"""
    return {LOG_RETENTION: f"interval {hours} hours", TOMBSTONE_RETENTION: f"interval {hours} hours"}


def clean_delta_log(table: DeltaTable) -> None:
    """Delete ``table``'s Delta log entries (commits and checkpoints) older than its ``delta.logRetentionDuration``.

    Deletion is delta-rs's ``cleanup_metadata``: entries older than the
    retention, up to the newest checkpoint before it, so every version
    within the retention stays readable (and time travel reaches no further
    back). Safe beside concurrent writers: a commit never needs an entry
    older than its own snapshot's checkpoint.
    """
    table.cleanup_metadata()
