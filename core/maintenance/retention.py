"""Retention per resolution (as in Thanos and Mimir): plan what is past its horizon, then delete it.

Defaults (``LAKE_RETENTION_*``): log segments and bronze (with quarantine)
7 days, 1-minute windows 30 days (with the reconciliation and stored query
results derived from them), 1-hour rollups 1 year, 1-day rollups forever.

- **Log**: segments appended before the horizon, from the head of each
  partition (:mod:`metrics_lake.core.log.segment_retention`); consumer groups that had not read
  them are reported.
- **Tables**: whole ``event_date`` (``ingest_date``) partitions older than
  the horizon are deleted with one Delta ``DELETE`` per table, a
  metadata-only commit since the predicate is on the partition column; the
  rows stay readable by time travel until VACUUM.
- **VACUUM**: files no version newer than ``vacuum_retention_hours`` needs
  are deleted, including files written by failed jobs and never committed
  (delta-rs ``vacuum(full=True)``, which also honours the retention period
  for those), and the Delta log is trimmed after a checkpoint.

:func:`plan_retention` changes nothing; :func:`apply_retention` does the
deletes. Both take ``now`` so runs (and tests) are reproducible.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.leases import maintenance_lease
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.segment_retention import PartitionRetention, apply_log_retention, plan_log_retention
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import retry_on_conflict
from metrics_lake.core.tables.delta import list_tables, open_table
from metrics_lake.lake_schemas.tables import TABLES

#: table -> (partition column holding its day, LakeSettings field with its retention in days), from the table registry.
TABLE_RETENTION: dict[str, tuple[str, str]] = {
    name: (spec.day_column, spec.retention_setting) for name, spec in TABLES.items() if spec.retention_setting
}


@dataclass(frozen=True)
class TableRetention:
    """One table's expired partitions: days before ``cutoff`` (a UTC date), with their files, rows and bytes."""

    table: str
    column: str
    cutoff: dt.date
    days: list[str]
    files: int
    rows: int
    size_bytes: int


@dataclass(frozen=True)
class VacuumResult:
    """Files VACUUM deletes (or would delete, in a plan) from one table."""

    table: str
    files: list[str]


@dataclass
class RetentionPlan:
    """Everything retention would delete at ``now``; ``groups_behind`` lists (group, topic, partition, committed, new start)."""

    now: dt.datetime
    log: list[PartitionRetention] = field(default_factory=list)
    tables: list[TableRetention] = field(default_factory=list)
    vacuum: list[VacuumResult] = field(default_factory=list)

    @property
    def groups_behind(self) -> list[tuple[str, str, int, int, int]]:
        """Consumer groups whose unread records are past retention: (group, topic, partition, committed, new start)."""
        return [
            (group, p.topic, p.partition, committed, p.new_start)
            for p in self.log
            for group, committed in sorted(p.behind.items())
        ]


def table_cutoffs(settings: LakeSettings, now: dt.datetime) -> dict[str, tuple[str, dt.date]]:
    """table -> (partition column, first day kept) for every table with a finite retention."""
    today = now.astimezone(dt.UTC).date()
    cutoffs = {}
    for table, (column, setting) in TABLE_RETENTION.items():
        days = getattr(settings, setting)
        if days is not None:
            cutoffs[table] = (column, today - dt.timedelta(days=days))
    return cutoffs


def _expired(store: Store, table: str, column: str, cutoff: dt.date) -> TableRetention:
    actions = pa.table(open_table(store, table).get_add_actions(flatten=True))
    days: list[str] = []
    files = rows = size = 0
    if actions.num_rows:
        values = pc.cast(actions.column(f"partition.{column}"), pa.string())
        old = actions.filter(pc.less(values, cutoff.isoformat()))
        days = sorted(set(pc.cast(old.column(f"partition.{column}"), pa.string()).to_pylist()))
        files, rows = old.num_rows, int(pc.sum(old.column("num_records")).as_py() or 0)
        size = int(pc.sum(old.column("size_bytes")).as_py() or 0)
    return TableRetention(table, column, cutoff, days, files, rows, size)


def vacuum_hours(settings: LakeSettings, table: str) -> int:
    """How long VACUUM keeps the files ``table`` no longer references: ``LAKE_VACUUM_RETENTION_HOURS``, or the
    table's own shorter ``vacuum_hours`` (:class:`~metrics_lake.lake_schemas.tables.TableSpec`)."""
    own = TABLES[table].vacuum_hours if table in TABLES else None
    return settings.vacuum_retention_hours if own is None else min(own, settings.vacuum_retention_hours)


def _vacuum(store: Store, table: str, hours: int, dry_run: bool) -> VacuumResult:
    files = retry_on_conflict(
        lambda: open_table(store, table).vacuum(
            retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False, full=True
        ),
        f"{table} vacuum",
    )
    return VacuumResult(table, sorted(files))


def log_horizon_ms(settings: LakeSettings, now: dt.datetime) -> int:
    """Epoch ms before which appended log segments are past retention at ``now``."""
    return int((now - dt.timedelta(days=settings.retention_log_days)).timestamp() * 1000)


def _plan_deletions(settings: LakeSettings, store: Store, now: dt.datetime) -> RetentionPlan:
    """The log segments and table partitions past their horizon at ``now`` (no VACUUM listing)."""
    plan = RetentionPlan(now)
    log = SegmentLog(store)
    for topic in log.topics():
        if not log.compacted(topic):  # a keyed topic is cleaned by key compaction (lake compact), never by age
            plan.log += plan_log_retention(log, topic, log_horizon_ms(settings, now))
    existing = set(list_tables(store))
    for table, (column, cutoff) in table_cutoffs(settings, now).items():
        if table in existing:
            plan.tables.append(_expired(store, table, column, cutoff))
    return plan


def plan_retention(settings: LakeSettings, store: Store, now: dt.datetime) -> RetentionPlan:
    """What retention at ``now`` would delete from the log and every table, VACUUM included; changes nothing."""
    plan = _plan_deletions(settings, store, now)
    for table in sorted(list_tables(store)):
        plan.vacuum.append(_vacuum(store, table, vacuum_hours(settings, table), dry_run=True))
    return plan


def apply_retention(settings: LakeSettings, store: Store, now: dt.datetime) -> RetentionPlan:
    """Delete what :func:`plan_retention` lists; returns the plan as carried out.

    The log is trimmed first, then expired partitions deleted from each table
    (one commit per table, retried on conflicts), then each table vacuumed,
    checkpointed and its Delta log cleaned up. Segments dropped from the
    index now are deleted after ``segment_delete_delay_seconds``, by this or
    a later run.
    """
    plan = _plan_deletions(settings, store, now)
    log = SegmentLog(store)
    delay_ms = int(settings.segment_delete_delay_seconds * 1000)
    for topic in log.topics():
        if not log.compacted(topic):
            apply_log_retention(log, topic, log_horizon_ms(settings, now), delete_delay_ms=delay_ms)
    for expired in plan.tables:
        if expired.files:
            predicate = f"{expired.column} < '{expired.cutoff.isoformat()}'"
            commit = CommitProperties(custom_metadata={"lake.operation": "RETENTION"})
            with maintenance_lease(store, expired.table):  # never beside a compaction removing the same files
                retry_on_conflict(
                    lambda p=predicate, c=commit, t=expired.table: open_table(store, t).delete(p, commit_properties=c),
                    f"{expired.table} retention delete",
                )
    for table in sorted(list_tables(store)):
        plan.vacuum.append(_vacuum(store, table, vacuum_hours(settings, table), dry_run=False))
        delta = open_table(store, table)
        delta.create_checkpoint()
        delta.cleanup_metadata()
    return plan
