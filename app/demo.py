"""``lake demo``: the main job end to end on the configured lake (default ./lakehouse).

Once the speed layer has run its first micro-batch, for ``seconds`` seconds
the host agent samples this machine every second and the fleet simulator
sends ``servers x metrics`` series in real time, after a handful of
malformed events (one per quarantine reason) to show that bad input is kept,
not dropped. Meanwhile the speed layer runs micro-batches every
``trigger_seconds``; when the agents stop it drains the log, then the
demo prints row counts, this host's CPU windows and commands to try next.
Running it again appends to the same lake (offsets and checkpoints carry on).
The stored queries are kept live by the speed layer, so the last lines name
the dashboard command (``lake demo --dashboard`` serves it right away).

**Labels.** Before the agents start, the demo puts the simulated servers in
the inventory (:func:`demo_inventory`: a ``dc``, ``role`` and ``team`` each;
only what differs from the inventory is appended), keeps the stored query
:data:`DEMO_QUERY` (RPC latency p99 by team and dc) in the config store, and
ends by showing its newest window per group.

**Missing data is a signal.** The last simulated server goes silent from a
quarter of the run to 60 % of it, and the demo keeps an absence rule,
``demo_server_silent`` (``FOR`` a sixth of the run, at least 3 s), in the
config store: its alert fires during the silence and resolves when the server
sends again. Unless ``LAKE_ALERTMANAGER_URL`` names one, the demo starts
Debian's ``prometheus-alertmanager`` for the run (in a temporary directory,
stopped at the end; with ``--dashboard`` when the dashboard stops) with a
webhook that prints each notification Alertmanager sends. Without an
installed Alertmanager the alerts are only recorded in the ``alerts`` table.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from rich import table as rich_table
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from metrics_lake.agents.host import HostAgent
from metrics_lake.agents.simulator import FleetSimulator, send_in_real_time
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.log.producer import producer_for
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import summarize_tables
from metrics_lake.lake_schemas.tables import Table

WINDOWS = Table.METRIC_WINDOWS_1M
#: The demo's absence rule (module docstring).
DEMO_RULE = "demo_server_silent"

#: The demo's grouped stored query (module docstring) and its text.
DEMO_QUERY = "demo_rpc_p99_by_team_dc"
DEMO_QUERY_TEXT = "FROM * SELECT app.rpc.latency_ms WINDOW 1m COMPUTE percentile(99), count BY team,dc"
_DCS, _TEAMS = ("eu-west", "eu-north", "us-east"), ("payments", "search", "checkout")

#: One payload per kind of contract violation, sent once per demo run.
MALFORMED_SAMPLES: list[str] = [
    '{"ts": 1700000000000, "server": "web-01", "metric": "host.cpu.utilization", "value": 12.5',
    '["not", "an", "object"]',
    '{"ts": 1700000000000, "server": "web-01", "value": 3.0}',
    '{"ts": 1700000000000, "server": "web-01", "metric": "app.rpc.count", "value": "12"}',
    '{"ts": 1700000000000, "server": "web-01", "metric": "app.rpc.latency_ms", "value": NaN}',
    '{"ts": 1700000000000, "server": "web-01", "metric": "CPU Usage %", "value": 1.0}',
    '{"ts": 1700000000000, "server": "", "metric": "host.cpu.utilization", "value": 1.0}',
    '{"ts": "yesterday", "server": "web-01", "metric": "host.cpu.utilization", "value": 1.0}',
    '{"ts": 1700000000000, "server": "web-01", "metric": "app.queue.depth", "value": 1.0, "tags": {"k": 1}}',
]


def _sql_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def demo_inventory(servers: int) -> dict[str, dict[str, str]]:
    """Labels of the simulated servers ``sim-0000``...: dc, role and team cycling so that every team spans dcs."""
    return {
        f"sim-{i:04d}": {"dc": _DCS[i % 3], "role": "web" if i % 2 == 0 else "api", "team": _TEAMS[(i // 3) % 3]}
        for i in range(servers)
    }


def demo_silence(servers: int, seconds: int) -> tuple[int, float, float, int]:
    """(index of the simulated server that goes silent, silence start s, end s, the demo rule's FOR s)."""
    return servers - 1, seconds * 0.25, seconds * 0.6, max(3, seconds // 6)


def run_demo(
    settings: LakeSettings,
    *,
    seconds: int,
    servers: int,
    metrics: int,
    console: Console,
    dashboard_port: int | None = None,
) -> None:
    """Run the demo; see the module docstring. Prints progress to ``console``.

    With ``dashboard_port`` it then serves the dashboard on that port until
    Ctrl-C or SIGTERM.
    """
    from metrics_lake.core.config_store import ALERT, Change, ConfigStore

    wall_start = time.monotonic()
    store = open_store(settings)
    console.rule("[bold]metrics-lake demo")
    console.print(
        f"lake root      {store.root}\ncheckpoints    {settings.checkpoint_path}\n"
        f"topic          {settings.topic} ({settings.partitions} partitions for a new topic)"
    )
    silent, quiet_from, quiet_to, for_s = demo_silence(servers, seconds)
    config_store = ConfigStore(store)
    config_store.ensure_seeded()
    rule = f"ABSENT host.cpu.utilization FROM sim-* FOR {for_s}s LABELS severity=info"
    config_store.apply(
        [Change("put", DEMO_RULE, rule, "lake demo: a simulated server goes silent part way", ALERT)], by="lake demo"
    )
    console.print(
        f"alert rule     {DEMO_RULE}: {rule} (sim-{silent:04d} is silent from {quiet_from:.0f} s to {quiet_to:.0f} s)"
    )
    from metrics_lake.core.config_store import QUERY
    from metrics_lake.core.inventory import Inventory, diff

    if config_store.current().of_kind(QUERY).get(DEMO_QUERY) is None:
        description = "lake demo: RPC latency p99 per team and dc (inventory labels)"
        config_store.apply([Change("put", DEMO_QUERY, DEMO_QUERY_TEXT, description, QUERY)], by="lake demo")
    inventory = Inventory(store)
    changes = diff(inventory.current(), demo_inventory(servers), full=False)
    if changes:
        inventory.append(changes)
    console.print(
        f"inventory      {servers} simulated servers labelled dc, role, team ({len(changes)} changed); "
        f"stored query {DEMO_QUERY}: {DEMO_QUERY_TEXT}"
    )
    with _alertmanager(settings, console) as (settings, notifications):
        _produce_and_stream(settings, store, seconds, servers, metrics, console, (silent, quiet_from, quiet_to))
        if notifications is not None:  # Alertmanager's own timers (group_wait) pass before it notifies
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(n[0] == "resolved" for n in notifications):
                time.sleep(0.2)
        _print_alerts(store, wall_start, notifications, console)
        _print_groups(store, console)
        _print_next_steps(settings, console)
        console.print(f"demo finished in {time.monotonic() - wall_start:.0f} s")
        if dashboard_port is not None:
            _serve_dashboard(settings, dashboard_port, console)


def _produce_and_stream(settings, store, seconds, servers, metrics, console, silence) -> None:
    """The agents produce for ``seconds`` while the speed layer runs (and alerts go out); then the log is drained,
    the tables summarised and this host's CPU windows shown."""
    from metrics_lake.app.console import print_batch
    from metrics_lake.app.notifier import notifying
    from metrics_lake.spark.jobs.sql_query import run_sql
    from metrics_lake.spark.jobs.stream_metrics import BatchGate, start_stream
    from metrics_lake.spark.session import build_session, stop_session

    producer = producer_for(settings, store)
    host = HostAgent()
    stop = threading.Event()
    producer.send_payloads(MALFORMED_SAMPLES)

    console.print("starting Spark (local) and the speed layer ...")
    spark = build_session(settings, "lake-demo")
    with notifying(settings) as wake:

        def progress(outcome) -> None:
            print_batch(outcome)
            wake()

        gate = BatchGate()
        query = start_stream(spark, settings, trigger_seconds=settings.trigger_seconds, progress=progress, gate=gate)
        # The agents start once the stream has run a batch: the silent server's silence must reach the speed layer
        # as silence, not as a backlog read together with the events after it (a slow Spark start did that).
        deadline = time.monotonic() + 300
        while not query.recentProgress and query.isActive and time.monotonic() < deadline:
            time.sleep(0.2)
        simulator = FleetSimulator(
            servers=servers,
            metrics=metrics,
            seconds=seconds,
            rate=1.0,
            seed=int(time.time()),
            start_ms=int(time.time() * 1000),
            silence=silence,
        )
        agents = [
            threading.Thread(
                target=host.run,
                kwargs=dict(producer=producer, interval=1.0, duration=seconds, stop=stop),
                name="host-agent",
                daemon=True,
            ),
            threading.Thread(
                target=send_in_real_time, args=(simulator, producer.send, stop), name="simulator", daemon=True
            ),
        ]
        console.print(
            f"producing for {seconds} s: host agent on {host.server!r} every 1 s, "
            f"{servers} simulated servers x {metrics} metrics at 1 Hz, {len(MALFORMED_SAMPLES)} malformed events"
        )
        for thread in agents:
            thread.start()
        try:
            with Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[events]:,} events"),
                TimeRemainingColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("agents producing", total=seconds, events=0)
                produce_start = time.monotonic()
                while any(thread.is_alive() for thread in agents):
                    time.sleep(0.5)
                    bar.update(
                        task, completed=min(time.monotonic() - produce_start, seconds), events=producer.stats.records
                    )
                bar.update(task, completed=seconds, events=producer.stats.records)
            producer.close()
            console.print(
                f"agents done: {producer.stats.records:,} events in {producer.stats.segments} segments; "
                "draining the log ..."
            )
            query.processAllAvailable()
        finally:
            stop.set()
            gate.close()  # a batch in flight (Ctrl-C) commits first: no stack traces of an interrupted job
            query.stop()

    console.rule("[bold]tables")
    summary = rich_table.Table("table", "version", "files", "rows")
    for s in summarize_tables(store):
        summary.add_row(s.name, str(s.version), str(s.files), f"{s.rows:,}")
    console.print(summary)

    cpu_query = (
        "SELECT window_start, count, round(avg, 1) AS avg, round(p95, 1) AS p95, round(max, 1) AS max "
        f"FROM {WINDOWS} WHERE server = {_sql_literal(host.server)} "
        "AND metric = 'host.cpu.utilization' ORDER BY window_start DESC LIMIT 5"
    )
    console.rule(f"[bold]this machine's CPU ({host.server}), 1-minute windows")
    windows = run_sql(spark, settings, cpu_query).toPandas()
    console.print(windows.to_string(index=False))
    stop_session(spark)


def _print_alerts(store, since: float, notifications: list | None, console: Console) -> None:
    """The alert transitions this run recorded, and what Alertmanager notified."""
    import pyarrow.compute as pc

    from metrics_lake.core.tables.delta import table_dataset

    console.rule("[bold]alerts (missing data is a signal)")
    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=time.monotonic() - since)
    rows = table_dataset(store, Table.ALERTS).to_table()
    rows = rows.filter(
        pc.greater_equal(rows.column("recorded_at"), pa.scalar(started, rows.schema.field("recorded_at").type))
    )
    listing = rich_table.Table("at (UTC)", "rule", "server", "transition", "what")
    for row in rows.sort_by([("recorded_at", "ascending"), ("seq", "ascending")]).to_pylist():
        listing.add_row(
            f"{row['at']:%H:%M:%S}",
            row["rule"],
            row["server"] or "(fleet)",
            f"{row['previous_state']} -> {row['state']}",
            row["summary"],
        )
    console.print(listing if rows.num_rows else "no alert changed state during this run")
    if notifications is None:
        return
    console.print(f"Alertmanager sent {len(notifications)} notification(s) to the demo's webhook:")
    for status, name, server in notifications:
        console.print(f"  {status.upper()}: alertname={name} server={server}")


def _print_groups(store, console: Console) -> None:
    """The newest window of :data:`DEMO_QUERY` per (team, dc) group: an answer by label, from ``query_results``."""
    import pyarrow.compute as pc

    from metrics_lake.core.tables.delta import table_dataset

    console.rule(f"[bold]RPC latency p99 by team and dc ({DEMO_QUERY}, newest window)")
    rows = table_dataset(store, Table.QUERY_RESULTS).to_table(
        columns=["query", "labels", "window_start", "aggregate", "value"]
    )
    rows = rows.filter(pc.equal(rows.column("query"), DEMO_QUERY)).to_pylist()
    for row in rows:
        row["group"] = (dict(row["labels"] or []).get("team", ""), dict(row["labels"] or []).get("dc", ""))
    newest: dict[tuple[str, str], dt.datetime] = {}
    for row in rows:
        newest[row["group"]] = max(newest.get(row["group"], row["window_start"]), row["window_start"])
    values = {(r["group"], r["aggregate"]): r["value"] for r in rows if r["window_start"] == newest[r["group"]]}
    listing = rich_table.Table("team", "dc", "window (UTC)", "p99 ms", "events")
    for group in sorted(newest):
        p99, count = values.get((group, "p99"), float("nan")), values.get((group, "count"), 0.0)
        listing.add_row(*group, f"{newest[group]:%H:%M}", f"{p99:.1f}", f"{count:,.0f}")
    console.print(listing if newest else "no window of the query yet (the simulator needs --metrics 2 or more)")


def _print_next_steps(settings: LakeSettings, console: Console) -> None:
    console.rule("[bold]try next")
    console.print(
        "lake dashboard        # then open http://127.0.0.1:8050/ (stored queries, alerts, servers, pipeline)\n"
        "lake tables\n"
        'lake sql "SELECT metric, count(*) AS windows, round(avg(p99), 2) AS avg_p99 '
        f'FROM {WINDOWS} GROUP BY metric ORDER BY metric"\n'
        f'lake sql "SELECT reason, raw FROM {Table.QUARANTINE_EVENTS}" --format json\n'
        f'lake sql "SELECT server, count(*) FROM {Table.BRONZE_EVENTS} GROUP BY server ORDER BY 2 DESC LIMIT 5"\n'
        f'lake sql --version {WINDOWS}=1 "SELECT count(*) FROM {WINDOWS}"   # time travel\n'
        f"lake queries show {DEMO_QUERY}; lake inventory list --label team=payments\n"
        f"lake alerts list; lake alerts show {DEMO_RULE}\n"
        'eval "$(lake infra alertmanager up)"   # a local Alertmanager for `lake stream` (web UI on :9093)\n'
        "(inside the project's virtualenv: .venv/bin/lake, or python3 run.py lake ...)",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )


class _NotificationPrinter:
    """A webhook receiver on 127.0.0.1 printing each notification Alertmanager POSTs; ``seen`` keeps
    ``(status, alertname, server)`` per alert."""

    def __init__(self, console: Console) -> None:
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                for alert in body.get("alerts", []):
                    labels = alert.get("labels", {})
                    seen.append((alert.get("status", "?"), labels.get("alertname"), labels.get("server")))
                    console.print(
                        f"[bold]Alertmanager notified[/]: {alert.get('status', '?').upper()} "
                        f"{labels.get('alertname')} on {labels.get('server', 'the fleet')}: "
                        f"{alert.get('annotations', {}).get('summary', '')}",
                        highlight=False,
                    )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/notifications"
        threading.Thread(target=self.server.serve_forever, name="demo-webhook", daemon=True).start()

    def close(self) -> None:
        """Stop listening."""
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def _alertmanager(settings: LakeSettings, console: Console) -> Iterator[tuple[LakeSettings, list | None]]:
    """Settings pointing at an Alertmanager for the run, and the list of its notifications (None: not watched).

    ``LAKE_ALERTMANAGER_URL`` is used as it is; else Debian's Alertmanager
    is started in a temporary directory (port 9093 if free) with the
    printing webhook, and stopped on exit; else alerts stay in the table.
    """
    from metrics_lake.infra.alertmanager import LocalAlertmanager, binary, start, stop
    from metrics_lake.infra.processes import bind_error
    from metrics_lake.lake_schemas.errors import AlertmanagerError

    if settings.alertmanager_url is not None:
        console.print(f"alerts to      {settings.alertmanager_url} (LAKE_ALERTMANAGER_URL)")
        yield settings, None
        return
    try:
        binary()
    except AlertmanagerError:
        console.print(
            "alerts to      the alerts table only: no Alertmanager installed (apt-get install prometheus-alertmanager)"
        )
        yield settings, None
        return
    receiver = _NotificationPrinter(console)
    directory = Path(tempfile.mkdtemp(prefix="lake-demo-alertmanager-"))
    port = 9093 if bind_error(9093) is None else _free_port()
    manager = LocalAlertmanager(directory, port, webhook=receiver.url)
    try:
        start(manager, log=lambda line: None)
        console.print(
            f"alerts to      Alertmanager {manager.url} (started for the demo; web UI {manager.url}/#/alerts)"
        )
        yield settings.model_copy(update={"alertmanager_url": manager.url}), receiver.seen
    finally:
        stop(manager, log=lambda line: None)
        receiver.close()
        shutil.rmtree(directory, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_dashboard(settings: LakeSettings, port: int, console: Console) -> None:
    """Serve the dashboard over the demo's lake until Ctrl-C or SIGTERM."""
    import signal

    from metrics_lake.app.dashboard import DashboardReader, serve

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    def ready(address) -> None:
        console.print(f"dashboard on http://{address[0]}:{address[1]}/ ; Ctrl-C stops it")

    serve(DashboardReader(settings), "127.0.0.1", port, stop, ready=ready)
