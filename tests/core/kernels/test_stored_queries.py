"""The stored query language: what parses, and the error each mistake gets."""

from __future__ import annotations

import pytest

from metrics_lake.core.kernels.selectors import server_pattern
from metrics_lake.core.kernels.stored_queries import load_stored_queries, parse_query
from metrics_lake.lake_schemas.errors import StoredQueryError


def test_parses_hopping_fleet_and_per_server_queries():
    hop = parse_query("hop", "FROM * SELECT app.rpc.latency_ms WINDOW 5m EVERY 1m COMPUTE percentile(99.9), avg")
    assert (hop.duration_s, hop.slide_s, hop.hopping, hop.per_server) == (300, 60, True, False)
    assert [a.label for a in hop.aggregates] == ["p99.9", "avg"]
    per = parse_query("per", "from web-*,db-1 select host.cpu.utilization window 1h compute max per server")
    assert (per.servers, per.duration_s, per.slide_s, per.hopping, per.per_server) == (
        ("web-*", "db-1"),
        3600,
        3600,
        False,
        True,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT x FROM y", "expected 'FROM <selector>"),
        ("FROM * SELECT Bad-Metric WINDOW 5m COMPUTE max", "is not a metric name"),
        ("FROM * SELECT cpu WINDOW 30s COMPUTE max", "is not <n>m, <n>h or <n>d"),
        ("FROM * SELECT cpu WINDOW 2d COMPUTE max", "between 1m and 1d"),
        ("FROM * SELECT cpu WINDOW 5m EVERY 10m COMPUTE max", "longer than WINDOW"),
        ("FROM * SELECT cpu WINDOW 5m COMPUTE median", "cannot compute 'median'"),
        ("FROM * SELECT cpu WINDOW 5m COMPUTE percentile(100)", "cannot compute 'percentile(100)'"),
        ("FROM * SELECT cpu WINDOW 5m COMPUTE max, max", "listed twice"),
    ],
)
def test_mistakes_are_named(text, message):
    with pytest.raises(StoredQueryError, match="stored query 'q'") as error:
        parse_query("q", text)
    assert message in str(error.value)


def test_file_errors(tmp_path):
    assert load_stored_queries()  # the shipped file parses
    path = tmp_path / "q.toml"
    path.write_text('[[queries]]\nname = "a"\nquery = "FROM * SELECT m WINDOW 1m COMPUTE max"\n' * 2)
    with pytest.raises(StoredQueryError, match=r"used twice: \['a'\]"):
        load_stored_queries(path)
    path.write_text('[[queries]]\nname = "a"\n')
    with pytest.raises(StoredQueryError, match=r"lacks \['query'\]"):
        load_stored_queries(path)
    with pytest.raises(StoredQueryError, match="does not exist"):
        load_stored_queries(tmp_path / "missing.toml")


def test_server_globs_become_anchored_patterns():
    assert server_pattern(("*",)) is None
    assert server_pattern(("web-*", "db.1", "a?")) == r"^(?:web\-.*|db\.1|a.)$"
