"""`lake alerts …`: rules in the config store (every edit one version), a declarations file applied as a diff, bad input
refused in one line naming the clause with nothing applied, the active alerts listed, delivery to Alertmanager."""

from __future__ import annotations

import time

import pytest
import requests

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.infra.alertmanager import LocalAlertmanager, start, stop
from tests.app.conftest import one_line
from tests.helpers import free_port_block

RULE = "fleet_rpc_latency_5m.p99 > 300 FOR 5m LABELS severity=page"


def test_add_show_list_rm_and_history(lake, store):
    listing = lake("alerts", "list").stdout
    assert "server_silent" in listing and "rpc_latency_p99_high" in listing  # the shipped rules
    added = lake("alerts", "add", "slow", RULE, "--description", "RPCs slow for 5 minutes")
    assert "slow: revision 1, config version 1" in added.stderr and "next micro-batch" in added.stderr
    shown = lake("alerts", "show", "slow").stdout
    assert RULE in shown and "RPCs slow for 5 minutes" in shown and "alice" in shown
    assert "fires when fleet_rpc_latency_5m p99 > 300 holds for 5m; labels severity=page" in shown
    assert "exists" in one_line(lake("alerts", "add", "slow", RULE.replace("300", "400"), expect=2))
    lake("alerts", "add", "slow", RULE.replace("300", "400"), "--replace", "--by", "bob")
    assert ConfigStore(store).current().rules["slow"].revision == 2
    lake("alerts", "rm", "server_silent")
    listing = lake("alerts", "list").stdout
    assert "config version 3" in listing and "server_silent" not in listing and "> 400" in listing
    history = lake("alerts", "history", "slow").stdout
    assert "alice" in history and "bob" in history and "+ alert slow" in history
    assert "no alert rule 'nope'" in one_line(lake("alerts", "rm", "nope", expect=2))


@pytest.mark.parametrize(
    ("rule", "clause"),
    [
        ("nope.p99 > 1", "unknown stored query 'nope'"),
        ("fleet_rpc_latency_5m.avg > 1", "computes p50, p95, p99, count, not 'avg'"),
        ("fleet_rpc_latency_5m.p99 >> 1", "expected '<query>.<aggregate> <op> <number>"),
        ("ABSENT host.cpu FOR 2d", "FOR '2d' must be at least 1s and shorter than 1d"),
        ("ABSENT Host-CPU FOR 1m", "is not a metric name"),
    ],
)
def test_a_bad_rule_is_one_line_naming_the_clause_and_nothing_changes(lake, store, rule, clause):
    assert clause in one_line(lake("alerts", "add", "bad", rule, expect=2))
    assert ConfigStore(store).versions() == []


def test_a_declarations_file_shows_its_diff_then_applies_with_yes(lake, store, tmp_path):
    file = tmp_path / "rules.toml"
    file.write_text(
        f'[[alerts]]\nname = "slow"\nrule = "{RULE}"\n\n[[alerts]]\nname = "quiet"\nrule = "ABSENT m FOR 1m"\n'
    )
    dry = lake("alerts", "--from-file", str(file))
    assert f"+ alert slow: {RULE}" in dry.stdout and "- alert server_silent" in dry.stdout and "dry run" in dry.stderr
    assert ConfigStore(store).versions() == []
    lake("alerts", "--from-file", str(file), "--yes")
    current = ConfigStore(store).current()
    assert sorted(current.rules) == ["quiet", "slow"] and "fleet_rpc_latency_5m" in current.entries  # queries kept
    assert "nothing to apply" in lake("alerts", "--from-file", str(file), "--yes").stderr
    file.write_text(file.read_text() + '\n[[alerts]]\nname = "bad"\nrule = "nope.p99 > 1"\n')
    assert "unknown stored query 'nope'" in one_line(lake("alerts", "--from-file", str(file), "--yes", expect=2))
    assert ConfigStore(store).current().version == 1


def test_list_shows_firing_alerts_and_notify_once_delivers_them_to_alertmanager(lake, settings, store, log, tmp_path):
    lake("alerts", "add", "quiet", "ABSENT host.cpu.utilization FROM sim-* FOR 1s LABELS severity=info")
    now_ms = int(time.time() * 1000) - 120_000
    for servers, seed in ((2, 0), (1, 1)):  # sim-0001 goes silent
        with Producer(log, settings.topic, partitions=2) as producer:
            producer.send(FleetSimulator(servers=servers, metrics=2, seconds=30, seed=seed, start_ms=now_ms).generate())
        run_batch_in_process(
            store, settings.topic, end_offsets(log, settings.topic), watermark_seconds=60, clock_skew_seconds=300
        )
        time.sleep(1.2)
    listing = lake("alerts", "list").stdout
    assert "active alerts" in listing and "sim-0001" in listing and "firing" in listing and "severity=info" in listing
    assert "LAKE_ALERTMANAGER_URL is not set" in one_line(lake("alerts", "notify", "--once", expect=2))
    manager = LocalAlertmanager(tmp_path / "am", free_port_block((0,), lowest=23000))
    start(manager, log=lambda _: None)
    try:
        delivered = lake("alerts", "notify", "--once", env_extra={"LAKE_ALERTMANAGER_URL": manager.url})
        assert "delivered 1 transition(s)" in delivered.stderr
        listed = requests.get(f"{manager.url}/api/v2/alerts", timeout=5).json()
        (watchdog,) = [a for a in listed if a["labels"]["alertname"] == "Watchdog"]
        assert watchdog["labels"] == {"alertname": "Watchdog", "severity": "none"}
        (alert,) = [a for a in listed if a["labels"]["alertname"] != "Watchdog"]
        assert alert["labels"] == {"alertname": "quiet", "server": "sim-0001", "severity": "info"}
        again = lake("alerts", "notify", "--once", env_extra={"LAKE_ALERTMANAGER_URL": manager.url})
        assert "delivered 0 transition(s)" in again.stderr  # the outbox remembers what Alertmanager accepted
    finally:
        stop(manager, log=lambda _: None)
    down = one_line(lake("alerts", "notify", "--once", env_extra={"LAKE_ALERTMANAGER_URL": manager.url}, expect=2))
    assert "did not answer" in down
