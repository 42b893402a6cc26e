"""A query added, changed or removed while the speed layer runs: live from the next batch, backfilled over the
retained windows, and the two together equal an independent computation over every event."""

from __future__ import annotations

import random

from deltalake import DeltaTable

import metrics_lake.core.speed.micro_batch as speed_layer
from metrics_lake.core.config_store import Change, ConfigStore
from metrics_lake.core.kernels.stored_queries import parse_query
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.maintenance.query_backfill import backfill_queries, pending_backfills, purge_query
from metrics_lake.core.speed.progress import query_progress
from metrics_lake.core.tables.delta import open_table, table_uri
from tests.helpers import assert_query_results, expected_query_results

START_MS = 1_763_600_000_000 - 1_763_600_000_000 % 86_400_000 + 86_400_000 - 1_800_000  # 23:30, a day boundary ahead
TOPIC = "metrics"
SEED = '[[queries]]\nname = "fleet"\nquery = "FROM * SELECT m.lat WINDOW 5m COMPUTE count, max, percentile(90)"\n'
HOPPING = "FROM web-* SELECT m.lat WINDOW 10m EVERY 5m COMPUTE count, sum, percentile(99) PER SERVER"
SERVERS = ["web-1", "web-2", "db-1"]


def round_of_events(rng: random.Random, round_: int, n: int = 600) -> list[dict]:
    lo = START_MS + round_ * 600_000
    return [
        {
            "ts": rng.randrange(lo, lo + 600_000),
            "server": rng.choice(SERVERS),
            "metric": rng.choice(["m.lat", "m.cpu"]),
            "value": round(rng.lognormvariate(3, 1), 3),
        }
        for _ in range(n)
    ]


def batch(store, log, events: list[dict]) -> None:
    with Producer(log, TOPIC, partitions=2, roll_bytes=20_000) as producer:
        producer.send_payloads(events)
    speed_layer.run_batch_in_process(
        store, TOPIC, end_offsets(log, TOPIC), watermark_seconds=60, clock_skew_seconds=10**9
    )


def rows_of(store, name: str) -> list[dict]:
    rows = DeltaTable(table_uri(store, "query_results")).to_pyarrow_table().to_pylist()
    return [r for r in rows if r["query"] == name]


def test_added_changed_and_removed_queries_follow_live_and_backfill_to_the_exact_answer(store, log, tmp_path):
    seed = tmp_path / "seed.toml"
    seed.write_text(SEED)
    config_store = ConfigStore(store, seed)
    config_store.ensure_seeded()
    rng = random.Random(11)
    events: list[dict] = []
    for round_ in range(4):  # 40 minutes over midnight, windows closing as the watermark moves
        events += round_of_events(rng, round_)
        batch(store, log, events[-600:])
    fleet = parse_query("fleet", SEED.split('query = "')[1].rstrip('"\n'))
    assert_query_results(rows_of(store, "fleet"), events, [fleet])

    config_store.apply([Change("put", "hopping", HOPPING)], by="test")
    hopping = config_store.current().entry("hopping").parsed()
    events += round_of_events(rng, 4)
    batch(store, log, events[-600:])  # the next batch adopts it: live rows for the windows after the watermark
    live = rows_of(store, "hopping")
    watermark = open_table(store, "metric_windows_1m").transaction_version(f"speed-layer/{TOPIC}/watermark")
    live_windows = {r["window_start"] for r in live}
    assert any(r["window_end"].timestamp() * 1000 > watermark for r in live)  # the open windows are live...
    assert len(live_windows) < len({k[2] for k in expected_query_results(events, [hopping])})  # ...the old ones not yet
    progress = query_progress(open_table(store, "query_results"), "hopping")
    assert progress.live_revision == hopping.revision and progress.backfilled_revision is None

    assert [q.name for q in pending_backfills(store, config_store.current().queries())] == ["hopping"]
    (result,) = backfill_queries(store, TOPIC, pending_backfills(store, config_store.current().queries()))
    assert result.query == "hopping" and result.rows > 0 and result.days == 2
    assert_query_results(rows_of(store, "hopping"), events, [hopping])  # every window, each once, exact
    assert query_progress(open_table(store, "query_results"), "hopping").backfilled(hopping.revision)
    assert pending_backfills(store, config_store.current().queries()) == []

    # Changed text: the old rows are replaced, live first, then by the backfill; none of the old grid is left.
    changed = "FROM * SELECT m.lat WINDOW 15m COMPUTE min, avg"
    config_store.apply([Change("put", "fleet", changed)], by="test")
    new_fleet = config_store.current().entry("fleet").parsed()
    backfill_queries(store, TOPIC, pending_backfills(store, config_store.current().queries()))  # backfill first...
    events += round_of_events(rng, 5)
    batch(store, log, events[-600:])  # ...then the live adoption: no gap between the two
    assert_query_results(rows_of(store, "fleet"), events, [new_fleet])
    assert_query_results(rows_of(store, "hopping"), events, [hopping])

    # Removed: its rows stay (until retention) and stop changing; a purge deletes them.
    config_store.apply([Change("delete", "hopping")], by="test")
    kept = rows_of(store, "hopping")
    events += round_of_events(rng, 6)
    batch(store, log, events[-600:])
    assert sorted(map(str, rows_of(store, "hopping"))) == sorted(map(str, kept))
    assert purge_query(store, "hopping") == len(kept)
    assert rows_of(store, "hopping") == []
    assert_query_results(rows_of(store, "fleet"), events, [new_fleet])
