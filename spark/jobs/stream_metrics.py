"""The speed layer on Spark: log -> bronze_events, quarantine_events, metric_windows_1m, exactly once.

One Structured Streaming query over the ``lakelog`` source runs the speed
layer of :mod:`metrics_lake.core.speed.micro_batch` in ``foreachBatch``:

1. the driver takes the batch's ends from the offset log Spark wrote before
   calling ``foreachBatch`` (:func:`logged_ends`), reads each table's
   committed positions and plans the batch
   (:func:`~metrics_lake.core.speed.batch_plan.plan_batch`): chunks of the log
   from the lowest position up to those ends;
2. Spark runs an RDD job of at most one task per core, each taking whole log
   partitions one after the other (:func:`process_on_executors`); a task reads a
   partition's chunks in offset order with pyarrow, judges their events against the
   cardinality limits, writes the bronze and quarantine Parquet files and
   computes the 1-minute window states, all in Arrow
   (:func:`~metrics_lake.core.speed.chunk_processing.process_partition`), and returns the
   file lists and the states, so events never cross into the JVM;
3. the driver commits each table with its new positions
   (:func:`~metrics_lake.core.speed.micro_batch.commit_batch`).

The log is read once per batch for all three tables. Spark's checkpoint
(``LAKE_CHECKPOINT_DIR``) is a cache of how far batches went: deleting it, or
starting on another machine, resumes from what the tables hold, and one lost
in part is deleted (:func:`discard_damaged_checkpoint`).

``lake stream --once`` (:func:`catch_up`) runs the same batches without a
streaming query: starting one over a Python data source costs seconds of
planner processes before its first batch, most of a one-shot run, and the
checkpoint it would keep is only that cache.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from metrics_lake.core.arrow_memory import FreedMemoryBudget, release_freed_memory
from metrics_lake.core.config import LakeSettings, load_settings
from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.maintenance.continuous_compaction import (
    VACUUMED_TABLES,
    CommitSlot,
    CompactionPolicy,
    CompactionRound,
    compact_speed_tables,
    log_retention_properties,
)
from metrics_lake.core.speed.alerting import AlertOptions, evaluate_idle
from metrics_lake.core.speed.batch_plan import BatchPlan, configured_limits, plan_batch
from metrics_lake.core.speed.chunk_processing import ChunkResult, process_partition
from metrics_lake.core.speed.micro_batch import BatchOutcome, commit_batch
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import starting_offsets, watermark_app_id
from metrics_lake.core.storage import Store, open_store
from metrics_lake.core.tables.delta import LatestTables, ensure_table
from metrics_lake.lake_schemas.errors import TopicNotFoundError
from metrics_lake.lake_schemas.tables import TABLES, Table
from metrics_lake.spark.datasources.log_source import limit_offsets

__all__ = [
    "BatchGate",
    "CompactionWorker",
    "catch_up",
    "checkpoint_location",
    "compact",
    "compaction_policy",
    "discard_damaged_checkpoint",
    "idle_alerts",
    "logged_ends",
    "prepare_lake",
    "run_batch",
    "run_stream",
    "start_stream",
]

log = logging.getLogger(__name__)

#: Records a task reads at a time (a log partition's range is cut into chunks of this size; each chunk is a bronze
#: file). 1,000,000 rather than 500,000: a batch of about 500,000 records a partition (an import into a running
#: stream) was then one chunk, not a full one and a sliver whose window states the task merges again. Measured with
#: ``bench/same_file.py``'s 12 M events, alternating runs: into a running stream 14.73 against 14.98 s (medians of 6),
#: ``lake stream --once`` 9.2-9.4 against 9.6-9.8 s, the driver's peak RSS 0.85 GB either way.
CHUNK_RECORDS = 1_000_000
#: The version line of the offset log files :func:`logged_ends` reads (Spark's ``OffsetSeqLog``, as Spark 4.2 writes it).
OFFSET_LOG_VERSION = "v1"


def prepare_lake(settings: LakeSettings) -> Store:
    """Make sure the topic, every table and the config store of stored queries exist; returns the store.

    The tables the stream writes every batch get ``LAKE_DELTA_LOG_RETENTION_HOURS`` as their Delta log retention
    (:func:`~metrics_lake.core.maintenance.continuous_compaction.log_retention_properties`): at creation, or in one
    commit when it changed, never between two batches.

    Cheap and idempotent; commands call it before starting Spark, so a
    wrong root, bad credentials or a missing permission fail in a second
    instead of after the JVM started.
    """
    store = open_store(settings)
    try:
        SegmentLog(store).partitions(settings.topic)
    except TopicNotFoundError:  # started before any producer: create it (needs write access to log/)
        SegmentLog(store).ensure_topic(settings.topic, settings.partitions)
    speed_log = log_retention_properties(settings.delta_log_retention_hours)
    for name in TABLES:
        ensure_table(store, name, properties=speed_log if name in VACUUMED_TABLES else None)
    ConfigStore(store).ensure_seeded()  # a new lake's stored queries: the shipped declarations, stored once
    return store


def process_on_executors(spark, settings: LakeSettings, plan: BatchPlan) -> list[ChunkResult]:
    """Run :func:`~metrics_lake.core.speed.chunk_processing.process_partition` for every partition of ``plan``: a
    partition's chunks in offset order, in one Spark task (as its cardinality limits need), and at most as many
    tasks as the cluster has cores (``defaultParallelism``), each taking its partitions one after the other.

    Fewer tasks than partitions: a job's fixed cost grows with its tasks, and a second wave of tasks waits for
    the first. Measured on ``local[2]``, 4 partitions: an empty job took 0.11-0.12 s as 2 tasks, 0.17-0.18 s
    as 4; a steady-load batch (50,000 records a partition) 0.25 s against 0.31 s (medians of 10); 3 M records
    a partition 6.3-7.9 s either way.

    An RDD job: each task's :class:`~metrics_lake.core.speed.chunk_processing.ChunkResult`
    (its Arrow window states included) comes back pickled, without Spark
    SQL's planning of every batch or a conversion into the JVM's rows (a
    ``mapInArrow`` job did both).
    """
    root, skew = settings.root, settings.quality_clock_skew_seconds

    def task(partitions: Iterable[int]) -> Iterator[ChunkResult]:
        store = open_store(load_settings(root=root))  # executors read LAKE_S3_* from their own environment
        for partition in partitions:
            yield from process_partition(store, plan, partition, clock_skew_seconds=skew)

    partitions = sorted(plan.partition_chunks())
    tasks = min(len(partitions), max(spark.sparkContext.defaultParallelism, 1))
    return spark.sparkContext.parallelize(partitions, tasks).mapPartitions(task).collect()


def run_batch(
    spark,
    settings: LakeSettings,
    ends: dict[int, int],
    open_windows: OpenWindows | None = None,
    tables: LatestTables | None = None,
) -> BatchOutcome | None:
    """Plan, process and commit one micro-batch reading up to ``ends``; ``None`` if no table needs anything.

    ``open_windows``: the stream's kept open-window rows, used and updated by the commit
    (:mod:`metrics_lake.core.speed.open_windows`); ``None`` reads every file. ``tables``: the
    tables the stream keeps open from one batch to the next
    (:class:`~metrics_lake.core.tables.delta.LatestTables`); ``None`` opens them for this batch.
    """
    started = time.monotonic()
    store = open_store(settings)
    tables = tables or LatestTables()
    plan = plan_batch(
        store,
        settings.topic,
        ends,
        watermark_seconds=settings.watermark_seconds,
        chunk_records=CHUNK_RECORDS,
        limits=configured_limits(settings, SegmentLog(store).partitions(settings.topic)),
        tables=tables,
    )
    if not plan.chunks:
        return None
    planned = time.monotonic()
    results = process_on_executors(spark, settings, plan)
    return commit_batch(
        store,
        plan,
        results,
        watermark_seconds=settings.watermark_seconds,
        started=started,
        alerting=AlertOptions.from_settings(settings),
        stages={"plan": planned - started, "tasks": time.monotonic() - planned},
        open_windows=open_windows,
        tables=tables,
    )


def checkpoint_location(settings: LakeSettings) -> Path:
    """The speed layer's streaming checkpoint for ``settings.topic``: ``<LAKE_CHECKPOINT_DIR>/<topic>/speed-layer``."""
    return settings.checkpoint_path / settings.topic / "speed-layer"


def discard_damaged_checkpoint(checkpoint: Path) -> bool:
    """Delete ``checkpoint`` if Spark would refuse to start from it; returns whether it did (and logs a warning
    naming the folder and why).

    Spark 4 refuses two checkpoints a crash can leave behind:

    - its ``metadata`` file is gone while its offset or commit log still holds files: the query stops with
      ``STREAMING_CHECKPOINT_MISSING_METADATA_FILE`` and asks for the file back;
    - no batch is logged yet (no ``offsets/<batch id>`` file) while ``offsets/``, ``commits/`` or ``state/`` holds
      anything: ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY`` ("should be empty on batch 0"). A process killed while
      Spark wrote the first offset leaves exactly that: the temporary file ``offsets/.0.<uuid>.tmp`` it renames
      into place (``CheckpointFileManager.createAtomic``).

    Here the checkpoint is only a cache of how far batches went (the tables' positions decide where a batch starts:
    :mod:`metrics_lake.core.speed.progress`), so a checkpoint lost in part is treated as one lost whole, as Kafka
    Streams wipes a corrupted local state store. Call it before the query starts, never while one runs on it.
    """
    if not checkpoint.is_dir():
        return False
    logs = {name: sorted((checkpoint / name).glob("*")) for name in ("offsets", "commits", "state")}
    if not (checkpoint / "metadata").exists() and any(path.is_file() for path in logs["offsets"] + logs["commits"]):
        why = "has lost its metadata file"
    elif not any(path.name.isdigit() for path in logs["offsets"]) and any(logs.values()):
        why = "logged no batch but is not empty (a crash while the first batch's offsets were written)"
    else:
        return False
    log.warning("checkpoint %s %s; deleting it (the tables' positions decide)", checkpoint, why)
    shutil.rmtree(checkpoint)
    return True


def logged_ends(checkpoint: Path, batch_id: int) -> dict[int, int] | None:
    """The end offsets (partition -> next offset) of micro-batch ``batch_id`` as Spark logged them in
    ``checkpoint``, or ``None`` if that file is missing or not in the format read here.

    Spark writes ``offsets/<batch id>`` before it runs the batch (its write-ahead offset log,
    ``OffsetSeqLog``): the version line :data:`OFFSET_LOG_VERSION`, the batch's metadata, then one
    line per source holding the offset its ``latestOffset`` returned, here the ``lakelog`` source's
    ``{"<partition>": <end>}``. Reading it spares each batch a Spark job that would collect the
    same ends from the batch's rows (one Python task): 0.16-0.21 s of a steady-state batch here.
    Where the batch starts is the tables' business either way (:mod:`metrics_lake.core.speed.progress`).
    """
    try:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
        if len(lines) != 3 or lines[0] != OFFSET_LOG_VERSION:  # another version, or more than the one source
            return None
        ends = json.loads(lines[2])
        if not isinstance(ends, dict) or not ends:
            return None
        parsed = {int(partition): int(end) for partition, end in ends.items()}
    except (OSError, UnicodeDecodeError, ValueError, TypeError):  # json.JSONDecodeError is a ValueError
        return None
    return parsed if all(end >= 0 for end in parsed.values()) else None


class BatchGate:
    """Lets a streaming query's micro-batches run until it is closed; closing waits for the batch in flight.

    ``StreamingQuery.stop()`` interrupts the query's thread wherever it is:
    in a batch, the batch's Spark job fails with an ``InterruptedException``
    and pages of Java and Python stack traces, though the tables stay exact
    (the next run completes the batch). Closing the gate
    before ``stop()`` ends the query between batches: :meth:`close` returns
    once the batch in flight, if any, has committed, and a batch that starts
    after it does nothing. Its records are read by the next run, which plans
    from the tables' positions (:func:`run_batch`), not from Spark's
    checkpoint that counts the batch as done. A gate given ``stop`` (the
    event a signal handler sets) is closed to new batches as soon as it is set.
    """

    def __init__(self, stop: threading.Event | None = None) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._stop = stop or threading.Event()

    def run(self, batch: Callable[[], None]) -> bool:
        """Run ``batch()`` unless the gate is closed; returns whether it ran. Its errors propagate. Also the
        commit slot of continuous compaction (:class:`CompactionWorker`): a round's commit taken through the
        gate never meets a batch's planning or commit."""
        with self._lock:
            if self._closed or self._stop.is_set():
                return False
            batch()
            return True

    def close(self) -> None:
        """Let no batch start from now on, once the one running (if any) has ended."""
        with self._lock:
            self._closed = True


def start_stream(
    spark,
    settings: LakeSettings,
    *,
    trigger_seconds: float,
    progress: Callable[[BatchOutcome], None] | None = None,
    gate: BatchGate | None = None,
):
    """Start the speed layer's streaming query for ``settings.topic``; returns the ``StreamingQuery``.

    Micro-batches start every ``trigger_seconds`` (0: back to back), each
    reading at most ``settings.max_records_per_batch`` records; ``progress``
    gets every committed batch's outcome. Each batch's ends come from Spark's
    offset log (:func:`logged_ends`); should that format change, from the
    batch's rows, with a warning. After a batch the driver gives the memory
    malloc keeps free back once it passes ``LAKE_FREED_MEMORY_KEEP_BYTES``
    (:class:`~metrics_lake.core.arrow_memory.FreedMemoryBudget`). Batches run
    through ``gate``: close it before stopping the query to stop between
    batches (:class:`BatchGate`).
    A checkpoint Spark would refuse is deleted first (:func:`discard_damaged_checkpoint`).
    """
    gate = gate or BatchGate()
    prepare_lake(settings)
    checkpoint = checkpoint_location(settings)
    discard_damaged_checkpoint(checkpoint)
    open_windows, tables = OpenWindows(), LatestTables()  # foreachBatch runs in this process: one batch at a time
    memory = FreedMemoryBudget(settings.freed_memory_keep_bytes)
    warned = threading.Event()

    def each_batch(batch_df, batch_id: int) -> None:
        gate.run(lambda: run_logged_batch(batch_df, batch_id))

    def run_logged_batch(batch_df, batch_id: int) -> None:
        ends = logged_ends(checkpoint, batch_id)
        if ends is None:  # the batch's rows say the same, for a Spark job per batch
            if not warned.is_set():
                warned.set()
                log.warning("no end offsets in %s for batch %d; each batch now collects them", checkpoint, batch_id)
            ends = {int(row["partition"]): int(row["end"]) for row in batch_df.collect()}
        outcome = run_batch(spark, settings, ends, open_windows, tables)
        memory.check()
        if outcome is not None and progress is not None:
            progress(outcome)

    return (
        spark.readStream.format("lakelog")
        .option("root", settings.root)
        .option("topic", settings.topic)
        .option("maxRecordsPerBatch", str(settings.max_records_per_batch))
        .load()
        .writeStream.foreachBatch(each_batch)
        .queryName(f"speed-layer[{settings.topic}]")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger_seconds} seconds")
        .start()
    )


def idle_alerts(settings: LakeSettings, tables: LatestTables | None = None, store: Store | None = None) -> int:
    """Evaluate absence rules and ``LakeNoData`` at the wall clock if every record has been read (no batch to run:
    :func:`~metrics_lake.core.speed.alerting.evaluate_idle`); returns the transitions recorded."""
    now_ms = int(time.time() * 1000)  # before the log's ends are read: the moment the end was observed at the latest
    store = store or open_store(settings)
    rules = ConfigStore(store).current().alert_rules()
    return evaluate_idle(store, settings.topic, rules, AlertOptions.from_settings(settings), now_ms, tables)


def compaction_policy(settings: LakeSettings) -> CompactionPolicy:
    """The continuous compaction policy ``settings`` configure (``LAKE_COMPACTION_*``, ``LAKE_VACUUM_RETENTION_HOURS``)."""
    return CompactionPolicy(
        settings.compaction_target_bytes, settings.compaction_min_files, settings.vacuum_retention_hours
    )


def compact(
    settings: LakeSettings,
    *,
    vacuum: bool = False,
    tables: LatestTables | None = None,
    store: Store | None = None,
    commit_slot: CommitSlot | None = None,
    stop: threading.Event | None = None,
) -> CompactionRound:
    """One round of continuous compaction of the speed tables (and VACUUM with ``vacuum``), closed windows being those
    before the windows table's watermark (:func:`~metrics_lake.core.maintenance.continuous_compaction.compact_speed_tables`:
    its commits in ``commit_slot``, at once without one; ``stop`` ends it before its next table).

    The log's segments are not the stream's to merge: it may only read ``log/`` (``lake compact --log-only`` and
    the compaction DAG do, with write access there). Afterwards the process gives the memory malloc keeps free
    back to the system (:func:`~metrics_lake.core.arrow_memory.release_freed_memory`)."""
    store = store or open_store(settings)
    tables = tables or LatestTables()
    watermark_ms = tables.latest(store, Table.METRIC_WINDOWS_1M).transaction_version(watermark_app_id(settings.topic))
    try:
        return compact_speed_tables(
            store,
            compaction_policy(settings),
            sealed_before_us=None if watermark_ms is None else watermark_ms * 1000,
            vacuum=vacuum,
            tables=tables,
            commit_slot=commit_slot,
            stop=stop,
        )
    finally:
        # A round's merges are this process's largest, rarest allocations: malloc keeps freed memory for the
        # next batch (metrics_lake.core.arrow_memory), and would keep their peak resident for good.
        release_freed_memory()


class CompactionWorker:
    """Continuous compaction beside a running stream: a round (:func:`compact`) every
    ``LAKE_COMPACTION_INTERVAL_SECONDS`` after the last one ended, with VACUUM every
    ``LAKE_VACUUM_INTERVAL_SECONDS``, on a thread of its own; each commit of a round through the stream's
    ``gate`` (:meth:`BatchGate.run`), between two batches.

    Why not the whole round between batches: a round that merges a size
    tier of large files takes seconds (8.4 s for 8 window files at minute 59
    of the 2-hour soak, docs/performance.md), and run between batches it
    stalled the stream that long; its commit takes milliseconds. The merge's
    work is Parquet decoding and encoding, which releases the GIL. A round
    that fails is logged and tried again at the next interval. It has its
    own store and snapshots (:class:`~metrics_lake.core.tables.delta.LatestTables`
    is not for concurrent use).
    """

    #: How long :meth:`close` waits for a round under way (seconds): a merge group is written within the
    #: maintenance lease's 30 s; one still running after this is abandoned (nothing committed; VACUUM removes
    #: its files).
    CLOSE_TIMEOUT_S = 60.0

    def __init__(self, settings: LakeSettings, gate: BatchGate) -> None:
        self._settings = settings
        self._gate = gate
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lake-continuous-compaction", daemon=True)

    def start(self) -> CompactionWorker:
        """Start the rounds; returns self."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the rounds: the one under way ends after its current table, within :attr:`CLOSE_TIMEOUT_S`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("a compaction round was still merging at exit; it committed nothing (VACUUM removes it)")

    def _run(self) -> None:
        settings = self._settings
        tables, store = LatestTables(), open_store(settings)
        last_vacuum = time.monotonic()
        while not self._stop.wait(settings.compaction_interval_seconds):
            vacuum_every = settings.vacuum_interval_seconds
            vacuum = bool(vacuum_every) and time.monotonic() - last_vacuum >= vacuum_every
            try:
                compact(
                    settings, vacuum=vacuum, tables=tables, store=store, commit_slot=self._gate.run, stop=self._stop
                )
            except Exception:  # noqa: BLE001 - a failed round is retried at the next interval
                log.warning(
                    "continuous compaction failed; retried in %.0f s",
                    settings.compaction_interval_seconds,
                    exc_info=True,
                )
                continue
            if vacuum:
                last_vacuum = time.monotonic()


def catch_up(spark, settings: LakeSettings, progress: Callable[[BatchOutcome], None] | None = None) -> int:
    """Process what the log holds now, in micro-batches of at most ``settings.max_records_per_batch``; returns batches run.

    The batches are the streaming query's (:func:`run_batch`), bounded the
    same way (:func:`~metrics_lake.spark.datasources.log_source.limit_offsets`)
    from the lowest position the tables hold up to the log's end offsets
    when it starts. Exactly once holds as for the query: each table commits
    its records with its positions, and a batch plans from those positions,
    so a run killed anywhere is completed by the next one, whatever batch
    bounds either chose. ``progress`` gets every committed batch's outcome.
    After a batch the memory malloc keeps free is given back once it passes
    ``LAKE_FREED_MEMORY_KEEP_BYTES`` (:class:`~metrics_lake.core.arrow_memory.FreedMemoryBudget`).
    """
    store = prepare_lake(settings)
    begin = starting_offsets(store, settings.topic)
    target = end_offsets(SegmentLog(store), settings.topic)
    batches, open_windows, tables = 0, OpenWindows(), LatestTables()
    memory = FreedMemoryBudget(settings.freed_memory_keep_bytes)
    while (ends := limit_offsets(begin, target, settings.max_records_per_batch)) != begin:
        outcome = run_batch(spark, settings, ends, open_windows, tables)
        memory.check()
        batches += 1
        if outcome is not None and progress is not None:
            progress(outcome)
        begin = ends
    idle_alerts(settings, tables, store)  # caught up: silent servers are judged at the time the run ended
    if settings.compaction_interval_seconds > 0:
        compact(settings, tables=tables, store=store)
    return batches


def run_stream(
    spark,
    settings: LakeSettings,
    *,
    once: bool,
    stop: threading.Event | None = None,
    progress: Callable[[BatchOutcome], None] | None = None,
    alerted: Callable[[], None] | None = None,
) -> None:
    """Run the speed layer; with ``once``, until all available data is processed.

    ``once`` runs micro-batches back to back until they have caught up with
    the log as it was at the start (:func:`catch_up`); a failed batch raises
    its Spark job's error (a ``pyspark.errors.PySparkException``). Without
    ``once`` it runs the streaming query every ``settings.trigger_seconds``
    until ``stop`` is set (a signal handler sets it: raising inside a
    blocking py4j call could break the JVM gateway) or the query fails,
    raising ``pyspark.errors.StreamingQueryException``. Once ``stop`` is
    set, the batch in flight commits and no other starts (:class:`BatchGate`).

    Between batches, once per trigger interval (at least a second), the
    stream does its idle work through the same gate: it evaluates absence
    rules and ``LakeNoData`` (:func:`idle_alerts`), so a log that gets no
    record at all still fires them (``alerted`` is called when that recorded
    transitions: the alert relay's ``wake``); an idle step that fails is
    logged and tried again at the next trigger. Continuous compaction runs
    beside the batches (:class:`CompactionWorker`, unless
    ``LAKE_COMPACTION_INTERVAL_SECONDS`` is 0).
    """
    if once:
        catch_up(spark, settings, progress)
        return
    stop = stop or threading.Event()
    gate = BatchGate(stop)
    query = start_stream(spark, settings, trigger_seconds=settings.trigger_seconds, progress=progress, gate=gate)
    idle_tables = LatestTables()  # the idle work's own: LatestTables is not for concurrent use
    idle_store = open_store(settings)
    every = max(settings.trigger_seconds, 1.0)
    last_idle = time.monotonic()
    compaction = CompactionWorker(settings, gate).start() if settings.compaction_interval_seconds > 0 else None

    def idle() -> None:
        if idle_alerts(settings, idle_tables, idle_store) and alerted is not None:
            alerted()

    try:
        # This query's termination: the session's awaitAnyTermination returns at once after any earlier query ended.
        while not stop.is_set() and not query.awaitTermination(min(every, 1.0)):
            if time.monotonic() - last_idle >= every:
                last_idle = time.monotonic()
                try:
                    gate.run(idle)
                except Exception:  # noqa: BLE001 - idle work that fails is retried at the next trigger
                    log.warning("idle alert evaluation failed; retried at the next trigger", exc_info=True)
        if query.exception() is not None:
            raise query.exception()
    finally:
        gate.close()
        if compaction is not None:
            compaction.close()
        if query.isActive:
            query.stop()
