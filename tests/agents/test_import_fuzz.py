"""``lake produce --from-file`` under hostile input and a SIGKILL: every line accounted for, nothing twice (issue 12).

The file is imported by the real CLI, directly into the log and through a
gateway; the log is then turned into bronze and quarantine by the speed
layer's batch function, and both tables are compared line by line with what
the generator knows about each line.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import time
from collections import Counter

import pytest
from deltalake import DeltaTable

from metrics_lake.core.config import load_settings
from metrics_lake.core.log.consumer import end_offsets, read_range
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.speed.micro_batch import run_batch_in_process
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import table_uri
from metrics_lake.lake_schemas.contract import raw_text
from tests.app.gateway_process import running_gateway
from tests.fuzz_events import START_MS, FuzzEvents
from tests.helpers import LAKE

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _lake(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LAKE, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("via", ["log", "gateway"])
def test_twelve_thousand_hostile_lines_import_exactly(tmp_path, via):
    lines = FuzzEvents(seed=12, heavy_share=0.02).lines(12_000)
    path = tmp_path / "hostile.jsonl.gz"
    path.write_bytes(gzip.compress(lines.body()))
    root = tmp_path / "lake"
    env = {"LAKE_ROOT": str(root), "LAKE_SPOOL_DIR": str(tmp_path / "spool")}
    if via == "gateway":
        with running_gateway(env, "--linger-ms", "20") as gateway:
            done = _lake(env, "produce", "--from-file", str(path), "--gateway", gateway.url)
    else:
        done = _lake(env, "produce", "--from-file", str(path))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())  # rich wraps lines to the terminal's width
    assert f"{len(lines.valid_ids):,} events accepted, {lines.invalid:,} rejected" in said
    assert f"{lines.blank:,} blank lines skipped" in said

    settings = load_settings(root=str(root))
    store = open_store(settings)
    ends = end_offsets(SegmentLog(store), settings.topic)
    assert sum(ends.values()) == len(lines.valid_ids) + lines.invalid
    run_batch_in_process(store, settings.topic, ends, watermark_seconds=120, clock_skew_seconds=300)
    bronze = DeltaTable(table_uri(store, "bronze_events")).to_pyarrow_table(columns=["value"])
    assert sorted(bronze.column("value").to_pylist()) == [float(i) for i in lines.valid_ids]
    quarantine = DeltaTable(table_uri(store, "quarantine_events")).to_pyarrow_table(columns=["reason", "raw"])
    events = [line for line in lines.lines if line.strip()]  # what the contract sees, blank lines left out
    expected_raw = Counter(raw_text(events[i]) for i in lines.invalid_at)
    assert Counter(quarantine.column("raw").to_pylist()) == expected_raw  # whole lines: none split, none merged
    assert quarantine.column("reason").null_count == 0


def test_an_import_killed_midway_and_run_again_stores_every_line_once(tmp_path):
    count = 1_000_000
    path = tmp_path / "big.jsonl"
    with open(path, "w") as handle:
        for i in range(count):
            handle.write(f'{{"ts":{START_MS + i * 5},"server":"srv-{i % 500}","metric":"m.x","value":{i}}}\n')
    root = tmp_path / "lake"
    env = {"LAKE_ROOT": str(root), "LAKE_LEASE_TTL_SECONDS": "2", "LAKE_SEGMENT_ROLL_BYTES": str(1 << 20)}
    settings = load_settings(root=str(root))
    process = subprocess.Popen(
        [LAKE, "produce", "--from-file", str(path)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline, stored = time.monotonic() + 300, 0
    while process.poll() is None and time.monotonic() < deadline:
        try:
            stored = sum(end_offsets(SegmentLog(open_store(settings)), settings.topic).values())
        except Exception:  # the topic is not created yet
            stored = 0
        if stored:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    log = SegmentLog(open_store(settings))
    killed_at = sum(end_offsets(log, settings.topic).values())
    assert 0 < killed_at < count, f"the kill should land mid-import ({killed_at:,} of {count:,} stored)"

    done = _lake(env, "produce", "--from-file", str(path))
    assert done.returncode == 0, done.stderr
    assert "were already imported by an earlier run" in " ".join(done.stderr.split())

    ends = end_offsets(log, settings.topic)
    values = [
        value
        for partition, end in ends.items()
        for value in read_range(log, settings.topic, partition, 0, end).column("value").to_pylist()
    ]
    assert len(values) == count and len(set(values)) == count  # every line once: none lost, none twice
