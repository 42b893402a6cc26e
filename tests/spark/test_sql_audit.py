"""The SQL audit's writer: what the JVM queues reaches `sql_audit` once, also when a commit fails or its answer is
lost; `lake sql`'s own rows. (The endpoint end to end: tests/integration/test_sql_audit.py.)"""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.spark import sql_audit
from metrics_lake.spark.sql_audit import AuditWriter, append_statement

START_MS = 1_800_000_000_000


class FakeAudit:
    """The JVM's LakeAudit as the writer sees it: a queue of JSON records and a dropped count."""

    def __init__(self) -> None:
        self.queue: list[str] = []
        self.made = 0
        self.dropped_records = 0

    def finish(self, n: int, outcome: str = "ok") -> None:
        for i in range(self.made, self.made + n):
            record = {
                "statement_id": f"op-{i}",
                "session_id": "s-1",
                "client": "jdbc",
                "kind": "statement",
                "caller": "ana",
                "statement": f"SELECT {i}",
                "started_ms": START_MS + i,
                "duration_ms": 3,
                "outcome": outcome,
                "files": 2,
            }
            self.queue.append(json.dumps(record))
        self.made += n

    def drain(self, most: int) -> list[str]:
        taken, self.queue = self.queue[:most], self.queue[most:]
        return taken

    def dropped(self) -> int:
        return self.dropped_records


def writer(store) -> tuple[AuditWriter, FakeAudit]:
    audit = FakeAudit()
    jvm = SimpleNamespace(metricslake=SimpleNamespace(spark=SimpleNamespace(LakeAudit=audit)))
    return AuditWriter(store, jvm), audit


def audit_rows(store) -> list[dict]:
    return sorted(open_table(store, Table.SQL_AUDIT).to_pyarrow_table().to_pylist(), key=lambda r: r["statement"])


def test_drained_statements_are_committed_once_with_their_columns(store):
    w, audit = writer(store)
    assert w.flush() == 0  # nothing queued: no commit, no table
    audit.finish(3)
    assert w.flush() == 3 and w.flush() == 0
    rows = audit_rows(store)
    assert [r["statement_id"] for r in rows] == ["op-0", "op-1", "op-2"]
    first = rows[0]
    assert first["started_at"] == dt.datetime.fromtimestamp(START_MS / 1000, dt.UTC)
    assert first["started_date"] == first["started_at"].date()
    assert (first["client"], first["kind"], first["caller"], first["outcome"]) == ("jdbc", "statement", "ana", "ok")
    assert (first["duration_ms"], first["rows"], first["files"], first["error"]) == (3, None, 2, None)


def test_a_failed_commit_is_retried_with_its_records_and_later_ones_wait_for_the_next(store, monkeypatch):
    w, audit = writer(store)
    audit.finish(2)
    real = sql_audit.commit_files

    def failing(*args, **kwargs):
        raise OSError("the store is unreachable")

    monkeypatch.setattr(sql_audit, "commit_files", failing)
    with pytest.raises(OSError):
        w.flush()
    audit.finish(1)  # drained into the next batch while the first waits
    monkeypatch.setattr(sql_audit, "commit_files", real)
    assert w.flush() == 2  # the first batch, as it was
    assert w.flush() == 1
    assert [r["statement_id"] for r in audit_rows(store)] == ["op-0", "op-1", "op-2"]


def test_a_commit_whose_answer_was_lost_is_not_applied_twice(store, monkeypatch):
    w, audit = writer(store)
    audit.finish(2)
    real = sql_audit.commit_files

    def landed_then_failed(*args, **kwargs):
        real(*args, **kwargs)
        raise TimeoutError("the answer of the commit was lost")

    monkeypatch.setattr(sql_audit, "commit_files", landed_then_failed)
    with pytest.raises(TimeoutError):
        w.flush()
    monkeypatch.setattr(sql_audit, "commit_files", real)
    assert w.flush() == 2  # the retry finds its batch committed and adds nothing
    assert [r["statement_id"] for r in audit_rows(store)] == ["op-0", "op-1"]


def test_a_writer_that_fell_behind_says_how_many_records_were_dropped(store, caplog):
    w, audit = writer(store)
    audit.dropped_records = 5
    w.flush()
    assert "dropped 5 statements' records" in caplog.text


def test_lake_sql_appends_its_statement(store):
    started = dt.datetime(2027, 1, 15, 12, 0, tzinfo=dt.UTC)
    append_statement(
        store,
        caller="alice",
        client="lake sql",
        statement="SELECT 1",
        started=started,
        seconds=0.25,
        rows=1,
        error=None,
    )
    append_statement(
        store, caller="alice", client="lake sql", statement="SELECT x", started=started, seconds=0.1, rows=None,
        error="[UNRESOLVED_COLUMN] x",
    )  # fmt: skip
    ok, failed = audit_rows(store)
    assert (ok["kind"], ok["duration_ms"], ok["rows"], ok["outcome"], ok["started_date"]) == (
        "query",
        250,
        1,
        "ok",
        dt.date(2027, 1, 15),
    )
    assert (failed["outcome"], failed["error"]) == ("error", "[UNRESOLVED_COLUMN] x")
