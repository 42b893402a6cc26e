"""The lake's storage layout: every object key under the lake root is built here, from names checked here.

Keys are ``/``-separated paths relative to ``LAKE_ROOT`` (a local directory
or ``s3://bucket/prefix``)::

    log/<topic>/topic.json                        topic_key: partition count, created once
    log/<topic>/<partition>/lease.json            lease_key: the writer's lease
    log/<topic>/<partition>/index.json            index_key: the partition index
    log/<topic>/<partition>/index-chunks/<name>.json
                                                  index_chunk_key: an immutable run of the index's older
                                                  entries, named from the index (core/log/index.py)
    log/<topic>/<partition>/<segment>.parquet     partition_key: immutable segments
    log/_consumers/<group>/<topic>.json           consumer_offsets_key: a consumer group's offsets
    log/_consumers/<group>/<topic>.inventory/<n>.json
                                                  inventory_pin_key: the inventory version the group joins
                                                  events with, from which offsets on
    tables/<name>/                                table_prefix: a Delta table (_delta_log/ and data files)
    tables/<name>/_delta_log/<version>.json       table_commit_key: the Delta commit of one version
    tables/_leases/<name>.json                    table_lease_key: a table's maintenance lease
    quality/<path>                                quality_key: data docs and the trend plot
    registry/versions/<version>.json              config_version_key: stored queries and alert rules, one
                                                  immutable object per version (core/config_store.py)
    notifications/<receiver>.json                 notifications_key: which alert transitions a receiver
                                                  (Alertmanager) has accepted: the outbox's delivery record
    auth/tokens.json                              TOKENS_KEY: the gateway's and dashboard's access tokens
                                                  (salted hashes only; core/tokens.py)

The seven prefixes :data:`LOG_PREFIX`, :data:`CONSUMERS_PREFIX`,
:data:`TABLES_PREFIX`, :data:`QUALITY_PREFIX`, :data:`CONFIG_PREFIX`,
:data:`NOTIFICATIONS_PREFIX` and :data:`AUTH_PREFIX` are the units the
object-store identities are granted (``metrics_lake.infra.seaweedfs``), and
:func:`grants` says which of them an operation
(:mod:`metrics_lake.lake_schemas.table_access`) needs.

Names that become part of a key (topics, tables) must match
:data:`NAME_PATTERN`: a lower-case letter followed by at most 63 lower-case
letters, digits and underscores, so a name can never leave its folder
(``..``, ``a/x``, an absolute path) or collide with a hidden, temporary or
reserved object (a leading ``.`` or ``_``: ``_consumers``, ``_leases``,
``_delta_log``); it is also a valid SQL identifier without quoting.
"""

from __future__ import annotations

import re

from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.table_access import Access, LogAccess, Operation
from metrics_lake.lake_schemas.tables import Table

__all__ = [
    "AUTH_PREFIX",
    "CONSUMERS_PREFIX",
    "INDEX_CHUNKS_FOLDER",
    "INVENTORY_TOPIC",
    "LOG_PREFIX",
    "NAME_PATTERN",
    "NOTIFICATIONS_PREFIX",
    "QUALITY_PREFIX",
    "CONFIG_PREFIX",
    "SQL_AUDIT_PREFIX",
    "CONFIG_VERSIONS_PREFIX",
    "TABLES_PREFIX",
    "TOKENS_KEY",
    "check_group",
    "check_name",
    "consumer_group_prefix",
    "consumer_offsets_key",
    "grants",
    "index_chunk_key",
    "index_chunks_prefix",
    "index_key",
    "inventory_pin_key",
    "inventory_pins_prefix",
    "is_group",
    "is_name",
    "lease_key",
    "notifications_key",
    "partition_key",
    "partition_prefix",
    "quality_key",
    "config_version_key",
    "table_commit_key",
    "table_key",
    "table_lease_key",
    "table_prefix",
    "topic_key",
]

#: The segment log.
LOG_PREFIX = "log"
#: Consumer groups' committed offsets (inside the log's prefix, granted apart from it).
CONSUMERS_PREFIX = f"{LOG_PREFIX}/_consumers"
#: Delta tables.
TABLES_PREFIX = "tables"
#: The statement audit's table: the one table its readers write (each the statements they run).
SQL_AUDIT_PREFIX = f"{TABLES_PREFIX}/{Table.SQL_AUDIT}"
#: Data-quality reports copied from the local GX project (for an S3 lake).
QUALITY_PREFIX = "quality"
#: The config store of stored queries and alert rules: operators' configuration, versioned. (The folder keeps
#: the name it had before the store was called the config store: existing lakes hold their versions there.)
CONFIG_PREFIX = "registry"
#: One immutable object per config version.
CONFIG_VERSIONS_PREFIX = f"{CONFIG_PREFIX}/versions"
#: What each alert receiver has accepted (the outbox's delivery records).
NOTIFICATIONS_PREFIX = "notifications"
#: Access tokens of the gateway and the dashboard: read by the servers that check them, written by admins only.
AUTH_PREFIX = "auth"
#: The one object holding every access token's record (replaced by compare-and-swap).
TOKENS_KEY = f"{AUTH_PREFIX}/tokens.json"

#: The server inventory's topic (keyed, compacted: ``metrics_lake.core.inventory``); reserved, ``LAKE_TOPIC`` may
#: not name it.
INVENTORY_TOPIC = "inventory"
#: Topic and table names (also the pattern of ``LAKE_TOPIC``).
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_NAME = re.compile(NAME_PATTERN)
#: Consumer group names (Kafka allows more; these stay safe as a key part).
_GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TABLE_LEASES = f"{TABLES_PREFIX}/_leases"


def is_name(name: object) -> bool:
    """Whether ``name`` is a valid topic or table name (:data:`NAME_PATTERN`)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_name(what: str, name: str) -> str:
    """Return ``name`` if it matches :data:`NAME_PATTERN`; else raise :class:`InputError`.

    ``what`` says where the name came from in the message (``"--into"``, ``"topic"``...).
    """
    if not is_name(name):
        raise InputError(
            f"{what} {name!r} is not a valid name: use a lower-case letter, then up to 63 lower-case letters, "
            f"digits or underscores (e.g. bronze_copy)"
        )
    return name


def is_group(group: object) -> bool:
    """Whether ``group`` is a valid consumer group name: 1-64 letters, digits, ``_``, ``.``, ``-``."""
    return isinstance(group, str) and _GROUP.fullmatch(group) is not None


def check_group(group: str) -> str:
    """Return consumer group name ``group`` if :func:`is_group`; else raise :class:`InputError`."""
    if not is_group(group):
        raise InputError(f"consumer group {group!r}: use 1-64 letters, digits, '_', '.', '-'")
    return group


def topic_key(topic: str) -> str:
    """``log/<topic>/topic.json``: the topic's partition count."""
    return f"{LOG_PREFIX}/{check_name('topic', topic)}/topic.json"


def partition_prefix(topic: str, partition: int) -> str:
    """``log/<topic>/<partition>``: the prefix of one partition's objects."""
    return f"{LOG_PREFIX}/{check_name('topic', topic)}/{int(partition)}"


def partition_key(topic: str, partition: int, name: str) -> str:
    """``log/<topic>/<partition>/<name>``: one object of a partition (a segment, its index, its lease)."""
    return f"{partition_prefix(topic, partition)}/{name}"


def lease_key(topic: str, partition: int) -> str:
    """``log/<topic>/<partition>/lease.json``: the partition writer's lease."""
    return partition_key(topic, partition, "lease.json")


def index_key(topic: str, partition: int) -> str:
    """``log/<topic>/<partition>/index.json``: the partition index."""
    return partition_key(topic, partition, "index.json")


#: Folder of a partition's index chunks, relative to the partition.
INDEX_CHUNKS_FOLDER = "index-chunks"


def index_chunks_prefix(topic: str, partition: int) -> str:
    """``log/<topic>/<partition>/index-chunks``: the partition index's chunks."""
    return partition_key(topic, partition, INDEX_CHUNKS_FOLDER)


def index_chunk_key(topic: str, partition: int, name: str) -> str:
    """``log/<topic>/<partition>/index-chunks/<name>``: one chunk of the partition index.

    ``name`` is the chunk's file name alone; raises :class:`InputError` for a
    name that is not a plain file name (the index is read from storage).
    """
    if "/" in name or name.startswith(".") or not name.endswith(".json"):
        raise InputError(f"index chunk name {name!r} is not a chunk's file name (<...>.json)")
    return f"{index_chunks_prefix(topic, partition)}/{name}"


def consumer_group_prefix(group: str) -> str:
    """``log/_consumers/<group>``: a consumer group's offsets, one object per topic."""
    return f"{CONSUMERS_PREFIX}/{check_group(group)}"


def consumer_offsets_key(group: str, topic: str) -> str:
    """``log/_consumers/<group>/<topic>.json``: ``group``'s committed offsets in ``topic``."""
    return f"{consumer_group_prefix(group)}/{check_name('topic', topic)}.json"


def inventory_pins_prefix(group: str, topic: str) -> str:
    """``log/_consumers/<group>/<topic>.inventory``: which inventory version ``group`` joined ``topic``'s events
    with, from which offsets (``metrics_lake.core.speed.enrichment``)."""
    return f"{consumer_group_prefix(group)}/{check_name('topic', topic)}.inventory"


def inventory_pin_key(group: str, topic: str, inventory_end: int) -> str:
    """``log/_consumers/<group>/<topic>.inventory/<inventory end>.json``: one pin, created once."""
    return f"{inventory_pins_prefix(group, topic)}/{inventory_end:020d}.json"


def limit_states_prefix(group: str, topic: str, partition: int) -> str:
    """``log/_consumers/<group>/<topic>.limits/<partition>``: the cardinality-limit states of ``group``'s reading of
    one partition (``metrics_lake.core.speed.cardinality_gate``)."""
    return f"{consumer_group_prefix(group)}/{check_name('topic', topic)}.limits/{int(partition)}"


def limit_state_key(group: str, topic: str, partition: int, hour_us: int) -> str:
    """``log/_consumers/<group>/<topic>.limits/<partition>/<hour>.arrow``: one limit hour's state, named by the
    hour's start in epoch µs."""
    return f"{limit_states_prefix(group, topic, partition)}/{int(hour_us):020d}.arrow"


def table_prefix(name: str) -> str:
    """``tables/<name>``: a Delta table's folder."""
    return f"{TABLES_PREFIX}/{check_name('table', name)}"


def table_key(name: str, relative: str) -> str:
    """``tables/<name>/<relative>``: an object of a table (a data file, ``_delta_log``)."""
    return f"{table_prefix(name)}/{relative}"


def table_commit_key(name: str, version: int) -> str:
    """``tables/<name>/_delta_log/<version, 20 digits>.json``: the Delta commit that made ``version`` of a table
    (the Delta protocol's name for a commit file)."""
    return table_key(name, f"_delta_log/{version:020d}.json")


def table_lease_key(name: str) -> str:
    """``tables/_leases/<name>.json``: the table's maintenance lease (compaction, day rewrites)."""
    return f"{_TABLE_LEASES}/{check_name('table', name)}.json"


def quality_key(relative: str) -> str:
    """``quality/<relative>``: a published data-quality report file."""
    return f"{QUALITY_PREFIX}/{relative}"


def config_version_key(version: int) -> str:
    """``registry/versions/<version>.json``, zero-padded to 12 digits so that listing order is version order."""
    if not 1 <= version < 10**12:
        raise ValueError(f"config version {version} out of range")  # programming error
    return f"{CONFIG_VERSIONS_PREFIX}/{version:012d}.json"


def notifications_key(receiver: str) -> str:
    """``notifications/<receiver>.json``: the transitions of ``alerts`` that ``receiver`` has accepted."""
    return f"{NOTIFICATIONS_PREFIX}/{check_name('receiver', receiver)}.json"


def grants(operation: Operation) -> frozenset[tuple[str, str]]:
    """The ``(verb, prefix)`` pairs ``operation`` needs of the store, verb ``"read"`` or ``"write"``.

    A log reader writes its consumer offsets; a table writer reads the table
    first (snapshots, positions); a log writer reads the index and leases.
    """
    needed: set[tuple[str, str]] = set()
    if operation.log is LogAccess.INSPECT:
        needed.add(("read", LOG_PREFIX))
    elif operation.log is LogAccess.READ:
        needed |= {("read", LOG_PREFIX), ("write", CONSUMERS_PREFIX)}
    elif operation.log in (LogAccess.WRITE, LogAccess.REWRITE):
        needed |= {("read", LOG_PREFIX), ("write", LOG_PREFIX)}
    if operation.reads or operation.writes:
        needed.add(("read", TABLES_PREFIX))
    if set(operation.writes) - {Table.SQL_AUDIT}:
        needed.add(("write", TABLES_PREFIX))
    elif operation.writes:  # the one table readers write: their statements' audit
        needed.add(("write", SQL_AUDIT_PREFIX))
    if operation.reports:
        needed |= {("read", QUALITY_PREFIX), ("write", QUALITY_PREFIX)}
    if operation.config_store is not None:
        needed.add(("read", CONFIG_PREFIX))
    if operation.config_store is Access.WRITE:
        needed.add(("write", CONFIG_PREFIX))
    if operation.notifies:
        needed |= {("read", NOTIFICATIONS_PREFIX), ("write", NOTIFICATIONS_PREFIX)}
    if operation.tokens is not None:
        needed.add(("read", AUTH_PREFIX))
    if operation.tokens is Access.WRITE:
        needed.add(("write", AUTH_PREFIX))
    return frozenset(needed)
