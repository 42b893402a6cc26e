"""The temporal join of events with the inventory: labels as of each event's log position, the same in any split
of batches and in a replay; unknown servers kept and counted; never-seen inventory servers alert."""

from __future__ import annotations

import pyarrow as pa

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.inventory import Change, Inventory
from metrics_lake.core.kernels.alert_evaluation import FIRING, evaluate
from metrics_lake.core.kernels.alert_rules import parse_rule
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.enrichment import expected_servers, read_pins
from metrics_lake.core.speed.progress import CONSUMER
from metrics_lake.core.speed.replay import ReplayRange, replay
from metrics_lake.core.tables.delta import open_table
from metrics_lake.lake_schemas.tables import Table
from tests.core.speed.test_micro_batch import START_MS, TOPIC, batch, produce


def fleet(seed: int, start_ms: int) -> pa.Table:
    return FleetSimulator(servers=4, metrics=2, seconds=60, rate=1.0, seed=seed, start_ms=start_ms).generate()


def labelled(store, name=Table.BRONZE_EVENTS) -> dict[tuple[int, int], dict]:
    rows = open_table(store, name).to_pyarrow_table(columns=["partition", "offset", "server", "labels"]).to_pylist()
    return {(r["partition"], r["offset"]): (r["server"], dict(r["labels"] or [])) for r in rows}


def run(store, log, splits: int) -> dict:
    """Three phases (events, inventory change, events ...) with ``splits`` batches per phase of events."""
    inventory = Inventory(store)
    inventory.append([Change(f"sim-{i:04d}", {"dc": "eu", "v": "1"}) for i in range(3)])  # sim-0003 unknown
    produce(log, fleet(1, START_MS))
    for _ in range(splits):
        batch(store)
    inventory.append([Change("sim-0000", {"dc": "us", "v": "2"}), Change("sim-0001", {}, deleted=True)])
    produce(log, fleet(2, START_MS + 60_000))
    ends = end_offsets(SegmentLog(store), TOPIC)
    if splits > 1:  # a batch up to half-way first: its tables are left where the next starts
        batch(store, {p: e - (e // 4) for p, e in ends.items()})
    outcome = batch(store)
    return labelled(store), outcome


def test_events_get_the_labels_in_force_at_their_log_position_in_any_split(store, log, tmp_path):
    from metrics_lake.core.storage import LocalStore

    got, outcome = run(store, log, 1)
    pins = read_pins(store, CONSUMER, TOPIC)
    assert [p.inventory_end for p in pins] == [3, 5]
    for (partition, offset), (server, labels) in got.items():
        after_change = offset >= pins[1].starts[partition]
        if server == "sim-0000":
            assert labels == ({"dc": "us", "v": "2"} if after_change else {"dc": "eu", "v": "1"})
        elif server == "sim-0001":
            assert labels == ({} if after_change else {"dc": "eu", "v": "1"})
        elif server == "sim-0002":
            assert labels == {"dc": "eu", "v": "1"}
        else:
            assert labels == {}  # not in the inventory: kept, unlabelled
    assert outcome.unknown_servers == sum(
        1 for (p, o), (s, _) in got.items() if o >= pins[1].starts[p] and s in ("sim-0001", "sim-0003")
    )
    # Another lake, the same events and inventory changes, batches split differently: the same labels.
    other = LocalStore(tmp_path / "other")
    assert run(other, SegmentLog(other), 3)[0].keys() == got.keys()
    windows = open_table(store, Table.METRIC_WINDOWS_1M).to_pyarrow_table().to_pylist()
    newest = {}
    for _position, (server, labels) in sorted(got.items()):
        newest[server] = labels  # a server's events are in one partition, in offset order
    bronze = open_table(store, Table.BRONZE_EVENTS).to_pyarrow_table(columns=["server", "tags"]).to_pylist()
    tags = {r["server"]: dict(r["tags"]) for r in bronze}  # the simulator's region tag, fixed per server
    for window in windows:  # the second minute's windows carry the labels of the newest event, over its tags
        if window["window_start"].timestamp() * 1000 >= START_MS + 60_000:
            assert dict(window["labels"]) == {**tags[window["server"]], **newest[window["server"]]}


def test_a_replay_joins_with_the_labels_the_speed_layer_pinned(store, log):
    got, _ = run(store, log, 1)
    ends = end_offsets(SegmentLog(store), TOPIC)
    Inventory(store).append([Change("sim-0002", {"dc": "mars"})])  # after the batches: must not leak into a replay
    ranges = [ReplayRange(p, 0, end) for p, end in ends.items()]
    replay(SegmentLog(store), TOPIC, ranges, into="bronze_replayed")
    assert labelled(store, "bronze_replayed") == got


def test_inventory_servers_that_never_report_raise_absence_alerts(store):
    Inventory(store).append([Change("quiet-1", {"role": "db"}), Change("web-1", {"role": "web"})])
    expected = expected_servers(store)
    since = expected.column("since")[0].value
    rule = parse_rule("silent", "ABSENT agent.heartbeat FROM quiet-* FOR 2m")
    last_seen = pa.table(
        {
            "server": pa.array([], pa.string()),
            "metric": pa.array([], pa.string()),
            "last_seen_at": pa.array([], pa.timestamp("us", "UTC")),
        }
    )
    kwargs = dict(threshold_at_us=None, threshold_values={}, last_seen=last_seen, expected=expected)
    assert evaluate([rule], {}, absence_at_us=since + 60_000_000, **kwargs) == []  # not silent for 2m yet
    (fired,) = evaluate([rule], {}, absence_at_us=since + 180_000_000, **kwargs)
    assert (fired.server, fired.state) == ("quiet-1", FIRING)  # web-1 is not FROM quiet-*
    assert "since it joined the inventory" in fired.summary


def test_grouped_queries_live_and_backfilled_equal_a_computation_over_the_events(store, log):
    """``BY dc`` over inventory labels, live (the speed layer) and backfilled (the nightly path), against the
    events grouped by hand; the unknown server (no ``dc``) is left out by ``dc!=``."""
    from metrics_lake.core.kernels.stored_queries import parse_query
    from metrics_lake.core.maintenance.query_backfill import backfill_queries

    inventory = {"sim-0000": {"dc": "eu"}, "sim-0001": {"dc": "eu"}, "sim-0002": {"dc": "us", "role": "db"}}
    Inventory(store).append([Change(server, labels) for server, labels in inventory.items()])
    events = FleetSimulator(servers=4, metrics=2, seconds=180, rate=1.0, seed=5, start_ms=START_MS).generate()
    produce(log, events)
    metric = events.column("metric")[0].as_py()
    text = f"FROM dc!= SELECT {metric} WINDOW 1m COMPUTE count, sum, max BY dc"
    live, nightly = parse_query("by_dc", text), parse_query("by_dc_nightly", text)
    batch(store, watermark_seconds=0, queries=[live])
    backfill_queries(store, TOPIC, [nightly])

    expected: dict[tuple, list[float]] = {}
    for row in events.to_pylist():
        if row["metric"] == metric and row["server"] in inventory:
            minute = int(row["ts"].timestamp()) // 60 * 60
            expected.setdefault((inventory[row["server"]]["dc"], minute), []).append(row["value"])
    rows = open_table(store, Table.QUERY_RESULTS).to_pyarrow_table().to_pylist()

    def by_key(name):
        return {
            (dict(r["labels"])["dc"], int(r["window_start"].timestamp()), r["aggregate"]): r
            for r in rows
            if r["query"] == name
        }

    got = by_key("by_dc")
    assert len(got) == 3 * len(expected) and all(r["server"] is None for r in got.values())
    for (dc, minute), values in expected.items():
        assert got[(dc, minute, "count")]["value"] == len(values)
        assert abs(got[(dc, minute, "sum")]["value"] - sum(values)) < 1e-9 * abs(sum(values))
        assert got[(dc, minute, "max")]["value"] == max(values)
    backfilled = by_key("by_dc_nightly")  # the closed windows (before the watermark): the same values
    assert backfilled and all(got[key]["value"] == row["value"] for key, row in backfilled.items())
