"""``lake alerts …``: the alert rules in the config store (add, rm, list, show, history, --from-file), the alerts they
raised, their delivery to Alertmanager (notify), and their evaluation over whole days (--date).

Rules are evaluated by the speed layer after every micro-batch (a running
``lake stream`` picks an edit up on its next one); transitions go to the
``alerts`` table and from there to ``LAKE_ALERTMANAGER_URL``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich import table as rich_table
from rich.markup import escape

from metrics_lake.app.cli.config_edits import (
    ByOption,
    FromFileOption,
    YesOption,
    group_callback,
    open_config_store,
    print_history,
)
from metrics_lake.app.cli.options import DateOption, FromOption, ToOption, open_tables, settings, stop_on_signals
from metrics_lake.app.console import err, out
from metrics_lake.lake_schemas.errors import AlertRuleError, CheckFailedError, ConfigError
from metrics_lake.lake_schemas.table_access import ALERTS
from metrics_lake.lake_schemas.tables import Table

__all__ = ["alerts_app"]

alerts_app = typer.Typer(
    help="Alert rules: manage them (add, rm, list, show, history, --from-file), deliver alerts to Alertmanager "
    "(notify), evaluate days (--date).",
    invoke_without_command=True,
    no_args_is_help=False,
)

_LIVE_HINT = "; evaluated from the stream's next micro-batch"


@alerts_app.callback()
def alerts(
    ctx: typer.Context,
    date: DateOption = None,
    from_day: FromOption = None,
    to_day: ToOption = None,
    from_file: FromFileOption = None,
    yes: YesOption = False,
    by: ByOption = None,
) -> None:
    """Apply a declarations file of alert rules (--from-file), or evaluate the rules over whole days (--date)."""
    from metrics_lake.core.config_store import ALERT

    group_callback(
        ctx,
        "alerts",
        ALERT,
        date=date,
        from_day=from_day,
        to_day=to_day,
        from_file=from_file,
        yes=yes,
        by=by,
        hint=lambda changes: _LIVE_HINT,
        evaluate=_evaluate_days,
    )


def _evaluate_days(chosen: list[dt.date]) -> None:
    from metrics_lake.core.maintenance.nightly_alerts import evaluate_alerts_for_day
    from metrics_lake.core.storage import open_store

    config = settings()
    open_tables(config, *ALERTS.tables)
    store = open_store(config)
    rules = open_config_store().current().alert_rules()
    err.print(f"evaluating {len(rules)} alert rules over {len(chosen)} day(s) of {Table.QUERY_RESULTS} ...")
    for day in chosen:
        result = evaluate_alerts_for_day(store, day, rules)
        what = "already evaluated" if result.skipped else f"{result.episodes} episode(s) the live evaluation missed"
        err.print(f"{day}: {what} -> {result.rows} transitions ({result.seconds:.1f} s)")


@alerts_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="Name (the alert's alertname): a-z, 0-9, _ (at most 64).")],
    rule: Annotated[
        str,
        typer.Argument(
            help='"<query>.<aggregate> <op> <number> [FOR <d>] [LABELS k=v,...]" or '
            '"ABSENT <metric> [FROM <servers>] FOR <d> [LABELS k=v,...]"'
        ),
    ],
    description: Annotated[str | None, typer.Option("--description", help="What the alert means, for people.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Change the rule if the name exists.")] = False,
    by: ByOption = None,
) -> None:
    """Add an alert rule (or change one with --replace); the stream evaluates it from its next micro-batch."""
    from metrics_lake.core.config_store import ALERT, Change

    config_store = open_config_store()
    current = config_store.current()
    if name in current.rules and not replace:
        raise AlertRuleError(f"alert rule {name!r} exists ({current.rules[name].text}); change it with --replace")
    new = config_store.apply([Change("put", name, rule, description, ALERT)], by=by, expected=current.version)
    if new.version == current.version:
        err.print(f"{name}: unchanged (config version {new.version})")
        return
    err.print(f"{name}: revision {new.rules[name].revision}, config version {new.version}{_LIVE_HINT}")


@alerts_app.command("rm")
def rm(name: Annotated[str, typer.Argument(help="The alert rule to remove.")], by: ByOption = None) -> None:
    """Remove an alert rule: its firing and pending alerts are resolved by the stream's next micro-batch."""
    from metrics_lake.core.config_store import ALERT, Change

    new = open_config_store().apply([Change("delete", name, kind=ALERT)], by=by)
    err.print(f"{name}: removed, config version {new.version}")


def _active():
    """The active alerts (pending and firing) by fingerprint, from the alerts table."""
    from metrics_lake.core.speed.alerting import AlertLog
    from metrics_lake.core.storage import open_store

    return AlertLog(open_store(settings())).refresh()


@alerts_app.command("list")
def list_rules() -> None:
    """List the alert rules (with how many of their alerts fire or pend), then every active alert."""
    current = open_config_store().current()
    active = _active()
    listing = rich_table.Table(
        "name",
        "kind",
        "revision",
        "firing",
        "pending",
        "rule",
        "description",
        title=f"config version {current.version}",
    )
    for rule in current.alert_rules():
        mine = [a for a in active.values() if a.rule == rule.name]
        listing.add_row(
            rule.name,
            rule.kind,
            str(rule.revision),
            str(sum(a.state == "firing" for a in mine)),
            str(sum(a.state == "pending" for a in mine)),
            escape(rule.text),
            escape(rule.description),
        )
    out.print(listing)
    _print_active(active.values())


def _print_active(alerts) -> None:
    alerts = sorted(alerts, key=lambda a: (a.rule, a.server or ""))
    if not alerts:
        err.print("no alert is firing or pending")
        return
    view = rich_table.Table("rule", "server", "state", "since (UTC)", "value", "labels", title="active alerts")
    for alert in alerts:
        since = dt.datetime.fromtimestamp(alert.active_since_us / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        view.add_row(
            alert.rule,
            alert.server or "(fleet)",
            alert.state,
            since,
            "" if alert.value is None else f"{alert.value:.6g}",
            ", ".join(f"{k}={v}" for k, v in alert.labels if k not in ("alertname", "server")),
        )
    out.print(view)


@alerts_app.command("show")
def show(name: Annotated[str, typer.Argument(help="The alert rule.")]) -> None:
    """Show one alert rule: its text, meaning, active alerts, latest transitions and the edits that touched it."""
    import pyarrow.compute as pc

    from metrics_lake.core.config_store import ALERT
    from metrics_lake.core.kernels.alert_rules import ABSENCE, format_duration
    from metrics_lake.core.speed.alerting import AlertLog
    from metrics_lake.core.storage import open_store

    config_store = open_config_store()
    entry = config_store.current().entry(name, ALERT)
    rule = entry.rule()
    out.print(f"[bold]{escape(name)}[/]  revision {entry.revision}, {rule.kind} rule")
    out.print(f"  rule         {escape(rule.text)}", soft_wrap=True)
    out.print(f"  description  {escape(entry.description)}", soft_wrap=True)
    if rule.kind == ABSENCE:
        meaning = (
            f"fires for each server of {','.join(rule.servers)} that sent {rule.metric} within the lookback and "
            f"nothing for {format_duration(rule.for_s)}"
        )
    else:
        meaning = f"fires when {rule.condition()} holds for {format_duration(rule.for_s)}"
    labels = ", ".join(f"{k}={v}" for k, v in rule.labels) or "none"
    out.print(f"  {meaning}; labels {labels}", soft_wrap=True)
    alert_log = AlertLog(open_store(settings()))
    _print_active(a for a in alert_log.refresh().values() if a.rule == name)
    rows = alert_log.transitions()
    mine = rows.filter(pc.equal(rows.column("rule"), name)).to_pylist()[-10:]
    for row in mine:
        out.print(
            f"  {row['at']:%Y-%m-%d %H:%M:%S} {row['previous_state']} -> {row['state']}: {escape(row['summary'])}",
            soft_wrap=True,
        )
    for version in config_store.history(name, ALERT):
        for change in (c for c in version.changes if c.name == name and c.kind == ALERT):
            out.print(f"  v{version.version} {version.at} {escape(version.by)}: {escape(change.describe())}")


@alerts_app.command("history")
def history(name: Annotated[str | None, typer.Argument(help="Only the edits of this rule.")] = None) -> None:
    """List the config store's versions: who changed what, when (alert rules and stored queries)."""
    from metrics_lake.core.config_store import ALERT

    print_history(name, None if name is None else ALERT)


@alerts_app.command("test")
def test_rules(
    files: Annotated[list[Path], typer.Argument(help="Test files (YAML): rules, input series, expected alerts.")],
) -> None:
    """Unit-test alert rules against input series, like `promtool test rules` (format: `lake alerts test --help`).

    Each file holds the stored queries and rules under test, input series in Prometheus's expanding notation
    (`values: "50 50 150x5 _x3"`) and the alerts expected at given evaluation times; they run through the speed
    layer's own evaluation on a temporary lake. Prints a diff per failed expectation and exits 1 when any failed,
    2 for a file that is not a valid test file.
    """
    from metrics_lake.app.alert_tests import run_test_file

    config = settings()
    failed = checked = 0
    for path in files:
        report = run_test_file(
            path, default_interval_s=config.alert_evaluation_interval_seconds, nodata_s=config.nodata_seconds
        )
        checked += report.checked
        for miss in report.mismatches:
            failed += 1
            out.print(f"FAILED {path}: {escape(miss.where)}", highlight=False)
            out.print(f"  expected: {escape(_alert_list(miss.expected))}", highlight=False)
            out.print(f"  got:      {escape(_alert_list(miss.got))}", highlight=False)
        if not report.mismatches:
            out.print(f"SUCCESS {path}: {report.checked} expectation(s) held", highlight=False)
    if failed:
        raise CheckFailedError(f"{failed} of {checked} alert expectation(s) failed")


def _alert_list(alerts: list) -> str:
    if not alerts:
        return "no alert"
    return "; ".join("{" + ", ".join(f"{k}={v}" for k, v in labels) + f"}} {state}" for labels, state in alerts)


@alerts_app.command("notify")
def notify(
    once: Annotated[bool, typer.Option("--once", help="Deliver what is due once, then stop.")] = False,
) -> None:
    """Deliver the alerts table's transitions to Alertmanager (LAKE_ALERTMANAGER_URL) and resend firing alerts.

    `lake stream` does this by itself; run this where the speed layer runs as scheduled batches (`--once` after
    each), or to drain the outbox after Alertmanager was down. Exits 2 if Alertmanager does not accept them.
    """
    from metrics_lake.app.notifier import deliver_all, start_notifiers

    config = settings()
    if not config.alertmanager_urls:
        raise ConfigError("LAKE_ALERTMANAGER_URL is not set: say which Alertmanager gets the alerts")
    if once:
        for url, done in deliver_all(config).items():
            err.print(
                f"delivered {done.delivered} transition(s), resent {done.resent} firing alert(s) to "
                f"{url} in {done.requests} request(s)"
            )
        return
    stop = stop_on_signals()
    err.print(f"delivering alerts to {', '.join(config.alertmanager_urls)} until Ctrl-C")
    relays = start_notifiers(config)
    stop.wait()
    for notifier, _ in relays:
        notifier.stop()
    for _, worker in relays:
        worker.join(timeout=10)
