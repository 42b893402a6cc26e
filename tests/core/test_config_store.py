"""The config store of stored queries: versions, revisions, history, declarative diffs, conflicts, bad input."""

from __future__ import annotations

import json
import threading

import pytest

from metrics_lake.core import keys
from metrics_lake.core.config_store import ALERT, QUERY, Change, ConfigStore, declared_changes, read_declarations
from metrics_lake.lake_schemas.errors import AlertRuleError, ConfigConflictError, NotFoundError, StoredQueryError

SEED = """
[[queries]]
name = "cpu"
description = "fleet cpu"
query = "FROM * SELECT host.cpu WINDOW 5m COMPUTE avg"
"""
LAT = "FROM web-* SELECT app.lat WINDOW 10m EVERY 5m COMPUTE percentile(99), count"


@pytest.fixture
def config_store(store, tmp_path) -> ConfigStore:
    seed = tmp_path / "seed.toml"
    seed.write_text(SEED)
    return ConfigStore(store, seed)


def test_a_new_lake_reads_the_seed_and_its_first_edit_stores_seed_and_edit_as_version_1(config_store, store):
    assert config_store.versions() == []
    assert config_store.current().version == 0 and list(config_store.current().entries) == ["cpu"]
    new = config_store.apply([Change("put", "lat", LAT, "p99")], by="alice")
    assert new.version == 1 and config_store.versions() == [1]
    assert {e.name: e.revision for e in new.entries.values()} == {"cpu": 1, "lat": 1}
    assert store.exists(keys.config_version_key(1))
    fresh = ConfigStore(store)  # another process, another default seed: the stored version wins
    assert [q.name for q in fresh.current().queries()] == ["cpu", "lat"]
    assert fresh.current().entry("lat").changed_by == "alice"


def test_revisions_change_with_the_text_only_and_history_records_who_did_what(config_store):
    config_store.ensure_seeded()
    v2 = config_store.apply([Change("put", "lat", LAT)], by="alice")
    v3 = config_store.apply([Change("put", "lat", LAT, "new description")], by="bob")
    assert v3.entry("lat").revision == v2.version == 2 and v3.entry("lat").changed_by == "bob"
    v4 = config_store.apply([Change("put", "lat", LAT.replace("99", "95"))], by="carol")
    assert v4.entry("lat").revision == 4 and v4.entry("lat").description == "new description"
    assert config_store.apply([Change("put", "lat", LAT.replace("99", "95"))]).version == 4  # no change, no version
    v5 = config_store.apply([Change("delete", "cpu")], by="dave")
    assert sorted(v5.entries) == ["lat"]
    assert [(v.version, v.by) for v in config_store.history("lat")] == [(2, "alice"), (3, "bob"), (4, "carol")]
    assert [v.by for v in config_store.history()] == ["seed", "alice", "bob", "carol", "dave"]
    assert config_store.read(1).entry("cpu").query.startswith("FROM *")  # old versions stay readable


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
def test_a_bad_edit_is_refused_naming_the_clause_and_nothing_is_applied(config_store, change, error, words):
    config_store.ensure_seeded()
    with pytest.raises(error, match=None) as raised:
        config_store.apply([Change("put", "ok", LAT), change])
    assert words in str(raised.value)
    assert config_store.versions() == [1]


def test_of_two_concurrent_edits_one_wins_and_the_other_gets_a_conflict(config_store):
    config_store.ensure_seeded()
    barrier = threading.Barrier(2)
    real_current = config_store.current
    outcomes: dict[str, object] = {}

    def current():  # both read version 1 before either writes
        version = real_current()
        barrier.wait(timeout=10)
        return version

    def edit(name: str) -> None:
        other = ConfigStore(config_store.store)
        other.current = current
        try:
            outcomes[name] = other.apply([Change("put", name, LAT)], by=name).version
        except ConfigConflictError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=edit, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, o in outcomes.items() if o == 2]
    losers = [o for o in outcomes.values() if isinstance(o, ConfigConflictError)]
    assert len(winners) == 1 and len(losers) == 1
    assert f"version 2 by {winners[0]}" in str(losers[0]) and "nothing was applied" in str(losers[0])
    assert sorted(config_store.current().entries) == sorted(["cpu", winners[0]])
    with pytest.raises(ConfigConflictError):  # an edit made against an older version (HTTP If-Match)
        config_store.apply([Change("delete", "cpu")], expected=1)


def test_a_declarations_file_applies_as_a_diff(config_store, tmp_path):
    config_store.ensure_seeded()
    config_store.apply([Change("put", "lat", LAT)])
    file = tmp_path / "queries.toml"
    file.write_text(
        SEED.replace("fleet cpu", "fleet cpu, hourly").replace("5m", "1h")
        + '\n[[queries]]\nname = "disk"\nquery = "FROM * SELECT host.disk WINDOW 1h COMPUTE max"\n'
    )
    changes = declared_changes(config_store.current(), read_declarations(file))
    assert [c.describe() for c in changes] == [
        "+ cpu: FROM * SELECT host.cpu WINDOW 1h COMPUTE avg",
        "+ disk: FROM * SELECT host.disk WINDOW 1h COMPUTE max",
        "- lat",
    ]
    after = config_store.apply(changes)
    assert sorted(after.entries) == ["cpu", "disk"] and after.entry("cpu").description == "fleet cpu, hourly"
    assert declared_changes(after, read_declarations(file)) == []


RULE = "lat.p99 > 250 FOR 3m LABELS severity=page"


def test_alert_rules_live_beside_queries_with_their_own_names_revisions_and_history(config_store):
    config_store.ensure_seeded()
    v2 = config_store.apply(
        [Change("put", "lat", LAT), Change("put", "lat", "lat.p99  >  250 FOR 3m LABELS severity=page", "slow", ALERT)],
        by="alice",
    )  # a query and a rule may share a name: each kind has its own
    assert v2.entry("lat", ALERT).text == RULE and v2.rules["lat"].revision == 2  # the text as parsed, normalised
    assert [r.name for r in v2.alert_rules()] == ["lat"] and v2.alert_rules()[0].description == "slow"
    v3 = config_store.apply([Change("put", "quiet", "ABSENT host.cpu FOR 2m", kind=ALERT)], by="bob")
    assert [c.describe() for c in v3.changes] == ["+ alert quiet: ABSENT host.cpu FOR 2m"]
    assert [v.version for v in config_store.history("lat", ALERT)] == [2] and len(config_store.history("lat")) == 1
    fresh = ConfigStore(config_store.store).current()  # read back from the stored object
    assert fresh.rules == v3.rules and fresh.entries == v3.entries
    with pytest.raises(NotFoundError, match="no alert rule 'nope'.*known: lat, quiet"):
        config_store.apply([Change("delete", "nope", kind=ALERT)])


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ([Change("put", "r", "nope.p99 > 1", kind=ALERT)], "unknown stored query 'nope' (known: cpu)"),
        ([Change("put", "r", "cpu.p99 > 1", kind=ALERT)], "'cpu' computes avg, not 'p99'"),
        ([Change("put", "r", "cpu.avg >> 1", kind=ALERT)], "expected '<query>.<aggregate> <op> <number>"),
        ([Change("put", "r", "ABSENT cpu FOR 2d", kind=ALERT)], "shorter than 1d"),
        ([Change("delete", "cpu")], "this edit removes stored query 'cpu', which alert rule 'hot'"),
        (
            [Change("put", "cpu", "FROM * SELECT host.cpu WINDOW 5m COMPUTE max")],
            "this edit changes stored query 'cpu'",
        ),
        ([Change("put", "r", "cpu.avg > 1", kind=ALERT)] * 2, "an edit names an entry twice: ['r']"),
    ],
)
def test_a_rule_naming_what_the_registry_lacks_is_refused_and_nothing_is_applied(config_store, changes, words):
    config_store.ensure_seeded()
    config_store.apply([Change("put", "hot", "cpu.avg > 90", kind=ALERT)])
    with pytest.raises(AlertRuleError) as raised:
        config_store.apply(changes)
    assert words in str(raised.value)
    assert config_store.versions() == [1, 2]


def test_rule_declarations_apply_as_a_diff_of_rules_only(config_store, tmp_path):
    config_store.ensure_seeded()
    config_store.apply([Change("put", "old", "ABSENT cpu FOR 1m", kind=ALERT)])
    file = tmp_path / "rules.toml"
    file.write_text('[[alerts]]\nname = "hot"\nrule = "cpu.avg > 90 FOR 5m"\ndescription = "busy"\n')
    changes = declared_changes(config_store.current(), read_declarations(file, ALERT), ALERT)
    assert [c.describe() for c in changes] == ["+ alert hot: cpu.avg > 90 FOR 5m", "- alert old"]
    after = config_store.apply(changes)
    assert sorted(after.rules) == ["hot"] and sorted(after.entries) == ["cpu"]  # queries untouched
    file.write_text('[[alerts]]\nname = "a"\nrule = "x.avg > 1"\n[[alerts]]\nname = "a"\nrule = "x.avg > 2"\n')
    with pytest.raises(AlertRuleError, match="'a' used twice"):
        read_declarations(file, ALERT)


def test_a_version_written_before_alert_rules_existed_reads_with_none(config_store, store):
    config_store.ensure_seeded()
    doc = json.loads(store.read(keys.config_version_key(1)))
    doc.pop("alerts")
    for change in doc["changes"]:
        change.pop("kind")
    store.create(keys.config_version_key(2), json.dumps({**doc, "version": 2}).encode())
    old = ConfigStore(store).read(2)
    assert old.rules == {} and sorted(old.entries) == ["cpu"] and old.changes[0].kind == QUERY
