"""What ``lake queries`` and ``lake alerts`` share: the config store of the configured lake, a declarations file applied
as a diff, the history of edits, and the ``--by`` option.

Every edit is one new config version (:mod:`metrics_lake.core.config_store`);
a running ``lake stream`` picks it up on its next micro-batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import table as rich_table
from rich.markup import escape

from metrics_lake.app.cli.options import days, settings
from metrics_lake.app.console import err, out
from metrics_lake.lake_schemas.errors import InputError

__all__ = [
    "ByOption",
    "FromFileOption",
    "YesOption",
    "apply_file",
    "group_callback",
    "open_config_store",
    "print_history",
]

ByOption = Annotated[
    str | None, typer.Option("--by", help="Who makes the edit, for the history (default: LAKE_AUTHOR or your user).")
]
FromFileOption = Annotated[
    Path | None,
    typer.Option(
        "--from-file",
        help="Make the config store hold exactly the entries this TOML file declares: shows the diff, applies it with --yes.",
    ),
]
YesOption = Annotated[bool, typer.Option("--yes", help="With --from-file: apply the diff (else a dry run).")]


def open_config_store():
    """The config store of the configured lake, checking absence rules against its lookback."""
    from metrics_lake.core.config_store import ConfigStore
    from metrics_lake.core.storage import open_store

    config = settings()
    return ConfigStore(open_store(config), absence_lookback_s=config.alert_absence_lookback_seconds)


def group_callback(
    ctx: typer.Context,
    command: str,
    kind: str,
    *,
    date: str | None,
    from_day: str | None,
    to_day: str | None,
    from_file: Path | None,
    yes: bool,
    by: str | None,
    hint,
    evaluate,
) -> None:
    """What ``lake <command>`` does without a subcommand: apply a declarations file of ``kind`` (``--from-file``),
    or ``evaluate(days)`` for ``--date``/``--from``/``--to``, or show its help; raises :class:`InputError` for
    options that do not go together."""
    if ctx.invoked_subcommand is not None:
        if date or from_day or to_day or from_file:
            raise InputError(f"--date/--from/--to/--from-file go without a subcommand: `lake {command} --date D`")
        return
    if from_file is not None:
        if date or from_day or to_day:
            raise InputError(f"--from-file applies declarations; evaluate days in a separate `lake {command} --date D`")
        apply_file(from_file, yes, by, kind, hint)
        return
    if not (date or from_day or to_day):
        out.print(ctx.get_help())
        return
    evaluate(days(date, from_day, to_day))


def apply_file(path: Path, yes: bool, by: str | None, kind: str, hint=lambda changes: "") -> None:
    """Make the config store's entries of ``kind`` exactly those ``path`` declares: print the diff; apply it (one
    version) with ``yes``. Every entry is parsed first, so a bad one fails before anything is applied."""
    from metrics_lake.core.config_store import declared_changes, read_declarations

    config_store = open_config_store()
    declared = read_declarations(path, kind)
    current = config_store.current()
    changes = declared_changes(current, declared, kind)
    if not changes:
        err.print(f"the config store (version {current.version}) already holds exactly {path}: nothing to apply")
        return
    for change in changes:
        out.print(escape(change.describe()), soft_wrap=True)
    if not yes:
        err.print(f"dry run: {len(changes)} change(s) against version {current.version}; apply them with --yes")
        return
    new = config_store.apply(changes, by=by, expected=current.version)
    err.print(f"applied {len(changes)} change(s): config version {new.version}{hint(changes)}")


def print_history(name: str | None, kind: str | None) -> None:
    """The config store's versions (only those touching ``name`` of ``kind``, if given): who changed what, when."""
    listing = rich_table.Table("version", "at", "by", "changes")
    for version in open_config_store().history(name, kind):
        changes = [c for c in version.changes if name is None or c.name == name]
        listing.add_row(str(version.version), version.at, version.by, "\n".join(c.describe() for c in changes))
    out.print(listing)
