"""What the dashboard and its JSON API read: stored query series, freshness, pipeline facts (delta-rs + Arrow).

No Spark: every read is a delta-rs snapshot scanned with Arrow datasets,
pruned by the ``event_date`` partition and the files' ``window_start``
statistics.

**Resolution.** A series has at most
:data:`~metrics_lake.app.dashboard.panel_series.MAX_POINTS` points (the step for a range:
:func:`~metrics_lake.app.dashboard.panel_series.choose_step`). At the
query's own step (its ``EVERY``, or its window when tumbling) the values are
the stored query's rows in ``query_results``, which the speed layer keeps
live. A range too long for that step is shown at the smallest step of
:data:`~metrics_lake.app.dashboard.panel_series.STEPS` that fits, with the query evaluated over *tumbling* windows of
that step (the way Datadog rolls a series up at query time): from 1-minute
windows for steps under an hour, else from ``metric_rollup_1h`` for the days
it holds and 1-minute windows for the rest (today, before the nightly run).
Percentiles always come from merged sketches, never from averaging values.

**Cache.** Results are computed per block (an hour for steps under an hour,
else a day). A block whose windows all ended more than
:data:`CACHE_AFTER_SECONDS` ago is kept for ``cache_ttl_seconds`` (default
300): a late event that changes such a window shows once the entry expires.
Newer blocks are read on every request, like Mimir's results cache, which
never caches the last 10 minutes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake.exceptions import TableNotFoundError

from metrics_lake.app.dashboard.panel_series import STEPS, choose_step, series_json
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.config_store import ConfigStore, ConfigVersion
from metrics_lake.core.kernels.alert_evaluation import epoch_us
from metrics_lake.core.kernels.alert_rules import ABSENCE
from metrics_lake.core.kernels.selectors import Selector
from metrics_lake.core.kernels.stored_queries import StoredQuery, parse_query, query_rows, window_states
from metrics_lake.core.kernels.windows import WINDOW_STATE, merge_states
from metrics_lake.core.log.consumer_groups import lag_report
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.alerting import AlertLog, append_clock_us, read_last_seen
from metrics_lake.core.speed.progress import QueryProgress, newest_window_end, query_progress, watermark_app_id
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.app_transactions import FollowedTable, followed
from metrics_lake.core.tables.delta import committed_after, open_table, table_dataset
from metrics_lake.lake_schemas.errors import LakeError, RangeError
from metrics_lake.lake_schemas.tables import Table
from metrics_lake.lake_schemas.types import TAGS

__all__ = [
    "CACHE_AFTER_SECONDS",
    "RANGES",
    "SILENT_AFTER_SECONDS",
    "DashboardReader",
    "utc_days",
]

#: The range picker's choices, in seconds.
RANGES = {"15m": 900, "1h": 3600, "6h": 21_600, "24h": 86_400, "7d": 604_800, "30d": 2_592_000}
#: Windows that ended longer ago than this are cached.
CACHE_AFTER_SECONDS = 600
#: A server not heard from for this long is shown silent when no absence rule says how long is too long.
SILENT_AFTER_SECONDS = 60
#: Transitions the alerts panel lists.
RECENT_TRANSITIONS = 20
HOUR, DAY = 3600, 86_400
_US = 1_000_000


@dataclass
class _Entry:
    rows: pa.Table
    expires: float


class DashboardReader:
    """Reads one lake for the dashboard; thread-safe.

    ``queries``: the stored queries shown (default: the lake's config store,
    :mod:`metrics_lake.core.config_store`, so edits show without a restart);
    ``clock``: seconds since the epoch (tests move it); ``cache_ttl_seconds``:
    how long a closed block stays cached (module docstring);
    ``refresh_seconds``: a table's newest version and the config store's are
    looked up at most this often (a listing each time).
    """

    def __init__(
        self,
        settings: LakeSettings,
        queries: list[StoredQuery] | None = None,
        *,
        clock=time.time,
        cache_ttl_seconds: float = 300.0,
        cache_blocks: int = 4096,
        refresh_seconds: float = 1.0,
    ) -> None:
        self.settings = settings
        self.store = open_store(settings)
        self.config_store = ConfigStore(self.store)
        self._fixed = None if queries is None else {q.name: q for q in queries}
        self._config: tuple[ConfigVersion, float] | None = None
        self.clock = clock
        self.cache_ttl_seconds = cache_ttl_seconds
        self.cache_blocks = cache_blocks
        self.refresh_seconds = refresh_seconds
        self._tables: dict[str, tuple[FollowedTable, float]] = {}
        # A FollowedTable is not for concurrent use, and requests run on a thread pool: its txn lookups take turns.
        self._transactions_lock = threading.Lock()
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.cache_hits = self.cache_misses = 0
        self.alert_log = AlertLog(self.store)

    # -- stored queries -----------------------------------------------------------------------------------------

    def config_version(self) -> ConfigVersion:
        """The config store's current version (looked up at most every ``refresh_seconds``)."""
        now = time.monotonic()
        with self._lock:
            cached = self._config
        if cached is None or now - cached[1] >= self.refresh_seconds:
            cached = (self.config_store.current(), now)
            with self._lock:
                self._config = cached
        return cached[0]

    def forget_config(self) -> None:
        """Look the config store up again on the next request (after this process edited it)."""
        with self._lock:
            self._config = None

    @property
    def queries(self) -> dict[str, StoredQuery]:
        """The stored queries shown, by name."""
        if self._fixed is not None:
            return self._fixed
        return {q.name: q for q in self.config_version().queries()}

    def query_status(self, query: StoredQuery) -> dict:
        """``{"revision", "live", "backfilled"}``: whether ``query_results`` holds ``query``'s current revision live
        (the stream adopted it) and over every retained window (its backfill ran)."""
        progress = self._progress(query)
        return {
            "revision": query.revision,
            "live": progress.is_live(query.revision),
            "backfilled": progress.is_backfilled(query.revision),
        }

    def _progress(self, query: StoredQuery) -> QueryProgress:
        table = self.table(Table.QUERY_RESULTS)
        if table is None:
            return QueryProgress(None, None, None)
        with self._transactions_lock:
            return query_progress(table, query.name)

    # -- tables -------------------------------------------------------------------------------------------------

    def table(self, name: str) -> FollowedTable | None:
        """Table ``name`` at its latest version (checked every ``refresh_seconds``), or None if it does not exist.

        Kept open between requests as a :class:`~metrics_lake.core.tables.app_transactions.FollowedTable`: a panel
        asks ``query_results`` for three ``txn`` versions (its query's progress), each of which delta-rs answers
        by replaying the table's log from its last checkpoint; followed, they read only the commits made since the
        last request. Measured on a running ``bench/soak.py`` lake (minute 25, a 1-day panel, two alternated runs
        of 8 requests each): 54-59 ms a panel asked of delta-rs, 35-44 ms followed.
        """
        now = time.monotonic()
        with self._lock:
            cached = self._tables.get(name)
        if cached is not None and now - cached[1] < self.refresh_seconds:
            return cached[0]
        try:
            if cached is None:
                table = followed(self.store, name, open_table(self.store, name))
            else:
                table = cached[0]
                if committed_after(self.store, name, table.version()):  # a stat, not a listing of the whole log
                    table.update_incremental()
        except TableNotFoundError:
            return None
        with self._lock:
            self._tables[name] = (table, now)
        return table

    def scan(self, name: str, days: list[dt.date], columns: list[str], condition=None) -> pa.Table | None:
        """Rows (``columns``) of table ``name`` in the ``event_date`` partitions ``days`` that ``condition`` (a
        pyarrow dataset expression) keeps, at the latest snapshot; None if the table does not exist."""
        table = self.table(name)
        if table is None:
            return None
        where = ds.field("event_date").isin(pa.array(days, pa.date32()))
        if condition is not None:
            where = where & condition
        return table_dataset(self.store, name, table).to_table(columns=columns, filter=where)

    # -- stored query series ------------------------------------------------------------------------------------

    def series(
        self,
        name: str,
        lo_s: int,
        hi_s: int,
        step_s: int | None = None,
        top: int = 5,
        select: Selector | None = None,
    ) -> dict:
        """Series of stored query ``name`` for windows starting in ``[lo_s, hi_s)`` (epoch s, aligned to the step).

        Returns ``{"query", "text", "step", "from", "to", "series": [{"server",
        "labels", "aggregate", "points": [[epoch ms, value], ...]}]}``;
        ``server`` is null for the fleet and for a group of a ``BY`` query
        (whose label values are ``labels``). A per-server query gives its
        ``top`` servers (highest mean of the first aggregate) and the fleet, a
        grouped one its ``top`` groups. ``select`` (the dashboard's label
        filter) keeps the servers and groups it matches (the fleet row stays).
        Raises ``KeyError`` for an unknown query and :class:`RangeError` for
        a bad range or step.
        """
        query = self.queries[name]
        if hi_s <= lo_s:
            raise RangeError("to", "to must be after from")
        step = choose_step(query, hi_s - lo_s, step_s)
        lo, hi = lo_s - lo_s % step, hi_s + (-hi_s) % step
        block = HOUR if step < HOUR else DAY
        parts, missing = [], []
        now = self.clock()
        # A cached block is of one text and one state of its rows: when the stream adopts the query or its backfill
        # lands, old blocks change at once, so the key moves on with them.
        version = (query.text, *dataclasses.astuple(self._progress(query))[:2])
        for start in range(lo - lo % block, hi, block):
            key = (name, version, step, start)
            with self._lock:
                entry = self._cache.get(key)
                if entry is not None and entry.expires > now:
                    self._cache.move_to_end(key)
                    self.cache_hits += 1
                    parts.append(entry.rows)
                    continue
            missing.append(start)
        for run_lo, run_hi in _runs(missing, block):
            rows = self._evaluate(query, step, run_lo, run_hi)
            parts.append(rows)
            self._keep(query, version, step, block, run_lo, run_hi, rows, now)
        rows = pa.concat_tables(parts) if parts else _EMPTY
        start = pc.cast(rows.column("window_start"), pa.int64())
        rows = rows.filter(pc.and_(pc.greater_equal(start, lo * _US), pc.less(start, hi * _US)))
        return {
            "query": name,
            "text": query.text,
            "step": step,
            "from": lo * 1000,
            "to": hi * 1000,
            "series": series_json(rows, query, top, select),
        }

    def preview(self, text: str, lo_s: int, hi_s: int, top: int = 5) -> dict:
        """A query text not (yet) stored, evaluated from the windows over ``[lo_s, hi_s)``: the shape of :meth:`series`.

        For the dashboard's query form. Raises :class:`StoredQueryError`
        naming the clause for a bad text and :class:`RangeError` for a bad range.
        """
        query = parse_query("preview", text)
        if hi_s <= lo_s:
            raise RangeError("to", "to must be after from")
        step = choose_step(query, hi_s - lo_s)
        lo, hi = lo_s - lo_s % step, hi_s + (-hi_s) % step
        evaluated = query if step == query.slide_s else dataclasses.replace(query, duration_s=step, slide_s=step)
        rows = self._computed(evaluated, lo, hi)
        return {
            "query": None,
            "text": query.text,
            "step": step,
            "from": lo * 1000,
            "to": hi * 1000,
            "series": series_json(rows, query, top),
        }

    def _keep(self, query, version, step, block, run_lo, run_hi, rows, now) -> None:
        start = pc.cast(rows.column("window_start"), pa.int64())
        window = query.duration_s if step == query.slide_s else step
        with self._lock:
            self.cache_misses += (run_hi - run_lo) // block
            for block_lo in range(run_lo, run_hi, block):
                if block_lo + block + window > now - CACHE_AFTER_SECONDS:
                    break  # this block's windows are recent: read again next time
                inside = pc.and_(pc.greater_equal(start, block_lo * _US), pc.less(start, (block_lo + block) * _US))
                self._cache[(query.name, version, step, block_lo)] = _Entry(
                    rows.filter(inside), now + self.cache_ttl_seconds
                )
            while len(self._cache) > self.cache_blocks:
                self._cache.popitem(last=False)

    def _evaluate(self, query: StoredQuery, step: int, lo: int, hi: int) -> pa.Table:
        """Rows (server, window_start, aggregate, value) of ``query`` at ``step`` for windows starting in [lo, hi)."""
        if step == query.slide_s:
            return self._stored_rows(query, lo, hi)  # a PER SERVER query's rows include its fleet rows
        return self._computed(dataclasses.replace(query, duration_s=step, slide_s=step), lo, hi)

    def _stored_rows(self, query: StoredQuery, lo: int, hi: int) -> pa.Table:
        last = hi + query.duration_s
        condition = (
            (ds.field("query") == query.name)
            & (ds.field("window_start") >= pa.scalar(lo * _US, pa.timestamp("us", "UTC")))
            & (ds.field("window_start") < pa.scalar(hi * _US, pa.timestamp("us", "UTC")))
        )
        rows = self.scan(Table.QUERY_RESULTS, utc_days(lo, last), _EMPTY.column_names, condition)
        return _EMPTY if rows is None else rows.cast(_EMPTY.schema)

    def _computed(self, query: StoredQuery, lo: int, hi: int) -> pa.Table:
        """``query`` evaluated from the windows (module docstring) for windows starting in ``[lo, hi)``."""
        minutes = self._states(query.metric, lo, hi + query.duration_s, hourly=query.slide_s >= HOUR)
        starts = np.arange(lo, hi, query.slide_s, dtype=np.int64) * _US
        states = window_states(minutes, query, starts)
        if states.num_rows == 0:
            return _EMPTY
        rows = query_rows(merge_states(states), [query], None, dt.datetime.now(dt.UTC))
        return rows.select(_EMPTY.column_names).cast(_EMPTY.schema)

    def _states(self, metric: str, lo: int, hi: int, *, hourly: bool) -> pa.Table:
        """Window states of ``metric`` starting in ``[lo, hi)``: hourly rollups where they exist if ``hourly``."""
        days = utc_days(lo, hi)
        condition = (
            (ds.field("metric") == metric)
            & (ds.field("window_start") >= pa.scalar(lo * _US, pa.timestamp("us", "UTC")))
            & (ds.field("window_start") < pa.scalar(hi * _US, pa.timestamp("us", "UTC")))
        )
        pieces, minute_days = [], days
        if hourly:
            rolled = self.scan(Table.METRIC_ROLLUP_1H, days, WINDOW_STATE.names + ["event_date"], condition)
            if rolled is not None and rolled.num_rows:
                have = set(pc.unique(rolled.column("event_date")).to_pylist())
                pieces.append(rolled.drop_columns(["event_date"]))
                minute_days = [d for d in days if d not in have]
        if minute_days:
            minutes = self.scan(Table.METRIC_WINDOWS_1M, minute_days, WINDOW_STATE.names, condition)
            if minutes is not None:
                pieces.append(minutes)
        return pa.concat_tables(pieces).cast(WINDOW_STATE) if pieces else WINDOW_STATE.empty_table()

    # -- alerts and servers -------------------------------------------------------------------------------------

    def alerts(self) -> dict:
        """The alert rules, the active alerts (firing first, then pending) and the latest transitions.

        ``{"rules": [{"name", "kind", "rule", "description", "revision", "firing", "pending"}],
        "active": [{"rule", "server", "state", "since", "value", "labels", "summary", "fingerprint"}],
        "recent": [{"at", "rule", "server", "previous_state", "state", "summary"}], "config_version"}``;
        times are epoch ms, ``server`` null for a fleet-wide alert.
        """
        version = self.config_version()
        active = self._active_alerts()
        rows = self.alert_log.transitions()
        # Only the rows shown become Python dicts: the active alerts' latest live transitions and the newest ones.
        mine = pc.and_(
            pc.equal(rows.column("source"), "live"),
            pc.is_in(rows.column("fingerprint"), pa.array(sorted(active), pa.string())),
        )
        latest = {r["fingerprint"]: r for r in rows.filter(mine).select(["fingerprint", "summary"]).to_pylist()}
        listed = []
        for alert in sorted(active.values(), key=lambda a: (a.state != "firing", a.rule, a.server or "")):
            listed.append(
                {
                    "rule": alert.rule,
                    "server": alert.server,
                    "state": alert.state,
                    "since": alert.active_since_us // 1000,
                    "value": alert.value,
                    "labels": dict(alert.labels),
                    "summary": latest[alert.fingerprint]["summary"] if alert.fingerprint in latest else "",
                    "fingerprint": alert.fingerprint,
                }
            )
        rules = []
        for rule in version.alert_rules():
            mine = [a for a in active.values() if a.rule == rule.name]
            rules.append(
                {
                    "name": rule.name,
                    "kind": rule.kind,
                    "rule": rule.text,
                    "description": rule.description,
                    "revision": rule.revision,
                    "firing": sum(a.state == "firing" for a in mine),
                    "pending": sum(a.state == "pending" for a in mine),
                }
            )
        recent = [
            {
                "at": epoch_us(r["at"]) // 1000,
                "rule": r["rule"],
                "server": r["server"],
                "previous_state": r["previous_state"],
                "state": r["state"],
                "summary": r["summary"],
            }
            for r in rows.slice(max(rows.num_rows - RECENT_TRANSITIONS, 0)).to_pylist()[::-1]
        ]
        return {"rules": rules, "active": listed, "recent": recent, "config_version": version.version}

    def servers(self, select: Selector | None = None) -> dict:
        """Every server's status by the lake's append clock: ``up``, ``silent`` (not heard from for the shortest
        FOR of the absence rules watching it, else :data:`SILENT_AFTER_SECONDS`, or an absence alert fires for
        it) or ``never seen`` (in the inventory, or named in an absence rule's FROM, but never heard from within
        the lookback); ``labels``: the server's inventory labels (the ``servers`` table). ``select`` keeps the
        servers it matches by name and inventory labels (the dashboard's label filter).

        ``{"clock": epoch ms, "servers": [{"server", "status", "last_seen_at", "silent_seconds", "alerts",
        "labels"}]}``, silent servers first.
        """
        table = self.table(Table.LAST_SEEN)
        seen = read_last_seen(self.store, table) if table is not None else pa.table({"server": [], "metric": []})
        rows = seen.filter(pc.is_null(seen.column("metric"))).to_pylist() if seen.num_rows else []
        clock_us = append_clock_us(seen) if seen.num_rows else None
        absence = [r for r in self.config_version().alert_rules() if r.kind == ABSENCE]
        alerting: dict[str, list[str]] = {}
        for alert in self._active_alerts().values():
            if alert.server is not None and alert.state == "firing":
                alerting.setdefault(alert.server, []).append(alert.rule)
        servers = []
        for row in rows:
            server, last_us = row["server"], epoch_us(row["last_seen_at"])
            silent_s = max(0.0, (clock_us - last_us) / 1e6) if clock_us is not None else 0.0
            watching = [r.for_s for r in absence if Selector(r.servers).matches(server, None)]
            limit = min(watching, default=SILENT_AFTER_SECONDS)
            status = "silent" if silent_s >= limit or server in alerting else "up"
            servers.append(
                {
                    "server": server,
                    "status": status,
                    "last_seen_at": last_us // 1000,
                    "silent_seconds": round(silent_s, 1),
                    "alerts": sorted(alerting.get(server, [])),
                }
            )
        known = {s["server"] for s in servers}
        inventory = self._inventory()
        named = {n for r in absence for n in r.servers if not any(c in n for c in "*?[")}
        for server in sorted((named | set(inventory)) - known):
            servers.append(
                {"server": server, "status": "never seen", "last_seen_at": None, "silent_seconds": None, "alerts": []}
            )
        for entry in servers:
            entry["labels"] = inventory.get(entry["server"], {})
        if select is not None:
            servers = [s for s in servers if select.matches(s["server"], s["labels"])]
        order = {"silent": 0, "never seen": 1, "up": 2}
        servers.sort(key=lambda s: (order[s["status"]], s["server"]))
        return {"clock": None if clock_us is None else clock_us // 1000, "servers": servers}

    def _inventory(self) -> dict[str, dict[str, str]]:
        """Server -> labels from the ``servers`` table (empty if the lake has no inventory)."""
        table = self.table(Table.SERVERS)
        if table is None:
            return {}
        rows = table_dataset(self.store, Table.SERVERS, table).to_table(columns=["server", "labels"])
        return dict(zip(rows.column("server").to_pylist(), map(dict, rows.column("labels").to_pylist()), strict=True))

    def _active_alerts(self) -> dict:
        """The active alerts by fingerprint, from the alerts table's latest version (read incrementally)."""
        table = self.table(Table.ALERTS)
        return self.alert_log.refresh(table) if table is not None else {}

    # -- freshness and pipeline ---------------------------------------------------------------------------------

    def freshness(self) -> dict:
        """How current the speed layer is: ``watermark`` (windows complete up to, epoch ms), ``newest_window_end``
        (epoch ms), ``lag_seconds`` (now minus the newest window's end), ``limit_seconds`` and ``stale``."""
        now = self.clock()
        table = self.table(Table.METRIC_WINDOWS_1M)
        watermark = newest = None
        if table is not None:
            with self._transactions_lock:
                watermark = table.transaction_version(watermark_app_id(self.settings.topic))
            end = newest_window_end(table)
            newest = None if end is None else int(end.timestamp() * 1000)
        limit = self.settings.quality_freshness_lag_seconds
        lag = None if newest is None else max(now - newest / 1000, 0.0)
        return {
            "watermark": watermark,
            "newest_window_end": newest,
            "lag_seconds": None if lag is None else round(lag, 1),
            "limit_seconds": limit,
            "stale": lag is None or lag > limit,
        }

    def pipeline(self, lo_s: int, hi_s: int) -> dict:
        """Consumer lag per group, quarantined events by reason per step, and the latest data-quality run."""
        return {
            "consumers": self._consumer_lag(),
            "quarantine": self._quarantine(lo_s, hi_s),
            "quality": self._latest_quality_run(),
        }

    def _consumer_lag(self) -> dict:
        try:
            report = lag_report(SegmentLog(self.store))
        except (LakeError, OSError) as exc:  # e.g. the analyst identity may not read log/
            return {"error": str(exc).splitlines()[0][:200], "groups": []}
        groups: dict[str, int] = {}
        for row in report:
            groups[f"{row.group} ({row.topic})"] = groups.get(f"{row.group} ({row.topic})", 0) + row.lag
        return {"groups": [{"group": g, "lag": lag} for g, lag in sorted(groups.items())]}

    def _quarantine(self, lo_s: int, hi_s: int) -> dict:
        step = next((s for s in STEPS if (hi_s - lo_s) / s <= 200), STEPS[-1])
        since = pa.scalar(lo_s * _US, pa.timestamp("us", "UTC"))
        condition = ds.field("ingested_at") >= since
        table = self.table(Table.QUARANTINE_EVENTS)
        if table is None:
            return {"step": step, "series": []}
        days = pa.array(utc_days(lo_s, hi_s + 1), pa.date32())
        rows = table_dataset(self.store, Table.QUARANTINE_EVENTS, table).to_table(
            columns=["reason", "ingested_at"], filter=ds.field("ingest_date").isin(days) & condition
        )
        if rows.num_rows == 0:
            return {"step": step, "series": []}
        code = pc.utf8_slice_codeunits(rows.column("reason"), 0, 40)
        code = pc.replace_substring_regex(code, ":.*$", "")
        seconds = pc.cast(rows.column("ingested_at"), pa.int64()).to_numpy(zero_copy_only=False) // _US
        bucket = pa.array((seconds - seconds % step) * 1000)
        counts = (
            pa.table({"reason": code, "bucket": bucket}).group_by(["reason", "bucket"]).aggregate([([], "count_all")])
        )
        series: dict[str, list] = {}
        for r in counts.sort_by([("reason", "ascending"), ("bucket", "ascending")]).to_pylist():
            series.setdefault(r["reason"], []).append([r["bucket"], r["count_all"]])
        return {"step": step, "series": [{"reason": k, "points": v} for k, v in series.items()]}

    def _latest_quality_run(self) -> dict | None:
        table = self.table(Table.DQ_RESULTS)
        if table is None:
            return None
        today = dt.datetime.fromtimestamp(self.clock(), dt.UTC).date()
        days = [today - dt.timedelta(days=d) for d in range(-1, 31)]
        rows = self.scan(Table.DQ_RESULTS, days, ["run_id", "run_at", "table", "success", "critical"])
        if rows is None or rows.num_rows == 0:
            return None
        latest = pc.max(rows.column("run_at")).as_py()
        run = rows.filter(pc.equal(rows.column("run_at"), pa.scalar(latest, rows.schema.field("run_at").type)))
        run_ids = set(run.column("run_id").to_pylist())
        run = rows.filter(pc.is_in(rows.column("run_id"), pa.array(sorted(run_ids))))
        success = run.column("success").to_numpy(zero_copy_only=False).astype(bool)
        critical = run.column("critical").to_numpy(zero_copy_only=False).astype(bool)
        return {
            "run_at": int(latest.timestamp() * 1000),
            "expectations": int(len(success)),
            "pass_rate": float(success.mean()),
            "critical_failed": int((critical & ~success).sum()),
            "tables": sorted(set(run.column("table").to_pylist())),
        }


_EMPTY = pa.schema(
    [
        pa.field("server", pa.string()),
        pa.field("labels", TAGS),
        pa.field("window_start", pa.timestamp("us", "UTC")),
        pa.field("aggregate", pa.string()),
        pa.field("value", pa.float64()),
    ]
).empty_table()


def utc_days(lo_s: int, hi_s: int) -> list[dt.date]:
    """UTC days overlapping ``[lo_s, hi_s)``."""
    first = dt.datetime.fromtimestamp(lo_s, dt.UTC).date()
    last = dt.datetime.fromtimestamp(max(hi_s - 1, lo_s), dt.UTC).date()
    return [first + dt.timedelta(days=d) for d in range((last - first).days + 1)]


def _runs(starts: list[int], block: int) -> list[tuple[int, int]]:
    """Contiguous runs ``[lo, hi)`` of the block starts."""
    runs: list[list[int]] = []
    for start in starts:
        if runs and runs[-1][1] == start:
            runs[-1][1] = start + block
        else:
            runs.append([start, start + block])
    return [(lo, hi) for lo, hi in runs]
