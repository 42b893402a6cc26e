"""The server inventory: files, label rules, the difference applied, the servers table."""

from __future__ import annotations

import pytest

from metrics_lake.core.inventory import (
    MAX_VALUE_LENGTH,
    Change,
    Inventory,
    diff,
    parse_inventory_file,
    parse_label_args,
    write_servers_table,
)
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.errors import InputError
from metrics_lake.lake_schemas.tables import Table


def test_csv_and_json_files_declare_the_same_inventory(tmp_path):
    csv = tmp_path / "servers.csv"
    csv.write_text("server,dc,role\nweb-1,eu,web\n\ndb-1,us,\n")
    js = tmp_path / "servers.json"
    js.write_text(
        '[{"server": "web-1", "labels": {"dc": "eu", "role": "web"}}, {"server": "db-1", "labels": {"dc": "us"}}]'
    )
    want = {"web-1": {"dc": "eu", "role": "web"}, "db-1": {"dc": "us"}}
    assert parse_inventory_file(csv) == want == parse_inventory_file(js)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server,dc\nweb-1,eu\nweb-1,us\n", "servers.csv:3: server 'web-1' is listed twice (first at 2)"),
        ("server,9dc\nweb-1,eu\n", "servers.csv:2: bad label name '9dc'"),
        ("server,__name__\nweb-1,x\n", "label name '__name__' of 'web-1' is reserved"),
        ("dc\neu\n", "servers.csv:1: the header must have a server column"),
        ("server,dc\nweb-1,eu,extra\n", "servers.csv:2: 3 cells, the header has 2"),
        (f"server,dc\nweb-1,{'x' * (MAX_VALUE_LENGTH + 1)}\n", f"is {MAX_VALUE_LENGTH + 1} characters long"),
    ],
)
def test_a_bad_file_is_refused_with_its_line_and_reason(tmp_path, text, message):
    path = tmp_path / "servers.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_inventory_file(path)


def test_label_arguments_need_name_equals_value():
    assert parse_label_args(["dc=eu", "role=web=1"]) == {"dc": "eu", "role": "web=1"}
    with pytest.raises(InputError, match="not NAME=VALUE"):
        parse_label_args(["dc"])


def test_applying_a_file_appends_only_the_difference_and_the_servers_table_follows(store):
    inventory = Inventory(store)
    assert inventory.end_offset() == 0 and inventory.current() == {}
    first = {"a": {"dc": "eu"}, "b": {"dc": "us"}, "c": {"dc": "us"}}
    inventory.append(diff({}, first, full=True))
    second = {"a": {"dc": "eu"}, "b": {"dc": "eu"}, "d": {}}
    changes = diff(inventory.current(), second, full=True)
    assert changes == [Change("b", {"dc": "eu"}), Change("c", {}, deleted=True), Change("d", {})]
    inventory.append(changes)
    assert inventory.current() == second and inventory.end_offset() == 6
    assert diff(inventory.current(), second, full=True) == []  # applying the same file again changes nothing
    assert write_servers_table(store) and not write_servers_table(store)  # folded once per inventory change
    rows = open_table(store, Table.SERVERS).to_pyarrow_table().sort_by("server").to_pylist()
    assert [(r["server"], dict(r["labels"]), r["valid_from_offset"]) for r in rows] == [
        ("a", {"dc": "eu"}, 0),
        ("b", {"dc": "eu"}, 3),
        ("d", {}, 5),
    ]
