"""Analysts' warm queries: the lake's Spark SQL beside Polars and DuckDB on the same Delta snapshot.

Builds a lake with the CLI (``lake produce`` of the fleet simulator, ``lake
stream --once``, then ``lake compact --cluster`` unless ``--no-cluster``),
then times three queries, best of ``--repeat``, each in a warm session:

- the lake: one Spark session with the lake's tables in its catalog
  (:func:`metrics_lake.spark.catalog.register_lake_tables`, as ``lake
  sql-server`` serves them), ``spark.sql(query).collect()``;
- Polars ``scan_delta`` of the table (delta-rs resolves the snapshot);
- DuckDB over the snapshot's active Parquet files.

Every engine must give the same answer (checked). For the lake, "files
read" is what the reader's pruning keeps
(:func:`metrics_lake.core.tables.pruning.keep_files`, the function the
reader calls) of the files in the snapshot.

Usage: ``python bench/analyst_queries.py [--size 2500x10x240] [--repeat 3] [--no-cluster]``
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
from common import LAKE, lake_env, run_measured, scratch_dir
from deltalake import DeltaTable

from metrics_lake.core import keys
from metrics_lake.core.tables.pruning import Predicate, keep_files
from metrics_lake.lake_schemas.tables import TABLES, Table

METRIC = "app.rpc.latency_ms"
SERVER = "sim-0042"

QUERIES = {
    "one series: count, avg, max from bronze": (
        Table.BRONZE_EVENTS,
        f"SELECT count(*) AS n, avg(value) AS mean, max(value) AS peak FROM {{t}} "
        f"WHERE metric = '{METRIC}' AND server = '{SERVER}'",
        [Predicate("metric", "=", METRIC), Predicate("server", "=", SERVER)],
    ),
    "one metric's p99 per minute from windows": (
        Table.METRIC_WINDOWS_1M,
        f"SELECT window_start, max(p99) AS p99 FROM {{t}} WHERE metric = '{METRIC}' "
        "GROUP BY window_start ORDER BY window_start",
        [Predicate("metric", "=", METRIC)],
    ),
    "top 10 servers by max of a metric from bronze": (
        Table.BRONZE_EVENTS,
        f"SELECT server, max(value) AS peak FROM {{t}} WHERE metric = '{METRIC}' "
        "GROUP BY server ORDER BY peak DESC, server LIMIT 10",
        [Predicate("metric", "=", METRIC)],
    ),
}


def best_of(repeat: int, run) -> tuple[float, list[tuple]]:
    """Best wall seconds of ``repeat`` calls of ``run`` and its last result (rows as tuples)."""
    best, rows = math.inf, []
    for _ in range(repeat):
        started = time.perf_counter()
        rows = run()
        best = min(best, time.perf_counter() - started)
    return best, rows


def normalized(rows: list[tuple]) -> list[tuple]:
    """Rows with floats rounded to 9 significant digits and times without zone, comparable across engines."""
    out = []
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, float):
                cell = float(f"{cell:.9g}")
            elif hasattr(cell, "tzinfo") and getattr(cell, "tzinfo", None) is not None:
                cell = cell.replace(tzinfo=None)
            cells.append(cell)
        out.append(tuple(cells))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2500x10x240", help="servers x metrics x seconds of the simulated fleet")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-cluster", action="store_true", help="query the files as the stream wrote them")
    args = parser.parse_args()
    servers, metrics, seconds = (int(x) for x in args.size.split("x"))
    work = scratch_dir("lake-analyst-")
    env = lake_env(work)
    steps = [
        [LAKE, "produce", "--servers", str(servers), "--metrics", str(metrics), "--seconds", str(seconds)],
        [LAKE, "stream", "--once"],
    ]
    if not args.no_cluster:
        steps.append([LAKE, "compact", "--cluster", "--tables-only", "--tables", Table.BRONZE_EVENTS])
    for step in steps:
        print(f"{' '.join(step[1:])}: {run_measured(step, env, cwd=work).seconds:.1f} s", flush=True)
    root = Path(env["LAKE_ROOT"])

    os.environ.update(env)
    from metrics_lake.core.config import load_settings
    from metrics_lake.spark.catalog import register_lake_tables
    from metrics_lake.spark.session import build_session

    settings = load_settings()
    spark = build_session(settings, "bench-analyst")
    register_lake_tables(spark, settings)
    duck = duckdb.connect()
    duck.execute("SET threads = 2")
    rows = []
    for label, (table, sql, predicates) in QUERIES.items():
        uri = str(root / keys.table_prefix(table))
        delta = DeltaTable(uri)
        actions = pa.table(delta.get_add_actions(flatten=True))
        kept = keep_files(actions, predicates, TABLES[table].schema, list(TABLES[table].partition_by))
        files = [f"{uri}/{p}" for p in actions.column("path").to_pylist()]
        duck.execute(f"CREATE OR REPLACE VIEW snapshot AS SELECT * FROM read_parquet({files!r})")
        lake_s, lake_rows = best_of(
            args.repeat, lambda sql=sql, table=table: [tuple(r) for r in spark.sql(sql.format(t=table)).collect()]
        )
        polars_s, polars_rows = best_of(
            args.repeat,
            lambda sql=sql, uri=uri: pl.SQLContext(t=pl.scan_delta(uri)).execute(sql.format(t="t")).collect().rows(),
        )
        duck_s, duck_rows = best_of(args.repeat, lambda sql=sql: duck.execute(sql.format(t="snapshot")).fetchall())
        assert normalized(lake_rows) == normalized(polars_rows) == normalized(duck_rows), (
            label,
            lake_rows[:3],
            polars_rows[:3],
            duck_rows[:3],
        )
        peer = min(polars_s, duck_s)
        rows.append(
            (
                label,
                f"{lake_s:.3f}",
                f"{polars_s:.3f}",
                f"{duck_s:.3f}",
                f"{lake_s / peer:.0f}x",
                f"{int(kept.sum())} / {actions.num_rows}",
            )
        )
    spark.stop()
    events = servers * metrics * seconds
    print(f"\n{events:,} events; {'clustered' if not args.no_cluster else 'as streamed'}; best of {args.repeat}")
    header = (
        "warm query",
        "lake Spark SQL s",
        "Polars s",
        "DuckDB s",
        "lake / faster peer",
        "files read / in snapshot",
    )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


if __name__ == "__main__":
    main()
