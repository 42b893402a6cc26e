"""The speed layer end to end: exact bronze set, quarantine, windows vs an independent computation."""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
import time
from itertools import pairwise

import pyarrow as pa
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.windows import QUANTILES
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.batch_plan import plan_batch
from metrics_lake.core.speed.chunk_processing import process_partition
from metrics_lake.core.tables.delta import open_table
from metrics_lake.spark.jobs.stream_metrics import (
    catch_up,
    checkpoint_location,
    discard_damaged_checkpoint,
    logged_ends,
    process_on_executors,
    run_stream,
    start_stream,
)
from tests.helpers import assert_quantile_within_bound, expected_windows
from tests.lake_schemas.test_contract import INVALID as CONTRACT_CASES

pytestmark = pytest.mark.spark
START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 60_000  # a minute boundary (2025-11-20), in the past: event
# times beyond append time + clock skew do not move the watermark (metrics_lake.core.speed.micro_batch)

#: One payload per quarantine reason code, with the code expected.
INVALID = dict(CONTRACT_CASES)


def produced_rows(log, topic="metrics") -> pa.Table:
    return pa.concat_tables(read_range(log, topic, p, 0, end) for p, end in end_offsets(log, topic).items())


def table_rows(store, name: str) -> list[dict]:
    return open_table(store, name).to_pyarrow_table().to_pylist()


def check_windows(store, produced: pa.Table) -> int:
    expected = expected_windows(produced)
    rows = table_rows(store, "metric_windows_1m")
    actual = {(r["metric"], r["server"], int(r["window_start"].timestamp() * 1000)): r for r in rows}
    assert len(rows) == len(actual), "a window has more than one row"
    assert actual.keys() == expected.keys()
    for key, want in expected.items():
        got = actual[key]
        assert (got["count"], got["min"], got["max"]) == (want["count"], want["min"], want["max"]), key
        assert math.isclose(got["sum"], want["sum"], rel_tol=1e-12), key
        assert math.isclose(got["avg"], want["sum"] / want["count"], rel_tol=1e-12), key
        assert got["window_end"] - got["window_start"] == dt.timedelta(minutes=1)
        assert got["event_date"] == got["window_start"].date()
        for column, q in QUANTILES:
            assert_quantile_within_bound(want["sorted"], q, got[column])
    return len(expected)


#: The tables a batch commits, in order (BatchOutcome.stages names them).
TABLES_IN_COMMIT_ORDER = [
    "bronze_events",
    "quarantine_events",
    "metric_windows_1m",
    "query_results",
    "last_seen",
    "alerts",
]


def test_stream_once_gives_exact_bronze_quarantine_and_windows(spark, settings, log, store):
    # 300 samples per window (rate 5/s): many per sketch bucket.
    sim = FleetSimulator(servers=6, metrics=4, seconds=180, rate=5.0, seed=11, start_ms=START_MS)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(sim.generate())
        producer.send_payloads(list(INVALID))
    produced = produced_rows(log)

    outcomes = []
    run_stream(spark, settings, once=True, progress=outcomes.append)

    # Each batch says where its time went, step by step, and the steps add up to no more than the batch.
    assert [list(o.stages) for o in outcomes] == [
        ["plan", "tasks", *TABLES_IN_COMMIT_ORDER[:2], "windows merge", *TABLES_IN_COMMIT_ORDER[2:]]
    ]
    assert all(s >= 0 for s in outcomes[0].stages.values())
    assert sum(outcomes[0].stages.values()) <= outcomes[0].seconds + 1e-6
    bronze = table_rows(store, "bronze_events")
    positions = [(r["topic"], r["partition"], r["offset"]) for r in bronze]
    valid = produced.filter(produced.column("reason").is_null())
    assert len(positions) == len(set(positions)) == valid.num_rows == sim.total_events
    assert set(positions) == set(
        zip(
            valid.column("topic").to_pylist(),
            valid.column("partition").to_pylist(),
            valid.column("offset").to_pylist(),
            strict=True,
        )
    )
    assert {r["event_date"] for r in bronze} == {dt.datetime.fromtimestamp(START_MS / 1000, dt.UTC).date()}

    quarantine = table_rows(store, "quarantine_events")
    assert len(quarantine) == len(INVALID) == 9
    assert {r["raw"]: r["reason"].split(":")[0] for r in quarantine} == INVALID
    invalid_positions = {(r["topic"], r["partition"], r["offset"]) for r in quarantine}
    assert not invalid_positions & set(positions)  # each event in exactly one of the two tables

    assert check_windows(store, produced) == 6 * 4 * 3

    # Nothing new: a second run commits nothing anywhere.
    versions = {name: open_table(store, name).version() for name in ("bronze_events", "metric_windows_1m")}
    run_stream(spark, settings, once=True)
    assert {name: open_table(store, name).version() for name in versions} == versions


def test_a_batch_runs_as_many_tasks_as_cores_each_taking_whole_partitions_in_order(spark, settings, log, store):
    """4 log partitions on ``local[2]``: one job of 2 tasks, and the chunk results of each partition, in partition
    and offset order, equal to processing the partitions in this process."""
    sim = FleetSimulator(servers=8, metrics=2, seconds=60, seed=12, start_ms=START_MS)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(sim.generate())
    ends = end_offsets(log, settings.topic)
    plan = plan_batch(store, settings.topic, ends, watermark_seconds=120, chunk_records=100)
    assert len(plan.partition_chunks()) == settings.partitions == 4

    spark.sparkContext.setJobGroup("grouped-partitions", "test")
    try:
        results = process_on_executors(spark, settings, plan)
    finally:
        spark.sparkContext.setJobGroup("", "")

    tracker = spark.sparkContext.statusTracker()
    (job,) = tracker.getJobIdsForGroup("grouped-partitions")
    (stage,) = tracker.getJobInfo(job).stageIds
    assert tracker.getStageInfo(stage).numTasks == spark.sparkContext.defaultParallelism == 2
    local = [
        r for p in sorted(plan.partition_chunks()) for r in process_partition(store, plan, p, clock_skew_seconds=300)
    ]
    assert len(results) == len(local) == len(plan.chunks)
    for got, want in zip(results, local, strict=True):
        assert got.counts == want.counts and got.states.equals(want.states) and got.touched == want.touched
    assert sum(r.counts["bronze_events"] for r in results) == sim.total_events


def test_windows_are_upserted_as_more_data_arrives_across_runs_and_batches(spark, settings, log, store):
    settings = settings.model_copy(update={"max_records_per_batch": 700})  # several micro-batches per run
    first = FleetSimulator(servers=3, metrics=2, seconds=90, rate=2.0, seed=1, start_ms=START_MS)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(first.generate())
    run_stream(spark, settings, once=True)
    check_windows(store, produced_rows(log))
    batches = [
        h for h in open_table(store, "metric_windows_1m").history() if h.get("lake.operation") == "STREAMING WINDOWS"
    ]
    assert len(batches) >= 2  # 1,080 events at <= 700 per micro-batch: at least two batches upserted windows

    # Same servers and metrics, continuing into the same last window and beyond.
    second = FleetSimulator(servers=3, metrics=2, seconds=60, rate=2.0, seed=2, start_ms=START_MS + 90_000)
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(second.generate())
    run_stream(spark, settings, once=True)
    assert check_windows(store, produced_rows(log)) == 3 * 2 * 3
    assert check_windows(store, produced_rows(log)) == 3 * 2 * 3  # still exact after rewriting window files


def test_events_later_than_the_watermark_reach_bronze_but_not_windows(spark, settings, log, store):
    settings = settings.model_copy(update={"watermark_seconds": 60})
    recent = FleetSimulator(servers=1, metrics=1, seconds=60, seed=3, start_ms=START_MS + 600_000).generate()
    late = {"ts": START_MS + 1_000, "server": "sim-0000", "metric": "host.cpu.utilization", "value": 50.0}
    with Producer(log, settings.topic, partitions=1) as producer:
        producer.send(recent)
    run_stream(spark, settings, once=True)  # watermark now ~START+11min - 60 s
    with Producer(log, settings.topic, partitions=1) as producer:
        producer.send_payloads([json.dumps(late)])
    run_stream(spark, settings, once=True)
    assert len(table_rows(store, "bronze_events")) == recent.num_rows + 1
    windows = table_rows(store, "metric_windows_1m")
    assert sum(w["count"] for w in windows) == recent.num_rows
    assert all(int(w["window_start"].timestamp() * 1000) >= START_MS + 600_000 for w in windows)


def test_a_failing_batch_surfaces_as_a_spark_error_in_both_modes(spark, settings, log, store):
    from pyspark.errors import PySparkException, StreamingQueryException

    log.ensure_topic(settings.topic, 1)
    with Producer(log, settings.topic, partitions=1) as producer:
        producer.send(FleetSimulator(servers=1, metrics=1, seconds=5, start_ms=START_MS).generate())
    # Corrupt the only segment: reading it must fail loudly, not yield nothing.
    segment = next(store.path(f"log/{settings.topic}/0").glob("*.parquet"))
    segment.chmod(0o644)
    segment.write_bytes(b"garbage")
    with pytest.raises(PySparkException, match="Parquet"):  # --once: the failed Spark job's error
        run_stream(spark, settings, once=True)
    with pytest.raises(StreamingQueryException, match="Parquet"):
        stream_to_end(spark, settings)


def assert_exactly_once(store, log) -> None:
    """Every valid record in bronze once, every reject in quarantine once, windows equal an independent computation."""
    produced = produced_rows(log)
    valid = produced.filter(produced.column("reason").is_null())
    bronze = [(r["topic"], r["partition"], r["offset"]) for r in table_rows(store, "bronze_events")]
    assert len(bronze) == len(set(bronze)) == valid.num_rows
    rejects = produced.num_rows - valid.num_rows
    quarantine = [(r["topic"], r["partition"], r["offset"]) for r in table_rows(store, "quarantine_events")]
    assert len(quarantine) == len(set(quarantine)) == rejects
    check_windows(store, produced)


def stream_to_end(spark, settings, progress=None):
    """The streaming query (not `--once`, which runs without one), run until it caught up with the log, then stopped."""
    query = start_stream(spark, settings, trigger_seconds=0, progress=progress)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return query


def batch_ids(settings) -> list[int]:
    """The micro-batches Spark logged offsets for in the speed layer's checkpoint, in order."""
    offsets = checkpoint_location(settings) / "offsets"
    return sorted(int(f.name) for f in offsets.iterdir() if f.name.isdigit()) if offsets.exists() else []


def test_each_batch_reads_up_to_the_ends_spark_logged_without_a_spark_job_of_its_own(
    spark, settings, log, store, monkeypatch
):
    from pyspark.sql.classic.dataframe import DataFrame

    settings = settings.model_copy(update={"max_records_per_batch": 150})
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=3, metrics=2, seconds=60, seed=3, start_ms=START_MS).generate())
    collected = []
    collect = DataFrame.collect
    monkeypatch.setattr(DataFrame, "collect", lambda df: collected.append(df) or collect(df))
    batches = []
    stream_to_end(spark, settings, progress=batches.append)

    assert collected == []  # no batch asked Spark for its rows
    checkpoint = checkpoint_location(settings)
    ends = [logged_ends(checkpoint, batch) for batch in batch_ids(settings)]
    assert ends[-1] == end_offsets(log, settings.topic)
    # Each batch read exactly from the previous batch's logged ends to its own (none read twice, none skipped).
    totals = [0] + [sum(batch_ends.values()) for batch_ends in ends]
    assert [outcome.records for outcome in batches] == [b - a for a, b in pairwise(totals)]
    assert len(batches) == 3 and all(outcome.records <= 150 for outcome in batches)  # 360 records
    assert_exactly_once(store, log)


def test_without_readable_logged_ends_each_batch_collects_its_rows_and_warns_once(
    spark, settings, log, store, monkeypatch, caplog
):
    from metrics_lake.spark.jobs import stream_metrics

    settings = settings.model_copy(update={"max_records_per_batch": 150})
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=3, metrics=2, seconds=60, seed=4, start_ms=START_MS).generate())
    monkeypatch.setattr(stream_metrics, "logged_ends", lambda checkpoint, batch_id: None)  # another Spark's format
    batches = []
    with caplog.at_level("WARNING", logger=stream_metrics.__name__):
        stream_to_end(spark, settings, progress=batches.append)
    assert [outcome.records for outcome in batches] == [150, 150, 60]
    assert len([r for r in caplog.records if "each batch now collects them" in r.getMessage()]) == 1
    assert_exactly_once(store, log)


def test_a_stop_during_a_batch_lets_it_commit_and_starts_no_other(spark, settings, log, store, monkeypatch):
    """The signal (``stop``) arrives while a batch runs: run_stream returns only once that batch has committed, the
    query runs no further batch, and the next run reads the rest from the tables' positions, exactly once."""
    from metrics_lake.spark.jobs import stream_metrics

    settings = settings.model_copy(update={"max_records_per_batch": 150, "trigger_seconds": 0.01})
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=3, metrics=2, seconds=60, seed=5, start_ms=START_MS).generate())
    stop, batches = threading.Event(), []
    real_run_batch = stream_metrics.run_batch

    def signalled_mid_batch(*args, **kwargs):
        stop.set()  # as the signal handler would; run_stream polls it every second
        time.sleep(2.5)
        return real_run_batch(*args, **kwargs)

    monkeypatch.setattr(stream_metrics, "run_batch", signalled_mid_batch)
    run_stream(spark, settings, once=False, stop=stop, progress=batches.append)
    assert [outcome.records for outcome in batches] == [150]  # committed before run_stream returned; no other
    assert open_table(store, "bronze_events").to_pyarrow_table().num_rows == 150
    monkeypatch.setattr(stream_metrics, "run_batch", real_run_batch)
    stream_to_end(spark, settings, progress=batches.append)
    assert [outcome.records for outcome in batches] == [150, 150, 60]
    assert_exactly_once(store, log)


V1_METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1795595314031,"conf":{"spark.sql.shuffle.partitions":"4"}}'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'v1\n{V1_METADATA}\n{{"0": 6000, "1": 0, "2": 17, "3": 6000}}', {0: 6000, 1: 0, 2: 17, 3: 6000}),
        (f'v1\n{V1_METADATA}\n{{"0": 6000}}\n', {0: 6000}),
        (f'v2\n{V1_METADATA}\n{{"0": 6000}}', None),  # a version this does not know
        (f'v1\n{V1_METADATA}\n{{"0": 6000}}\n{{"0": 1}}', None),  # two sources
        (f"v1\n{V1_METADATA}\n-", None),  # a source without an offset
        (f"v1\n{V1_METADATA}\n{{}}", None),
        (f'v1\n{V1_METADATA}\n{{"zero": 6000}}', None),
        (f'v1\n{V1_METADATA}\n{{"0": -1}}', None),
        (f"v1\n{V1_METADATA}\n[6000]", None),
        ("v1", None),
        (b"v1\n\xff\xfe\n{}", None),
    ],
)
def test_logged_ends_reads_sparks_v1_offset_log_and_nothing_else(tmp_path, text, expected):
    (tmp_path / "offsets").mkdir()
    target = tmp_path / "offsets" / "7"
    target.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert logged_ends(tmp_path, 7) == expected
    assert logged_ends(tmp_path, 8) is None  # not logged


def test_checkpoints_spark_would_refuse_are_deleted_and_no_other(tmp_path):
    """Spark refuses a checkpoint whose offset or commit log holds files once ``metadata`` is gone, and one that
    logged no batch but holds anything in ``offsets``, ``commits`` or ``state`` (a SIGKILL while the first offset
    file was written leaves its temporary file); those are deleted. A whole one, a fresh one Spark created (empty
    logs) and a missing folder are left as they are."""
    whole = tmp_path / "whole"
    (whole / "offsets").mkdir(parents=True)
    (whole / "metadata").write_text('{"id":"q"}')
    (whole / "offsets" / "0").write_text("v1")
    (whole / "offsets" / ".1.3f1c.tmp").write_text("")  # a later batch's offsets being written: Spark ignores it
    fresh = tmp_path / "fresh"
    for log_dir in ("offsets", "commits"):
        (fresh / log_dir).mkdir(parents=True)
    (fresh / "metadata").write_text('{"id":"q"}')
    damaged = {
        "no-metadata-offsets": {"offsets/3": "v1"},
        "no-metadata-commits": {"commits/3": "v1"},
        "killed-writing-batch-0": {"metadata": '{"id":"q"}', "offsets/.0.9d2e4c1a.tmp": ""},
        "commit-without-offsets": {"metadata": '{"id":"q"}', "commits/0": "v1"},
        "state-without-offsets": {"metadata": '{"id":"q"}', "state/0/0/1.delta": ""},
    }
    for name, files in damaged.items():
        for relative, text in files.items():
            (tmp_path / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / relative).write_text(text)
        assert discard_damaged_checkpoint(tmp_path / name) is True, name
        assert not (tmp_path / name).exists()
    assert discard_damaged_checkpoint(whole) is False
    assert discard_damaged_checkpoint(fresh) is False
    assert discard_damaged_checkpoint(tmp_path / "missing") is False
    assert (whole / "offsets" / "0").exists() and (fresh / "metadata").exists()


@pytest.mark.slow
def test_losing_the_checkpoint_at_any_point_neither_loses_nor_duplicates(spark, settings, log, store):
    """The issue's reproduction (delete LAKE_CHECKPOINT_DIR between runs) and its variants: a checkpoint lost
    between batches, an older checkpoint restored, another query's checkpoint. The tables' positions decide."""
    import shutil

    settings = settings.model_copy(update={"max_records_per_batch": 150})  # 361 records per produce: several batches
    checkpoint = settings.checkpoint_path

    def produce(seed: int, start_ms: int) -> None:
        with Producer(log, settings.topic, partitions=settings.partitions) as producer:
            producer.send(FleetSimulator(servers=3, metrics=2, seconds=60, seed=seed, start_ms=start_ms).generate())
            producer.send_payloads(['{"bad": true}'])

    produce(1, START_MS)
    stream_to_end(spark, settings)
    shutil.rmtree(checkpoint)  # 1. lost after a complete run: the next run starts where the tables are
    stream_to_end(spark, settings)
    assert_exactly_once(store, log)

    saved = checkpoint.with_name("saved-checkpoint")
    shutil.copytree(checkpoint, saved)
    produce(2, START_MS + 60_000)
    batches = []
    stream_to_end(spark, settings, progress=batches.append)
    assert len(batches) >= 2
    shutil.rmtree(checkpoint)
    shutil.copytree(saved, checkpoint)  # 2. an older checkpoint restored: the tables are ahead of it
    produce(4, START_MS + 90_000)
    restored = set(batch_ids(settings))
    stream_to_end(spark, settings)
    assert_exactly_once(store, log)
    # 361 new records in batches of 150, from where the tables are: not 2 more batches for what they hold
    assert len(set(batch_ids(settings)) - restored) == 3

    produce(5, START_MS + 100_000)  # 2b. `--once` (no streaming query) between runs of the query, then the query
    assert catch_up(spark, settings) >= 2
    produce(6, START_MS + 110_000)
    stream_to_end(spark, settings)
    assert_exactly_once(store, log)

    produce(3, START_MS + 120_000)
    stop_after_first = settings.model_copy(update={"max_records_per_batch": 300})
    query = start_stream(spark, stop_after_first, trigger_seconds=0)
    deadline = time.monotonic() + 120
    while not query.recentProgress and time.monotonic() < deadline:  # 3. lost between batches, mid-run
        time.sleep(0.1)
    query.stop()
    shutil.rmtree(checkpoint)
    other = settings.model_copy(update={"checkpoint_dir": str(checkpoint.parent / "someone-elses")})
    stream_to_end(spark, other)  # 4. another query's checkpoint (here: an empty one elsewhere)
    stream_to_end(spark, settings)
    assert_exactly_once(store, log)

    produce(7, START_MS + 130_000)
    stream_to_end(spark, settings)
    (checkpoint_location(settings) / "metadata").unlink()  # 5. lost in part: Spark alone would refuse to start
    produce(8, START_MS + 140_000)
    stream_to_end(spark, settings)
    assert_exactly_once(store, log)


def test_a_stream_killed_while_spark_wrote_its_first_offsets_restarts_exactly_once(spark, settings, log, store):
    """A SIGKILL while Spark wrote ``offsets/0`` leaves its metadata and the temporary offsets file; Spark refuses to
    start from that (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``) until the checkpoint is deleted, so the stream
    deletes it and the restart lands every record once."""
    with Producer(log, settings.topic, partitions=settings.partitions) as producer:
        producer.send(FleetSimulator(servers=3, metrics=2, seconds=60, seed=5, start_ms=START_MS).generate())
    checkpoint = checkpoint_location(settings)
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id":"6f0f8c1e-3b1a-4c53-9a57-1f2d1e0c4b7d"}\n')
    (checkpoint / "offsets" / ".0.5e0b6a3f-2f4e-4a8e-9d0c-6a1b2c3d4e5f.tmp").write_bytes(b"")
    batches = []
    stream_to_end(spark, settings, progress=batches.append)
    assert sum(outcome.records for outcome in batches) == 360
    assert batch_ids(settings)[0] == 0
    assert_exactly_once(store, log)
