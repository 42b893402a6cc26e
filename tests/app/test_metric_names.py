"""The one naming rule from other protocols' metric names to the contract's [a-z0-9_.]{1,128}."""

from __future__ import annotations

import pytest

from metrics_lake.app.gateway.protocols.metric_names import metric_name
from metrics_lake.lake_schemas.contract import METRIC_NAME


@pytest.mark.parametrize(
    ("name", "mapped"),
    [
        ("node_cpu_seconds_total", "node_cpu_seconds_total"),  # Prometheus: unchanged
        ("http.server.request.duration", "http.server.request.duration"),  # OTel semantic conventions: unchanged
        ("CPU Usage", "cpu_usage"),
        ("job:http_requests:rate5m", "job_http_requests_rate5m"),  # recording rules
        ("node_memory_MemAvailable_bytes", "node_memory_memavailable_bytes"),
        ("disk  io -- time", "disk_io_time"),  # a run of invalid characters is one underscore
        ("temp°C", "temp_c"),
        ("cpu.usage_idle", "cpu.usage_idle"),  # InfluxDB measurement.field
        ("İstanbul.K", "_stanbul.k"),  # only ASCII letters are lowered: one character never becomes two
    ],
)
def test_real_world_names_map_to_the_contract_and_keep_the_original_when_changed(name, mapped):
    result, original = metric_name(name)
    assert result == mapped
    assert METRIC_NAME.fullmatch(result)
    assert original == (None if name == mapped else name)


def test_long_names_keep_a_digest_so_different_names_stay_different():
    a, b = "x" * 200 + "a", "x" * 200 + "b"
    (left, _), (right, _) = metric_name(a), metric_name(b)
    assert len(left) == len(right) == 128 and left != right
    assert METRIC_NAME.fullmatch(left) and METRIC_NAME.fullmatch(right)
    assert metric_name("y" * 128) == ("y" * 128, None)  # at the limit: unchanged


def test_an_empty_name_has_no_mapping():
    assert metric_name("") == (None, None)
