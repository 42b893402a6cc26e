"""Table creation: every lake table checkpoints its Delta log often, whether this release or an older one made it."""

from __future__ import annotations

from deltalake import DeltaTable

from metrics_lake.core.tables.commits import commit_files
from metrics_lake.core.tables.delta import TABLE_PROPERTIES, ensure_table, open_table, table_uri
from metrics_lake.lake_schemas.tables import TABLES, Table

WINDOWS = Table.METRIC_WINDOWS_1M


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
