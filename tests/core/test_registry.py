"""The registry of stored queries: versions, revisions, history, declarative diffs, conflicts, bad input."""

from __future__ import annotations

import threading

import pytest

from metrics_lake.core import keys
from metrics_lake.core.registry import Change, Registry, declared_changes, read_declarations
from metrics_lake.lake_schemas.errors import NotFoundError, RegistryConflictError, StoredQueryError

SEED = """
[[queries]]
name = "cpu"
description = "fleet cpu"
query = "FROM * SELECT host.cpu WINDOW 5m COMPUTE avg"
"""
LAT = "FROM web-* SELECT app.lat WINDOW 10m EVERY 5m COMPUTE percentile(99), count"


@pytest.fixture
def registry(store, tmp_path) -> Registry:
    seed = tmp_path / "seed.toml"
    seed.write_text(SEED)
    return Registry(store, seed)


def test_a_new_lake_reads_the_seed_and_its_first_edit_stores_seed_and_edit_as_version_1(registry, store):
    assert registry.versions() == []
    assert registry.current().version == 0 and list(registry.current().entries) == ["cpu"]
    new = registry.apply([Change("put", "lat", LAT, "p99")], by="alice")
    assert new.version == 1 and registry.versions() == [1]
    assert {e.name: e.revision for e in new.entries.values()} == {"cpu": 1, "lat": 1}
    assert store.exists(keys.registry_version_key(1))
    fresh = Registry(store)  # another process, another default seed: the stored version wins
    assert [q.name for q in fresh.current().queries()] == ["cpu", "lat"]
    assert fresh.current().entry("lat").changed_by == "alice"


def test_revisions_change_with_the_text_only_and_history_records_who_did_what(registry):
    registry.ensure_seeded()
    v2 = registry.apply([Change("put", "lat", LAT)], by="alice")
    v3 = registry.apply([Change("put", "lat", LAT, "new description")], by="bob")
    assert v3.entry("lat").revision == v2.version == 2 and v3.entry("lat").changed_by == "bob"
    v4 = registry.apply([Change("put", "lat", LAT.replace("99", "95"))], by="carol")
    assert v4.entry("lat").revision == 4 and v4.entry("lat").description == "new description"
    assert registry.apply([Change("put", "lat", LAT.replace("99", "95"))]).version == 4  # no change, no version
    v5 = registry.apply([Change("delete", "cpu")], by="dave")
    assert sorted(v5.entries) == ["lat"]
    assert [(v.version, v.by) for v in registry.history("lat")] == [(2, "alice"), (3, "bob"), (4, "carol")]
    assert [v.by for v in registry.history()] == ["seed", "alice", "bob", "carol", "dave"]
    assert registry.read(1).entry("cpu").query.startswith("FROM *")  # old versions stay readable


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        (Change("put", "bad", "FROM * SELECT m WINDOW 5m COMPUTE percentile(0)"), StoredQueryError, "percentile(0)"),
        (Change("put", "bad", "FROM * SELECT m WINDOW 2d COMPUTE avg"), StoredQueryError, "WINDOW '2d'"),
        (Change("put", "bad", "SELECT m FROM *"), StoredQueryError, "expected 'FROM"),
        (Change("put", "Bad-Name", LAT), StoredQueryError, "[a-z0-9_]"),
        (Change("delete", "nope"), NotFoundError, "known: cpu"),
    ],
)
def test_a_bad_edit_is_refused_naming_the_clause_and_nothing_is_applied(registry, change, error, words):
    registry.ensure_seeded()
    with pytest.raises(error, match=None) as raised:
        registry.apply([Change("put", "ok", LAT), change])
    assert words in str(raised.value)
    assert registry.versions() == [1]


def test_of_two_concurrent_edits_one_wins_and_the_other_gets_a_conflict(registry):
    registry.ensure_seeded()
    barrier = threading.Barrier(2)
    real_current = registry.current
    outcomes: dict[str, object] = {}

    def current():  # both read version 1 before either writes
        version = real_current()
        barrier.wait(timeout=10)
        return version

    def edit(name: str) -> None:
        other = Registry(registry.store)
        other.current = current
        try:
            outcomes[name] = other.apply([Change("put", name, LAT)], by=name).version
        except RegistryConflictError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=edit, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, o in outcomes.items() if o == 2]
    losers = [o for o in outcomes.values() if isinstance(o, RegistryConflictError)]
    assert len(winners) == 1 and len(losers) == 1
    assert f"version 2 by {winners[0]}" in str(losers[0]) and "nothing was applied" in str(losers[0])
    assert sorted(registry.current().entries) == sorted(["cpu", winners[0]])
    with pytest.raises(RegistryConflictError):  # an edit made against an older version (HTTP If-Match)
        registry.apply([Change("delete", "cpu")], expected=1)


def test_a_declarations_file_applies_as_a_diff(registry, tmp_path):
    registry.ensure_seeded()
    registry.apply([Change("put", "lat", LAT)])
    file = tmp_path / "queries.toml"
    file.write_text(
        SEED.replace("fleet cpu", "fleet cpu, hourly").replace("5m", "1h")
        + '\n[[queries]]\nname = "disk"\nquery = "FROM * SELECT host.disk WINDOW 1h COMPUTE max"\n'
    )
    changes = declared_changes(registry.current(), read_declarations(file))
    assert [c.describe() for c in changes] == [
        "+ cpu: FROM * SELECT host.cpu WINDOW 1h COMPUTE avg",
        "+ disk: FROM * SELECT host.disk WINDOW 1h COMPUTE max",
        "- lat",
    ]
    after = registry.apply(changes)
    assert sorted(after.entries) == ["cpu", "disk"] and after.entry("cpu").description == "fleet cpu, hourly"
    assert declared_changes(after, read_declarations(file)) == []
