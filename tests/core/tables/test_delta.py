"""Delta tables: every lake table checkpoints its log often, whether this release or an older one made it; a
table's rows are scanned through the store's own Arrow file system."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from metrics_lake.core import keys
from metrics_lake.core.tables.commits import commit_changes, commit_files, remove_action
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import (
    LOG_RETENTION,
    TABLE_PROPERTIES,
    LatestTables,
    ensure_table,
    open_table,
    table_dataset,
    table_uri,
)
from metrics_lake.core.tables.snapshots import snapshot_files
from metrics_lake.lake_schemas.tables import TABLES, Table
from tests.core.tables.test_pruning import bronze_rows

WINDOWS = Table.METRIC_WINDOWS_1M
BRONZE = Table.BRONZE_EVENTS
ROOT = Path(__file__).resolve().parents[3]


def _checkpoints(store, name: str) -> list[str]:
    log_dir = store.base / "tables" / name / "_delta_log"
    return sorted(p.name for p in log_dir.iterdir() if p.name.endswith(".checkpoint.parquet"))


def test_a_new_table_writes_a_checkpoint_every_ten_commits(store) -> None:
    ensure_table(store, WINDOWS)  # version 0
    for batch in range(1, 25):
        assert commit_files(store, WINDOWS, [], app_id="test", batch_id=batch)

    table = open_table(store, WINDOWS)
    assert table.version() == 24
    assert table.metadata().configuration == TABLE_PROPERTIES
    assert _checkpoints(store, WINDOWS) == [f"{v:020d}.checkpoint.parquet" for v in (9, 19)]
    assert table.transaction_version("test") == 24  # the checkpoint kept every txn


def test_a_table_an_older_release_made_gets_the_properties_in_one_commit(store) -> None:
    spec = TABLES[WINDOWS]
    DeltaTable.create(table_uri(store, WINDOWS), spec.schema, partition_by=list(spec.partition_by))

    upgraded = ensure_table(store, WINDOWS)
    again = ensure_table(store, WINDOWS)

    assert upgraded.metadata().configuration == TABLE_PROPERTIES
    assert again.version() == upgraded.version() == 1  # one commit, then nothing to do
    assert upgraded.schema().to_arrow().names == spec.schema.names


def test_a_table_dataset_reads_through_the_stores_own_file_system_exactly_the_rows_a_filter_keeps(any_store) -> None:
    """On a local directory and on S3: the rows, the files skipped by statistics, and no Python file system."""
    every = []
    for batch in range(3):  # offsets [0, 400), [400, 800), [800, 1200); each batch in two files (two days)
        rows = bronze_rows(batch, 400, batch * 400)
        files = write_data_files(any_store, BRONZE, pa.Table.from_pylist(rows, TABLES[BRONZE].schema))
        commit_files(any_store, BRONZE, [f.add_action() for f in files], app_id="test", batch_id=batch)
        every += rows
    offset = pads.field("offset")
    where = (pads.field("partition") == 2) & (offset >= 100) & (offset < 300)

    dataset = table_dataset(any_store, BRONZE)
    got = dataset.to_table(columns=["offset", "partition"], filter=where)

    native, _ = any_store.arrow_fs()
    assert isinstance(dataset.filesystem, pafs.SubTreeFileSystem)
    assert type(dataset.filesystem.base_fs) is type(native)  # not delta-rs's pyarrow.fs.PyFileSystem
    expected = sorted(r["offset"] for r in every if r["partition"] == 2 and 100 <= r["offset"] < 300)
    assert sorted(got.column("offset").to_pylist()) == expected
    assert len(expected) > 0 and set(got.column("partition").to_pylist()) == {2}
    assert len(list(dataset.get_fragments())) == 6
    assert len(list(dataset.get_fragments(filter=where))) == 2  # the first batch's files; statistics skip the rest
    at_version = table_dataset(any_store, BRONZE, open_table(any_store, BRONZE, version=1))
    assert at_version.count_rows() == 400  # time travel: the snapshot of the table given


def _append(store, batch: int, table=None) -> None:
    """Commit 100 bronze rows (two files, one per day) as batch ``batch``; on ``table`` if given, else fresh."""
    files = write_data_files(
        store, BRONZE, pa.Table.from_pylist(bronze_rows(batch, 100, batch * 100), TABLES[BRONZE].schema)
    )
    if table is None:
        commit_files(store, BRONZE, [f.add_action() for f in files], app_id="test", batch_id=batch)
    else:
        commit_changes(table, BRONZE, files, [], transactions=[], operation="TEST")


def test_latest_tables_keep_one_table_open_and_bring_it_to_every_other_writers_commits(store) -> None:
    tables = LatestTables()
    created = tables.latest(store, BRONZE)  # asked for the first time: created, with the lake's properties
    assert created.version() == 0 and created.metadata().configuration == TABLE_PROPERTIES
    for batch in range(1, 13):  # another writer, past a checkpoint (every 10 commits)
        _append(store, batch)

    table = tables.latest(store, BRONZE)

    assert table is created  # the same object, brought up to date
    assert table.version() == 12 and table.transaction_version("test") == 12
    assert table_dataset(store, BRONZE, table).count_rows() == 12 * 100
    _append(store, 13, table)  # committing on it moves it too
    assert tables.latest(store, BRONZE).version() == open_table(store, BRONZE).version() == 13


def test_a_kept_table_is_refreshed_only_when_another_commit_exists(any_store, monkeypatch) -> None:
    """A refresh lists the whole Delta log on a local lake (docs/performance.md): when the next version's commit
    does not exist, the kept table is current and is handed out as it is."""
    tables = LatestTables()
    kept = tables.latest(any_store, BRONZE)
    refreshed_from, refresh = [], kept.update_incremental
    monkeypatch.setattr(kept, "update_incremental", lambda: (refreshed_from.append(kept.version()), refresh())[1])

    assert tables.latest(any_store, BRONZE) is kept and refreshed_from == []
    _append(any_store, 1)
    _append(any_store, 2)
    assert tables.latest(any_store, BRONZE).version() == 2 and refreshed_from == [0]
    assert tables.latest(any_store, BRONZE).version() == 2 and refreshed_from == [0]
    _append(any_store, 3, kept)  # its own commit leaves the object at 2 (delta-rs): the next ask refreshes it
    assert tables.latest(any_store, BRONZE).version() == 3 and refreshed_from == [0, 2]


def test_a_kept_table_left_unasked_while_the_log_was_cleaned_up_past_it_is_still_refreshed(store) -> None:
    """Its next commit no longer exists, but neither does its own: the log moved on (a dashboard idle for longer
    than the log retention)."""
    tables = LatestTables()
    kept = tables.latest(store, BRONZE)
    for batch in range(1, 4):
        _append(store, batch)
    writer = open_table(store, BRONZE)
    writer.alter.set_table_properties({LOG_RETENTION: "interval 0 seconds"})
    writer = open_table(store, BRONZE)
    writer.create_checkpoint()
    writer.cleanup_metadata()
    assert not any_commit(store, [0, 1]) and kept.version() == 0

    assert tables.latest(store, BRONZE).version() == writer.version() == 4


def any_commit(store, versions: list[int]) -> bool:
    """Whether the bronze table's log still holds a commit of one of ``versions``."""
    return any(store.exists(keys.table_commit_key(BRONZE, v)) for v in versions)


def test_a_kept_table_whose_update_fails_is_opened_again(store, monkeypatch) -> None:
    tables = LatestTables()
    broken = tables.latest(store, BRONZE)
    _append(store, 1)

    def unreadable() -> None:
        raise DeltaError("Generic error: the object store failed a read")

    monkeypatch.setattr(broken, "update_incremental", unreadable)
    table = tables.latest(store, BRONZE)

    assert table is not broken and table.version() == 1
    assert tables.latest(store, BRONZE) is table  # kept from then on


def test_a_commit_on_a_kept_table_still_loses_to_a_concurrent_remove_of_its_file(store) -> None:
    """What the speed layer's exactly-once path relies on (:mod:`metrics_lake.core.tables.commits`): a commit on
    the snapshot it planned from fails when another writer removed a file it removes meanwhile, and the next
    ``latest`` plans on a snapshot that has the other writer's commit."""
    _append(store, 1)
    tables = LatestTables()
    planned = tables.latest(store, BRONZE)
    victim = snapshot_files(store, BRONZE, planned)[0]
    other = open_table(store, BRONZE)  # a concurrent writer (a rewrite by compaction of an older release)
    commit_changes(other, BRONZE, [], [remove_action(victim)], transactions=[], operation="OTHER")

    with pytest.raises(CommitFailedError):
        commit_changes(planned, BRONZE, [], [remove_action(victim)], transactions=[], operation="TEST")

    again = tables.latest(store, BRONZE)
    assert again.version() == 2 and victim.relative not in {f.relative for f in snapshot_files(store, BRONZE, again)}


def test_the_library_scans_tables_only_through_table_dataset() -> None:
    """``DeltaTable.to_pyarrow_table``/``to_pyarrow_dataset`` read through a Python file system whose calls from
    Arrow's threads can abort a process at exit (:func:`table_dataset`); only ``table_dataset`` may call them."""
    folders = ["app", "core", "agents", "spark", "infra", "quality", "dags", "lake_schemas"]
    tracked = subprocess.run(["git", "ls-files", *folders], cwd=ROOT, capture_output=True, text=True, check=True)
    calls = []
    for name in tracked.stdout.split():
        if name.endswith(".py"):
            for node in ast.walk(ast.parse((ROOT / name).read_text())):
                method = getattr(getattr(node, "func", None), "attr", None) if isinstance(node, ast.Call) else None
                if method in ("to_pyarrow_table", "to_pyarrow_dataset"):
                    calls.append(f"{name}:{node.lineno}")
    assert [call.partition(":")[0] for call in calls] == ["core/tables/delta.py"], calls
