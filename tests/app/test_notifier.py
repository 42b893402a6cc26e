"""The alert relay: only what is still true is sent after a catch-up, the Watchdog every round, and every configured
Alertmanager served on its own (one down or hanging delays nothing for the others, and catches up when back)."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import socket
import threading
import time

import pytest

from metrics_lake.app.notifier import AlertNotifier, deliver_all, receiver_name, start_notifiers
from metrics_lake.core import keys
from metrics_lake.core.config import load_settings
from metrics_lake.core.kernels.alert_evaluation import (
    FIRING,
    INACTIVE,
    PENDING,
    RESOLVED,
    Transition,
    transitions_table,
)
from metrics_lake.core.kernels.alert_rules import parse_rule
from metrics_lake.core.tables.commits import commit_changes
from metrics_lake.core.tables.data_files import write_data_files
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.lake_schemas.errors import AlertmanagerError, ConfigError
from metrics_lake.lake_schemas.tables import Table
from tests.helpers import wait_for

S = 1_000_000
RULE = parse_rule("hot", "cpu_max.max > 100 FOR 1m LABELS severity=page")


class FakeAlertmanager:
    """Alertmanager's ``POST /api/v2/alerts`` on 127.0.0.1: records each request's alerts; ``status`` to answer."""

    def __init__(self) -> None:
        self.posts: list[list[dict]] = []
        self.status = 200
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if owner.status == 200:
                    owner.posts.append(body)
                self.send_response(owner.status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[dict]:
        return [a for post in self.posts for a in post if a["labels"]["alertname"] != "Watchdog"]

    def watchdogs(self) -> list[dict]:
        return [a for post in self.posts for a in post if a["labels"]["alertname"] == "Watchdog"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def alerts_table(store):
    """The ``alerts`` table, made before any relay starts, as the stream makes it at its start: a relay's first round
    and a test's first write creating it at once can both commit a CREATE (delta-rs retries the loser as a later
    version), and the write then fails with "Metadata changed since last commit"."""
    return ensure_table(store, Table.ALERTS)


@pytest.fixture
def managers():
    made = [FakeAlertmanager(), FakeAlertmanager()]
    yield made
    for m in made:
        m.close()


def record(store, *moves: tuple[str, str, int, int]) -> None:
    """Append transitions ``(previous, state, at s, active since s)`` of RULE on web-1 to ``alerts``, one commit."""
    base = 1_790_000_000 * S
    transitions = [
        Transition(
            RULE,
            "web-1",
            RULE.alert_labels("web-1"),
            state,
            previous,
            base + at * S,
            base + since * S,
            150.0,
            None,
            None,
            f"{state} at {at}",
        )
        for previous, state, at, since in moves
    ]
    table = ensure_table(store, Table.ALERTS)
    rows = transitions_table(transitions, dt.datetime.now(dt.UTC))
    commit_changes(table, Table.ALERTS, write_data_files(store, Table.ALERTS, rows), [], transactions=[], operation="T")


def iso(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_catch_up_that_recorded_a_whole_episode_sends_it_resolved_once_with_its_end(settings, store, managers):
    notifier = AlertNotifier(settings, store, url=managers[0].url, clock=lambda: 1_790_000_600.0)
    assert notifier.deliver().delivered == 0  # the relay's record exists from here on (the Watchdog went)
    record(
        store,
        (INACTIVE, PENDING, 0, 0),
        (PENDING, FIRING, 60, 0),
        (FIRING, RESOLVED, 240, 0),
    )
    done = notifier.deliver()
    assert (done.delivered, done.requests) == (2, 1)  # the firing and the resolved row, in one request
    (alert,) = managers[0].alerts()
    assert alert["labels"] == {"alertname": "hot", "server": "web-1", "severity": "page"}
    assert (alert["startsAt"], alert["endsAt"]) == (iso(1_790_000_000), iso(1_790_000_240))
    assert notifier.deliver().delivered == 0  # the record keeps what was accepted
    assert len(managers[0].alerts()) == 1


def test_the_watchdog_is_sent_every_resend_interval_and_recorded_only_in_notifications(settings, store, managers):
    now = [1_790_000_000.0]
    config = settings.model_copy(update={"alert_resend_seconds": 30.0})
    notifier = AlertNotifier(config, store, url=managers[0].url, clock=lambda: now[0])
    notifier.deliver()
    notifier.deliver()  # not due again yet
    now[0] += 30
    notifier.deliver()
    first, second = managers[0].watchdogs()
    assert first["labels"] == {"alertname": "Watchdog", "severity": "none"}
    assert first["startsAt"] == second["startsAt"] == iso(1_790_000_000)
    assert second["endsAt"] == iso(1_790_000_030 + 4 * 30)  # valid for four resend intervals
    doc = json.loads(store.read(keys.notifications_key(receiver_name(managers[0].url))))
    assert doc["watchdog_sent_at"] == iso(1_790_000_030) and doc["url"] == managers[0].url
    assert ensure_table(store, Table.ALERTS).to_pyarrow_table().num_rows == 0


def test_every_alertmanager_gets_every_alert_and_one_that_refused_catches_up(settings, store, managers):
    both = settings.model_copy(update={"alertmanager_url": f"{managers[0].url},{managers[1].url}"})
    record(store, (INACTIVE, FIRING, 0, 0))
    managers[1].status = 503
    with pytest.raises(AlertmanagerError, match=f"Alertmanager at {managers[1].url} refused 2 alert"):
        deliver_all(both, store)
    assert [a["labels"]["server"] for a in managers[0].alerts()] == ["web-1"]
    assert managers[1].posts == []
    managers[1].status = 200
    done = deliver_all(both, store)
    assert (done[managers[0].url].delivered, done[managers[1].url].delivered) == (0, 1)
    assert [a["labels"]["server"] for a in managers[1].alerts()] == ["web-1"]


def test_one_alertmanager_that_hangs_delays_nothing_for_the_other(settings, store, managers):
    hanging = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    url = f"http://127.0.0.1:{hanging.getsockname()[1]}"
    config = settings.model_copy(
        update={"alertmanager_url": f"{url},{managers[0].url}", "alert_notify_timeout_seconds": 30.0}
    )
    relays = start_notifiers(config, store)
    try:
        record(store, (INACTIVE, FIRING, 0, 0))
        started = time.monotonic()
        for notifier, _ in relays:
            notifier.wake()
        took = wait_for(lambda: managers[0].alerts(), "the answering Alertmanager got the alert", timeout=20)
        assert took < 10 and time.monotonic() - started < 10
    finally:
        for notifier, _ in relays:
            notifier.stop()
        hanging.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://127.0.0.1:9093,127.0.0.1:9094", "'127.0.0.1:9094' in the Alertmanager list is not an http"),
        ("http://127.0.0.1:9093,http://:9094", "'http://:9094' in the Alertmanager list"),
        ("http://a:9093,http://a:99999", "'http://a:99999' in the Alertmanager list"),
        ("http://a:9093,http://a:9093/", "names an Alertmanager twice"),
    ],
)
def test_an_alertmanager_list_with_a_bad_entry_is_refused_naming_it(value, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(alertmanager_url=value)


def test_a_list_of_alertmanagers_is_split_and_trimmed(tmp_path):
    config = load_settings(root=str(tmp_path), alertmanager_url=" http://a:9093/ , https://b:9093")
    assert config.alertmanager_urls == ["http://a:9093", "https://b:9093"]
    assert load_settings(root=str(tmp_path)).alertmanager_urls == []
