"""``lake demo``: the main job end to end on the configured lake (default ./lakehouse).

For ``seconds`` seconds the host agent samples this machine every second and
the fleet simulator sends ``servers x metrics`` series in real time, plus a
handful of malformed events (one per quarantine reason) to show that bad
input is kept, not dropped. Meanwhile the speed layer runs micro-batches
every ``trigger_seconds``; when the agents stop it drains the log, then the
demo prints row counts, this host's CPU windows and commands to try next.
Running it again appends to the same lake (offsets and checkpoints carry on).
The stored queries are kept live by the speed layer, so the last lines name
the dashboard command (``lake demo --dashboard`` serves it right away).
"""

from __future__ import annotations

import threading
import time

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
    from metrics_lake.app.console import print_batch
    from metrics_lake.spark.jobs.sql_query import run_sql
    from metrics_lake.spark.jobs.stream_metrics import start_stream
    from metrics_lake.spark.session import build_session

    wall_start = time.monotonic()
    store = open_store(settings)
    console.rule("[bold]metrics-lake demo")
    console.print(
        f"lake root      {store.root}\ncheckpoints    {settings.checkpoint_path}\n"
        f"topic          {settings.topic} ({settings.partitions} partitions for a new topic)"
    )
    producer = producer_for(settings, store)
    host = HostAgent()
    simulator = FleetSimulator(
        servers=servers,
        metrics=metrics,
        seconds=seconds,
        rate=1.0,
        seed=int(time.time()),
        start_ms=int(time.time() * 1000),
    )
    stop = threading.Event()
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
    producer.send_payloads(MALFORMED_SAMPLES)
    for thread in agents:
        thread.start()

    console.print("starting Spark (local) and the speed layer ...")
    spark = build_session(settings, "lake-demo")
    query = start_stream(spark, settings, trigger_seconds=settings.trigger_seconds, progress=print_batch)
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
    spark.stop()

    console.rule("[bold]try next")
    console.print(
        "lake dashboard        # then open http://127.0.0.1:8050/ (stored queries, freshness, pipeline)\n"
        "lake tables\n"
        'lake sql "SELECT metric, count(*) AS windows, round(avg(p99), 2) AS avg_p99 '
        f'FROM {WINDOWS} GROUP BY metric ORDER BY metric"\n'
        f'lake sql "SELECT reason, raw FROM {Table.QUARANTINE_EVENTS}" --format json\n'
        f'lake sql "SELECT server, count(*) FROM {Table.BRONZE_EVENTS} GROUP BY server ORDER BY 2 DESC LIMIT 5"\n'
        f'lake sql --version {WINDOWS}=1 "SELECT count(*) FROM {WINDOWS}"   # time travel\n'
        "(inside the project's virtualenv: .venv/bin/lake, or python3 run.py lake ...)",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )
    console.print(f"demo finished in {time.monotonic() - wall_start:.0f} s")
    if dashboard_port is not None:
        _serve_dashboard(settings, dashboard_port, console)


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
