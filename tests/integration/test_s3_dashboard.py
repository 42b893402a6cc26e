"""The dashboard's reads on an S3 lake with the read-only analyst identity (delta-rs and Arrow through S3)."""

from __future__ import annotations

import pytest

from metrics_lake.app.dashboard import DashboardReader
from metrics_lake.core.config import load_settings
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import open_store
from metrics_lake.infra.seaweedfs import settings_env
from tests.app.test_dashboard import HOUR_MS, QUERIES, START_MS, ingest, make_events, points
from tests.helpers import expected_query_results

pytestmark = [pytest.mark.integration, pytest.mark.s3]


def test_the_analyst_identity_reads_the_dashboard_of_an_s3_lake(own_s3_server):
    s3_server = own_s3_server  # the identities' rights are scoped to the bucket root: a server of its own
    env = settings_env(s3_server, "admin")
    store = open_store(load_settings(**{k.removeprefix("LAKE_").lower(): v for k, v in env.items()}))
    log = SegmentLog(store)
    events = make_events(3, START_MS, START_MS + HOUR_MS, 600)
    ingest(store, log, events)
    analyst = settings_env(s3_server, "analyst")
    reader = DashboardReader(
        load_settings(**{k.removeprefix("LAKE_").lower(): v for k, v in analyst.items()}),
        QUERIES,
        clock=lambda: START_MS / 1000 + 2 * 3600,
    )
    answer = reader.series("hopping", START_MS // 1000, START_MS // 1000 + 3600)
    expected = expected_query_results(events, QUERIES)
    assert points(answer, None, "count") == {
        k[2]: v
        for k, v in expected.items()
        if k[0] == "hopping" and k[3] == "count" and START_MS <= k[2] < START_MS + HOUR_MS
    }
    assert reader.freshness()["newest_window_end"] == max(e["ts"] for e in events) // 60_000 * 60_000 + 60_000
    pipeline = reader.pipeline(START_MS // 1000, START_MS // 1000 + 3600)
    assert pipeline["consumers"]["groups"] == [] and "error" in pipeline["consumers"]  # the analyst may not read log/
