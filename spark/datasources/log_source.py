"""Spark streaming source over the segment log (format ``lakelog``): it says how far each micro-batch reads.

Offsets are ``{"<partition>": <next offset>}`` for one topic. A micro-batch
is one row per log partition, ``(topic, partition, start, end)``: the
speed layer (:mod:`metrics_lake.spark.jobs.stream_metrics`) reads the
records itself, in Spark tasks, from where each table's own committed
position is (:mod:`metrics_lake.core.speed.micro_batch`). It takes a
batch's ends from Spark's offset log, where ``latestOffset``'s answer is
written before the batch runs, and reads these rows only if that log is not
in the format it knows (:func:`~metrics_lake.spark.jobs.stream_metrics.logged_ends`).
So the offsets Spark keeps in its checkpoint only decide how far a batch goes; where it starts,
and what is exactly-once, is decided by the tables. A query without a
checkpoint starts at the lowest position the tables hold
(:func:`~metrics_lake.core.speed.progress.starting_offsets`).

Options:

- ``root`` (required): lake root, as ``LAKE_ROOT``;
- ``topic`` (default ``metrics``);
- ``maxRecordsPerBatch``: read limit, split fairly across partitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.progress import starting_offsets
from metrics_lake.core.storage import Store, open_store
from metrics_lake.core.tables.delta import LatestTables
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.types import spark_schema

__all__ = ["BATCH_RANGE", "LogDataSource", "LogRange", "LogStreamReader", "limit_offsets"]

#: One row of a micro-batch: the offsets of one partition it covers.
BATCH_RANGE = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("start", pa.int64(), nullable=False),
        pa.field("end", pa.int64(), nullable=False),
    ]
)


def _open_store(options) -> Store:
    if "root" not in options:
        raise InputError("lakelog source needs option 'root' (the lake root, like LAKE_ROOT)")
    return open_store(load_settings(root=options["root"]))


@dataclass(frozen=True)
class LogRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition in a micro-batch."""

    topic: str
    partition: int
    start: int
    end: int


def limit_offsets(start: dict[int, int], end: dict[int, int], max_rows: int) -> dict[int, int]:
    """Cut the range ``start..end`` to at most ``max_rows`` records, shared fairly.

    Water-filling: partitions with little backlog take all of it, the rest
    split what is left equally, so no partition starves. Returns new ends.
    """
    backlog = {p: max(end[p] - start.get(p, 0), 0) for p in end}
    remaining = max_rows
    limited = {}
    for left, p in enumerate(sorted(backlog, key=backlog.get), start=0):
        share = remaining // (len(backlog) - left)
        take = min(backlog[p], share)
        limited[p] = start.get(p, 0) + take
        remaining -= take
    return limited


class LogStreamReader(DataSourceStreamReader):
    """Micro-batch planner for one topic; see the module docstring for options."""

    def __init__(self, options) -> None:
        self.options = options
        self.topic = self.options.get("topic", "metrics")
        self.max_rows = int(self.options["maxRecordsPerBatch"]) if "maxRecordsPerBatch" in self.options else None
        self._store: Store | None = _open_store(self.options)
        self._tables = LatestTables()  # the runner process asks at every trigger: kept open, brought up to date

    @property
    def store(self) -> Store:
        """The lake's store, reopened lazily after unpickling."""
        if self._store is None:
            self._store = _open_store(self.options)
        return self._store

    def __getstate__(self) -> dict:
        # Spark pickles the reader; an S3 client holds sockets and locks, so it is reopened where unpickled, and
        # the kept tables too.
        return {**self.__dict__, "_store": None, "_tables": LatestTables()}

    def _ends(self) -> dict[int, int]:
        return end_offsets(SegmentLog(self.store), self.topic)

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts: the lowest position the speed layer's tables hold."""
        return {str(p): offset for p, offset in starting_offsets(self.store, self.topic, self._tables).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxRecordsPerBatch)`` when the option is set."""
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End offsets of the next batch, honouring ``limit``.

        The limit counts from where the tables are when they are ahead of
        ``start``: a checkpoint older than the tables (``lake stream --once``
        ran meanwhile, or an old copy was restored) then costs one batch,
        not one empty batch per ``maxRecordsPerBatch`` records they hold.
        """
        ends = self._ends()
        if isinstance(limit, ReadMaxRows):
            held = starting_offsets(self.store, self.topic, self._tables)
            begin = {int(p): max(int(o), held.get(int(p), 0)) for p, o in start.items()}
            ends = limit_offsets(begin, ends, limit.max_rows)
        return {str(p): offset for p, offset in ends.items()}

    def reportLatestOffset(self) -> dict:
        """Log end offsets, for the query's progress (lag) report."""
        return {str(p): offset for p, offset in self._ends().items()}

    def partitions(self, start: dict, end: dict) -> list[LogRange]:
        """One range per partition of the topic (including those with nothing new: the batch names every end)."""
        return [LogRange(self.topic, int(p), int(start.get(p, stop)), int(stop)) for p, stop in end.items()]

    def read(self, partition: LogRange) -> Iterator[pa.RecordBatch]:
        """The range as one row (runs on executors; reading the records is the speed layer's job)."""
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "topic": partition.topic,
                    "partition": partition.partition,
                    "start": partition.start,
                    "end": partition.end,
                }
            ],
            schema=BATCH_RANGE,
        )

    def commit(self, end: dict) -> None:
        """Nothing to do: the speed layer records positions in the tables and the consumer group itself."""


class LogDataSource(DataSource):
    """``spark.readStream.format("lakelog")``: the segment log as a stream of per-partition batch ranges."""

    @classmethod
    def name(cls) -> str:
        """Format name: ``lakelog``."""
        return "lakelog"

    def schema(self):
        """The :data:`BATCH_RANGE` columns as a Spark schema."""
        return spark_schema(BATCH_RANGE)

    def streamReader(self, schema) -> LogStreamReader:
        """A reader over the topic named in the options."""
        return LogStreamReader(self.options)
