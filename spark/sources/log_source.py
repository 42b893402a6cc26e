"""Spark streaming source over the segment log (format ``lakelog``).

Offsets are ``{"<partition>": <next offset>}`` for one topic: a micro-batch
reads ``[start, end)`` per partition. Because segments are immutable and
offsets dense, re-reading a batch after a crash (Spark re-plans it from its
offset log) returns exactly the same rows, which is what lets the sinks be
exactly-once.

Options:
- ``root`` (required): lake root, as ``LAKE_ROOT``;
- ``topic`` (default ``metrics``);
- ``maxRecordsPerBatch``: read limit, split fairly across partitions;
- ``recordsPerSplit`` (default 500000): a partition's range is cut into Spark
  tasks of at most this many records;
- ``startingOffsets``: ``earliest`` (default) or ``latest`` for a new query;
- ``consumerGroup``: commit each finished batch's end offsets under this
  consumer group name (:mod:`metrics_lake.core.log.consumer_groups`), for ``lake consumers``.

Rows have the :data:`metrics_lake.schemas.LOG_ROW` columns with timestamps in
microseconds (Spark's ``TIMESTAMP``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets, read_range, start_offsets
from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import open_store
from metrics_lake.schemas import LOG_ROW, UTC_US, spark_schema

#: LOG_ROW as Spark sees it (timestamps in microseconds).
SPARK_LOG_ROW = pa.schema(
    [field.with_type(UTC_US) if pa.types.is_timestamp(field.type) else field for field in LOG_ROW]
)


def _open_log(options) -> SegmentLog:
    if "root" not in options:
        raise ValueError("lakelog source needs option 'root' (the lake root, like LAKE_ROOT)")
    return SegmentLog(open_store(load_settings(root=options["root"])))


@dataclass(frozen=True)
class LogRange(InputPartition):
    """One Spark task's input: offsets ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


def limit_offsets(start: dict[int, int], end: dict[int, int], max_rows: int) -> dict[int, int]:
    """Cut the range ``start..end`` to at most ``max_rows`` records, shared fairly.

    Water-filling: partitions with little backlog take all of it, the rest
    split what is left equally, so no partition starves. Returns new ends.
    """
    backlog = {p: end[p] - start.get(p, 0) for p in end}
    remaining = max_rows
    limited = {}
    for left, p in enumerate(sorted(backlog, key=backlog.get), start=0):
        share = remaining // (len(backlog) - left)
        take = min(backlog[p], share)
        limited[p] = start.get(p, 0) + take
        remaining -= take
    return limited


class LogStreamReader(DataSourceStreamReader):
    """Micro-batch reader of one topic; see the module docstring for options."""

    def __init__(self, options) -> None:
        self.options = options
        self.topic = self.options.get("topic", "metrics")
        self.max_rows = int(self.options["maxRecordsPerBatch"]) if "maxRecordsPerBatch" in self.options else None
        self.split = int(self.options.get("recordsPerSplit", 500_000))
        if self.split < 1:
            raise ValueError("recordsPerSplit must be >= 1")
        self._log: SegmentLog | None = _open_log(self.options)

    @property
    def log(self) -> SegmentLog:
        """The log, reopened lazily after unpickling."""
        if self._log is None:
            self._log = _open_log(self.options)
        return self._log

    def __getstate__(self) -> dict:
        # Spark pickles the reader; an S3 client holds sockets and locks, so it is reopened where unpickled.
        return {**self.__dict__, "_log": None}

    def _ends(self) -> dict[int, int]:
        return end_offsets(self.log, self.topic)

    def initialOffset(self) -> dict:
        """Where a new query starts: the earliest retained offsets, or the latest."""
        offsets = (
            self._ends() if self.options.get("startingOffsets") == "latest" else start_offsets(self.log, self.topic)
        )
        return {str(p): offset for p, offset in offsets.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxRecordsPerBatch)`` when the option is set."""
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """End offsets of the next batch, honouring ``limit``."""
        ends = self._ends()
        if isinstance(limit, ReadMaxRows):
            begin = {int(p): int(o) for p, o in start.items()}
            ends = limit_offsets(begin, ends, limit.max_rows)
        return {str(p): offset for p, offset in ends.items()}

    def reportLatestOffset(self) -> dict:
        """Log end offsets, for the query's progress (lag) report."""
        return {str(p): offset for p, offset in self._ends().items()}

    def partitions(self, start: dict, end: dict) -> list[LogRange]:
        """One task per ``recordsPerSplit`` records of each partition's range."""
        ranges = []
        for key, stop in end.items():
            p, lo = int(key), int(start.get(key, 0))
            for begin in range(lo, int(stop), self.split):
                ranges.append(LogRange(self.topic, p, begin, min(begin + self.split, int(stop))))
        return ranges

    def read(self, partition: LogRange) -> Iterator[pa.RecordBatch]:
        """Arrow batches of one range (runs on executors)."""
        log = _open_log(self.options)
        table = read_range(log, partition.topic, partition.partition, partition.start, partition.end)
        yield from table.cast(SPARK_LOG_ROW).to_batches(max_chunksize=65_536)

    def commit(self, end: dict) -> None:
        """Record ``end`` as the consumer group's offsets (if one is set); segments are kept by retention."""
        group = self.options.get("consumerGroup")
        if group:
            commit_offsets(self.log.store, group, self.topic, {int(p): int(o) for p, o in end.items()})


class LogDataSource(DataSource):
    """``spark.readStream.format("lakelog")``: the segment log as a stream."""

    @classmethod
    def name(cls) -> str:
        """Format name: ``lakelog``."""
        return "lakelog"

    def schema(self):
        """The :data:`LOG_ROW` columns as a Spark schema."""
        return spark_schema(SPARK_LOG_ROW)

    def streamReader(self, schema) -> LogStreamReader:
        """A reader over the topic named in the options."""
        return LogStreamReader(self.options)
