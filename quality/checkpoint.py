"""``lake quality``: run the GX checkpoints of a day, record every result in ``dq_results``, publish data docs.

For each table with a suite (:mod:`metrics_lake.quality.suites`) and rows on the day:

1. Spark reads that day's partition and adds the suite's derived columns;
2. a GX checkpoint (Spark data source, whole-DataFrame batch) validates it
   with ``result_format=SUMMARY`` (observed values, unexpected counts and a
   sample of unexpected values) and updates the data docs;
3. every expectation result becomes a ``dq_results`` row; one Delta commit
   per run holds them all.

The GX project is a file context in ``settings.quality_path`` (by default
``<LAKE_ROOT>/quality``). GX data docs slow down as stored validations pile
up, so after each run only the newest ``quality_keep_runs`` results per suite
are kept and the docs are rebuilt from them. For an S3 lake the docs site and
the trend plot are also copied to ``quality/`` in the bucket.

Gates: :meth:`QualityReport.critical_failures` lists failed expectations of
severity ``critical``; the CLI exits 1 and the Airflow gate task fails on
them, so rollups and stored queries are not built from bad data.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from metrics_lake.core import keys
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.commits import retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table, list_tables, open_table
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.tables import TABLES, Table
from metrics_lake.quality.suites import CRITICAL, SUITE_TABLES, build_suite, prepare

_THRESHOLD_KEYS = ("min_value", "max_value", "value_set", "regex", "column_set", "or_equal")


@dataclass(frozen=True)
class Outcome:
    """One expectation's result on one table and day (a ``dq_results`` row, minus run fields)."""

    table: str
    expectation: str
    column: str | None
    critical: bool
    success: bool
    observed_value: str | None
    unexpected_count: int | None
    unexpected_percent: float | None
    threshold: str
    sample: str | None


@dataclass
class QualityReport:
    """A run over one day: its id, per-table outcomes and row counts, where the docs are, how long it took."""

    run_id: str
    day: dt.date
    outcomes: list[Outcome] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    docs_index: Path | None = None
    seconds: float = 0.0

    def critical_failures(self, table: str | None = None) -> list[Outcome]:
        """Failed critical expectations (of ``table`` only, if given)."""
        return [o for o in self.outcomes if o.critical and not o.success and (table is None or o.table == table)]

    def describe_failures(self) -> str:
        """One line per failed critical expectation, with observed value and sample; for gate errors."""
        return "\n".join(
            f"{o.table}: {o.expectation}({o.column or ''}) observed {o.observed_value}, "
            f"{o.unexpected_count} unexpected, e.g. {o.sample}"
            for o in self.critical_failures()
        )


def _text(value) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, default=str)


def outcome(table: str, result) -> Outcome:
    """An :class:`Outcome` from one GX ``ExpectationValidationResult`` of ``table``."""
    config = result.expectation_config
    kwargs = config.kwargs
    details = result.result or {}
    column = (
        kwargs.get("column")
        or ", ".join(kwargs.get("column_list") or [])
        or (f"{kwargs['column_A']} >= {kwargs['column_B']}" if "column_A" in kwargs else None)
    )
    threshold = {k: kwargs[k] for k in _THRESHOLD_KEYS if kwargs.get(k) is not None}
    if kwargs.get("row_condition"):
        threshold["where"] = str(kwargs["row_condition"])
    sample = details.get("partial_unexpected_list")
    return Outcome(
        table=table,
        expectation=config.type,
        column=column,
        critical=str(config.severity).lower().endswith(CRITICAL),
        success=bool(result.success),
        observed_value=_text(details.get("observed_value")),
        unexpected_count=details.get("unexpected_count"),
        unexpected_percent=details.get("unexpected_percent"),
        threshold=json.dumps(threshold, default=str),
        sample=_text(sample[:10]) if sample else None,
    )


def _previous_counts(store, table: str, day: dt.date) -> list[int]:
    """Row counts (from Delta statistics) of the up to 7 days before ``day`` that have rows."""
    actions = pa.table(open_table(store, table).get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    counts: dict[str, int] = {}
    for row in actions.select(["partition.event_date", "num_records"]).to_pylist():
        key = str(row["partition.event_date"])
        counts[key] = counts.get(key, 0) + int(row["num_records"] or 0)
    window = [(day - dt.timedelta(days=i)).isoformat() for i in range(1, 8)]
    return [counts[d] for d in window if counts.get(d)]


def gx_context(settings: LakeSettings):
    """The file-backed GX project in ``settings.quality_path`` (created on first use).

    GX draws a progress bar per validation with its own switch, not tqdm's;
    it follows tqdm's ``TQDM_DISABLE`` variable (set by the CLI unless
    ``--verbose``), so both kinds of bar are on or off together.
    """
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    settings.quality_path.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(settings.quality_path))
    context.variables.progress_bars = ProgressBarsConfig(globally=os.environ.get("TQDM_DISABLE", "") in ("", "0"))
    return context


def validate(context, table: str, frame, suite):
    """Run ``table``'s checkpoint (``suite``, data docs update) on the Spark DataFrame ``frame``.

    Returns the GX ``ExpectationValidationResult`` list. The suite, the
    validation definition and the checkpoint are replaced on every run,
    since thresholds depend on the day and the time of the run.
    """
    import great_expectations as gx
    from great_expectations.exceptions import DataContextError

    try:
        source = context.data_sources.get("lake")
    except (KeyError, ValueError):
        source = context.data_sources.add_spark(name="lake")
    try:
        asset = source.get_asset(table)
    except LookupError:
        asset = source.add_dataframe_asset(name=table)
    try:
        batch = asset.get_batch_definition("day")
    except (KeyError, ValueError):
        batch = asset.add_batch_definition_whole_dataframe("day")
    for store in (context.checkpoints, context.validation_definitions, context.suites):
        try:
            store.delete(table)  # the suite's thresholds depend on the day and the time of the run
        except DataContextError:  # not there yet
            pass
    suite = context.suites.add(suite)
    definition = context.validation_definitions.add(gx.ValidationDefinition(name=table, data=batch, suite=suite))
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name=table,
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")],
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": 10},
        )
    )
    result = checkpoint.run(batch_parameters={"dataframe": frame})
    return [r for run in result.run_results.values() for r in run.results]


def prune_validations(settings: LakeSettings, context) -> None:
    """Keep the newest ``quality_keep_runs`` stored validations per suite, then rebuild the data docs from them."""
    root = settings.quality_path / "gx" / "uncommitted" / "validations"
    if root.is_dir():
        for suite_dir in root.iterdir():
            results = sorted(suite_dir.rglob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in results[settings.quality_keep_runs :]:
                old.unlink()
    site = settings.quality_path / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations"
    shutil.rmtree(site, ignore_errors=True)
    context.build_data_docs()


def write_results(settings: LakeSettings, report: QualityReport, run_at: dt.datetime) -> None:
    """Append the run's outcomes to ``dq_results`` in one Delta commit."""
    rows = [
        {
            "run_id": report.run_id,
            "run_at": run_at,
            **{k: getattr(o, k) for k in Outcome.__dataclass_fields__},
            "rows": report.rows.get(o.table),
            "event_date": report.day,
        }
        for o in report.outcomes
    ]
    if not rows:
        return
    store = open_store(settings)
    spec = TABLES[Table.DQ_RESULTS]
    files = write_data_files(store, Table.DQ_RESULTS, pa.Table.from_pylist(rows, schema=spec.schema))
    retry_on_conflict(
        lambda: ensure_table(store, Table.DQ_RESULTS).create_write_transaction(
            [f.add_action() for f in files], mode="append", schema=spec.schema, partition_by=list(spec.partition_by)
        ),
        f"{Table.DQ_RESULTS} append",
    )


def publish(settings: LakeSettings) -> None:
    """For an S3 lake, copy the docs site and the trend plot to ``quality/`` in the bucket."""
    if not settings.is_s3:
        return
    store = open_store(settings)
    site = settings.quality_path / "gx" / "uncommitted" / "data_docs" / "local_site"
    for path in site.rglob("*"):
        if path.is_file():
            store.replace(keys.quality_key(f"docs/{path.relative_to(site)}"), path.read_bytes())
    trend = settings.quality_path / "trend.html"
    if trend.exists():  # in the bucket the docs site sits at quality/docs/
        page = trend.read_text().replace("gx/uncommitted/data_docs/local_site/", "docs/")
        store.replace(keys.quality_key("trend.html"), page.encode())
        store.replace(keys.quality_key("trend.png"), (settings.quality_path / "trend.png").read_bytes())


def run_quality(
    spark, settings: LakeSettings, day: dt.date, tables: list[str] | None = None, now: dt.datetime | None = None
) -> QualityReport:
    """Validate ``day`` of ``tables`` (default: every table with a suite that exists); see the module docstring.

    Raises ``KeyError`` for a table without a suite. Tables with no rows on
    the day are skipped (and absent from the report's ``rows``); a run for
    today (``now``'s date) also checks freshness
    (:mod:`metrics_lake.quality.freshness`), critically, so a lake whose
    newest data is too old fails even when today has no rows.
    """
    from metrics_lake.quality.trend import write_trend
    from metrics_lake.spark.jobs.day_partitions import read_days

    started = time.monotonic()
    now = now or dt.datetime.now(dt.UTC)
    store = open_store(settings)
    existing = set(list_tables(store))
    chosen = tables or [t for t in SUITE_TABLES if t in existing]
    for table in chosen:
        if table not in SUITE_TABLES:
            raise InputError(f"no quality suite for table {table!r}; suites exist for {', '.join(SUITE_TABLES)}")
    report = QualityReport(run_id=uuid.uuid4().hex, day=day)
    context = gx_context(settings)
    for table in chosen:
        if table not in existing:
            continue
        frame = prepare(read_days(spark, settings.root, table, [day]), table).cache()
        try:
            rows = frame.count()
            if rows == 0:
                continue
            report.rows[table] = rows
            suite = build_suite(table, settings, day, now, _previous_counts(store, table, day))
            report.outcomes += [outcome(table, r) for r in validate(context, table, frame, suite)]
        finally:
            frame.unpersist()
    if day == now.date() and (tables is None or Table.METRIC_WINDOWS_1M in tables):
        from metrics_lake.core.config_store import ConfigStore
        from metrics_lake.quality.freshness import freshness_outcomes

        report.outcomes += freshness_outcomes(settings, ConfigStore(store).current().queries(), now)
    write_results(settings, report, now)
    prune_validations(settings, context)
    write_trend(settings)
    publish(settings)
    report.docs_index = settings.quality_path / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    report.seconds = time.monotonic() - started
    return report
