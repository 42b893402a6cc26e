"""The lake's scheduled operations as plain functions, for Airflow tasks (and anything else that schedules).

Each takes the settings (``LAKE_*`` on the worker) and ISO day strings, runs
one step with the same code as the CLI, and returns a small JSON-ready
summary that Airflow keeps as the task's XCom, so a run's log and its
return value say what it did. Errors propagate, so the task fails and
Airflow retries it; every step is idempotent, so a retry is safe.

Spark is started lazily by the steps that need it (one local session per
task process, reused across the steps of that process).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.errors import ConsumerBehindRetentionError, QualityGateError
from metrics_lake.lake_schemas.tables import Table

log = logging.getLogger(__name__)


def _spark(settings: LakeSettings, app: str):
    from metrics_lake.spark.session import build_session

    return build_session(settings, app)


def _days(days: list[str]) -> list[dt.date]:
    return [dt.date.fromisoformat(day) for day in days]


def _jsonable(value):
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def run_speed_layer_once(settings: LakeSettings) -> dict:
    """Process everything available in the log into bronze/quarantine/windows, then stop (``lake stream --once``).

    Returns the table versions after the run and the consumer lag per group (records).
    """
    from metrics_lake.core.log.consumer_groups import lag_report
    from metrics_lake.core.log.log import SegmentLog
    from metrics_lake.core.tables.delta import summarize_tables
    from metrics_lake.spark.jobs.stream_metrics import run_stream

    run_stream(_spark(settings, "lake-speed-layer"), settings, once=True)
    store = open_store(settings)
    lag: dict[str, int] = {}
    for row in lag_report(SegmentLog(store)):
        lag[row.group] = lag.get(row.group, 0) + row.lag
    return {"versions": {t.name: t.version for t in summarize_tables(store)}, "lag": lag}


def recompute_days(settings: LakeSettings, days: list[str]) -> list[dict]:
    """Rebuild ``days`` of ``metric_windows_1m`` from bronze (``lake recompute``); one summary per day."""
    from metrics_lake.spark.jobs.recompute import recompute

    results = recompute(_spark(settings, "lake-recompute"), settings, _days(days))
    return [_jsonable(asdict(r)) for r in results]


def rollup_days(settings: LakeSettings, days: list[str]) -> list[dict]:
    """Rebuild ``days`` of the 1h and 1d rollups (``lake rollup``); one summary per day and table."""
    from metrics_lake.spark.jobs.rollups import rollup

    return [_jsonable(asdict(r)) for r in rollup(_spark(settings, "lake-rollup"), settings, _days(days))]


def evaluate_queries(settings: LakeSettings, days: list[str]) -> list[dict]:
    """Evaluate the stored queries for ``days`` into ``query_results`` (``lake queries``)."""
    from metrics_lake.core.config_store import ConfigStore
    from metrics_lake.spark.jobs.evaluate_queries import evaluate_queries_for_day

    queries = ConfigStore(open_store(settings)).current().queries()
    spark = _spark(settings, "lake-queries")
    return [_jsonable(asdict(evaluate_queries_for_day(spark, settings, queries, day))) for day in _days(days)]


def backfill_pending_queries(settings: LakeSettings) -> list[dict]:
    """Backfill the stored queries added or changed since their last backfill (``lake queries backfill``)."""
    from metrics_lake.core.config_store import ConfigStore
    from metrics_lake.core.maintenance.query_backfill import backfill_queries, pending_backfills

    store = open_store(settings)
    pending = pending_backfills(store, ConfigStore(store).current().queries())
    return [asdict(r) for r in backfill_queries(store, settings.topic, pending)]


def evaluate_alert_days(settings: LakeSettings, days: list[str]) -> list[dict]:
    """Evaluate the threshold rules over ``days``' final stored query results (``lake alerts --date``); appends the
    episodes the live evaluation missed to ``alerts``. One summary per day."""
    from metrics_lake.core.maintenance.nightly_alerts import evaluate_alerts_for_day

    store = open_store(settings)
    return [_jsonable(asdict(evaluate_alerts_for_day(store, day))) for day in _days(days)]


def notify_alerts(settings: LakeSettings) -> dict:
    """Deliver the alerts table's outbox to every configured Alertmanager once (``lake alerts notify --once``).

    Returns what was sent; ``{"skipped": ...}`` when ``LAKE_ALERTMANAGER_URL``
    is not set. Raises :class:`~metrics_lake.lake_schemas.errors.AlertmanagerError`
    when Alertmanager does not accept them (the task fails and is retried;
    the outbox keeps them).
    """
    from metrics_lake.app.notifier import deliver_all

    if settings.alertmanager_url is None:
        return {"skipped": "LAKE_ALERTMANAGER_URL is not set"}
    return {url: asdict(done) for url, done in deliver_all(settings).items()}


def compact_log(settings: LakeSettings) -> list[dict]:
    """Merge small segments of every topic (``lake compact --log-only``); one summary per partition."""
    from metrics_lake.core.log import segment_compaction as compaction
    from metrics_lake.core.log.log import SegmentLog

    results = compaction.compact_log(
        SegmentLog(open_store(settings)),
        target_bytes=settings.log_compaction_target_bytes,
        delete_delay_ms=int(settings.segment_delete_delay_seconds * 1000),
        **settings.keyed_compaction,
    )
    return [asdict(r) for r in results]


def compact_tables(settings: LakeSettings, tables: list[str] | None = None, z_order: bool = False) -> list[dict]:
    """Bin-pack (or Z-order) and checkpoint ``tables`` (default: all); one summary per table."""
    from metrics_lake.core.maintenance.table_compaction import compact_table
    from metrics_lake.core.tables.delta import list_tables

    store = open_store(settings)
    results = []
    for name in tables or list_tables(store):
        result = compact_table(
            store,
            name,
            target_bytes=settings.table_compaction_target_bytes,
            z_order=z_order,
        )
        log.info(
            "%s: %d files (avg %.1f KiB) -> %d files (avg %.1f KiB)",
            name,
            result.files_before,
            result.avg_bytes_before / 1024,
            result.files_after,
            result.avg_bytes_after / 1024,
        )
        results.append(asdict(result))
    return results


def retain(settings: LakeSettings, apply: bool, now: dt.datetime | None = None) -> dict:
    """Run retention at ``now`` (default: the current time); with ``apply`` False only plan it.

    Returns per-table files/rows deleted, log segments dropped and VACUUMed
    file counts. Raises :class:`ConsumerBehindRetentionError` (after
    deleting, so the run is loud but retention still holds) when a consumer
    group had unread records past retention.
    """
    from metrics_lake.core.maintenance.retention import apply_retention, plan_retention

    store = open_store(settings)
    now = now or dt.datetime.now(dt.UTC)
    plan = apply_retention(settings, store, now) if apply else plan_retention(settings, store, now)
    summary = {
        "applied": apply,
        "now": now.isoformat(),
        "tables": {t.table: {"cutoff": t.cutoff.isoformat(), "files": t.files, "rows": t.rows} for t in plan.tables},
        "log_segments": sum(p.segments for p in plan.log),
        "log_records": sum(p.records for p in plan.log),
        "vacuumed_files": {v.table: len(v.files) for v in plan.vacuum},
    }
    if plan.groups_behind:
        behind = "; ".join(f"{g} on {t}/{p}: committed {c}, log start {s}" for g, t, p, c, s in plan.groups_behind)
        raise ConsumerBehindRetentionError(f"consumer groups behind retention: {behind} (summary: {summary})")
    return summary


def replay_days(settings: LakeSettings, first: str, last: str) -> dict:
    """Replay the log's events with event time in days ``first``..``last`` into bronze; present rows are skipped.

    Returns records read, rows written per table and rows already present.
    """
    from metrics_lake.core.log.log import SegmentLog
    from metrics_lake.core.speed.replay import replay, replay_ranges

    start = dt.datetime.combine(dt.date.fromisoformat(first), dt.time(), dt.UTC)
    end = dt.datetime.combine(dt.date.fromisoformat(last) + dt.timedelta(days=1), dt.time(), dt.UTC)
    from_ms, to_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    log_ = SegmentLog(open_store(settings))
    ranges = replay_ranges(log_, settings.topic, from_time_ms=from_ms, to_time_ms=to_ms)
    stats = replay(log_, settings.topic, ranges, from_time_ms=from_ms, to_time_ms=to_ms)
    return {"read": stats.read, "written": stats.written, "already_present": stats.already_present}


def check_quality(settings: LakeSettings, day: str, tables: list[str]) -> dict:
    """Run the GX checkpoints of ``tables`` for ``day`` (``lake quality``); the gate before downstream steps.

    Returns per table the rows checked and expectations passed/failed.
    Raises :class:`QualityGateError` naming each failed critical expectation
    with its observed value and a sample, and how to query the failing rows.
    """
    from metrics_lake.quality.checkpoint import run_quality

    report = run_quality(_spark(settings, "lake-quality"), settings, dt.date.fromisoformat(day), tables)
    summary = {
        table: {
            "rows": rows,
            "passed": sum(o.success for o in report.outcomes if o.table == table),
            "failed": sum(not o.success for o in report.outcomes if o.table == table),
        }
        for table, rows in report.rows.items()
    }
    if report.critical_failures():
        raise QualityGateError(
            f"critical expectations failed for {day}; downstream steps stopped:\n{report.describe_failures()}\n"
            f"failing rows: lake sql \"SELECT * FROM {Table.DQ_RESULTS} WHERE run_id = '{report.run_id}' AND NOT success\"; "
            f"report: {report.docs_index}"
        )
    return {"run_id": report.run_id, "tables": summary, "docs": str(report.docs_index)}
