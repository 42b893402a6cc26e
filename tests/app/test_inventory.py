"""The inventory's front ends: the gateway's PUT/DELETE /v1/inventory/{server} and `lake inventory`."""

from __future__ import annotations

import requests

from metrics_lake.core.inventory import Inventory
from metrics_lake.core.storage import LocalStore
from tests.app.conftest import one_line


def test_the_gateway_puts_and_deletes_inventory_records_and_refuses_bad_ones(start_gateway, tmp_path):
    url, gateway = start_gateway()
    inventory = Inventory(LocalStore(tmp_path / "lake"))
    answer = requests.put(f"{url}/v1/inventory/web-1", json={"labels": {"dc": "eu", "role": "web"}})
    assert (answer.status_code, answer.json()) == (200, {"server": "web-1", "deleted": False, "offset": 0})
    assert inventory.current() == {"web-1": {"dc": "eu", "role": "web"}}
    for body, reason in [
        ({"labels": {"bad-name": "x"}}, "bad label name 'bad-name'"),
        ({"labels": {"dc": 1}}, "must be a string"),
        ({"dc": "eu"}, 'expected {"labels"'),
        ("not json", "not JSON"),
    ]:
        sent = requests.put(
            f"{url}/v1/inventory/web-2", **({"data": body} if isinstance(body, str) else {"json": body})
        )
        assert sent.status_code == 400 and reason in sent.json()["error"]
    assert requests.put(f"{url}/v1/inventory/web-2", data=b"x" * 70_000).status_code == 413
    assert requests.delete(f"{url}/v1/inventory/web-9").status_code == 404
    assert requests.delete(f"{url}/v1/inventory/web-1").json() == {"server": "web-1", "deleted": True, "offset": 1}
    assert inventory.current() == {} and inventory.end_offset() == 2  # nothing of the refused requests landed
    assert "lake_gateway_inventory_changes_total 2.0" in requests.get(f"{url}/metrics").text


def test_lake_inventory_apply_shows_the_difference_and_applies_it_with_yes(lake, store, tmp_path):
    path = tmp_path / "servers.csv"
    path.write_text("server,dc,team\nweb-1,eu,core\ndb-1,us,data\n")
    dry = lake("inventory", "apply", str(path))
    assert "+ db-1  dc=us,team=data" in dry.stdout and "nothing applied" in dry.stderr
    assert Inventory(store).end_offset() == 0
    lake("inventory", "apply", str(path), "--yes")
    lake("inventory", "set", "web-2", "dc=eu", "team=core")
    path.write_text("server,dc,team\nweb-1,eu,edge\n")
    applied = lake("inventory", "apply", str(path), "--yes")
    assert "~ web-1  dc=eu,team=core -> dc=eu,team=edge" in applied.stdout
    assert "- db-1" in applied.stdout and "- web-2" in applied.stdout
    assert Inventory(store).current() == {"web-1": {"dc": "eu", "team": "edge"}}
    listed = lake("inventory", "list", "--label", "team=edge")
    assert "web-1" in listed.stdout and "1 of 1 servers" in listed.stderr
    path.write_text("server,dc\nweb-1,eu\nweb-1,us\n")
    assert one_line(lake("inventory", "apply", str(path), "--yes", expect=2)).endswith(
        "servers.csv:3: server 'web-1' is listed twice (first at 2)"
    )
    assert "reserved" in one_line(lake("inventory", "set", "web-1", "__name__=x", expect=2))
    assert "not in the inventory" in one_line(lake("inventory", "rm", "nope", expect=2))
