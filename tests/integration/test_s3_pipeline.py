"""The whole pipeline with LAKE_ROOT=s3://… on the suite's S3 server, each step as its own CLI process.

Producers sign as the agent identity, the stream as the pipeline identity,
the checks as admin: the least-privilege split a deployment uses.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from metrics_lake.core.log.consumer_groups import lag_report
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.tables.delta import open_table
from metrics_lake.infra.seaweedfs import settings_env, store_as
from metrics_lake.lake_schemas.tables import TABLES
from tests.helpers import LAKE, positions
from tests.spark.test_stream_metrics import INVALID, check_windows, produced_rows, table_rows

pytestmark = [pytest.mark.integration, pytest.mark.s3, pytest.mark.slow]


def run_lake(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``lake *args`` with only ``env``'s LAKE_* settings; fail the test on a non-zero exit."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    done = subprocess.run([LAKE, *args], env={**clean, **env}, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"lake {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done


def bronze_rows(store) -> int:
    """Rows in bronze_events now (0 before the table exists)."""
    try:
        return open_table(store, "bronze_events").to_pyarrow_table(columns=["offset"]).num_rows
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def stream_until(env: dict, done, log_path, timeout: float = 300) -> None:
    """Run the continuous `lake stream` (the streaming query, with its checkpoint) until ``done()``, then SIGTERM it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    with open(log_path, "wb") as output:
        process = subprocess.Popen(
            [LAKE, "stream", "--trigger", "1"], env={**clean, **env}, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + timeout
            while not done() and time.monotonic() < deadline:
                assert process.poll() is None, log_path.read_text()[-3000:]
                time.sleep(1)
            assert done(), f"the stream did not get there in {timeout:.0f} s:\n{log_path.read_text()[-3000:]}"
        finally:
            process.send_signal(signal.SIGTERM)  # stops between micro-batches
            assert process.wait(120) == 0, log_path.read_text()[-3000:]


@pytest.fixture
def s3_lake(own_s3_server, tmp_path):
    """Per-identity LAKE_* settings for a lake at the bucket root, plus the admin store to check results with."""
    local = {"LAKE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "LAKE_SPARK_MASTER": "local[2]"}
    local |= {"LAKE_SHUFFLE_PARTITIONS": "2", "LAKE_SPOOL_DIR": str(tmp_path / "spool")}
    envs = {identity: settings_env(own_s3_server, identity) | local for identity in ("agent", "pipeline")}
    return envs, store_as(own_s3_server, "admin")


def test_end_to_end_on_s3_gives_exact_bronze_quarantine_and_windows(s3_lake, tmp_path):
    envs, admin = s3_lake
    invalid = tmp_path / "invalid.jsonl"
    invalid.write_text("\n".join(INVALID) + "\n")
    run_lake(envs["agent"], "produce", "--servers", "4", "--metrics", "3", "--seconds", "60", "--rate", "3")
    stream_until(envs["pipeline"], lambda: bronze_rows(admin) == 4 * 3 * 60 * 3, tmp_path / "stream.log")
    # The streaming query's checkpoint is lost (another machine, an ephemeral container); the tables on S3
    # say where to resume.
    shutil.rmtree(tmp_path / "checkpoints")
    run_lake(
        envs["agent"], "produce", "--servers", "4", "--metrics", "3", "--seconds", "60", "--rate", "3", "--seed", "7"
    )
    run_lake(envs["agent"], "produce", "--from-file", str(invalid))
    run_lake(envs["pipeline"], "stream", "--once")

    produced = produced_rows(SegmentLog(admin))
    valid = produced.filter(produced.column("reason").is_null())
    assert valid.num_rows == 4 * 3 * 120 * 3
    bronze = table_rows(admin, "bronze_events")
    in_bronze = positions(bronze)
    assert len(in_bronze) == len(set(in_bronze)) == valid.num_rows
    assert set(in_bronze) == set(positions(valid))
    quarantine = table_rows(admin, "quarantine_events")
    assert {r["raw"]: r["reason"].split(":")[0] for r in quarantine} == INVALID
    assert check_windows(admin, produced) >= 4 * 3 * 2  # equal to an independent computation; two runs of 60 s
    # Replay as the pipeline identity: an ingested range changes no table; into a new table it reproduces it.
    versions = {name: open_table(admin, name).version() for name in TABLES}
    run_lake(envs["pipeline"], "replay")
    assert {name: open_table(admin, name).version() for name in TABLES} == versions
    run_lake(envs["pipeline"], "replay", "--into", "bronze_copy", "--partitions", "0-1")
    copy = open_table(admin, "bronze_copy").to_pyarrow_table()
    assert sorted(positions(copy)) == sorted(p for p in in_bronze if p[1] in (0, 1))
    lag = run_lake(envs["pipeline"], "consumers").stdout
    assert "speed-layer" in lag
    report = lag_report(SegmentLog(admin))
    assert len(report) == 4 and all(r.lag == 0 for r in report)  # the speed layer caught up on 4 partitions
    # The analyst-facing SQL works against S3 too.
    answer = run_lake(envs["pipeline"], "sql", "SELECT count(*) AS n FROM bronze_events", "--format", "json")
    assert json.loads(answer.stdout) == {"n": valid.num_rows}  # JSON Lines, one object per row
