"""``lake produce``, ``lake agent``, ``lake gateway``: getting events into the log."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from metrics_lake.app.cli.options import (
    GatewayOption,
    InsecureOption,
    TlsCertOption,
    TlsClientCaOption,
    TlsKeyOption,
    partition_list,
    server_tls,
    settings,
    stop_on_signals,
)
from metrics_lake.app.console import err
from metrics_lake.core.arrow_pandas import hide_pandas
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.log.producer import producer_for
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.tables import Table

__all__ = ["agent", "gateway", "produce"]


def _sink(settings: LakeSettings, gateway: str | None, import_of: Path | None = None):
    """Where agents send: a gateway (through the disk spool) or the log directly.

    An import through a gateway gets a spool of its own, named by its import
    id, so a re-run resumes it (see :mod:`metrics_lake.agents.file_import`).
    """
    if gateway is None:
        return producer_for(settings)
    from metrics_lake.agents.gateway_client import GatewaySender

    spool, agent_id = Path(settings.spool_dir), None
    if import_of is not None:
        from metrics_lake.agents.file_import import import_id

        agent_id = import_id(import_of)
        spool = spool / "imports" / agent_id
    err.print(f"sending through {gateway} (spool {spool})")
    return GatewaySender(gateway, spool, agent_id=agent_id, token=settings.client_token(), ca=settings.tls_ca)


def _import_with_progress(producer, path: Path):
    """:func:`~metrics_lake.agents.file_import.import_jsonl` with a progress bar on a terminal (bytes done, events).

    A ``.gz`` file's uncompressed size is unknown up front: its bar counts without a total.
    """
    from metrics_lake.agents.file_import import import_jsonl

    total = None if path.suffix == ".gz" else path.stat().st_size
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[events]:,} events"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(f"importing {path.name}", total=total, events=0)
        return import_jsonl(
            producer,
            path,
            progress=lambda stats: bar.update(task, completed=stats.bytes, events=stats.accepted + stats.rejected),
        )


def produce(
    servers: Annotated[int, typer.Option(min=1, help="Simulated servers.")] = 10,
    metrics: Annotated[int, typer.Option(min=1, help="Metrics per server.")] = 5,
    seconds: Annotated[int, typer.Option(min=1, help="Seconds of event time to generate.")] = 60,
    rate: Annotated[float, typer.Option(min=0.001, help="Samples per second per (server, metric).")] = 1.0,
    seed: Annotated[int, typer.Option(help="RNG seed: same seed, same events.")] = 42,
    realtime: Annotated[bool, typer.Option(help="Pace sending to the wall clock instead of all at once.")] = False,
    from_file: Annotated[Path | None, typer.Option(help="Import JSON Lines (.jsonl or .jsonl.gz) instead.")] = None,
    gateway: GatewayOption = None,
) -> None:
    """Produce events to the log: a seeded fleet simulator, or a JSON Lines import."""
    from metrics_lake.agents.file_import import check_importable
    from metrics_lake.agents.simulator import FleetSimulator, send_in_real_time

    hide_pandas()  # no pandas here: pyarrow's import of it cost 0.2 s before the first append (core.arrow_pandas)
    config = settings()
    if from_file is not None:
        check_importable(from_file)
    started = time.monotonic()
    with _sink(config, gateway, from_file) as producer:
        if from_file is not None:
            stats = _import_with_progress(producer, from_file)
            again = f"; {stats.duplicates:,} were already imported by an earlier run" if stats.duplicates else ""
            err.print(
                f"imported {from_file}: {stats.accepted:,} events accepted, {stats.rejected:,} rejected "
                f"(-> {Table.QUARANTINE_EVENTS}), {stats.blank:,} blank lines skipped{again}"
            )
            return
        simulator = FleetSimulator(
            servers=servers,
            metrics=metrics,
            seconds=seconds,
            rate=rate,
            seed=seed,
            start_ms=int(time.time() * 1000) if realtime else None,
        )
        err.print(f"simulating {simulator.total_events:,} events from {servers} servers x {metrics} metrics")
        if realtime:
            send_in_real_time(simulator, producer.send)
        else:
            producer.send(simulator.generate())
    elapsed = time.monotonic() - started
    unit = "acknowledged requests" if gateway else "segments"
    err.print(
        f"produced {producer.stats.records:,} events in {producer.stats.segments} {unit} "
        f"to topic {config.topic!r} in {elapsed:.1f} s"
    )


def agent(
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between samples.")] = 5.0,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: run until Ctrl-C).")
    ] = None,
    server: Annotated[str | None, typer.Option(help="Server name to report (default: hostname).")] = None,
    gateway: GatewayOption = None,
) -> None:
    """Run the host agent: this machine's CPU, memory, swap, disk, network, load and process metrics, and a
    heartbeat; under systemd it reports ready and pings the watchdog (docs/lake-agent.service)."""
    from metrics_lake.agents.host import HostAgent, systemd_notify

    config = settings()
    host = HostAgent(server)
    stop = stop_on_signals()  # SIGTERM (systemctl stop) ends it between samples, flushing what it holds
    err.print(
        f"host agent for {host.server!r}: sampling every {interval:g} s into topic {config.topic!r}; Ctrl-C stops"
    )
    with _sink(config, gateway) as producer:
        sent = host.run(producer, interval=interval, duration=duration, stop=stop, notify=systemd_notify())
    err.print(f"{'stopped: ' if stop.is_set() else ''}sent {sent:,} events")


def gateway(
    host: Annotated[str | None, typer.Option(help="Listen address (default LAKE_GATEWAY_HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default LAKE_GATEWAY_PORT, 8787).")] = None,
    partitions: Annotated[
        str | None, typer.Option(help="Partitions this gateway owns, e.g. 0-1 or 0,2 (default: all).")
    ] = None,
    linger_ms: Annotated[
        int,
        typer.Option(
            min=1,
            help="Group commit: a partition's records wait at most this long for requests still on their way to "
            "share their flush, and none once no request is (a flush under way delays the next one further).",
        ),
    ] = 25,
    roll_bytes: Annotated[
        int | None, typer.Option(min=1024, help="Flush a partition early at this many buffered bytes.")
    ] = None,
    otlp_port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="Also listen on this port (OTLP/HTTP's conventional 4318)."),
    ] = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_client_ca: TlsClientCaOption = None,
    ops_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve /healthz and /metrics without credentials here (default LAKE_GATEWAY_OPS_PORT).",
        ),
    ] = None,
    insecure: InsecureOption = False,
) -> None:
    """Run the ingest gateway: agents POST events (JSON, OTLP/HTTP, Prometheus remote-write, InfluxDB line
    protocol) with a write token once the lake has tokens; a success means durable in the log (see app/gateway/)."""
    from metrics_lake.app.gateway import Gateway, serve
    from metrics_lake.app.http_server import check_exposure
    from metrics_lake.core.storage import open_store
    from metrics_lake.core.tokens import TokenStore

    config = settings()
    owned = partition_list(partitions)
    tls = server_tls(config, tls_cert, tls_key, tls_client_ca)
    listen = host or config.gateway_host
    warning = check_exposure("the gateway", listen, tls, bool(TokenStore(open_store(config)).active()), insecure)
    if warning:
        err.print(f"[bold red]{warning}[/]")
    stop = stop_on_signals()
    err.print(f"gateway: taking the leases of topic {config.topic!r} partitions {partitions or 'all'}...")
    try:
        ingest = Gateway(config, owned=owned, linger_ms=linger_ms, roll_bytes=roll_bytes)
    except InputError as exc:  # owned partitions out of range
        raise InputError(f"--partitions {partitions}: {exc}") from None
    scheme = "https" if tls else "http"
    access = "tokens required" if ingest.auth.enabled else "open: the lake has no tokens"

    def ready(address) -> None:
        err.print(
            f"gateway {ingest.gateway_id} listening on {scheme}://{address[0]}:{address[1]} "
            f"(partitions {ingest.producer.owned}, linger {linger_ms} ms, {access})"
            + (f", OTLP also on port {otlp_port}" if otlp_port else "")
            + "; Ctrl-C stops"
        )

    def ops_ready(address) -> None:
        err.print(f"gateway /healthz and /metrics on http://{address[0]}:{address[1]} (no credentials)")

    ops_port = config.gateway_ops_port if ops_port is None else ops_port
    serve(
        ingest,
        listen,
        config.gateway_port if port is None else port,
        stop,
        ready=ready,
        otlp_port=otlp_port,
        tls=tls,
        ops=None if ops_port is None else (config.gateway_ops_host, ops_port),
        ops_ready=ops_ready,
    )
    err.print(f"stopped; {ingest.producer.stats.records:,} events received")
