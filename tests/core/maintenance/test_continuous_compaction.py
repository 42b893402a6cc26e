"""Continuous compaction: size tiers, and a stream compacting between its batches or beside them (a thread of rounds
racing the batches' commits) keeps every table exact (the same rows as a twin lake never compacted) with a bounded
number of files per day; a round whose merged file a batch rewrote before its commit plans again."""

from __future__ import annotations

import logging
import os
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.maintenance import continuous_compaction
from metrics_lake.core.maintenance.continuous_compaction import (
    CompactionPolicy,
    compact_speed_tables,
    log_retention_properties,
    size_tier,
)
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.speed.open_windows import OpenWindows
from metrics_lake.core.speed.progress import watermark_app_id
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.delta import LatestTables, ensure_table, open_table
from metrics_lake.core.tables.snapshots import snapshot_files
from metrics_lake.lake_schemas.tables import Table

TOPIC = "metrics"
QUERIES = [parse_query("cpu_2m", "FROM * SELECT host.cpu.utilization WINDOW 2m EVERY 1m COMPUTE max, avg PER SERVER")]


def test_size_tiers_are_powers_of_the_min_files_below_the_target():
    policy = CompactionPolicy(target_bytes=64_000, min_files=4)
    assert [size_tier(s, policy) for s in (1, 3_999, 4_000, 15_999, 16_000, 63_999, 64_000, 10**9)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        None,
        None,
    ]


def rows(store, name: str, columns: list[str]) -> list[tuple]:
    table = open_table(store, name).to_pyarrow_table(columns=columns)
    table = table.select(columns)
    return sorted(
        (tuple(r.values()) for r in table.to_pylist()), key=lambda r: tuple("" if v is None else v for v in r)
    )


POLICY = CompactionPolicy(target_bytes=4 * 1024 * 1024, min_files=3, vacuum_hours=0)


def most_files(store) -> int:
    """The most active files of bronze, the windows and the query results."""
    return max(
        len(snapshot_files(store, name, open_table(store, name)))
        for name in (Table.BRONZE_EVENTS, Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS)
    )


def compaction_round(store, tables: LatestTables, *, commit_slot=None, stop=None, sealed_before_us=None):
    """A round as the stream runs one (closed windows those before the windows' watermark, unless given)."""
    if sealed_before_us is None:
        watermark = tables.latest(store, Table.METRIC_WINDOWS_1M).transaction_version(watermark_app_id(TOPIC))
        sealed_before_us = None if watermark is None else watermark * 1000
    return compact_speed_tables(
        store, POLICY, sealed_before_us=sealed_before_us, tables=tables, commit_slot=commit_slot, stop=stop
    )


class Lake:
    """A lake fed a batch at a time: 12 servers, one second of events each, batch ``i`` at ``start_ms + i * 10 s``,
    run in process as the stream's driver runs it (open windows and snapshots kept)."""

    def __init__(self, root, start_ms: int) -> None:
        self.store = LocalStore(str(root))
        self.log = SegmentLog(self.store)
        self.sim = FleetSimulator(servers=12, metrics=3, seconds=1, seed=3, start_ms=0).generate()
        self.open_windows, self.tables = OpenWindows(), LatestTables()
        self.start_ms, self.batches = start_ms, 0

    def batch(self) -> None:
        """Produce and process the next batch."""
        sim = self.sim
        ts = pc.add(
            pc.subtract(sim.column("ts").cast(pa.int64()), sim.column("ts").cast(pa.int64())),
            self.start_ms + self.batches * 10_000,
        )
        with Producer(self.log, TOPIC, partitions=2, linger_ms=0) as producer:
            producer.send(sim.set_column(0, "ts", ts.cast(sim.schema.field("ts").type)))
        run_batch_in_process(
            self.store,
            TOPIC,
            end_offsets(self.log, TOPIC),
            watermark_seconds=10,
            clock_skew_seconds=300,
            queries=QUERIES,
            rules=[],
            open_windows=self.open_windows,
            tables=self.tables,
        )
        self.batches += 1


def run_lake(
    root, start_ms: int, *, compact_every: int | None, beside: bool = False, batches: int = 48
) -> tuple[LocalStore, list[int]]:
    """``batches`` batches (:class:`Lake`); with ``compact_every``, a compaction round after every that many
    batches (as ``lake stream --once`` runs one after its batches); with ``beside``, rounds back to back on a
    thread from the first batch on, committing between batches (as ``lake stream`` runs them, its batch gate a
    lock here). Returns the store and files per day after each round that merged."""
    lake = Lake(root, start_ms)
    counts: list[int] = []
    gate, stop, failures = threading.Lock(), threading.Event(), []

    def between_batches(commit) -> bool:
        with gate:
            commit()
        return True

    def compact_beside() -> None:
        own = LatestTables()
        try:
            while not stop.is_set():
                if compaction_round(lake.store, own, commit_slot=between_batches, stop=stop).merged:
                    counts.append(most_files(lake.store))
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    thread = threading.Thread(target=compact_beside)
    for i in range(batches):
        with gate:
            lake.batch()
        time.sleep(0.01)  # the gap between two triggers: a lock is not fair, and the stream's gate is free there
        if beside and i == 0:
            thread.start()
        if compact_every and (i + 1) % compact_every == 0:
            compaction_round(lake.store, LatestTables())
            counts.append(most_files(lake.store))
    if beside:
        stop.set()
        thread.join()
        assert not failures, failures
    return lake.store, counts


@pytest.mark.parametrize("beside", [False, True], ids=["between batches", "beside batches"])
def test_compacting_keeps_every_table_exact_and_the_files_bounded(tmp_path, beside):
    # One start for both lakes: computed in each, two runs straddling a minute would hold different events.
    start_ms = int(time.time() * 1000) // 60_000 * 60_000 - 48 * 10_000 - 120_000
    plain, _ = run_lake(tmp_path / "plain", start_ms, compact_every=None)
    compacted, counts = run_lake(tmp_path / "compacted", start_ms, compact_every=None if beside else 4, beside=beside)
    bronze = ["server", "metric", "ts", "value"]
    windows = ["metric", "server", "window_start", "count", "sum", "min", "max"]
    results = ["query", "server", "window_start", "aggregate", "value"]
    for name, columns in (
        (Table.BRONZE_EVENTS, bronze),
        (Table.METRIC_WINDOWS_1M, windows),
        (Table.QUERY_RESULTS, results),
    ):
        want = rows(plain, name, columns)
        assert want and rows(compacted, name, columns) == want, name
    plain_bronze = len(snapshot_files(plain, Table.BRONZE_EVENTS, open_table(plain, Table.BRONZE_EVENTS)))
    assert plain_bronze >= 48  # a file per batch and partition, uncompacted
    # A day keeps fewer than 3 x min_files small files per tier, plus the open windows' own files.
    assert counts and max(counts) <= 3 * 3 * 2 + 4, counts
    for name in (Table.BRONZE_EVENTS, Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS):
        history = open_table(compacted, name).history()
        assert any(h.get("lake.operation") == "CONTINUOUS COMPACTION" for h in history), name


def test_a_round_keeps_the_speed_tables_delta_log_for_its_retention_and_deletes_older_entries(tmp_path):
    store = LocalStore(str(tmp_path))
    table = ensure_table(store, Table.LAST_SEEN, properties=log_retention_properties(2))
    assert table.metadata().configuration["delta.enableExpiredLogCleanup"] == "false"  # no listing per checkpoint
    assert table.version() == 0  # created with its retention: no commit of its own
    for _ in range(24):  # a checkpoint at every tenth version
        table.alter.set_table_properties({"delta.dataSkippingNumIndexedCols": str(32 + table.version() % 2)})
    log_dir = tmp_path / "tables" / Table.LAST_SEEN / "_delta_log"
    old = time.time() - 3 * 3600
    for version in range(21):  # versions 0-20 were written three hours ago; 21-24 just now
        for entry in log_dir.glob(f"{version:020d}.*"):
            os.utime(entry, (old, old))
    compact_speed_tables(store, CompactionPolicy(), sealed_before_us=None, tables=LatestTables())

    after = open_table(store, Table.LAST_SEEN)
    assert after.metadata().configuration["delta.logRetentionDuration"] == "interval 2 hours"
    assert after.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 2 hours"
    commits = sorted(int(p.name.split(".")[0]) for p in log_dir.glob("*.json"))
    # Entries before the newest checkpoint older than the retention (version 19's) are gone; from it on all stay.
    assert commits == list(range(19, after.version() + 1)) and after.version() == 24
    assert open_table(store, Table.LAST_SEEN, version=19).version() == 19  # the oldest version kept reads
    with pytest.raises(DeltaError, match="No files in log segment"):  # older versions are out of reach
        open_table(store, Table.LAST_SEEN, version=5)


def test_checkpoints_leave_out_the_tombstones_older_than_the_tables_tombstone_retention(tmp_path):
    """What keeps a compacted table's checkpoints from growing (:func:`log_retention_properties`): delta-rs writes
    into a checkpoint only the tombstones younger than ``delta.deletedFileRetentionDuration``. Here 2 s: six files
    removed, then after 3 s six more; the checkpoint holds the six recent tombstones, not twelve."""
    uri = str(tmp_path / "table")
    rows = pa.table({"value": [1.0, 2.0]})
    write_deltalake(uri, rows, configuration={"delta.deletedFileRetentionDuration": "interval 2 seconds"})
    for _ in range(6):
        write_deltalake(uri, rows, mode="overwrite")  # each overwrite removes the file before it
    time.sleep(3)
    for _ in range(6):
        write_deltalake(uri, rows, mode="overwrite")
    table = DeltaTable(uri)
    table.create_checkpoint()
    checkpoint = tmp_path / "table" / "_delta_log" / f"{table.version():020d}.checkpoint.parquet"
    removes = pq.read_table(checkpoint, columns=["remove"]).column("remove").drop_null()
    assert len(removes) == 6


def test_a_merge_whose_file_a_batch_rewrote_before_the_commit_slot_plans_again(tmp_path, caplog, monkeypatch):
    """The check at the commit: a round over the windows merges every small file, open windows' too (as a stored
    query adopted from where its backfill stopped would rewrite closed windows), and a batch runs in the commit
    slot before the commit, rewriting an open window's file. Committed as planned, its rows would be in the table
    twice."""
    monkeypatch.setattr(continuous_compaction, "COMPACTED_TABLES", {Table.METRIC_WINDOWS_1M: True})
    start_ms = int(time.time() * 1000) // 60_000 * 60_000 - 24 * 10_000 - 120_000
    plain, _ = run_lake(tmp_path / "plain", start_ms, compact_every=None, batches=24)
    lake = Lake(tmp_path / "raced", start_ms)
    for _ in range(23):
        lake.batch()
    slots = []

    def batch_first(commit) -> bool:
        if not slots:
            lake.batch()  # the 24th batch, between the merge and its commit
        slots.append(commit)
        commit()
        return True

    with caplog.at_level(logging.INFO, logger="metrics_lake.core.maintenance.continuous_compaction"):
        compaction = compaction_round(lake.store, LatestTables(), commit_slot=batch_first, sealed_before_us=2**62)
    assert any("a batch rewrote a file it merged; planning again" in r.message for r in caplog.records)
    assert compaction.merged[Table.METRIC_WINDOWS_1M] >= POLICY.min_files
    columns = ["metric", "server", "window_start", "count", "sum", "min", "max"]
    assert rows(lake.store, Table.METRIC_WINDOWS_1M, columns) == rows(plain, Table.METRIC_WINDOWS_1M, columns)


def test_a_round_ends_before_its_next_table_once_stopped_and_commits_nothing_the_slot_refuses(tmp_path):
    start_ms = int(time.time() * 1000) // 60_000 * 60_000 - 12 * 10_000 - 120_000
    store, _ = run_lake(tmp_path, start_ms, compact_every=None, batches=12)
    versions = {name: open_table(store, name).version() for name in (Table.BRONZE_EVENTS, Table.QUERY_RESULTS)}
    refused = compaction_round(store, LatestTables(), commit_slot=lambda commit: False)  # the stream is stopping
    assert not refused.merged
    stop = threading.Event()
    stop.set()
    assert not compaction_round(store, LatestTables(), stop=stop).merged
    assert {name: open_table(store, name).version() for name in versions} == versions
    assert compaction_round(store, LatestTables()).merged.get(Table.BRONZE_EVENTS)  # there was something to merge
