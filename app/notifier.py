"""Alert notifications: the ``alerts`` table's transitions delivered to Prometheus Alertmanager (API v2) from an outbox.

The ``alerts`` table is the outbox: the speed layer commits each transition
there exactly once, in the same commit as its log positions
(:mod:`metrics_lake.core.speed.alerting`), and :class:`AlertNotifier` relays
what Alertmanager has not accepted yet. It keeps, under
``notifications/alertmanager.json``, the ids of the transitions Alertmanager
answered 200 to; a transition is removed from the outbox only then. So an
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
Alertmanager merges them into one. Transitions of one alert are delivered in
order, never two in one request; pending transitions and the nightly run's
(past) ones are not sent. A relay that starts without a delivery record
sends the current state: every firing alert, and alerts resolved within the
last 15 minutes (Prometheus's ``resolvedRetention``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
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
from metrics_lake.core.kernels.alert_rules import epoch_us
from metrics_lake.core.registry import Registry
from metrics_lake.core.speed.alerting import AlertLog
from metrics_lake.core.storage import Store, open_store
from metrics_lake.lake_schemas.errors import AlertmanagerError, ConfigError, LakeError

__all__ = ["RECEIVER", "AlertNotifier", "Delivery", "alert_payload", "notifying", "start_notifier"]

log = logging.getLogger(__name__)

#: The receiver's name in ``notifications/<receiver>.json``.
RECEIVER = "alertmanager"
#: Resolved alerts a relay without a delivery record still sends (Prometheus's resolvedRetention).
RESOLVED_RETENTION_S = 15 * 60
_FORMAT = 1
_US = 1_000_000


@dataclass(frozen=True)
class Delivery:
    """One round of :meth:`AlertNotifier.deliver`: transitions delivered, firing alerts sent again, requests made."""

    delivered: int
    resent: int
    requests: int


def _iso(us: int) -> str:
    return dt.datetime.fromtimestamp(us / _US, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
    """Relays the lake's alerts to Alertmanager (module docstring); one per lake and Alertmanager.

    ``clock``: epoch seconds (tests move it). Raises :class:`ConfigError`
    when ``LAKE_ALERTMANAGER_URL`` is not set.
    """

    def __init__(self, settings: LakeSettings, store: Store | None = None, *, clock=time.time) -> None:
        if settings.alertmanager_url is None:
            raise ConfigError("LAKE_ALERTMANAGER_URL is not set: say which Alertmanager gets the alerts")
        self.settings = settings
        self.url = f"{settings.alertmanager_url}/api/v2/alerts"
        self.store = store or open_store(settings)
        self.alert_log = AlertLog(self.store)
        self.registry = Registry(self.store)
        self.clock = clock
        self.session = requests.Session()
        self._delivered: set[str] | None = None
        self._last_sent: dict[str, float] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()

    # -- the delivery record ------------------------------------------------------------------------------------

    def _load(self, rows: pa.Table) -> set[str]:
        """The ids Alertmanager accepted: the stored record, or (none yet) all but the current state's."""
        key = keys.notifications_key(RECEIVER)
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
        doc = {"format": _FORMAT, "receiver": RECEIVER, "url": self.settings.alertmanager_url, "delivered": sorted(ids)}
        self.store.replace(keys.notifications_key(RECEIVER), json.dumps(doc).encode())

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
        batches: list[list[dict]] = []
        for row in outbox:  # in commit order; an alert's next transition goes in a later request
            for batch in batches:
                if all(r["fingerprint"] != row["fingerprint"] for r in batch):
                    batch.append(row)
                    break
            else:
                batches.append([row])
        if due:
            if batches:
                batches[-1].extend(due)
            else:
                batches.append(due)
        descriptions = {name: e.description for name, e in self.registry.current().rules.items()} if batches else {}
        requests_made = 0
        for batch in batches:
            payload = [
                alert_payload(
                    {**r, "description": descriptions.get(r["rule"], "")},
                    now_s=now,
                    resend_s=resend,
                    dashboard_url=self.settings.dashboard_url,
                )
                for r in batch
            ]
            self._post(payload)
            requests_made += 1
            for row in batch:
                self._last_sent[row["fingerprint"]] = now
                self._delivered.add(row["id"])
            self._delivered &= set(live.column("id").to_pylist())  # forget ids retention removed from the table
            self._save(self._delivered)
        return Delivery(len(outbox), len(due), requests_made)

    def _post(self, payload: list[dict]) -> None:
        try:
            answer = self.session.post(self.url, json=payload, timeout=self.settings.alert_notify_timeout_seconds)
        except requests.RequestException as exc:
            raise AlertmanagerError(f"Alertmanager at {self.settings.alertmanager_url} did not answer: {exc}") from None
        if answer.status_code != 200:
            raise AlertmanagerError(
                f"Alertmanager at {self.settings.alertmanager_url} refused {len(payload)} alert(s): "
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
                    log.warning("Alertmanager at %s accepts alerts again", self.settings.alertmanager_url)
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


def start_notifier(settings: LakeSettings, store: Store | None = None) -> tuple[AlertNotifier, threading.Thread] | None:
    """Run an :class:`AlertNotifier` in a daemon thread; returns ``(notifier, thread)`` (``notifier.stop()`` ends
    it), or None when ``LAKE_ALERTMANAGER_URL`` is not set."""
    if settings.alertmanager_url is None:
        return None
    notifier = AlertNotifier(settings, store)
    thread = threading.Thread(target=notifier.run, name="alert-notifier", daemon=True)
    thread.start()
    return notifier, thread


@contextlib.contextmanager
def notifying(settings: LakeSettings, store: Store | None = None) -> Iterator[Callable[[], None]]:
    """Relay alerts to ``LAKE_ALERTMANAGER_URL`` in a thread for the duration of the block; yields ``wake()`` for the
    caller to call after each micro-batch (a no-op when no Alertmanager is configured).

    On exit the thread stops and one last delivery is tried, so what the
    block committed is sent before a one-shot command ends; if Alertmanager
    does not take it, it stays in the outbox (logged) for the next run.
    """
    relay = start_notifier(settings, store)
    if relay is None:
        yield lambda: None
        return
    notifier, thread = relay
    try:
        yield notifier.wake
    finally:
        notifier.stop()
        thread.join(timeout=settings.alert_notify_timeout_seconds + 5)
        try:
            notifier.deliver()
        except (LakeError, OSError) as exc:
            log.warning("%s; the alerts stay in the outbox for the next `lake stream` or `lake alerts notify`", exc)
