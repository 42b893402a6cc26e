"""A table's versions: opening one by number or by time (time travel), and listing them with their row changes.

Delta keeps every version a commit made until log cleanup drops old
commits (after a checkpoint) and VACUUM deletes the files only old
versions read (PROTOCOL.md "Checkpoints", "Vacuum"). So a version can be
unknown (never committed, or its commit cleaned up) or known but no longer
readable (its files vacuumed); both get an error naming what is available.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from deltalake import DeltaTable

from metrics_lake.core import keys
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.errors import InputError

__all__ = ["TableVersion", "check_files_present", "open_as_of", "parse_timestamp", "table_history"]


@dataclass(frozen=True)
class TableVersion:
    """One commit of a table: version, commit time (UTC), operation, and files and rows it added and removed.

    ``rows_removed`` is None when a removed file's row count is unknown
    (its ``add`` was committed before the oldest version kept in the log).
    """

    version: int
    at: dt.datetime
    operation: str
    files_added: int
    files_removed: int
    rows_added: int
    rows_removed: int | None


def parse_timestamp(text: str) -> dt.datetime:
    """An ISO-8601 time (``2026-11-20 10:00``, ``2026-11-20T10:00:00Z``, a date) as UTC; naive means UTC.

    Raises :class:`~metrics_lake.lake_schemas.errors.InputError` naming the text when it is not one.
    """
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"TIMESTAMP AS OF {text!r}: expected a time like '2026-11-20 10:00' (UTC)") from None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _commits(table: DeltaTable) -> list[tuple[int, dt.datetime, str]]:
    """(version, commit time, operation) of every commit the log still holds, oldest first."""
    commits = [
        (
            int(entry["version"]),
            dt.datetime.fromtimestamp(entry["timestamp"] / 1000, dt.UTC),
            entry.get("lake.operation") or entry.get("operation") or "?",
        )
        for entry in table.history()
    ]
    return sorted(commits)


def _span(name: str, commits: list[tuple[int, dt.datetime, str]]) -> str:
    (first, first_at, _), (last, last_at, _) = commits[0], commits[-1]
    return f"{name} has versions {first} ({first_at:%Y-%m-%d %H:%M:%S} UTC) to {last} ({last_at:%Y-%m-%d %H:%M:%S} UTC)"


def open_as_of(store: Store, name: str, version: int | None = None, timestamp: str | None = None) -> DeltaTable:
    """Table ``name`` at ``version``, or at the last version committed at or before ``timestamp``, else latest.

    Raises :class:`~metrics_lake.lake_schemas.errors.InputError` naming the
    oldest and newest versions (and their times) when the version does not
    exist or the time is before the oldest commit the log holds; raises
    ``deltalake.exceptions.TableNotFoundError`` if the table does not exist.
    """
    latest = open_table(store, name)
    if version is None and timestamp is None:
        return latest
    commits = _commits(latest)
    if timestamp is not None:
        at = parse_timestamp(timestamp)
        before = [v for v, committed, _ in commits if committed <= at]
        if not before:
            raise InputError(
                f"{name} TIMESTAMP AS OF '{timestamp}' is before its oldest version: {_span(name, commits)}"
            )
        version = before[-1]
    if version not in {v for v, _, _ in commits}:
        raise InputError(f"{name} VERSION AS OF {version} does not exist: {_span(name, commits)}")
    return open_table(store, name, version)


def check_files_present(store: Store, name: str, table: DeltaTable, relative_paths: list[str]) -> None:
    """Raise :class:`~metrics_lake.lake_schemas.errors.InputError` if VACUUM deleted a file of this old snapshot.

    ``relative_paths``: the files about to be read, as the Delta log names them.
    """
    missing = sum(1 for path in relative_paths if not store.exists(keys.table_key(name, path)))
    if missing:
        commits = _commits(open_table(store, name))
        raise InputError(
            f"{name} version {table.version()} is no longer readable: VACUUM deleted {missing} of its files "
            f"(`lake retain` keeps files old versions need for LAKE_VACUUM_HOURS); {_span(name, commits)}, "
            "recent ones readable"
        )


def table_history(store: Store, name: str, limit: int = 20) -> list[TableVersion]:
    """The last ``limit`` versions of table ``name``, newest first, with files and rows each added and removed.

    Rows come from the ``add`` actions' statistics (``numRecords``); a
    removed file's rows from the snapshot before the listed versions.
    """
    latest = open_table(store, name)
    commits = _commits(latest)[-limit:]
    first = commits[0][0]
    records: dict[str, int] = {}
    if first > 0:
        try:
            before = open_table(store, name, first - 1)
            actions = before.get_add_actions(flatten=True)
            records = dict(
                zip(actions.column("path").to_pylist(), actions.column("num_records").to_pylist(), strict=True)
            )
        except Exception:  # noqa: BLE001 - the version before the log's oldest may be gone: rows removed unknown
            records = {}
    history = []
    for version, at, operation in commits:
        added = removed = rows_added = 0
        rows_removed: int | None = 0
        for line in store.read(keys.table_commit_key(name, version)).splitlines():
            action = json.loads(line)
            if "add" in action:
                add = action["add"]
                rows = json.loads(add["stats"]).get("numRecords", 0) if add.get("stats") else 0
                records[add["path"]] = rows
                added += 1
                rows_added += rows
            elif "remove" in action:
                removed += 1
                rows = records.pop(action["remove"]["path"], None)
                rows_removed = None if rows is None or rows_removed is None else rows_removed + rows
        history.append(TableVersion(version, at, operation, added, removed, rows_added, rows_removed))
    return history[::-1]
