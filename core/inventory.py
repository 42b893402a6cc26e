"""The server inventory: which servers exist and their labels, as a keyed, compacted changelog topic.

The inventory is one topic of the segment log, ``inventory``, with a single
partition (one total order of changes, so "the inventory as of offset N" is
one number) and cleanup policy ``compact``
(:mod:`metrics_lake.core.log.keyed_compaction`). Each record
(:data:`~metrics_lake.lake_schemas.log_records.INVENTORY_RECORD`) is keyed by
server and holds the server's whole label set from then on, or its removal
(a tombstone): reading the topic from offset 0 and keeping the newest record
per server gives the current inventory (:func:`fold`), the *table* of Kafka
Streams' KTable, so the topic is the inventory's only source of truth.

Writers: ``lake inventory apply FILE`` (the file is the whole inventory: the
difference with the current state is appended, upserts and tombstones only),
``lake inventory set|rm`` and the gateway's ``PUT /v1/inventory/{server}``.
Readers: the speed layer's enrichment (labels as of an offset), the
``servers`` table (:func:`write_servers_table`), absence alerts and the
dashboard (servers that should report).

Labels follow Prometheus's rules: names match ``[a-zA-Z_][a-zA-Z0-9_]*``
and do not start with ``__`` (reserved); ``server`` is the key, not a label.
Limits (Mimir's defaults, smaller): a name of at most 128 characters, a
value of at most 1,024, 30 labels per server.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Transaction

from metrics_lake.core import keys
from metrics_lake.core.log.consumer import KEYED_ROW, read_keyed
from metrics_lake.core.log.log import AppendResult, SegmentLog
from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_changes, remove_action, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.core.tables.snapshots import snapshot_files
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.log_records import INVENTORY_RECORD
from metrics_lake.lake_schemas.tables import SERVERS, Table

__all__ = [
    "INVENTORY_TOPIC",
    "MAX_LABELS",
    "MAX_NAME_LENGTH",
    "MAX_VALUE_LENGTH",
    "Change",
    "Inventory",
    "check_labels",
    "diff",
    "fold",
    "parse_inventory_file",
    "parse_label_args",
    "servers_rows",
    "write_servers_table",
]

INVENTORY_TOPIC = keys.INVENTORY_TOPIC
MAX_NAME_LENGTH = 128
MAX_VALUE_LENGTH = 1024
MAX_LABELS = 30
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MAX_SERVER_LENGTH = 128  # the event contract's limit
#: The ``servers`` table records the inventory end offset it folds as this ``txn`` application id.
SERVERS_APP_ID = "lake-inventory"


def check_labels(server: str, labels: dict[str, str], where: str = "") -> None:
    """Raise :class:`InputError` naming ``where`` (a file line) if ``server`` or ``labels`` break the rules
    (module docstring)."""
    at = f"{where}: " if where else ""
    if not isinstance(server, str) or not 1 <= len(server) <= _MAX_SERVER_LENGTH:
        raise InputError(f"{at}server must be 1 to {_MAX_SERVER_LENGTH} characters, got {server!r}")
    if not isinstance(labels, dict):
        raise InputError(f"{at}labels of {server!r} must be an object of label name to value")
    if len(labels) > MAX_LABELS:
        raise InputError(f"{at}{server!r} has {len(labels)} labels; at most {MAX_LABELS} are allowed")
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name) or len(name) > MAX_NAME_LENGTH:
            raise InputError(
                f"{at}bad label name {name!r} of {server!r}: names match [a-zA-Z_][a-zA-Z0-9_]* "
                f"(Prometheus), at most {MAX_NAME_LENGTH} characters"
            )
        if name.startswith("__") or name == "server":
            raise InputError(f"{at}label name {name!r} of {server!r} is reserved (__* and server)")
        if not isinstance(value, str):
            raise InputError(f"{at}label {name} of {server!r} must be a string, got {type(value).__name__}")
        if len(value) > MAX_VALUE_LENGTH:
            raise InputError(
                f"{at}label {name} of {server!r} is {len(value)} characters long; at most {MAX_VALUE_LENGTH}"
            )


def parse_label_args(pairs: list[str]) -> dict[str, str]:
    """``["dc=eu", "role=web"]`` as a dict; :class:`InputError` for an argument without ``=`` or a repeated name."""
    labels: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"label {pair!r} is not NAME=VALUE")
        if name in labels:
            raise InputError(f"label {name!r} given twice")
        labels[name] = value
    return labels


def parse_inventory_file(path: Path) -> dict[str, dict[str, str]]:
    """The inventory a file declares: server -> labels, checked (:func:`check_labels`).

    ``.csv``: a header row with a ``server`` column, every other column a
    label (an empty cell: the server has no such label). ``.json``: a list
    of ``{"server": S, "labels": {...}}`` or an object of server to labels.
    Raises :class:`InputError` with the line (CSV) or item (JSON) for a
    duplicate server, a bad label or a file that is neither.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read inventory file {path}: {exc}") from None
    if path.suffix.lower() == ".csv":
        return _parse_csv(text, path)
    if path.suffix.lower() == ".json":
        return _parse_json(text, path)
    raise InputError(f"{path}: an inventory file is .csv or .json")


def _parse_csv(text: str, path: Path) -> dict[str, dict[str, str]]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header or "server" not in header:
        raise InputError(f"{path}:1: the header must have a server column (every other column is a label)")
    if len(set(header)) != len(header):
        raise InputError(f"{path}:1: a column name is repeated in the header")
    at = header.index("server")
    inventory: dict[str, dict[str, str]] = {}
    first_line: dict[str, int] = {}
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise InputError(f"{path}:{line}: {len(row)} cells, the header has {len(header)}")
        server = row[at].strip()
        labels = {name: cell for name, cell in zip(header, row, strict=True) if name != "server" and cell != ""}
        _add(inventory, first_line, server, labels, f"{path}:{line}", line)
    return inventory


def _parse_json(text: str, path: Path) -> dict[str, dict[str, str]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if isinstance(doc, dict):
        items = [{"server": server, "labels": labels} for server, labels in doc.items()]
    elif isinstance(doc, list):
        items = doc
    else:
        raise InputError(f"{path}: expected a list of {{server, labels}} or an object of server to labels")
    inventory: dict[str, dict[str, str]] = {}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "server" not in item:
            raise InputError(f'{path}: item {i}: expected {{"server": ..., "labels": {{...}}}}')
        _add(inventory, first, item["server"], item.get("labels") or {}, f"{path}: item {i}", i)
    return inventory


def _add(inventory: dict, first: dict, server, labels, where: str, position: int) -> None:
    check_labels(server, labels, where)
    if server in inventory:
        raise InputError(f"{where}: server {server!r} is listed twice (first at {first[server]})")
    inventory[server], first[server] = dict(labels), position


@dataclass(frozen=True)
class Change:
    """One inventory change: ``server`` gets ``labels`` (a new server or new labels), or is removed (``deleted``)."""

    server: str
    labels: dict[str, str]
    deleted: bool = False


def diff(current: dict[str, dict[str, str]], desired: dict[str, dict[str, str]], *, full: bool) -> list[Change]:
    """The changes that make ``current`` into ``desired``: upserts of new or relabelled servers and, if ``full``
    (``desired`` is the whole inventory), tombstones of the servers it leaves out. Sorted by server."""
    changes = [Change(s, labels) for s, labels in sorted(desired.items()) if current.get(s) != labels]
    if full:
        changes += [Change(s, {}, deleted=True) for s in sorted(set(current) - set(desired))]
    return sorted(changes, key=lambda c: c.server)


def fold(records: pa.Table, before: int | None = None) -> pa.Table:
    """The inventory table from changelog records (:data:`~metrics_lake.core.log.consumer.KEYED_ROW`): per server
    its newest record with offset below ``before`` (None: all), tombstoned servers left out; sorted by server.

    Columns as :data:`~metrics_lake.core.log.consumer.KEYED_ROW` (``deleted`` all false).
    """
    if before is not None:
        records = records.filter(pc.less(records.column("offset"), before))
    if records.num_rows == 0:
        return KEYED_ROW.empty_table()
    codes = pc.dictionary_encode(records.column("server")).combine_chunks()
    code = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    offset = records.column("offset").to_numpy(zero_copy_only=False)
    newest = np.full(len(codes.dictionary), -1, np.int64)
    np.maximum.at(newest, code, offset)
    latest = records.filter(pa.array(offset == newest[code]))
    latest = latest.filter(pc.invert(latest.column("deleted")))
    return latest.take(pc.sort_indices(latest.column("server")))


class Inventory:
    """The inventory topic of one lake (module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.log = SegmentLog(store)

    def ensure(self) -> None:
        """Create the inventory topic (one partition, compacted) unless it exists."""
        self.log.ensure_topic(INVENTORY_TOPIC, 1, compacted=True)

    def exists(self) -> bool:
        """Whether the inventory topic exists."""
        return self.store.exists(keys.topic_key(INVENTORY_TOPIC))

    def end_offset(self) -> int:
        """The inventory's log end offset (0 if it does not exist): the position "as of now"."""
        return self.log.index(INVENTORY_TOPIC, 0).next_offset if self.exists() else 0

    def records(self, start: int = 0) -> pa.Table:
        """Every record from offset ``start`` on (:data:`~metrics_lake.core.log.consumer.KEYED_ROW`)."""
        return read_keyed(self.log, INVENTORY_TOPIC, 0, start) if self.exists() else KEYED_ROW.empty_table()

    def current(self) -> dict[str, dict[str, str]]:
        """The current inventory: server -> labels."""
        table = fold(self.records())
        return dict(zip(table.column("server").to_pylist(), map(dict, table.column("labels").to_pylist()), strict=True))

    def append(self, changes: list[Change], *, changed_at: dt.datetime | None = None) -> AppendResult | None:
        """Append ``changes`` as one segment (atomically: all or none); None if there are none.

        Raises the log's errors (:class:`~metrics_lake.lake_schemas.errors.LeaseHeldError` if another writer keeps
        the partition for longer than 30 s, storage errors).
        """
        if not changes:
            return None
        self.ensure()
        ts = int((changed_at or dt.datetime.now(dt.UTC)).timestamp() * 1000)
        records = pa.table(
            {
                "offset": pa.array(np.zeros(len(changes), np.int64)),  # filled in by the log's writer
                "ts": pa.array(np.full(len(changes), ts, np.int64)).cast(INVENTORY_RECORD.field("ts").type),
                "server": [c.server for c in changes],
                "labels": pa.array([sorted(c.labels.items()) for c in changes], INVENTORY_RECORD.field("labels").type),
                "deleted": [c.deleted for c in changes],
            },
            schema=INVENTORY_RECORD,
        )
        return self.log.append(INVENTORY_TOPIC, 0, records)


def servers_rows(records: pa.Table) -> pa.Table:
    """Rows of the ``servers`` table (:data:`~metrics_lake.lake_schemas.tables.SERVERS`) from changelog records."""
    table = fold(records)
    return pa.table(
        {
            "server": table.column("server"),
            "labels": table.column("labels"),
            "valid_from_offset": table.column("offset"),
            "changed_at": table.column("ts"),
            "appended_at": table.column("ingested_at"),
        }
    ).cast(SERVERS)


def write_servers_table(store: Store, inventory: Inventory | None = None) -> bool:
    """Rewrite the ``servers`` table from the inventory if the inventory moved past what it holds; returns whether
    it committed.

    The inventory end offset it folds is recorded in the same commit (a
    ``txn`` action), so concurrent writers (``lake stream`` and ``lake
    inventory``) never move it back: each commits only a newer fold.
    """
    inventory = inventory or Inventory(store)
    name = Table.SERVERS

    def attempt() -> bool:
        table = ensure_table(store, name)
        end = inventory.end_offset()
        held = table.transaction_version(SERVERS_APP_ID)
        if held is not None and held >= end:
            return False
        rows = servers_rows(inventory.records())
        commit_changes(
            table,
            name,
            write_data_files(store, name, rows),
            [remove_action(f) for f in snapshot_files(store, name, table)],
            transactions=[Transaction(SERVERS_APP_ID, end)],
            operation="INVENTORY",
        )
        return True

    return retry_on_conflict(attempt, name)
