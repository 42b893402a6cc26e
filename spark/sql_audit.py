"""The SQL audit: every statement run through ``lake sql-server`` or ``lake sql``, recorded once in ``sql_audit``.

The endpoint's statements are followed in its JVM (``spark/jvm/metricslake/spark/LakeAudit.java``: a Spark
listener on the Spark Connect and Thrift servers' operation events), which queues one JSON record per
statement when it ends. :class:`AuditWriter` drains that queue every :data:`DRAIN_SECONDS` on a thread of its
own, off every query's path, and appends the records to ``sql_audit`` in one Delta commit per drain, carrying a
``txn`` (app id ``sql-audit/<writer id>``, the drain's number) so that a commit retried after an unclear failure
adds nothing twice (:func:`~metrics_lake.core.tables.commits.commit_files`). A commit that fails keeps its
records for the next round; records still queued when the server stops are written before it exits. Statements
of a server killed with SIGKILL since its last drain are lost with it (at most :data:`DRAIN_SECONDS` of them).

``lake sql`` appends its one statement itself (:func:`append_statement`) after printing the result.

Columns and units: :data:`metrics_lake.lake_schemas.tables.SQL_AUDIT`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import uuid

import pyarrow as pa

from metrics_lake.core.storage import Store
from metrics_lake.core.tables.commits import commit_files, retry_on_conflict
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.lake_schemas.tables import SQL_AUDIT, Table

__all__ = ["DRAIN_SECONDS", "AuditWriter", "append_statement", "audit_rows"]

log = logging.getLogger(__name__)
#: How often the endpoint's finished statements are written to ``sql_audit`` (seconds).
DRAIN_SECONDS = 1.0
#: Most statements one commit holds.
MAX_PER_COMMIT = 10_000


def audit_rows(records: list[dict]) -> pa.Table:
    """``sql_audit`` rows from the JVM's records (``statement_id``, ``session_id``, ``client``, ``kind``,
    ``caller``, ``statement``, ``started_ms`` epoch ms, ``duration_ms``, ``outcome``, optional ``error``,
    ``rows``, ``files``)."""
    rows = []
    for r in records:
        started = dt.datetime.fromtimestamp(r["started_ms"] / 1000, dt.UTC)
        rows.append(
            {
                "statement_id": r["statement_id"],
                "session_id": r.get("session_id"),
                "client": r["client"],
                "kind": r["kind"],
                "caller": r["caller"],
                "statement": r.get("statement") or "",
                "started_at": started,
                "duration_ms": r.get("duration_ms"),
                "rows": r.get("rows"),
                "files": r.get("files"),
                "outcome": r["outcome"],
                "error": r.get("error"),
                "started_date": started.date(),
            }
        )
    return pa.Table.from_pylist(rows, schema=SQL_AUDIT)


def append_statement(
    store: Store,
    *,
    caller: str,
    client: str,
    statement: str,
    started: dt.datetime,
    seconds: float,
    rows: int | None,
    error: str | None,
) -> None:
    """Append one statement's row to ``sql_audit`` (``lake sql``'s own): outcome ``error`` when ``error`` is
    given, else ``ok``; ``started`` is aware (UTC), ``seconds`` its duration. Raises what the store raises."""
    record = {
        "statement_id": str(uuid.uuid4()),
        "session_id": None,
        "client": client,
        "kind": "query",
        "caller": caller,
        "statement": statement,
        "started_ms": int(started.timestamp() * 1000),
        "duration_ms": int(seconds * 1000),
        "rows": rows,
        "files": None,
        "outcome": "ok" if error is None else "error",
        "error": error,
    }
    files = write_data_files(store, Table.SQL_AUDIT, audit_rows([record]))
    retry_on_conflict(
        lambda: ensure_table(store, Table.SQL_AUDIT).create_write_transaction(
            [f.add_action() for f in files], mode="append", schema=SQL_AUDIT, partition_by=["started_date"]
        ),
        f"{Table.SQL_AUDIT} append",
    )


class AuditWriter:
    """Writes the endpoint's finished statements to ``sql_audit`` every :data:`DRAIN_SECONDS` (module docstring).

    ``jvm``: the py4j view of the server's JVM (``spark._jvm``); ``verbose``: also log one line per statement
    (who, client, outcome, milliseconds, rows, files, the statement's first 200 characters). :meth:`start` runs
    it on a daemon thread; :meth:`stop` ends the thread after a last drain. :meth:`flush` is one round.
    """

    def __init__(self, store: Store, jvm, *, verbose: bool = False) -> None:
        self.store = store
        self.audit = jvm.metricslake.spark.LakeAudit
        self.verbose = verbose
        self.app_id = f"sql-audit/{uuid.uuid4()}"
        self.next_batch = 0
        self._held: list[pa.Table] = []  # drained, in no batch yet
        self._pending: tuple[list, int] | None = None  # a batch's files written, its commit not landed yet
        self._stop = threading.Event()
        self._flushing = threading.Lock()  # the thread's round and stop()'s last one never overlap
        self._thread: threading.Thread | None = None
        self._dropped = 0

    def start(self) -> None:
        """Drain on a daemon thread until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="sql-audit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread after a last drain (the server's statements up to now are written)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(DRAIN_SECONDS):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - the store may be briefly unreachable: the records wait
                log.warning("writing the SQL audit failed (its statements are kept and retried): %s", exc)

    def flush(self) -> int:
        """Drain the JVM's finished statements and commit them; returns the rows committed this round.

        Records drained are written as files once; their commit is retried with the same batch number until it
        lands (a retry after a commit that did land adds nothing), and records drained meanwhile wait for the
        next batch."""
        with self._flushing:
            return self._flush()

    def _flush(self) -> int:
        drained = audit_rows([json.loads(r) for r in self.audit.drain(MAX_PER_COMMIT)])
        dropped = self.audit.dropped()
        if dropped > self._dropped:
            log.error("the SQL audit fell behind and dropped %d statements' records", dropped - self._dropped)
            self._dropped = dropped
        if self.verbose:
            for r in drained.to_pylist():
                log.info(
                    "%s %s %s %s %d ms, %s rows, %s files: %s",
                    r["caller"],
                    r["client"],
                    r["kind"],
                    r["outcome"],
                    r["duration_ms"] or 0,
                    "?" if r["rows"] is None else r["rows"],
                    "?" if r["files"] is None else r["files"],
                    " ".join(r["statement"].split())[:200],
                )
        if drained.num_rows:
            self._held.append(drained)
        if self._pending is None and self._held:
            rows = pa.concat_tables(self._held)
            files = write_data_files(self.store, Table.SQL_AUDIT, rows)
            self._pending, self._held = ([f.add_action() for f in files], rows.num_rows), []
        if self._pending is None:
            return 0
        actions, count = self._pending
        commit_files(self.store, Table.SQL_AUDIT, actions, app_id=self.app_id, batch_id=self.next_batch)
        self._pending = None
        self.next_batch += 1
        return count
