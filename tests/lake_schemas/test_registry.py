"""One registry: table names exist once (no literal elsewhere), operations declare their tables, keys come from one module.

The literal scan reads every Python file of ours but the tests (which pin
the documented names on purpose: a test using the constant could not notice
a table being renamed) with ``ast``: a string constant, or a piece of an
f-string, that is a table's name or holds one as a word is a literal, except
in docstrings and in ``lake_schemas/tables.py``, where the names are declared.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from metrics_lake.core import keys
from metrics_lake.infra.seaweedfs import GRANTS, identity_actions, least_privileged_identity
from metrics_lake.lake_schemas.table_access import (
    ANALYSIS,
    COMPACT,
    CONSUMERS,
    OPERATIONS,
    PRODUCE,
    QUALITY,
    QUERIES,
    RECOMPUTE,
    STREAM,
    TOKENS,
)
from metrics_lake.lake_schemas.tables import TABLES, Table, rollup_chain

ROOT = Path(__file__).resolve().parents[2]
#: Folders whose Python files must name tables through the table registry.
SCANNED = ("lake_schemas", "core", "agents", "spark", "infra", "quality", "app", "dags", "bench")
DECLARED_IN = Path("lake_schemas/tables.py")
NAME_WORD = re.compile(r"\b(" + "|".join(re.escape(name) for name in Table if "_" in name) + r")\b")
#: Names that are also English words (``alerts``) count only where they name a table: in SQL or a storage path.
WORD_NAME = re.compile(
    r"(?:\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+|tables/)("
    + "|".join(re.escape(n) for n in Table if "_" not in n)
    + r")\b",
    re.IGNORECASE,
)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def table_name_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in ``path`` naming a table, docstrings left out."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if NAME_WORD.search(node.value) or WORD_NAME.search(node.value):
                found.append((node.lineno, node.value))
    return found


def test_the_scan_finds_a_literal_and_skips_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Reads bronze_events."""\n'
        "def f(t):\n"
        '    """Writes query_results."""\n'
        '    return t == "metric_windows_1m" or f"SELECT * FROM dq_results WHERE {t}"\n'
        'print("no alerts fired", "SELECT * FROM alerts")\n'
    )
    found = table_name_literals(sample)
    assert sorted(found) == [
        (4, "SELECT * FROM dq_results WHERE "),
        (4, "metric_windows_1m"),
        (5, "SELECT * FROM alerts"),
    ]


def test_no_table_name_is_written_as_a_literal_outside_the_registry():
    tracked = subprocess.run(["git", "ls-files", *SCANNED], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [Path(name) for name in tracked.stdout.split() if name.endswith(".py") and Path(name) != DECLARED_IN]
    assert len(files) > 100
    literals = [f"{name}:{line}: {text!r}" for name in files for line, text in table_name_literals(ROOT / name)]
    assert literals == [], "use Table.<NAME> from metrics_lake.lake_schemas.tables:\n" + "\n".join(literals)


def test_table_members_are_the_registry_and_are_strings():
    assert list(TABLES) == list(Table)
    assert Table.BRONZE_EVENTS == "bronze_events" and f"{Table.BRONZE_EVENTS}" == "bronze_events"
    assert all(spec.name is name for name, spec in TABLES.items())


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_each_operation_names_declared_tables(name):
    operation = OPERATIONS[name]
    assert operation.name == name
    assert set(operation.tables) <= set(TABLES)
    assert len(set(operation.writes)) == len(operation.writes)


def test_operations_derive_what_the_registry_says():
    assert STREAM.writes == (
        Table.BRONZE_EVENTS,
        Table.QUARANTINE_EVENTS,
        Table.METRIC_WINDOWS_1M,
        Table.QUERY_RESULTS,
        Table.LAST_SEEN,
        Table.ALERTS,
        Table.SERVERS,
    )  # the speed layer's commit order: query results from committed windows, alerts from both and last_seen
    assert [spec.name for spec in rollup_chain()] == [Table.METRIC_ROLLUP_1H, Table.METRIC_ROLLUP_1D]
    assert set(RECOMPUTE.writes) == {Table.METRIC_WINDOWS_1M, Table.LAMBDA_RECONCILIATION}
    assert set(QUALITY.reads) >= {name for name, spec in TABLES.items() if spec.quality_suite}
    assert set(COMPACT.writes) == set(TABLES) and ANALYSIS.writes == (Table.SQL_AUDIT,)


def test_every_storage_key_comes_from_the_layout():
    assert keys.topic_key("metrics") == "log/metrics/topic.json"
    assert keys.lease_key("metrics", 3) == "log/metrics/3/lease.json"
    assert keys.index_key("metrics", 3) == "log/metrics/3/index.json"
    assert keys.partition_key("metrics", 3, "00000000000000000000.parquet") == (
        "log/metrics/3/00000000000000000000.parquet"
    )
    assert keys.consumer_offsets_key("speed-layer", "metrics") == "log/_consumers/speed-layer/metrics.json"
    assert keys.table_prefix(Table.BRONZE_EVENTS) == "tables/bronze_events"
    assert keys.table_lease_key(Table.METRIC_WINDOWS_1M) == "tables/_leases/metric_windows_1m.json"
    assert keys.quality_key("trend.html") == "quality/trend.html"
    for bad in ("..", "a/b", "_consumers", "Metrics", ""):
        with pytest.raises(ValueError, match="not a valid name"):
            keys.topic_key(bad)
    with pytest.raises(ValueError, match="consumer group"):
        keys.consumer_offsets_key("a/b", "metrics")


def test_no_module_builds_a_key_by_hand():
    """Keys under the lake root are spelled only in the layout module (and the tests)."""
    pattern = re.compile(r"""["'](log|tables|quality)/""")
    tracked = subprocess.run(["git", "ls-files", *SCANNED[:-2]], cwd=ROOT, capture_output=True, text=True, check=True)
    offenders = []
    for name in tracked.stdout.split():
        if name.endswith(".py") and name != "core/keys.py":
            tree = ast.parse((ROOT / name).read_text())
            docstrings = _docstrings(tree)
            offenders += [
                f"{name}:{node.lineno}: {node.value!r}"
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and pattern.match(repr(node.value))
            ]
    assert offenders == []


def test_the_object_store_policies_are_the_layout_s_prefixes():
    actions = identity_actions("lake")
    assert actions["agent"] == ["Read:lake/log/*", "Write:lake/log/*", "Read:lake/auth/*", "List:lake"]
    assert "Write:lake/log/_consumers/*" in actions["pipeline"] and "Write:lake/log/*" not in actions["pipeline"]
    assert actions["analyst"] == [
        "Read:lake/tables/*",
        "Write:lake/tables/sql_audit/*",  # the audit of their own statements, and no other table
        "Read:lake/quality/*",
        "Read:lake/registry/*",
        "Read:lake/auth/*",
        "List:lake",
    ]
    assert "Write:lake/registry/*" in actions["pipeline"]
    assert not any(action.startswith("Write:lake/auth") for grants in actions.values() for action in grants)
    assert set(GRANTS) == {"agent", "pipeline", "analyst"}


@pytest.mark.parametrize(
    ("operation", "identity"),
    [
        (PRODUCE, "agent"),
        (STREAM, "pipeline"),
        (CONSUMERS, "agent"),
        (ANALYSIS, "analyst"),
        (QUERIES, "pipeline"),
        (COMPACT, "admin"),
        (TOKENS, "admin"),
    ],
)
def test_each_operation_gets_the_least_privileged_identity_covering_it(operation, identity):
    assert least_privileged_identity(keys.grants(operation)) == identity
