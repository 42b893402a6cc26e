"""``lake stream``, ``lake replay``, ``lake consumers``: the speed layer and the log's readers."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import table as rich_table
from rich.text import Text

from metrics_lake.app.cli.options import partition_list, settings, stop_on_signals, time_ms
from metrics_lake.app.console import err, out, print_batch
from metrics_lake.core.keys import check_name
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import open_store
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.tables import Table

__all__ = ["FORCED", "STOPPING", "consumers", "replay", "stream"]

#: What `lake stream` says at the first Ctrl-C or SIGTERM, and at a second one (which ends it at once).
STOPPING = "stopping once the micro-batch in flight commits (Ctrl-C again exits at once; the next run completes it)"
FORCED = "exiting at once: a micro-batch in flight is left for the next `lake stream` to complete, exactly once"


def stream(
    once: Annotated[bool, typer.Option("--once", help="Process everything available, then stop.")] = False,
    trigger: Annotated[
        float | None, typer.Option(help="Micro-batch interval in seconds (LAKE_TRIGGER_SECONDS).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0, max=65535, help="Serve Prometheus metrics of the batches on this port (/metrics, 127.0.0.1)."
        ),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Address the metrics listener binds.")] = "127.0.0.1",
) -> None:
    """Run the speed layer: log -> bronze, quarantine, windows, query results, alerts, exactly once; alerts go to
    LAKE_ALERTMANAGER_URL if set."""
    from metrics_lake.spark.jobs.stream_metrics import prepare_lake
    from metrics_lake.spark.session import build_session, driver_jvm_exited, kill_driver_jvm, stop_session

    config = settings(trigger_seconds=trigger)
    prepare_lake(config)
    spark = build_session(config, "lake-stream", data_sources=not once)  # --once runs RDD jobs only
    stop = None if once else stop_on_signals(stopping=STOPPING, forced=FORCED, before_forced_exit=kill_driver_jvm)
    try:
        try:
            _run_speed_layer(spark, config, once, stop, metrics_host, metrics_port)
        finally:
            stop_session(spark)
    except Exception:
        # Something signalled Spark's JVM too (systemd's KillMode=control-group, killall): it exited at once, and
        # every call into it since failed. Not a bug: a batch in flight is completed by the next run.
        if stop is None or not stop.is_set() or not driver_jvm_exited():
            raise
        err.print(
            "stopped on signal; Spark's JVM got it too and exited at once: a micro-batch in flight is completed "
            "by the next run (under systemd, stop `lake stream` with KillMode=mixed: docs/lake-stream.service)",
            soft_wrap=True,
        )
        return
    if stop is not None and stop.is_set():
        err.print("stopped on signal, between micro-batches")


def _run_speed_layer(spark, config, once: bool, stop, metrics_host: str, metrics_port: int | None) -> None:
    """`lake stream`'s work in ``spark``: the speed layer, its progress lines, metrics listener and alert relay."""
    from metrics_lake.app.notifier import notifying
    from metrics_lake.app.speed_metrics import SpeedMetrics
    from metrics_lake.spark.jobs.stream_metrics import run_stream

    mode = "until all available data is processed" if once else f"every {config.trigger_seconds:g} s until Ctrl-C"
    alerts = f"; alerts to {', '.join(config.alertmanager_urls)}" if config.alertmanager_urls else ""
    err.print(f"speed layer for topic {config.topic!r} ({mode}){alerts}", highlight=False)
    metrics = SpeedMetrics(open_store(config), config.topic)
    if metrics_port is not None:
        try:
            server, _ = metrics.serve(metrics_host, metrics_port)
        except OSError as exc:
            raise InputError(f"--metrics-port {metrics_port}: cannot listen on {metrics_host} ({exc})") from None
        err.print(f"metrics on http://{metrics_host}:{server.server_port}/metrics", highlight=False)
    with notifying(config) as wake:

        def progress(outcome) -> None:
            print_batch(outcome)
            metrics.observe(outcome)
            wake()

        run_stream(spark, config, once=once, stop=stop, progress=progress, alerted=wake)


def replay(
    from_offset: Annotated[int | None, typer.Option(min=0, help="First offset (every partition).")] = None,
    to_offset: Annotated[int | None, typer.Option(min=0, help="End offset, exclusive (every partition).")] = None,
    from_time: Annotated[str | None, typer.Option(help="Events at or after this time (ISO-8601 or epoch ms).")] = None,
    to_time: Annotated[str | None, typer.Option(help="Events before this time (ISO-8601 or epoch ms).")] = None,
    partitions: Annotated[str | None, typer.Option(help="Only these partitions, e.g. 0,2-3.")] = None,
    into: Annotated[
        str | None, typer.Option(help=f"Write the range's events to this new table instead of {Table.BRONZE_EVENTS}.")
    ] = None,
    topic: Annotated[str | None, typer.Option(help="Topic to replay (default LAKE_TOPIC).")] = None,
) -> None:
    """Re-read a range of the log through the bronze path; rows already in the table are skipped."""
    from metrics_lake.core.speed.batch_plan import configured_limits
    from metrics_lake.core.speed.replay import replay as run_replay
    from metrics_lake.core.speed.replay import replay_ranges

    config = settings()
    topic = check_name("--topic", topic) if topic is not None else config.topic
    if into is not None:
        check_name("--into", into)
    from_ms, to_ms = time_ms("--from-time", from_time), time_ms("--to-time", to_time)
    log = SegmentLog(open_store(config))
    try:
        ranges = replay_ranges(
            log,
            topic,
            from_offset=from_offset,
            to_offset=to_offset,
            from_time_ms=from_ms,
            to_time_ms=to_ms,
            partitions=partition_list(partitions),
        )
    except IndexError as exc:
        raise InputError(f"--partitions {partitions}: {exc}") from None
    total = sum(r.end - r.start for r in ranges)
    err.print(
        f"replaying {total:,} records of {topic!r}: " + ", ".join(f"{r.partition}:[{r.start},{r.end})" for r in ranges)
    )
    stats = run_replay(
        log,
        topic,
        ranges,
        limits=configured_limits(config, log.partitions(topic)),
        into=into,
        from_time_ms=from_ms,
        to_time_ms=to_ms,
        progress=lambda r, done: err.print(f"  partition {r.partition}: {done:,}/{r.end - r.start:,}"),
    )
    written = ", ".join(f"{n:,} rows to {t}" for t, n in stats.written.items())
    err.print(f"read {stats.read:,} records; wrote {written}; {stats.already_present:,} already present (skipped)")


def consumers(
    group: Annotated[str | None, typer.Option(help="Only this consumer group.")] = None,
) -> None:
    """Consumer groups: committed offset, log end and lag per partition; exits 1 if retention removed unread records."""
    from metrics_lake.core.log.consumer_groups import lag_report

    report = lag_report(SegmentLog(open_store(settings())), group)
    if not report:
        err.print("no consumer group has committed offsets yet (`lake stream` commits the group speed-layer)")
        return
    view = rich_table.Table("group", "topic", "partition", "committed", "log start", "log end", "lag")
    for row in report:
        lag = Text(f"{row.lag:,}", style="red" if row.behind_retention else "")
        committed = "-" if row.committed is None else f"{row.committed:,}"
        view.add_row(row.group, row.topic, str(row.partition), committed, f"{row.start:,}", f"{row.end:,}", lag)
    out.print(view)
    behind = [r for r in report if r.behind_retention]
    if behind:
        err.print(f"[red]warning:[/] {len(behind)} partition(s) have unread records already removed by retention")
        raise typer.Exit(1)
