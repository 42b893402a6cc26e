"""A running `lake stream` follows the config store without a restart: a query added with the CLI, changed through the
API and removed again; after a backfill its rows equal an independent computation over every event."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time

import pytest
from deltalake import DeltaTable
from starlette.testclient import TestClient

from metrics_lake.app.dashboard import DashboardReader
from metrics_lake.app.dashboard.server import build_app
from metrics_lake.core.config import load_settings
from metrics_lake.core.config_store import ConfigStore
from metrics_lake.core.log.consumer import end_offsets
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.speed.progress import CONSUMER, query_progress
from metrics_lake.core.tables.commits import committed_offsets
from metrics_lake.core.tables.delta import open_table, table_uri
from tests.helpers import LAKE, assert_query_results, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "admin-token-for-the-test"


def rows_of(store, name: str) -> list[dict]:
    rows = DeltaTable(table_uri(store, "query_results")).to_pyarrow_table().to_pylist()
    return [r for r in rows if r["query"] == name]


def live_revision(store, name: str) -> int | None:
    return query_progress(open_table(store, "query_results"), name).live_revision


def test_the_stream_follows_queries_added_changed_and_removed_while_it_runs(settings, store, log, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env |= {
        "LAKE_ROOT": settings.root,
        "LAKE_CHECKPOINT_DIR": settings.checkpoint_dir,
        "LAKE_SPARK_MASTER": "local[2]",
        "LAKE_SHUFFLE_PARTITIONS": "2",
        "LAKE_TRIGGER_SECONDS": "1",
        "LAKE_WATERMARK_SECONDS": "5",
        "LAKE_AUTHOR": "ops",
    }
    events: list[dict] = []
    stop_producing = threading.Event()
    rng = random.Random(5)
    start_ms = int(time.time() * 1000) - 600_000  # ten minutes of history first, then the clock

    def produce() -> None:
        ts = start_ms
        with Producer(log, settings.topic, partitions=2, roll_bytes=50_000) as producer:
            while not stop_producing.is_set():
                batch = [
                    {
                        "ts": ts + i * 100,
                        "server": rng.choice(["web-1", "web-2", "db-1"]),
                        "metric": "m.lat",
                        "value": round(rng.lognormvariate(3, 1), 3),
                    }
                    for i in range(200)
                ]
                ts += 20_000  # 20 s of event time per 0.2 s: the watermark moves, windows close
                producer.send_payloads(batch)
                producer.flush()
                events.extend(batch)
                time.sleep(0.2)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    with open(tmp_path / "stream.log", "wb") as output:
        stream = subprocess.Popen(
            [LAKE, "stream"], env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(
            lambda: (
                ConfigStore(store).versions()
                and store.exists("tables/query_results/_delta_log")
                and open_table(store, "query_results").version() > 1
            ),
            "the stream's first batches",
        )

        def run(*args: str) -> subprocess.CompletedProcess:
            result = subprocess.run([LAKE, *args], env=env, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            return result

        run("queries", "add", "web_max", "FROM web-* SELECT m.lat WINDOW 1m COMPUTE max, count PER SERVER")
        revision = ConfigStore(store).current().entry("web_max").revision
        added = wait_for(lambda: live_revision(store, "web_max") == revision and rows_of(store, "web_max"), "web_max")

        api = TestClient(build_app(DashboardReader(load_settings(root=settings.root, admin_token=TOKEN))))
        answer = api.put(
            "/api/queries/web_max",
            json={"query": "FROM web-* SELECT m.lat WINDOW 2m EVERY 1m COMPUTE max, percentile(90)"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert answer.status_code == 200, answer.text
        changed = answer.json()["revision"]
        wait_for(lambda: live_revision(store, "web_max") == changed, "the changed web_max")
        wait_for(lambda: any(r["aggregate"] == "p90" for r in rows_of(store, "web_max")), "rows of the new text")

        run("queries", "add", "gone", "FROM * SELECT m.lat WINDOW 1m COMPUTE count")
        wait_for(lambda: rows_of(store, "gone"), "rows of gone")
        run("queries", "rm", "gone")
        time.sleep(3)  # the stream's next batches see the removal
        kept = sorted(map(str, rows_of(store, "gone")))
        time.sleep(3)
        assert sorted(map(str, rows_of(store, "gone"))) == kept  # no longer updated, and kept

        stop_producing.set()
        producer.join(30)
        ends = end_offsets(log, settings.topic)

        def caught_up() -> bool:  # query_results (committed last in a batch) holds every record
            marks = committed_offsets(open_table(store, "query_results"), CONSUMER, settings.topic, ends)
            return all((marks[p] or 0) >= end for p, end in ends.items())

        wait_for(caught_up, "the stream to catch up")
        backfilled = run("queries", "backfill")
        assert "web_max: revision" in backfilled.stderr
    finally:
        os.killpg(stream.pid, signal.SIGTERM)
        stream.wait(60)
    query = ConfigStore(store).current().entry("web_max").parsed()
    assert_query_results(rows_of(store, "web_max"), events, [query])
    print(f"query added -> first live rows after {added:.1f} s (trigger 1 s)")
