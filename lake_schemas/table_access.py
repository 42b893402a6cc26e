"""What each operation of the lake reads and writes, declared once.

An :class:`Operation` is one step users and schedulers run: a ``lake``
command, an Airflow task, a Spark job. It declares the tables it reads and
writes (:class:`~metrics_lake.lake_schemas.tables.Table`) and how it uses the
log. The rest derives from these declarations instead of repeating them:

- the Airflow tasks' outlets (``metrics_lake.app.orchestration.outlets``):
  a task that runs an operation updates the Assets of its ``writes``;
- the CLI opens (creating if absent) an operation's tables before it starts
  Spark, so a wrong root or a missing permission fails in a second, and
  names the object-store identity an operation needs when access is denied
  (``metrics_lake.core.keys.grants`` and ``metrics_lake.infra.seaweedfs``);
- the jobs ensure and commit the tables their operation names
  (the speed layer commits its ``writes`` in that order).

Writes are in commit order. An operation that reads a table it also writes
lists it in both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from metrics_lake.lake_schemas.tables import TABLES, Table, rollup_chain

__all__ = [
    "ALERTS",
    "ANALYSIS",
    "COMPACT",
    "CONSUMERS",
    "DEMO",
    "INVENTORY",
    "Access",
    "OPERATIONS",
    "PRODUCE",
    "QUALITY",
    "QUERIES",
    "RECOMPUTE",
    "REPLAY",
    "RETAIN",
    "ROLLUP",
    "STREAM",
    "TOKENS",
    "LogAccess",
    "Operation",
]


class LogAccess(StrEnum):
    """How an operation uses the segment log."""

    #: Reads records and commits its consumer group's offsets.
    READ = "read"
    #: Reads the partition indexes and the consumer groups' offsets, no records.
    INSPECT = "inspect"
    #: Appends records (producers, the gateway).
    WRITE = "write"
    #: Rewrites or deletes segments (compaction, retention); offsets never move.
    REWRITE = "rewrite"


class Access(StrEnum):
    """How an operation uses a store prefix other than the log (the config store of stored queries and alert rules)."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True)
class Operation:
    """One operation of the lake (module docstring).

    ``name``: the ``lake`` command that runs it; ``summary``: one line for
    help texts; ``reads``/``writes``: the tables it reads and commits to
    (writes in commit order); ``log``: its use of the log, if any;
    ``reports``: whether it publishes files under ``quality/`` (data docs);
    ``config_store``: its use of the config store of stored queries and alert rules
    (``metrics_lake.core.config_store``), if any; ``notifies``: whether it sends
    alerts to Alertmanager (and keeps its outbox's delivery record under
    ``notifications/``); ``tokens``: its use of the access tokens under
    ``auth/`` (the gateway and the dashboard read them to check requests,
    ``lake tokens`` writes them).
    """

    name: str
    summary: str
    reads: tuple[Table, ...] = ()
    writes: tuple[Table, ...] = ()
    log: LogAccess | None = None
    reports: bool = False
    config_store: Access | None = None
    notifies: bool = False
    tokens: Access | None = None

    @property
    def tables(self) -> tuple[Table, ...]:
        """Every table the operation touches, reads first, each once."""
        return tuple(dict.fromkeys((*self.reads, *self.writes)))


_ROLLUPS = rollup_chain()
_SUITES = tuple(name for name, spec in TABLES.items() if spec.quality_suite)

#: Producers: ``lake produce``, ``lake agent``, ``lake gateway`` (which checks its clients' tokens).
PRODUCE = Operation("produce", "append metric events to the log", log=LogAccess.WRITE, tokens=Access.READ)
#: The speed layer; query results are evaluated from the windows it has just committed, alert rules from the
#: query results and the servers' last-seen times it has just committed; it also sends the alerts.
STREAM = Operation(
    "stream",
    "speed layer: log -> bronze, quarantine, 1-minute windows, stored query results and alerts, exactly once",
    reads=(Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS, Table.LAST_SEEN, Table.ALERTS),
    writes=(
        Table.BRONZE_EVENTS,
        Table.QUARANTINE_EVENTS,
        Table.METRIC_WINDOWS_1M,
        Table.QUERY_RESULTS,
        Table.LAST_SEEN,
        Table.ALERTS,
        Table.SERVERS,
    ),
    log=LogAccess.READ,
    config_store=Access.WRITE,  # seeds a new lake's config store from the shipped declarations
    notifies=True,
)
#: Re-reads a log range through the bronze path, skipping the positions the tables hold.
REPLAY = Operation(
    "replay",
    "re-read a log range into bronze and quarantine; rows already present are skipped",
    reads=(Table.BRONZE_EVENTS, Table.QUARANTINE_EVENTS),
    writes=(Table.BRONZE_EVENTS, Table.QUARANTINE_EVENTS),
    log=LogAccess.READ,
)
#: The batch layer; reads the speed layer's windows and the last reconciliation before replacing the day.
RECOMPUTE = Operation(
    "recompute",
    "batch layer: rebuild days of 1-minute windows from bronze and reconcile them with the speed layer's",
    reads=(Table.BRONZE_EVENTS, Table.METRIC_WINDOWS_1M, Table.LAMBDA_RECONCILIATION),
    writes=(Table.METRIC_WINDOWS_1M, Table.LAMBDA_RECONCILIATION),
)
#: Rollups, each table from the finer one (the registry's rollup chain).
ROLLUP = Operation(
    "rollup",
    "downsample days of 1-minute windows into the 1-hour and 1-day rollups",
    reads=tuple(spec.rollup_of for spec in _ROLLUPS if spec.rollup_of is not None),
    writes=tuple(spec.name for spec in _ROLLUPS),
)
#: Stored queries: managing the config store, evaluating whole days (the nightly run) and backfills.
QUERIES = Operation(
    "queries",
    f"manage the stored queries and evaluate them over days into {Table.QUERY_RESULTS}",
    reads=(Table.METRIC_WINDOWS_1M, Table.QUERY_RESULTS),
    writes=(Table.QUERY_RESULTS,),
    config_store=Access.WRITE,
)
#: Alert rules: managing them in the config store, sending the alerts to Alertmanager, the nightly evaluation.
ALERTS = Operation(
    "alerts",
    f"manage the alert rules, send the alerts to Alertmanager and evaluate rules over whole days into {Table.ALERTS}",
    reads=(Table.QUERY_RESULTS, Table.ALERTS),
    writes=(Table.ALERTS,),
    config_store=Access.WRITE,
    notifies=True,
)
#: Great Expectations suites of a day, plus the freshness of the newest windows and query results.
QUALITY = Operation(
    "quality",
    f"validate a day of every table with a quality suite; results to {Table.DQ_RESULTS}, data docs to quality/",
    reads=(*_SUITES, Table.QUERY_RESULTS),
    writes=(Table.DQ_RESULTS,),
    reports=True,
    config_store=Access.READ,
)
#: The server inventory: appends changes to the ``inventory`` topic and folds it into ``servers``.
INVENTORY = Operation(
    "inventory",
    f"change the server inventory (labels per server) and show it; folded into {Table.SERVERS}",
    reads=(Table.SERVERS,),
    writes=(Table.SERVERS,),
    log=LogAccess.WRITE,
)
#: Consumer groups' positions and lag (``lake consumers``).
CONSUMERS = Operation("consumers", "show consumer groups' committed offsets and lag", log=LogAccess.INSPECT)
#: Compaction of log segments and Delta files.
COMPACT = Operation(
    "compact",
    "merge small log segments and bin-pack small Delta files",
    reads=tuple(TABLES),
    writes=tuple(TABLES),
    log=LogAccess.REWRITE,
)
#: Retention per resolution and VACUUM.
RETAIN = Operation(
    "retain",
    "delete what is past its retention from the log and every table, then VACUUM",
    reads=tuple(TABLES),
    writes=tuple(TABLES),
    log=LogAccess.REWRITE,
)
#: Analysts and the dashboard: every table, read only, but for the audit of the statements they run.
ANALYSIS = Operation(
    "sql",
    "read the tables and the stored queries (Spark SQL, the dashboard, table listings)",
    reads=tuple(TABLES),
    writes=(Table.SQL_AUDIT,),
    config_store=Access.READ,
    tokens=Access.READ,  # the dashboard checks its users' tokens
)
#: ``lake tokens``: create, list and revoke the gateway's and dashboard's access tokens.
TOKENS = Operation("tokens", "create, list and revoke access tokens", tokens=Access.WRITE)
#: The demo: produces, then runs the speed layer, in one process.
DEMO = Operation(
    "demo",
    "produce a minute of metrics and run the speed layer over them",
    reads=STREAM.reads,
    writes=STREAM.writes,
    log=LogAccess.WRITE,
    config_store=STREAM.config_store,
    notifies=STREAM.notifies,
)

#: Every operation by name.
OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        PRODUCE,
        STREAM,
        REPLAY,
        CONSUMERS,
        RECOMPUTE,
        ROLLUP,
        QUERIES,
        ALERTS,
        INVENTORY,
        QUALITY,
        COMPACT,
        RETAIN,
        ANALYSIS,
        TOKENS,
        DEMO,
    )
}
