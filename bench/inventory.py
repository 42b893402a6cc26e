"""The server inventory's costs, each beside its peer from the same run.

1. Enrichment: the speed layer's library path (plan, process, commit of
   ``metrics_lake.core.speed.micro_batch``, no Spark) over the same log, on a lake
   whose inventory holds every server with ``--labels`` labels, beside the
   same run on a lake without an inventory. Alternating runs, best of
   ``--repeat``.
2. Applying an inventory file of ``--inventory-servers`` servers
   (``parse_inventory_file`` + diff + one append), and a new consumer reading
   the compacted topic from offset 0 and folding it.

Usage: ``python bench/inventory.py [--servers 10000 --metrics 10 --seconds 10 --labels 5]``. Prints figures;
asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time

from common import scratch_dir

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.inventory import Inventory, diff, fold, parse_inventory_file
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.keyed_compaction import compact_keyed_partition
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.enrichment import InventoryCache
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import LocalStore

TOPIC = "metrics"


def build(root, events, inventory: dict | None) -> LocalStore:
    store = LocalStore(root)
    if inventory is not None:
        Inventory(store).append(diff({}, inventory, full=True))
    with Producer(SegmentLog(store), TOPIC, partitions=4) as producer:
        producer.send(events)
    return store


def stream_once(store) -> float:
    started = time.perf_counter()
    run_batch_in_process(
        store,
        TOPIC,
        end_offsets(SegmentLog(store), TOPIC),
        watermark_seconds=120,
        clock_skew_seconds=300,
        queries=[],
        rules=[],
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--labels", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--inventory-servers", type=int, default=100_000)
    args = parser.parse_args()
    work = scratch_dir("bench-inventory-")
    events = FleetSimulator(
        servers=args.servers, metrics=args.metrics, seconds=args.seconds, rate=1.0, seed=7
    ).generate()
    servers = sorted(set(events.column("server").to_pylist()))
    labels = {s: {f"label{k}": f"value{hash((s, k)) % 20}" for k in range(args.labels)} for s in servers}
    print(f"enrichment: {events.num_rows:,} events of {len(servers):,} servers, {args.labels} labels each")
    best = {"no inventory": float("inf"), "inventory": float("inf")}
    for attempt in range(args.repeat):
        for name in best if attempt % 2 == 0 else reversed(list(best)):
            store = build(work / f"{name.replace(' ', '-')}-{attempt}", events, labels if name == "inventory" else None)
            InventoryCache._by_root.clear()  # a cold cache, as a new stream process has
            best[name] = min(best[name], stream_once(store))
    for name, seconds in best.items():
        print(f"  {name:>12}: {seconds:6.2f} s  {events.num_rows / seconds:>12,.0f} events/s")
    print(f"  enrichment costs {100 * (best['inventory'] / best['no inventory'] - 1):+.1f} % of the batch time")

    path = work / "servers.csv"
    with path.open("w") as f:
        f.write("server," + ",".join(f"label{k}" for k in range(args.labels)) + "\n")
        for i in range(args.inventory_servers):
            f.write(f"srv-{i:06d}," + ",".join(f"v{(i + k) % 17}" for k in range(args.labels)) + "\n")
    store = LocalStore(work / "inventory-lake")
    inventory = Inventory(store)
    started = time.perf_counter()
    desired = parse_inventory_file(path)
    inventory.append(diff(inventory.current(), desired, full=True))
    applied = time.perf_counter() - started
    print(f"inventory of {args.inventory_servers:,} servers applied in {applied:.2f} s (parse, diff, one append)")
    changed = {s: {**ls, "label0": "moved"} for s, ls in list(desired.items())[: args.inventory_servers // 2]}
    inventory.append(diff(inventory.current(), {**desired, **changed}, full=True))
    compact_keyed_partition(inventory.log, "inventory", 0, min_lag_ms=0, tombstone_retention_ms=0, delete_delay_ms=0)
    started = time.perf_counter()
    table = fold(Inventory(store).records())
    print(
        f"a new consumer read the compacted topic from offset 0 and folded {table.num_rows:,} servers "
        f"in {time.perf_counter() - started:.2f} s"
    )


if __name__ == "__main__":
    main()
