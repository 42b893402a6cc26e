"""`lake queries …` manages the config store: every edit one version with who/when, a declarations file applied as a
diff (dry run first), bad input refused in one line naming the clause with nothing applied."""

from __future__ import annotations

import pytest

from metrics_lake.core.config_store import ConfigStore
from tests.app.conftest import one_line

LAT = "FROM web-* SELECT app.rpc.latency_ms WINDOW 5m COMPUTE percentile(99), count"


def test_add_show_list_rm_and_history(lake, store):
    assert "fleet_rpc_latency_5m" in lake("queries", "list").stdout  # a new lake lists the shipped seed
    added = lake("queries", "add", "web_p99", LAT, "--description", "web tier p99")
    assert "web_p99: revision 1, config version 1" in added.stderr and "lake queries backfill" in added.stderr
    shown = lake("queries", "show", "web_p99").stdout
    assert LAT in shown and "web tier p99" in shown and "v1" in shown and "alice" in shown
    assert "waiting for the stream, backfill pending" in shown
    assert "exists" in one_line(lake("queries", "add", "web_p99", LAT.replace("99", "95"), expect=2))
    lake("queries", "add", "web_p99", LAT.replace("99", "95"), "--replace", "--by", "bob")
    assert ConfigStore(store).current().entry("web_p99").revision == 2
    lake("queries", "rm", "fleet_cpu_hourly")
    listing = lake("queries", "list").stdout
    assert "config version 3" in listing and "fleet_cpu_hourly" not in listing and "percentile(95)" in listing
    history = lake("queries", "history", "web_p99").stdout
    assert "alice" in history and "bob" in history
    assert "known:" in one_line(lake("queries", "rm", "nope", expect=2))


@pytest.mark.parametrize(
    ("query", "clause"),
    [
        ("FROM * SELECT m WINDOW 5m COMPUTE percentile(0)", "percentile(0)"),
        ("FROM * SELECT m WINDOW 2d COMPUTE avg", "WINDOW '2d' must be between 1m and 1d"),
        ("FROM * SELECT Bad-Metric WINDOW 5m COMPUTE avg", "is not a metric name"),
        ("FROM * SELECT m WINDOW 5m EVERY 10m COMPUTE avg", "EVERY 10m is longer than WINDOW 5m"),
    ],
)
def test_a_bad_query_is_one_line_naming_the_clause_and_nothing_changes(lake, store, query, clause):
    assert clause in one_line(lake("queries", "add", "bad", query, expect=2))
    assert ConfigStore(store).versions() == []


def test_a_declarations_file_shows_its_diff_then_applies_with_yes(lake, store, tmp_path):
    lake("queries", "add", "web_p99", LAT)
    file = tmp_path / "queries.toml"
    file.write_text(
        f'[[queries]]\nname = "web_p99"\nquery = "{LAT}"\n\n[[queries]]\nname = "disk"\n'
        'query = "FROM * SELECT host.disk WINDOW 1h COMPUTE max"\n'
    )
    dry = lake("queries", "--from-file", str(file))
    assert "+ disk: FROM * SELECT host.disk WINDOW 1h COMPUTE max" in dry.stdout
    assert "- fleet_rpc_latency_5m" in dry.stdout and "dry run" in dry.stderr
    assert ConfigStore(store).current().version == 1
    refused = one_line(lake("queries", "--from-file", str(file), "--yes", expect=2))  # a seeded rule uses the query
    assert "removes stored query 'fleet_rpc_latency_5m', which alert rule 'rpc_latency_p99_high'" in refused
    assert ConfigStore(store).current().version == 1  # nothing half-applied
    lake("alerts", "rm", "rpc_latency_p99_high")
    lake("queries", "--from-file", str(file), "--yes")
    assert sorted(ConfigStore(store).current().entries) == ["disk", "web_p99"]
    assert "nothing to apply" in lake("queries", "--from-file", str(file), "--yes").stderr
    file.write_text(file.read_text() + '\n[[queries]]\nname = "bad"\nquery = "FROM * SELECT m WINDOW 5m COMPUTE p99"\n')
    assert "cannot compute 'p99'" in one_line(lake("queries", "--from-file", str(file), "--yes", expect=2))
    assert ConfigStore(store).current().version == 3
