"""`lake quality` on an S3 lake: results in dq_results in the bucket, data docs and trend copied to quality/."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from metrics_lake.core.tables.delta import open_table
from metrics_lake.infra.seaweedfs import settings_env, store_as
from tests.helpers import LAKE
from tests.quality.test_quality import DAY, bad_windows, land

pytestmark = [pytest.mark.integration, pytest.mark.s3, pytest.mark.slow]


def test_quality_on_s3_writes_results_and_publishes_reports(s3_server, tmp_path):
    prefix = f"tests/{uuid.uuid4().hex}"
    store = store_as(s3_server, "admin", prefix)
    land(store, "metric_windows_1m", bad_windows())
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env |= settings_env(s3_server, "admin", prefix) | {
        "LAKE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "LAKE_QUALITY_DIR": str(tmp_path / "quality"),
        "LAKE_SPARK_MASTER": "local[2]",
    }
    done = subprocess.run(
        [LAKE, "quality", "--table", "metric_windows_1m", "--date", DAY.isoformat()],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]  # the crafted partition fails critical expectations
    assert "critical expectations failed" in done.stderr
    results = open_table(store, "dq_results").to_pyarrow_table().to_pylist()
    assert {r["table"] for r in results} == {"metric_windows_1m"}
    assert any(r["column"] == "window_seconds" and not r["success"] for r in results)
    assert b"metric_windows_1m" in store.read("quality/docs/index.html")
    assert store.read("quality/trend.png")[:4] == b"\x89PNG"
    trend = store.read("quality/trend.html")
    assert b"window_seconds" in trend and b"href='docs/index.html'" in trend
