"""Compaction while `lake stream` writes: the log and every table compacted again and again, nothing lost or duplicated.

The events cover the end of one day and then the next day, so the first
day's windows close while the stream runs and compaction rewrites them
beside the stream's commits to the next day. Compaction is called as
``lake compact`` calls it: it finds the days the speed layer may still
rewrite itself and leaves them alone (delta-rs would otherwise let both
commits remove the same window file and keep both rewrites' rows).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metrics_lake.agents.simulator import FleetSimulator
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.log.segment_compaction import compact_topic
from metrics_lake.core.maintenance.table_compaction import compact_table
from metrics_lake.core.tables.delta import list_tables, open_table
from tests.helpers import LAKE, positions
from tests.integration.test_kill_restart import lake_env
from tests.spark.test_stream_metrics import check_windows

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PHASES = 8
MIDNIGHT_MS = 1_763_596_800_000  # 2025-11-20T00:00Z, in the past (event times do not run ahead of append times)


def phase_start_ms(phase: int) -> int:
    """Phases 0-3 cover the last 2 minutes of 2025-11-19; 4-7 start at 02:00 on the 20th, which moves the
    watermark (event time - 3,600 s) into the 20th: the 19th's windows close."""
    first_day = PHASES // 2
    if phase < first_day:
        return MIDNIGHT_MS - (first_day - phase) * 30_000
    return MIDNIGHT_MS + 2 * 3_600_000 + (phase - first_day) * 30_000


def windows_count(store) -> int:
    """Events the windows table counts (0 before the stream created it)."""
    if "metric_windows_1m" not in list_tables(store):
        return 0
    return pc.sum(open_table(store, "metric_windows_1m").to_pyarrow_table(columns=["count"])["count"]).as_py() or 0


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``condition`` every 0.3 s; AssertionError naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_compaction_concurrent_with_the_stream_loses_and_duplicates_nothing(settings, log, store, tmp_path):
    # `lake compact` beside the stream is under test: the stream's own compaction (on in test_kill_restart.py) would
    # leave it little to merge.
    env = {**lake_env(settings), "LAKE_COMPACTION_INTERVAL_SECONDS": "0"}
    log.ensure_topic(settings.topic, settings.partitions)
    produced_all = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for phase in range(PHASES):  # 8 rounds of 10 servers x 4 metrics x 30 s, one every ~1.5 s
                if phase == PHASES // 2:  # the first day complete in the windows before the next day's events:
                    # fair shares of a backlog could otherwise carry one partition past the watermark of another
                    wait_for(lambda n=phase * 2_400: windows_count(store) == n, 300, "the first day's windows")
                sim = FleetSimulator(
                    servers=10, metrics=4, seconds=30, rate=2.0, seed=phase, start_ms=phase_start_ms(phase)
                )
                with Producer(log, settings.topic, partitions=settings.partitions) as producer:
                    producer.send(sim.generate())
                time.sleep(1.5)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test thread
            errors.append(exc)
        finally:
            produced_all.set()

    with open(tmp_path / "stream.log", "wb") as output:
        stream = subprocess.Popen(
            [LAKE, "stream"], env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        producer = threading.Thread(target=produce)
        producer.start()
        rewrites: Counter[str] = Counter()
        segment_merges = 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and (
            not produced_all.is_set() or rewrites.total() < 3 or rewrites["metric_windows_1m"] < 1
        ):
            for result in compact_topic(log, settings.topic, target_bytes=1 << 20, delete_delay_ms=0):
                segment_merges += result.runs
            for name in list_tables(store):
                rewrites[name] += compact_table(store, name, target_bytes=1 << 20).partitions_rewritten
            time.sleep(0.3)
        producer.join()
        assert not errors, errors
        # Let the stream catch up while compaction keeps running, then stop it cleanly.
        produced = pa.concat_tables(
            read_range(log, settings.topic, p, 0, end) for p, end in end_offsets(log, settings.topic).items()
        )
        deadline = time.monotonic() + 180
        while (
            time.monotonic() < deadline
            and open_table(store, "bronze_events").to_pyarrow_table(columns=["offset"]).num_rows < produced.num_rows
        ):
            for name in list_tables(store):
                rewrites[name] += compact_table(store, name, target_bytes=1 << 20).partitions_rewritten
            time.sleep(0.5)
        assert stream.poll() is None, (tmp_path / "stream.log").read_text()[-3000:]
        stream.send_signal(signal.SIGTERM)  # the driver only: it stops the queries between batches
        stream.wait(60)
    assert stream.returncode == 0, (tmp_path / "stream.log").read_text()[-3000:]
    final = subprocess.run([LAKE, "stream", "--once"], env=env, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]

    assert produced.num_rows == PHASES * 10 * 4 * 60
    assert rewrites.total() >= 3 and rewrites["metric_windows_1m"] >= 1 and segment_merges >= 1, (
        rewrites,
        segment_merges,
    )
    bronze = open_table(store, "bronze_events").to_pyarrow_table(columns=["topic", "partition", "offset"])
    counts = Counter(positions(bronze))
    assert max(counts.values()) == 1, "a (topic, partition, offset) landed twice"
    assert set(counts) == set(positions(produced))
    check_windows(store, produced)
