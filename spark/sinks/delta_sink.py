"""Streaming Delta sink for the raw layer (format ``lakebronze``).

Takes log rows (:data:`metrics_lake.spark.sources.log_source.SPARK_LOG_ROW`) and routes
them by contract validity: valid events to ``bronze_events``, rejected ones
to ``quarantine_events``. Executors write Parquet files under the table and
return them as commit messages; the driver commits each table's files in one
Delta version carrying ``txn(appId, batchId)`` (:func:`metrics_lake.core.tables.commit_files`),
and a batch that table already committed is skipped. So a micro-batch re-run
after a crash adds nothing twice, and files of a failed attempt stay
uncommitted, invisible to readers, until VACUUM removes them.

Options: ``root`` (lake root) and ``appId`` (stable per streaming query; see
:func:`metrics_lake.spark.jobs.stream_metrics.query_app_id`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from metrics_lake.core.config import load_settings
from metrics_lake.core.storage import Store, open_store
from metrics_lake.core.tables import WrittenFile, commit_files, write_data_files
from metrics_lake.schemas import BRONZE_EVENTS, QUARANTINE_EVENTS

BRONZE = "bronze_events"
QUARANTINE = "quarantine_events"


def split_log_rows(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Split log rows into (bronze rows, quarantine rows) with their tables' schemas.

    ``event_date`` is the UTC date of the event time; ``ingest_date`` the
    UTC date the record was appended to the log.
    """
    rejected = pc.is_valid(rows.column("reason"))
    valid = rows.filter(pc.invert(rejected))
    bad = rows.filter(rejected)
    bronze = valid.append_column("event_date", pc.cast(valid.column("ts"), pa.date32()))
    quarantine = bad.append_column("ingest_date", pc.cast(bad.column("ingested_at"), pa.date32()))
    return (
        bronze.select(BRONZE_EVENTS.names).cast(BRONZE_EVENTS),
        quarantine.select(QUARANTINE_EVENTS.names).cast(QUARANTINE_EVENTS),
    )


@dataclass
class FilesWritten(WriterCommitMessage):
    """Commit message of one Spark task: the data files it wrote."""

    files: list[WrittenFile] = field(default_factory=list)


def commit_batch(store: Store, files: list[WrittenFile], *, app_id: str, batch_id: int) -> dict[str, bool]:
    """Commit one micro-batch's files, each table in one Delta version with ``txn(app_id, batch_id)``.

    Returns, per table that had files, whether it committed (False: that
    batch was already committed and is skipped).
    """
    outcome = {}
    for table in (BRONZE, QUARANTINE):
        actions = [f.add_action() for f in files if f.table == table]
        if actions:
            outcome[table] = commit_files(store, table, actions, app_id=app_id, batch_id=batch_id)
    return outcome


class BronzeStreamWriter(DataSourceStreamArrowWriter):
    """Writes bronze and quarantine files on executors; commits on the driver."""

    def __init__(self, options) -> None:
        self.options = options
        for required in ("root", "appId"):
            if required not in self.options:
                raise ValueError(f"lakebronze sink needs option {required!r}")

    def _store(self) -> Store:
        return open_store(load_settings(root=self.options["root"]))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        """Write this task's rows as Parquet files (not yet visible)."""
        batches = list(iterator)
        if not batches:
            return FilesWritten()
        rows = pa.Table.from_batches(batches)
        bronze, quarantine = split_log_rows(rows)
        store = self._store()
        return FilesWritten(write_data_files(store, BRONZE, bronze) + write_data_files(store, QUARANTINE, quarantine))

    def commit(self, messages: list[FilesWritten | None], batchId: int) -> None:
        """Commit all tasks' files for ``batchId`` exactly once."""
        files = [f for message in messages if message is not None for f in message.files]
        commit_batch(self._store(), files, app_id=self.options["appId"], batch_id=batchId)

    def abort(self, messages: list[FilesWritten | None], batchId: int) -> None:
        """Leave written files uncommitted: invisible to readers, removed by VACUUM."""


class BronzeDeltaDataSource(DataSource):
    """``df.writeStream.format("lakebronze")``: log rows into bronze/quarantine Delta tables."""

    @classmethod
    def name(cls) -> str:
        """Format name: ``lakebronze``."""
        return "lakebronze"

    def streamWriter(self, schema, overwrite: bool) -> BronzeStreamWriter:
        """The exactly-once writer; ``overwrite`` is not supported (append only)."""
        if overwrite:
            raise ValueError("lakebronze is append-only")
        return BronzeStreamWriter(self.options)
