"""``lake inventory …``: the server inventory (which servers exist, their labels): apply a file, set or remove one
server, list it.

Every change is appended to the ``inventory`` topic (:mod:`metrics_lake.core.inventory`) and folded into the
``servers`` table at once; a running ``lake stream`` joins events appended from its next micro-batch on with
the new labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import table as rich_table
from rich.markup import escape

from metrics_lake.app.cli.options import open_tables, settings
from metrics_lake.app.console import err, out
from metrics_lake.lake_schemas.table_access import INVENTORY

__all__ = ["inventory_app"]

inventory_app = typer.Typer(
    help="The server inventory: labels per server (apply a CSV/JSON file, set, rm, list).", no_args_is_help=True
)

_FOLLOW = "; the stream labels events appended from its next micro-batch on"


def _open():
    from metrics_lake.core.inventory import Inventory
    from metrics_lake.core.storage import open_store

    config = settings()
    open_tables(config, *INVENTORY.tables)
    store = open_store(config)
    return store, Inventory(store)


def _commit(store, inventory, changes) -> None:
    from metrics_lake.core.inventory import write_servers_table

    result = inventory.append(changes)
    write_servers_table(store, inventory)
    if result is not None:
        err.print(f"appended offsets {result.base_offset}..{result.end_offset - 1} of the inventory{_FOLLOW}")


def _print_changes(changes, current) -> None:
    for change in changes:
        if change.deleted:
            out.print(f"[red]- {escape(change.server)}[/]  {escape(_labels_text(current[change.server]))}")
        elif change.server in current:
            old, new = _labels_text(current[change.server]), _labels_text(change.labels)
            out.print(f"[yellow]~ {escape(change.server)}[/]  {escape(old)} -> {escape(new)}")
        else:
            out.print(f"[green]+ {escape(change.server)}[/]  {escape(_labels_text(change.labels))}")


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(no labels)"


@inventory_app.command("apply")
def apply(
    path: Annotated[Path, typer.Argument(help="servers.csv (a server column, every other column a label) or .json")],
    yes: Annotated[bool, typer.Option("--yes", help="Apply the changes; without it only print them.")] = False,
) -> None:
    """Make the inventory hold exactly the file's servers and labels: prints the difference (new, changed and
    removed servers), appends it with --yes."""
    from metrics_lake.core.inventory import diff, parse_inventory_file

    desired = parse_inventory_file(path)  # checked whole before anything is appended
    store, inventory = _open()
    current = inventory.current()
    changes = diff(current, desired, full=True)
    _print_changes(changes, current)
    added = sum(1 for c in changes if not c.deleted and c.server not in current)
    removed = sum(1 for c in changes if c.deleted)
    summary = f"{added} new, {len(changes) - added - removed} changed, {removed} removed, {len(desired):,} in file"
    if not changes:
        err.print(f"the inventory already holds {path} ({len(desired):,} servers)")
    elif not yes:
        err.print(f"{summary}; nothing applied (run again with --yes)")
    else:
        _commit(store, inventory, changes)
        err.print(f"applied: {summary}")


@inventory_app.command("set")
def set_labels(
    server: Annotated[str, typer.Argument(help="The server's name.")],
    labels: Annotated[list[str], typer.Argument(help="Its labels, NAME=VALUE; they replace the ones it had.")],
) -> None:
    """Set one server's labels (all of them: those not given are dropped), adding it if new."""
    from metrics_lake.core.inventory import Change, check_labels, parse_label_args

    wanted = parse_label_args(labels)
    check_labels(server, wanted)
    store, inventory = _open()
    current = inventory.current()
    if current.get(server) == wanted:
        err.print(f"{server} already has {_labels_text(wanted)}")
        return
    _print_changes([Change(server, wanted)], current)
    _commit(store, inventory, [Change(server, wanted)])


@inventory_app.command("rm")
def remove(server: Annotated[str, typer.Argument(help="The server to remove from the inventory.")]) -> None:
    """Remove a server from the inventory (a tombstone: its later events are unlabelled and it is no longer
    expected to report)."""
    from metrics_lake.core.inventory import Change
    from metrics_lake.lake_schemas.errors import NotFoundError

    store, inventory = _open()
    current = inventory.current()
    if server not in current:
        raise NotFoundError(f"{server!r} is not in the inventory (`lake inventory list` shows it)")
    _print_changes([Change(server, {}, deleted=True)], current)
    _commit(store, inventory, [Change(server, {}, deleted=True)])


@inventory_app.command("list")
def list_servers(
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="Only servers with NAME=VALUE (repeatable).")
    ] = None,
) -> None:
    """The inventory's servers and labels, sorted by server."""
    from metrics_lake.core.inventory import parse_label_args

    wanted = parse_label_args(label or [])
    _, inventory = _open()
    current = inventory.current()
    chosen = {s: ls for s, ls in current.items() if all(ls.get(k) == v for k, v in wanted.items())}
    names = sorted({name for ls in chosen.values() for name in ls})
    view = rich_table.Table("server", *names)
    for server, ls in sorted(chosen.items()):
        view.add_row(escape(server), *(escape(ls.get(name, "")) for name in names))
    out.print(view)
    err.print(f"{len(chosen):,} of {len(current):,} servers (inventory end offset {inventory.end_offset()})")
