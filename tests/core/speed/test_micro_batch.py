"""The speed layer's exactly-once commit path, without Spark: positions held by the tables decide everything.

Batches run in this process (:func:`run_batch_in_process`); the Spark job
runs the same plan/process/commit steps in tasks (tests/spark/).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.kernels.windows import QUANTILES, WINDOW_STATE, series_shards
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.maintenance.table_compaction import compact_table
from metrics_lake.core.speed import chunk_processing, progress
from metrics_lake.core.speed.batch_plan import BRONZE, QUARANTINE, QUERIES, WINDOWS, plan_batch
from metrics_lake.core.speed.chunk_processing import process_partition, split_log_rows
from metrics_lake.core.speed.micro_batch import commit_batch, run_batch_in_process
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import CONSUMER, starting_offsets
from metrics_lake.core.speed.table_commits import query_results as query_results_commit
from metrics_lake.core.speed.table_commits import windows as windows_commit
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.commits import commit_changes, committed_offsets, remove_action
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import LatestTables, open_table
from metrics_lake.core.tables.snapshots import read_data_files, snapshot_files
from metrics_lake.lake_schemas.errors import ConcurrentWriterError
from metrics_lake.lake_schemas.log_records import with_dictionaries
from metrics_lake.lake_schemas.tables import (
    BRONZE_EVENTS,
    METRIC_WINDOWS_1M,
    QUARANTINE_EVENTS,
    QUERY_RESULTS,
    Table,
    table_spec,
)
from tests.helpers import assert_quantile_within_bound, expected_windows, positions

START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 60_000  # a past minute boundary
TOPIC = "metrics"


def produce(log, events: pa.Table | None = None, payloads: list[str] | None = None, partitions=4) -> None:
    with Producer(log, TOPIC, partitions=partitions, roll_bytes=30_000) as producer:
        if events is not None:
            producer.send(events)
        if payloads:
            producer.send_payloads(payloads)


def batch(store, ends=None, watermark_seconds=120, **options):
    ends = ends if ends is not None else end_offsets(SegmentLog(store), TOPIC)
    return run_batch_in_process(
        store, TOPIC, ends, watermark_seconds=watermark_seconds, clock_skew_seconds=300, **options
    )


def produced(log) -> pa.Table:
    return pa.concat_tables(read_range(log, TOPIC, p, 0, end) for p, end in end_offsets(log, TOPIC).items())


def assert_exact(store, log) -> None:
    """Bronze holds every valid record once, quarantine every reject once, windows equal the events' windows."""
    rows = produced(log)
    valid = rows.filter(rows.column("reason").is_null())
    bronze = open_table(store, BRONZE).to_pyarrow_table()
    assert sorted(positions(bronze)) == sorted(positions(valid))
    rejects = rows.filter(rows.column("reason").is_valid())
    assert sorted(positions(open_table(store, QUARANTINE).to_pyarrow_table())) == sorted(positions(rejects))
    windows = open_table(store, WINDOWS).to_pyarrow_table().to_pylist()
    got = {(w["metric"], w["server"], int(w["window_start"].timestamp() * 1000)): w for w in windows}
    want = expected_windows(valid)
    assert got.keys() == want.keys()
    for key, expect in want.items():
        assert (got[key]["count"], got[key]["min"], got[key]["max"]) == (expect["count"], expect["min"], expect["max"])
        assert got[key]["sum"] == pytest.approx(expect["sum"], rel=1e-12)
        for column, q in QUANTILES:
            assert_quantile_within_bound(expect["sorted"], q, got[key][column])


def test_log_rows_split_into_bronze_and_quarantine_with_or_without_rejects(log):
    produce(log, FleetSimulator(servers=3, metrics=2, seconds=30, seed=5, start_ms=START_MS).generate(), partitions=1)
    clean = read_range(log, TOPIC, 0, 0, end_offsets(log, TOPIC)[0])
    produce(log, payloads=['{"no": "ts"}', "not json"], partitions=1)
    mixed = read_range(log, TOPIC, 0, 0, end_offsets(log, TOPIC)[0])
    for rows, rejects in ((clean, 0), (mixed, 2)):
        bronze, quarantine = split_log_rows(rows)
        assert bronze.schema == BRONZE_EVENTS and quarantine.schema == QUARANTINE_EVENTS
        assert bronze.column("offset").to_pylist() == list(range(clean.num_rows))
        assert quarantine.column("offset").to_pylist() == list(range(clean.num_rows, clean.num_rows + rejects))
        days = {ts.date() for ts in rows.column("ts").to_pylist() if ts is not None}
        assert set(bronze.column("event_date").to_pylist()) == days
        # Read with dictionaries (as the speed layer's tasks do): bronze keeps them, the same rows.
        coded = read_range(log, TOPIC, 0, 0, rows.num_rows, dictionaries=True)
        coded_bronze, coded_quarantine = split_log_rows(coded)
        assert coded_bronze.schema == with_dictionaries(BRONZE_EVENTS)
        assert coded_bronze.cast(BRONZE_EVENTS).equals(bronze) and coded_quarantine.equals(quarantine)


def test_touched_minutes_are_each_metrics_distinct_minutes_from_plain_or_dictionary_strings_over_any_span(log):
    produce(log, FleetSimulator(servers=4, metrics=3, seconds=200, seed=2, start_ms=START_MS).generate(), partitions=1)
    end = end_offsets(log, TOPIC)[0]
    # Read in three ranges: chunks with a dictionary each, as a speed-layer chunk of several segments is.
    coded = pa.concat_tables(
        [
            split_log_rows(read_range(log, TOPIC, 0, lo, hi, dictionaries=True))[0]
            for lo, hi in ((0, 7), (7, 300), (300, end))
        ]
    )
    plain = coded.cast(BRONZE_EVENTS)
    wide = pa.concat_tables(
        [
            plain,
            plain.slice(0, 5).set_column(
                3, "ts", pa.array([dt.datetime(2020, 1, 1, tzinfo=dt.UTC)] * 5, plain.schema.field("ts").type)
            ),
        ]
    )

    def independent(rows: pa.Table) -> dict[str, list[int]]:
        minutes: dict[str, set[int]] = {}
        for metric, ts in zip(rows.column("metric").to_pylist(), rows.column("ts").to_pylist(), strict=True):
            micros = int(ts.timestamp()) * 1_000_000
            minutes.setdefault(metric, set()).add(micros - micros % 60_000_000)
        return {metric: sorted(starts) for metric, starts in minutes.items()}

    want = independent(plain)
    assert len(want) == 3 and all(len(starts) == 4 for starts in want.values())  # 200 s from a minute boundary
    assert chunk_processing.touched_minutes(coded) == chunk_processing.touched_minutes(plain) == want
    # Six years between two minutes: sorted, not a table of every minute in between.
    assert chunk_processing.touched_minutes(wide) == independent(wide) != want
    assert chunk_processing.touched_minutes(plain.slice(0, 0)) == {}


def test_batches_in_any_split_give_exact_tables_and_a_replay_commits_nothing(store, log):
    events = FleetSimulator(servers=5, metrics=3, seconds=200, rate=2.0, seed=1, start_ms=START_MS).generate()
    produce(log, events, ['{"no": "ts"}', "not json"])
    ends = end_offsets(log, TOPIC)
    halves = {p: end // 2 for p, end in ends.items()}
    assert batch(store, halves, chunk_records=97).records == sum(halves.values())
    assert batch(store, ends, chunk_records=500).records == sum(ends.values()) - sum(halves.values())
    assert_exact(store, log)
    versions = {name: open_table(store, name).version() for name in (BRONZE, QUARANTINE, WINDOWS)}
    assert batch(store, ends) is None  # the same ends again: every table holds them already
    assert batch(store, halves) is None  # an older batch (a stale checkpoint): nothing either
    assert {name: open_table(store, name).version() for name in versions} == versions
    for name in (BRONZE, QUARANTINE, WINDOWS):  # a partition that never had a record has no position yet
        committed = committed_offsets(open_table(store, name), CONSUMER, TOPIC, ends)
        assert {p: position or 0 for p, position in committed.items()} == ends
    assert starting_offsets(store, TOPIC) == ends


def test_a_crash_between_table_commits_is_caught_up_without_duplicates(store, log, monkeypatch):
    produce(log, FleetSimulator(servers=3, metrics=2, seconds=120, seed=2, start_ms=START_MS).generate())
    real = windows_commit.upsert_windows

    def crash(*args, **kwargs):
        raise RuntimeError("killed after bronze and quarantine committed")

    monkeypatch.setattr(windows_commit, "upsert_windows", crash)
    with pytest.raises(RuntimeError):
        batch(store)
    monkeypatch.setattr(windows_commit, "upsert_windows", real)
    ends = end_offsets(log, TOPIC)
    bronze = committed_offsets(open_table(store, BRONZE), CONSUMER, TOPIC, ends)
    assert {p: position or 0 for p, position in bronze.items()} == ends
    assert starting_offsets(store, TOPIC) == {p: 0 for p in ends}  # windows hold nothing yet
    outcome = batch(store)  # re-reads the log for the windows only
    assert outcome.rows[BRONZE] == outcome.rows[QUARANTINE] == 0 and outcome.windows_written == 3 * 2 * 2
    assert_exact(store, log)


def test_a_batch_committed_twice_counts_once_and_a_moved_position_is_refused(store, log):
    produce(log, FleetSimulator(servers=2, metrics=2, seconds=30, seed=3, start_ms=START_MS).generate())
    first_ends = end_offsets(log, TOPIC)
    produce(log, FleetSimulator(servers=2, metrics=2, seconds=30, seed=4, start_ms=START_MS + 30_000).generate())
    all_ends = end_offsets(log, TOPIC)

    def planned(ends):
        plan = plan_batch(store, TOPIC, ends, watermark_seconds=120, chunk_records=1000)
        return plan, [
            r for p in plan.partition_chunks() for r in process_partition(store, plan, p, clock_skew_seconds=300)
        ]

    # Two attempts of the same batch (a lost commit response, a replayed batch): the second commits nothing.
    (plan, results), (again, again_results) = planned(first_ends), planned(first_ends)
    stale, stale_results = planned(all_ends)  # planned before either commit, reading further
    assert commit_batch(store, plan, results, watermark_seconds=120).rows[BRONZE] == sum(first_ends.values())
    assert commit_batch(store, again, again_results, watermark_seconds=120).rows == {
        BRONZE: 0,
        QUARANTINE: 0,
        Table.METRIC_WINDOWS_1M: 0,
        QUERIES: 0,
        Table.LAST_SEEN: 0,
        Table.ALERTS: 0,
    }
    # A plan whose starting positions another writer has since moved (two streams on one topic) is refused.
    with pytest.raises(ConcurrentWriterError, match="another speed layer committed positions"):
        commit_batch(store, stale, stale_results, watermark_seconds=120)
    batch(store)
    assert_exact(store, log)


@pytest.mark.parametrize("kept", [False, True], ids=["tables-opened-per-batch", "tables-kept-by-the-stream"])
def test_compaction_during_a_windows_commit_leaves_the_open_days_alone_and_nothing_doubles(
    store, log, monkeypatch, kept
):
    """delta-rs lets a commit remove a file a concurrent OPTIMIZE already removed (no conflict), which would
    duplicate rows; compaction therefore skips the days the speed layer may still rewrite (first_open_day)."""
    tables = LatestTables() if kept else None
    yesterday = START_MS - 86_400_000
    produce(log, FleetSimulator(servers=3, metrics=2, seconds=150, seed=5, start_ms=yesterday).generate())
    batch(store, tables=tables)  # yesterday's minutes are still open: a file each
    produce(log, FleetSimulator(servers=3, metrics=2, seconds=150, seed=6, start_ms=START_MS).generate())
    batch(store, tables=tables)  # the watermark is now on START's day: yesterday is closed
    open_day = progress.first_open_day(store)
    assert open_day == dt.datetime.fromtimestamp(START_MS / 1000, dt.UTC).date()
    produce(log, FleetSimulator(servers=3, metrics=2, seconds=60, seed=7, start_ms=START_MS + 120_000).generate())
    real = windows_commit.commit_changes
    compacted = []

    def compaction_meanwhile(table, name, *args, **kwargs):
        if name == WINDOWS and not compacted:  # runs between the batch's planning and its windows commit
            compacted.append(compact_table(store, WINDOWS, target_bytes=1 << 20))  # finds the open day itself
        return real(table, name, *args, **kwargs)

    monkeypatch.setattr(windows_commit, "commit_changes", compaction_meanwhile)
    batch(store, tables=tables)
    assert compacted[0].partitions_rewritten == 1  # yesterday's minute files merged; today's left alone
    assert_exact(store, log)


def test_a_stream_keeping_its_tables_open_plans_and_commits_on_what_other_writers_committed(store, log):
    """A stream keeps its tables open from one batch to the next (:class:`LatestTables`): another stream's
    commits in between still refuse its stale plan, and its next batch starts where the other one stopped."""
    ends = []
    for part in range(3):
        start_ms = START_MS + part * 30_000
        produce(log, FleetSimulator(servers=2, metrics=2, seconds=30, seed=8 + part, start_ms=start_ms).generate())
        ends.append(end_offsets(log, TOPIC))
    kept = LatestTables()
    assert batch(store, ends[0], tables=kept).rows[BRONZE] == sum(ends[0].values())
    stale = plan_batch(store, TOPIC, ends[2], watermark_seconds=120, chunk_records=1000, tables=kept)
    results = [r for p in stale.partition_chunks() for r in process_partition(store, stale, p, clock_skew_seconds=300)]

    assert batch(store, ends[1]).records == sum(ends[1].values()) - sum(ends[0].values())  # another stream
    with pytest.raises(ConcurrentWriterError, match="another speed layer committed positions"):
        commit_batch(store, stale, results, watermark_seconds=120, tables=kept)
    outcome = batch(store, tables=kept)

    assert outcome.records == sum(ends[2].values()) - sum(ends[1].values())  # from where the other one stopped
    assert_exact(store, log)


def test_the_watermark_leaves_out_late_events_and_ignores_clocks_in_the_future(store, log):
    now_ms = int(time.time() * 1000) // 60_000 * 60_000
    recent = FleetSimulator(servers=1, metrics=1, seconds=60, seed=7, start_ms=now_ms - 600_000).generate()
    produce(log, recent, partitions=1)
    future = {"ts": now_ms + 86_400_000 * 365, "server": "sim-0000", "metric": "host.cpu.utilization", "value": 1.0}
    produce(log, payloads=[json.dumps(future)], partitions=1)
    batch(store, watermark_seconds=60)
    # The year-ahead event moved the newest event time only to its append time + 300 s of clock skew.
    watermark = open_table(store, WINDOWS).transaction_version(progress.watermark_app_id(TOPIC))
    assert now_ms - 60_000 <= watermark <= int(time.time() * 1000) + 300_000 - 60_000
    assert progress.first_open_day(store) == dt.datetime.fromtimestamp(watermark / 1000, dt.UTC).date()
    late = {"ts": now_ms - 3_600_000, "server": "sim-0000", "metric": "host.cpu.utilization", "value": 2.0}
    on_time = {"ts": watermark + 1_000, "server": "sim-0000", "metric": "host.cpu.utilization", "value": 3.0}
    produce(log, payloads=[json.dumps(late), json.dumps(on_time)], partitions=1)
    outcome = batch(store, watermark_seconds=60)
    assert outcome.late_events == 1 and outcome.rows[BRONZE] == 2
    windows = open_table(store, WINDOWS).to_pyarrow_table(columns=["count"]).column("count").to_pylist()
    assert sum(windows) == recent.num_rows + 2  # the future event and the on-time one; not the late one


def test_kept_open_windows_give_the_tables_reading_gives_and_files_they_do_not_hold_are_read(
    store, log, tmp_path, monkeypatch
):
    """A stream keeps the rows of the open-window files it committed (OpenWindows), of ``metric_windows_1m`` and of
    ``query_results``, instead of reading them back: the same windows and query results as a speed layer that reads
    every file, batch after batch; after a restart, or once another writer rewrote a file it kept, the files are
    read again."""
    events = FleetSimulator(servers=4, metrics=3, seconds=200, rate=2.0, seed=31, start_ms=START_MS).generate()
    reading = LocalStore(str(tmp_path / "reading"))
    produce(log, events, ["not json"])
    produce(SegmentLog(reading), events, ["not json"])
    step, read_at = 0, {METRIC_WINDOWS_1M: [], QUERY_RESULTS: []}  # batches reading the kept lake's files whole
    real_read = {module: module.read_data_files for module in (windows_commit, query_results_commit)}

    for module in real_read:

        def read_data_files(read_store, files, schema, columns=None, module=module, **options):
            if read_store is store and schema in read_at and columns is None and files:
                read_at[schema].append(step)
            return real_read[module](read_store, files, schema, columns, **options)

        monkeypatch.setattr(module, "read_data_files", read_data_files)
    ends = end_offsets(log, TOPIC)
    kept = OpenWindows()
    for step in (1, 2, 3, 5, 8, 13, 21, 34):  # batches of a few seconds to a minute of events, out of 34 parts
        cut = {p: end * step // 34 for p, end in ends.items()}
        assert batch(store, cut, open_windows=kept).records == batch(reading, cut).records
        for name, paths in ((WINDOWS, kept.paths), (QUERIES, kept.result_paths)):
            assert paths and set(paths) <= {f.relative for f in snapshot_files(store, name, open_table(store, name))}
        if step == 8:  # another writer rewrites the files kept (as a compaction would)
            rewrite_files(store, WINDOWS, kept.paths)
            rewrite_files(store, QUERIES, kept.result_paths)
        if step == 21:
            kept = OpenWindows()  # a restarted stream holds nothing
    assert read_at[METRIC_WINDOWS_1M] == [13, 34]  # every other batch read no window file
    assert sorted(set(read_at[QUERY_RESULTS])) == [13, 34]  # nor a query_results file it would rewrite
    assert_exact(store, log)
    for name, clock, key in ((WINDOWS, "updated_at", ()), (QUERIES, "computed_at", ("query", "aggregate"))):
        tables = [open_table(s, name).to_pyarrow_table().drop_columns([clock]) for s in (store, reading)]
        order = [(c, "ascending") for c in (*key, "metric", "server", "window_start")]
        assert tables[0].num_rows > 0 and tables[0].sort_by(order).equals(tables[1].sort_by(order))


def test_a_large_upsert_is_merged_and_written_in_shards_of_series_giving_the_tables_one_thread_gives(
    store, log, tmp_path, monkeypatch
):
    """Above UPSERT_ROWS_PER_SHARD rows, the windows upsert splits the series into shards, each merged and written
    on a thread of its own: an open minute is one file per shard holding that shard's series, kept for the next
    batch and not read back; the tables equal those of a speed layer that upserts on one thread."""
    events = FleetSimulator(servers=6, metrics=3, seconds=200, rate=2.0, seed=41, start_ms=START_MS).generate()
    single = LocalStore(str(tmp_path / "single"))
    produce(log, events, ["not json"])
    produce(SegmentLog(single), events, ["not json"])
    threads, reads, lake = set(), [], [store]  # lake: the one batching now
    real_merge, real_read = windows_commit.merge_into_rows, windows_commit.read_data_files
    default_rows = windows_commit.UPSERT_ROWS_PER_SHARD

    def merge_into_rows(*args, **options):
        if lake[0] is store:
            threads.add(threading.current_thread().name)
        return real_merge(*args, **options)

    def read_data_files(read_store, files, schema, columns=None, **options):
        if read_store is store and schema is METRIC_WINDOWS_1M and columns is None and files:
            reads.append(len(files))
        return real_read(read_store, files, schema, columns, **options)

    monkeypatch.setattr(windows_commit, "merge_into_rows", merge_into_rows)
    monkeypatch.setattr(windows_commit, "read_data_files", read_data_files)
    monkeypatch.setattr(windows_commit, "UPSERT_THREADS", 3)
    ends, kept = end_offsets(log, TOPIC), OpenWindows()
    for step in (1, 2, 4, 7, 11):  # 18 series: every batch's rows make three shards of at least 4
        cut = {p: end * step // 11 for p, end in ends.items()}
        monkeypatch.setattr(windows_commit, "UPSERT_ROWS_PER_SHARD", 4)
        lake[0] = store
        assert batch(store, cut, open_windows=kept).records > 0
        monkeypatch.setattr(windows_commit, "UPSERT_ROWS_PER_SHARD", default_rows)
        lake[0] = single
        batch(single, cut)
        files = [f for f in snapshot_files(store, WINDOWS, open_table(store, WINDOWS)) if f.relative in kept.paths]
        by_start: dict[object, list[int]] = {}
        for rows in kept.rows_of(files):
            (shard,) = set(series_shards(rows.column("metric"), rows.column("server"), 3).tolist())  # one a file
            (start,) = set(rows.column("window_start").to_pylist())  # one open window start a file
            by_start.setdefault(start, []).append(shard)
        assert by_start and all(sorted(shards) == [0, 1, 2] for shards in by_start.values())
    assert len(threads) == 3 and all(name.startswith("windows-upsert") for name in threads)
    assert reads == []  # every batch merged into the shards the batch before kept
    assert_exact(store, log)
    for name, clock, key in ((WINDOWS, "updated_at", ()), (QUERIES, "computed_at", ("query", "aggregate"))):
        tables = [open_table(s, name).to_pyarrow_table().drop_columns([clock]) for s in (store, single)]
        order = [(c, "ascending") for c in (*key, "metric", "server", "window_start")]
        assert tables[0].num_rows > 0 and tables[0].sort_by(order).equals(tables[1].sort_by(order))


def test_a_stream_forgets_the_merged_minutes_of_a_stored_query_removed_from_the_registry(store, log):
    """A stream keeps each stored query's merged minutes between batches; once a query is no longer among the
    config store's queries, the next batch drops its minutes (else they stayed until the stream restarted), and a query
    that comes back is merged anew, with the results a stream that never dropped it gives."""
    events = FleetSimulator(servers=3, metrics=2, seconds=180, rate=1.0, seed=43, start_ms=START_MS).generate()
    produce(log, events)
    fleet = parse_query("fleet_cpu", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE avg, max")
    peak = parse_query("peak_cpu", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE max, percentile(99)")
    ends, kept = end_offsets(log, TOPIC), OpenWindows()
    cut = {p: end // 3 for p, end in ends.items()}
    batch(store, cut, queries=[fleet, peak], open_windows=kept)
    assert kept.queries == ["fleet_cpu", "peak_cpu"]
    cut = {p: end * 2 // 3 for p, end in ends.items()}
    batch(store, cut, queries=[fleet], open_windows=kept)  # peak_cpu was removed from the config store
    assert kept.queries == ["fleet_cpu"]
    batch(store, ends, queries=[fleet, peak], open_windows=kept)  # and added again
    assert kept.queries == ["fleet_cpu", "peak_cpu"]
    results = open_table(store, QUERIES).to_pyarrow_table()
    assert set(results.column("query").to_pylist()) == {"fleet_cpu", "peak_cpu"}


def test_kept_query_results_rows_of_windows_a_batch_does_not_touch_are_rewritten_unchanged(store, log, tmp_path):
    """The open query windows of three queries share one ``query_results`` file (same start and end); a batch with
    events of one metric replaces that query's rows and writes the other two's again from the rows the driver
    kept, as a speed layer that reads the file writes them. A fourth query's window (another end, another file)
    the batches leave as it is stays kept."""
    reading = LocalStore(str(tmp_path / "reading"))
    texts = {m: f"FROM * SELECT {m} WINDOW 5m COMPUTE max, avg" for m in "abc"} | {
        "d": "FROM * SELECT d WINDOW 10m COMPUTE avg"
    }
    queries = [parse_query(f"peak_{m}", text) for m, text in texts.items()]

    def events(metrics: str, second: int) -> list[str]:
        at = START_MS - START_MS % 600_000 + second * 1000  # where a 5-minute and a 10-minute window start
        return [json.dumps({"ts": at, "server": "s1", "metric": m, "value": float(second)}) for m in metrics]

    kept = OpenWindows()
    for metrics, second in (("abcd", 1), ("b", 20), ("b", 40)):
        for lake in (log, SegmentLog(reading)):
            produce(lake, payloads=events(metrics, second), partitions=1)
        batch(store, queries=queries, rules=[], open_windows=kept)
        batch(reading, queries=queries, rules=[])
        assert len(kept.result_paths) == 2
    tables = [open_table(s, QUERIES).to_pyarrow_table().drop_columns(["computed_at"]) for s in (store, reading)]
    order = [("query", "ascending"), ("aggregate", "ascending")]
    assert tables[0].sort_by(order).equals(tables[1].sort_by(order))
    values = {(r["query"], r["aggregate"]): r["value"] for r in tables[0].to_pylist()}
    assert values == {
        ("peak_a", "max"): 1.0, ("peak_a", "avg"): 1.0, ("peak_b", "max"): 40.0, ("peak_b", "avg"): 61 / 3,
        ("peak_c", "max"): 1.0, ("peak_c", "avg"): 1.0, ("peak_d", "avg"): 1.0,
    }  # fmt: skip


def rewrite_files(store, name: str, paths: list[str]) -> None:
    """Rewrite the files of table ``name`` at ``paths`` (Delta log paths) into new files, rows unchanged."""
    table = open_table(store, name)
    files = [f for f in snapshot_files(store, name, table) if f.relative in paths]
    assert len(files) == len(paths)
    rows = read_data_files(store, files, table_spec(name).schema)
    commit_changes(
        table,
        name,
        write_data_files(store, name, rows),
        [remove_action(f) for f in files],
        transactions=[],
        operation="OPTIMIZE",
        data_change=False,
    )


def test_the_query_evaluation_reads_a_window_file_once_and_only_the_queried_metrics_of_it(
    store, log, tmp_path, monkeypatch
):
    """Stored queries need the windows of earlier minutes (a 1-hour window holds sixty): a stream takes the queried
    metrics' rows of the files it wrote from the rows it keeps, keeps what it took from each file for the next
    batch, and reads a file (those metrics' rows only) when it keeps neither: after another writer rewrote it, or
    after a restart. The query results equal those of a speed layer that keeps nothing."""
    events = FleetSimulator(servers=4, metrics=3, seconds=400, rate=2.0, seed=37, start_ms=START_MS).generate()
    reading = LocalStore(str(tmp_path / "reading"))
    produce(log, events)
    produce(SegmentLog(reading), events)
    queried = {"app.rpc.latency_ms", "host.cpu.utilization"}  # of the simulator's three, the default queries'
    step, reads = 0, []  # (batch, Delta log path) of every window file the kept lake's query evaluation read
    real_read = query_results_commit.read_data_file

    def read_data_file(data_file, schema, filesystem, columns=None, **options):
        rows = real_read(data_file, schema, filesystem, columns, **options)
        if str(store.root) in data_file.path and columns == list(WINDOW_STATE.names):  # not adoption's minutes
            assert set(rows.column("metric").to_pylist()) == queried
            assert rows.num_rows < pq.read_metadata(data_file.path).num_rows  # the third metric was not read
            reads.append((step, data_file.relative))
        return rows

    monkeypatch.setattr(query_results_commit, "read_data_file", read_data_file)
    ends = end_offsets(log, TOPIC)
    kept, unkept_at_restart = OpenWindows(), set()
    for step in range(1, 21):  # 20 s of events a batch: a 60 s watermark seals a minute every third batch
        cut = {p: end * step // 20 for p, end in ends.items()}
        batch(store, cut, watermark_seconds=60, open_windows=kept)
        batch(reading, cut, watermark_seconds=60)
        if step == 10:  # another writer rewrites the sealed files selected from (as compaction would): into one
            rewrite_files(store, WINDOWS, sorted(set(kept.selected_paths) - set(kept.paths)))
        if step == 15:
            kept = OpenWindows()  # a restarted stream holds nothing
        if step == 16:  # every window file is of the queries' hour: all but those batch 16 wrote were read
            snapshot = {f.relative for f in snapshot_files(store, WINDOWS, open_table(store, WINDOWS))}
            unkept_at_restart = snapshot - set(kept.paths)
    assert len(unkept_at_restart) >= 3
    assert [path for at, path in reads if at == 16] and {path for at, path in reads if at == 16} == unkept_at_restart
    assert len([path for at, path in reads if at == 11]) == 1  # the rewritten file
    assert sorted({at for at, _ in reads}) == [11, 16]  # every other batch read no window file
    assert len(reads) == len(set(reads))
    tables = [open_table(s, QUERIES).to_pyarrow_table().drop_columns(["computed_at"]) for s in (store, reading)]
    order = [(c, "ascending") for c in ("query", "aggregate", "metric", "server", "window_start")]
    assert tables[0].num_rows > 0 and tables[0].sort_by(order).equals(tables[1].sort_by(order))


def test_a_stream_keeps_only_the_window_rows_its_stored_queries_need_next(store, log, tmp_path):
    """An hourly fleet query reuses each earlier minute's merge, so the stream keeps no rows of those minutes: what it
    selects from window files between batches is the current windows of a PER SERVER query (whose rows are its
    states) and the minutes merged again, however far into the hour. The results equal a stream that keeps nothing."""
    events = FleetSimulator(servers=4, metrics=2, seconds=540, rate=1.0, seed=47, start_ms=START_MS).generate()
    unkept = LocalStore(str(tmp_path / "unkept"))
    produce(log, events)
    produce(SegmentLog(unkept), events)
    queries = [
        parse_query("fleet_cpu", "FROM * SELECT host.cpu.utilization WINDOW 1h COMPUTE avg, max, percentile(99)"),
        parse_query("server_cpu", "FROM * SELECT host.cpu.utilization WINDOW 2m COMPUTE max PER SERVER"),
    ]
    ends, kept, selected = end_offsets(log, TOPIC), OpenWindows(), []
    for step in range(1, 28):  # 20 s of events a batch
        cut = {p: end * step // 27 for p, end in ends.items()}
        batch(store, cut, watermark_seconds=60, queries=queries, open_windows=kept)
        batch(unkept, cut, watermark_seconds=60, queries=queries)
        files = {f.relative: f for f in snapshot_files(store, WINDOWS, open_table(store, WINDOWS))}
        newest = max(f.window_starts[1] for f in files.values())
        for path in kept.selected_paths:  # of this 2-minute window, or the minute before it sealed this batch
            assert files[path].window_starts[1] >= newest - newest % 120_000_000 - 60_000_000
        selected.append(len(kept.selected_paths))
    assert len(files) >= 3 * max(selected)  # the hour's files outnumber those kept: most minutes are not kept
    tables = [open_table(s, QUERIES).to_pyarrow_table().drop_columns(["computed_at"]) for s in (store, unkept)]
    order = [(c, "ascending") for c in ("query", "aggregate", "metric", "server", "window_start")]
    assert tables[0].num_rows > 0 and tables[0].sort_by(order).equals(tables[1].sort_by(order))
