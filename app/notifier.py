"""Alert notifications: the ``alerts`` table's transitions delivered to Prometheus Alertmanager (API v2) from an outbox.

The ``alerts`` table is the outbox: the speed layer commits each transition
there exactly once, in the same commit as its log positions
(:mod:`metrics_lake.core.speed.alerting`), and :class:`AlertNotifier` relays
what Alertmanager has not accepted yet. It keeps, under
``notifications/alertmanager_<hash>.json`` (:func:`receiver_name`), the ids
of the transitions that Alertmanager answered 200 to; a transition is removed from the outbox only then. So an
Alertmanager that is down, slow or refusing loses nothing: the relay retries
with backoff (1 s doubling to 30 s) and never blocks the speed layer, which
only wakes it after each micro-batch.

What is sent follows Prometheus (``cmd/prometheus/main.go`` ``sendAlerts``
and ``rules/alerting.go``):

- a firing alert with ``endsAt`` four resend intervals ahead, sent when it
  fires and again every ``LAKE_ALERT_RESEND_SECONDS`` while it fires, so
  Alertmanager keeps it active and resolves it by itself if the lake stops
  talking;
- a resolved alert with ``endsAt`` the moment it resolved (never later than
  now);
- labels: ``alertname``, ``server`` where per server, the rule's LABELS;
  annotations ``summary`` (what happened, with the value), ``description``
  (the rule's) and ``rule``; ``generatorURL`` the dashboard with the rule.

``startsAt`` is the alert's ``active_since`` (pending since; for absence,
when the silence reached FOR), the same in every message of one alert, so
Alertmanager merges them into one. Of the transitions of one alert waiting
in the outbox only the latest is sent (a catch-up that recorded a whole
episode sends it resolved, with its ``endsAt``, as Prometheus does for an
alert that resolved while it was down); pending transitions and the nightly
run's (past) ones are not sent. A relay that starts without a delivery
record sends the current state: every firing alert, and alerts resolved
within the last 15 minutes (Prometheus's ``resolvedRetention``).

**Several Alertmanagers** (``LAKE_ALERTMANAGER_URL`` a comma-separated list,
Prometheus's model for a high-availability pair): one relay per
Alertmanager, each in its own thread with its own delivery record
(``notifications/alertmanager_<hash of its URL>.json``), so one that is down
delays nothing for the others and gets what it missed when it returns.

**Watchdog**: every round a relay also sends an always-firing alert
``{alertname="Watchdog", severity="none"}`` (kube-prometheus's dead man's
switch) valid for four resend intervals: while the lake's alerting path
runs, Alertmanager holds it; a receiver that expects it to be notified
regularly (docs/alerts.md) pages when it stops. It is not an ``alerts``
row; only the delivery record notes when it was last sent.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import requests

from metrics_lake.core import keys
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.kernels.alert_evaluation import epoch_us
from metrics_lake.core.speed.alerting import AlertLog
from metrics_lake.core.storage import Store, open_store
from metrics_lake.lake_schemas.errors import AlertmanagerError, ConfigError, LakeError

__all__ = [
    "WATCHDOG",
    "AlertNotifier",
    "Delivery",
    "alert_payload",
    "deliver_all",
    "notifying",
    "receiver_name",
    "start_notifiers",
    "watchdog_payload",
]

log = logging.getLogger(__name__)

#: The always-firing alert's labels (kube-prometheus's ``Watchdog``).
WATCHDOG = {"alertname": "Watchdog", "severity": "none"}
#: Resolved alerts a relay without a delivery record still sends (Prometheus's resolvedRetention).
RESOLVED_RETENTION_S = 15 * 60
_FORMAT = 1
_US = 1_000_000
#: Alerts per POST: Alertmanager takes any number, but a catch-up of 10,000 servers is kept to a few requests.
_ALERTS_PER_REQUEST = 5_000


def receiver_name(url: str) -> str:
    """The delivery record's name for the Alertmanager at ``url``: ``alertmanager_`` and 16 hex digits of its
    SHA-256 (``notifications/<name>.json``)."""
    return f"alertmanager_{hashlib.sha256(url.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Delivery:
    """One round of :meth:`AlertNotifier.deliver`: transitions delivered, firing alerts sent again, requests made."""

    delivered: int
    resent: int
    requests: int


def _iso(us: int) -> str:
    return dt.datetime.fromtimestamp(us / _US, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def watchdog_payload(*, started_s: float, now_s: float, resend_s: float, dashboard_url: str) -> dict:
    """The ``Watchdog`` alert (module docstring) as Alertmanager API v2's ``postableAlert``: firing since
    ``started_s``, valid for four resend intervals after ``now_s`` (epoch seconds)."""
    return {
        "labels": dict(WATCHDOG),
        "annotations": {
            "summary": "The lake's alerting path is alive: this alert always fires while `lake stream` or "
            "`lake alerts notify` runs. Route it to a dead man's switch that pages when it stops.",
        },
        "startsAt": _iso(int(started_s * _US)),
        "endsAt": _iso(int((now_s + 4 * resend_s) * _US)),
        "generatorURL": f"{dashboard_url}/#alerts",
    }


def alert_payload(row: dict, *, now_s: float, resend_s: float, dashboard_url: str) -> dict:
    """Alertmanager API v2's ``postableAlert`` for one ``alerts`` row (a dict of its columns; times as datetimes).

    A firing row is valid for four resend intervals after ``now_s`` (epoch
    seconds); a resolved one ends when it resolved, at most ``now_s``.
    """
    starts = epoch_us(row["active_since"])
    if row["state"] == "firing":
        ends = int((now_s + 4 * resend_s) * _US)
    else:
        ends = min(epoch_us(row["at"]), int(now_s * _US))
    annotations = {"summary": row["summary"], "rule": row["rule_text"]}
    if row.get("description"):
        annotations["description"] = row["description"]
    return {
        "labels": dict(row["labels"]),
        "annotations": annotations,
        "startsAt": _iso(starts),
        "endsAt": _iso(max(ends, starts)),
        "generatorURL": f"{dashboard_url}/#alert={row['rule']}",
    }


class AlertNotifier:
    """Relays the lake's alerts to one Alertmanager (module docstring); one per lake and Alertmanager.

    ``url``: the Alertmanager's base URL (default: the first of
    ``LAKE_ALERTMANAGER_URL``); ``alert_log``: the ``alerts`` table as read
    so far, shared by the relays of several Alertmanagers (it is thread-safe:
    the table is read once for all of them; default: one of its own);
    ``clock``: epoch seconds (tests move it). Raises :class:`ConfigError`
    when no Alertmanager is given or configured.
    """

    def __init__(
        self,
        settings: LakeSettings,
        store: Store | None = None,
        *,
        url: str | None = None,
        alert_log: AlertLog | None = None,
        clock=time.time,
    ) -> None:
        if url is None and not settings.alertmanager_urls:
            raise ConfigError("LAKE_ALERTMANAGER_URL is not set: say which Alertmanager gets the alerts")
        self.settings = settings
        self.base_url = url or settings.alertmanager_urls[0]
        self.url = f"{self.base_url}/api/v2/alerts"
        self.receiver = receiver_name(self.base_url)
        self.store = store or open_store(settings)
        self.alert_log = alert_log or AlertLog(self.store)
        self.config_store = ConfigStore(self.store)
        self.clock = clock
        self.session = requests.Session()
        self._delivered: set[str] | None = None
        self._last_sent: dict[str, float] = {}
        self._started = clock()
        self._watchdog_sent: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()

    # -- the delivery record ------------------------------------------------------------------------------------

    def _load(self, rows: pa.Table) -> set[str]:
        """The ids Alertmanager accepted: the stored record, or (none yet) all but the current state's."""
        key = keys.notifications_key(self.receiver)
        try:
            doc = json.loads(self.store.read(key))
            if doc.get("format") == _FORMAT:
                return set(doc["delivered"])
            log.warning("%s has format %r, not %d: starting from the current state", key, doc.get("format"), _FORMAT)
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            log.warning("%s is not a delivery record: starting from the current state", key)
        latest = {}
        for row in rows.select(["fingerprint", "id", "state", "at"]).to_pylist():
            latest[row["fingerprint"]] = row
        horizon = int((self.clock() - RESOLVED_RETENTION_S) * _US)
        current = {
            r["id"]
            for r in latest.values()
            if r["state"] == "firing" or (r["state"] == "resolved" and epoch_us(r["at"]) >= horizon)
        }
        return set(rows.column("id").to_pylist()) - current

    def _save(self, ids: set[str]) -> None:
        doc = {
            "format": _FORMAT,
            "receiver": self.receiver,
            "url": self.base_url,
            "delivered": sorted(ids),
            "watchdog_sent_at": None if self._watchdog_sent is None else _iso(int(self._watchdog_sent * _US)),
        }
        self.store.replace(keys.notifications_key(self.receiver), json.dumps(doc).encode())

    # -- one round ----------------------------------------------------------------------------------------------

    def deliver(self) -> Delivery:
        """Send what the outbox holds and the firing alerts due a resend; returns what was done.

        Raises :class:`AlertmanagerError` if Alertmanager does not answer or
        refuses a request; what it did not accept stays in the outbox.
        """
        active = self.alert_log.refresh()
        rows = self.alert_log.transitions()
        live = rows.filter(pc.equal(rows.column("source"), "live"))
        if self._delivered is None:
            self._delivered = self._load(live)
        # Only the rows to send become Python dicts: the outbox, and the firing rows of alerts due a resend.
        state = live.column("state")
        notifiable = pc.or_(
            pc.equal(state, "firing"),
            pc.and_(pc.equal(state, "resolved"), pc.equal(live.column("previous_state"), "firing")),
        )
        delivered = pa.array(sorted(self._delivered), pa.string())
        outbox = live.filter(pc.and_(notifiable, pc.invert(pc.is_in(live.column("id"), delivered)))).to_pylist()
        now = self.clock()
        resend = self.settings.alert_resend_seconds
        queued = {r["fingerprint"] for r in outbox}
        keys_due = [
            key
            for key, alert in sorted(active.items())
            if alert.state == "firing" and key not in queued and now - self._last_sent.get(key, 0.0) >= resend
        ]
        firing_rows = {}  # the transition that made each due alert fire: the latest firing row of its fingerprint
        if keys_due:
            wanted = pc.and_(pc.equal(state, "firing"), pc.is_in(live.column("fingerprint"), pa.array(keys_due)))
            for row in live.filter(wanted).to_pylist():
                firing_rows[row["fingerprint"]] = row
        due = [firing_rows[key] for key in keys_due if key in firing_rows]
        # Per alert only its latest transition waiting is sent (module docstring); the others count as delivered.
        latest = {r["fingerprint"]: r for r in outbox}
        rows_to_send = list(latest.values()) + due
        descriptions = {}
        if rows_to_send:
            descriptions = {name: e.description for name, e in self.config_store.current().rules.items()}
        payload = [
            alert_payload(
                {**r, "description": descriptions.get(r["rule"], "")},
                now_s=now,
                resend_s=resend,
                dashboard_url=self.settings.dashboard_url,
            )
            for r in rows_to_send
        ]
        watchdog_due = self._watchdog_sent is None or now - self._watchdog_sent >= resend
        if watchdog_due:
            payload.append(
                watchdog_payload(
                    started_s=self._started, now_s=now, resend_s=resend, dashboard_url=self.settings.dashboard_url
                )
            )
        requests_made = 0
        for at in range(0, len(payload), _ALERTS_PER_REQUEST):
            self._post(payload[at : at + _ALERTS_PER_REQUEST])
            requests_made += 1
        if watchdog_due:
            self._watchdog_sent = now
        if payload:
            for row in rows_to_send:
                self._last_sent[row["fingerprint"]] = now
            self._delivered.update(r["id"] for r in outbox)
            self._delivered &= set(live.column("id").to_pylist())  # forget ids retention removed from the table
            self._save(self._delivered)
        return Delivery(len(outbox), len(due), requests_made)

    def _post(self, payload: list[dict]) -> None:
        try:
            answer = self.session.post(self.url, json=payload, timeout=self.settings.alert_notify_timeout_seconds)
        except requests.RequestException as exc:
            raise AlertmanagerError(f"Alertmanager at {self.base_url} did not answer: {exc}") from None
        if answer.status_code != 200:
            raise AlertmanagerError(
                f"Alertmanager at {self.base_url} refused {len(payload)} alert(s): "
                f"HTTP {answer.status_code} {answer.text[:200]}"
            )

    # -- the relay loop -----------------------------------------------------------------------------------------

    def wake(self) -> None:
        """Deliver soon (after a micro-batch committed new transitions)."""
        self._wake.set()

    def stop(self) -> None:
        """End :meth:`run` at once (its current request finishes first)."""
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Deliver until :meth:`stop`: at each :meth:`wake` and at least every few seconds, with backoff after a
        failure (1 s doubling to 30 s; each outage is logged when it starts and when it ends)."""
        backoff, failing = 1.0, False
        while not self._stop.is_set():
            wait = min(5.0, self.settings.alert_resend_seconds)
            try:
                done = self.deliver()
                if failing:
                    log.warning("Alertmanager at %s accepts alerts again", self.base_url)
                if done.delivered:
                    log.info("alerts: %d transition(s) delivered to Alertmanager", done.delivered)
                elif done.resent:
                    log.debug("alerts: %d firing alert(s) sent again", done.resent)
                backoff, failing = 1.0, False
            except (LakeError, OSError) as exc:
                if not failing:
                    log.warning("%s; alerts stay in the outbox and are retried", exc)
                failing, wait = True, backoff
                backoff = min(backoff * 2, 30.0)
            self._wake.wait(wait)
            self._wake.clear()


def start_notifiers(settings: LakeSettings, store: Store | None = None) -> list[tuple[AlertNotifier, threading.Thread]]:
    """Run an :class:`AlertNotifier` per configured Alertmanager, each in a daemon thread; returns
    ``(notifier, thread)`` pairs (``notifier.stop()`` ends one), none when ``LAKE_ALERTMANAGER_URL`` is not set."""
    if not settings.alertmanager_urls:
        return []
    store = store or open_store(settings)
    alert_log = AlertLog(store)
    relays = []
    for url in settings.alertmanager_urls:
        notifier = AlertNotifier(settings, store, url=url, alert_log=alert_log)
        thread = threading.Thread(target=notifier.run, name=f"alert-notifier[{url}]", daemon=True)
        thread.start()
        relays.append((notifier, thread))
    return relays


def deliver_all(settings: LakeSettings, store: Store | None = None) -> dict[str, Delivery]:
    """One delivery round to every configured Alertmanager (``lake alerts notify --once``); by URL.

    Raises :class:`AlertmanagerError` naming those that did not accept,
    after trying every one (the others' deliveries stand).
    """
    store = store or open_store(settings)
    alert_log = AlertLog(store)
    done: dict[str, Delivery] = {}
    failed: list[str] = []
    for url in settings.alertmanager_urls:
        try:
            done[url] = AlertNotifier(settings, store, url=url, alert_log=alert_log).deliver()
        except AlertmanagerError as exc:
            failed.append(str(exc))
    if failed:
        raise AlertmanagerError("; ".join(failed))
    return done


@contextlib.contextmanager
def notifying(settings: LakeSettings, store: Store | None = None) -> Iterator[Callable[[], None]]:
    """Relay alerts to every ``LAKE_ALERTMANAGER_URL`` in threads for the duration of the block; yields ``wake()``
    for the caller to call after each micro-batch (a no-op when no Alertmanager is configured).

    On exit the threads stop and one last delivery to each is tried, so what
    the block committed is sent before a one-shot command ends; what an
    Alertmanager does not take stays in its outbox (logged) for the next run.
    """
    relays = start_notifiers(settings, store)
    if not relays:
        yield lambda: None
        return

    def wake() -> None:
        for notifier, _ in relays:
            notifier.wake()

    try:
        yield wake
    finally:
        for notifier, _ in relays:
            notifier.stop()
        for notifier, thread in relays:
            thread.join(timeout=settings.alert_notify_timeout_seconds + 5)
            try:
                notifier.deliver()
            except (LakeError, OSError) as exc:
                log.warning("%s; the alerts stay in the outbox for the next `lake stream` or `lake alerts notify`", exc)
