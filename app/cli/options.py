"""What several ``lake`` commands share: settings loading, option types, parsers of days, times and partitions.

Parsers raise :class:`~metrics_lake.lake_schemas.errors.InputError` naming the
option and the expected form; the error boundary in
:func:`metrics_lake.app.cli.main` prints it as one line with exit code 2.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Annotated

import typer

from metrics_lake.core.config import LakeSettings, load_settings
from metrics_lake.lake_schemas.errors import InputError

__all__ = [
    "DateOption",
    "FromOption",
    "GatewayOption",
    "InsecureOption",
    "TlsCertOption",
    "TlsClientCaOption",
    "TlsKeyOption",
    "ToOption",
    "day",
    "days",
    "open_tables",
    "partition_list",
    "server_tls",
    "settings",
    "stop_on_signals",
    "time_ms",
]


def settings(**overrides) -> LakeSettings:
    """The lake settings for this command (``LAKE_*``, ``lake.toml``, then ``overrides`` from flags)."""
    return load_settings(**overrides)


def stop_on_signals(
    *, stopping: str | None = None, forced: str | None = None, before_forced_exit: Callable[[], None] | None = None
) -> threading.Event:
    """An event set by SIGTERM (systemd, Kubernetes, Airflow) or Ctrl-C, for a clean stop between batches.

    ``stopping``: a line printed to stderr at the first signal, so a stop
    that waits (for a micro-batch in flight, say) does not look like a hang.
    ``forced``: for a command whose writes are all atomic and completed by
    its next run (``lake stream``), a second signal prints this line and
    ends the process at once, with exit code 128 + the signal's number (130
    after Ctrl-C, as shells report it), running no cleanup but
    ``before_forced_exit`` (ending child processes that would outlive it).
    Without ``forced``, a second signal changes nothing.
    """
    stop = threading.Event()

    def handler(signum, frame):
        if stop.is_set() and forced is not None:
            _say(forced)
            if before_forced_exit is not None:
                before_forced_exit()
            for stream in (sys.stdout, sys.stderr):  # what the command printed before; os._exit would drop it
                with contextlib.suppress(Exception):  # a write the signal interrupted: a reentrant flush raises
                    stream.flush()
            os._exit(128 + signum)  # not sys.exit: cleanup (stopping Spark) waits for the batch being skipped
        if not stop.is_set() and stopping is not None:
            _say(stopping)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def _say(line: str) -> None:
    """Write ``line`` to stderr (file descriptor 2) from a signal handler: not through ``sys.stderr`` or the
    console, since the interrupted code may be inside a write to them (a reentrant write raises)."""
    os.write(2, (line + "\n").encode())


GatewayOption = Annotated[
    str | None,
    typer.Option(
        help="Send through the ingest gateway at this URL (e.g. http://127.0.0.1:8787), spooling to "
        "LAKE_SPOOL_DIR while it is unreachable, instead of writing the log directly."
    ),
]
TlsCertOption = Annotated[
    str | None, typer.Option(help="Serve HTTPS with this PEM certificate chain (default LAKE_TLS_CERT).")
]
TlsKeyOption = Annotated[str | None, typer.Option(help="PEM private key of --tls-cert (default LAKE_TLS_KEY).")]
TlsClientCaOption = Annotated[
    str | None,
    typer.Option(help="Require client certificates signed by this PEM CA: mutual TLS (default LAKE_TLS_CLIENT_CA)."),
]
InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Listen on a non-loopback address without TLS or tokens anyway (a warning is printed).",
    ),
]
DateOption = Annotated[str | None, typer.Option("--date", help="UTC day, YYYY-MM-DD.")]
FromOption = Annotated[str | None, typer.Option("--from", help="First UTC day of a range.")]
ToOption = Annotated[str | None, typer.Option("--to", help="Last UTC day of a range (inclusive).")]


def server_tls(config: LakeSettings, cert: str | None, key: str | None, client_ca: str | None):
    """The :class:`~metrics_lake.app.http_server.TlsFiles` of a server: the options, else ``LAKE_TLS_*``; or None."""
    from metrics_lake.app.http_server import TlsFiles

    if cert is None and key is None:
        cert, key = config.tls_cert, config.tls_key
    return TlsFiles.of(cert, key, client_ca if client_ca is not None else config.tls_client_ca)


def partition_list(text: str | None) -> list[int] | None:
    """``"0,2-3"`` -> ``[0, 2, 3]``; ``None`` stays ``None`` (all partitions)."""
    if text is None:
        return None
    owned: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise InputError(f"--partitions {text!r}: use partition numbers and ranges such as 0,2-3")
        owned.extend(range(int(lo), int(hi or lo) + 1))
    return owned


def time_ms(option: str, text: str | None) -> int | None:
    """``--from-time``/``--to-time``: ISO-8601 with a zone, or epoch milliseconds."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InputError(f"{option} {text!r}: use ISO-8601 such as 2026-11-21T10:00:00Z, or epoch ms") from None
    if moment.tzinfo is None:
        raise InputError(f"{option} {text!r}: add a zone (Z or +01:00); event times are UTC instants")
    return int(moment.timestamp() * 1000)


def day(option: str, text: str) -> dt.date:
    """A ``YYYY-MM-DD`` option value as a date."""
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise InputError(f"{option} {text!r}: expected a UTC date YYYY-MM-DD") from None


def days(date: str | None, from_day: str | None, to_day: str | None) -> list[dt.date]:
    """The days named by ``--date`` or ``--from``/``--to``."""
    if (date is None) == (from_day is None and to_day is None):
        raise InputError("give --date DAY, or --from DAY --to DAY")
    if date is not None:
        return [day("--date", date)]
    if from_day is None or to_day is None:
        raise InputError("a range needs both --from and --to")
    first, last = day("--from", from_day), day("--to", to_day)
    if last < first:
        raise InputError(f"--to {last} is before --from {first}")
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def open_tables(config: LakeSettings, *names: str):
    """Open (creating if absent) the named tables and return the store.

    Commands call it before starting Spark, so a wrong root, bad
    credentials or a missing permission fail in a second, not after the JVM
    started.
    """
    from metrics_lake.core.storage import open_store
    from metrics_lake.core.tables.delta import ensure_table

    store = open_store(config)
    for name in names:
        ensure_table(store, name)
    return store
