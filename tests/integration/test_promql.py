"""PromQL over the lake: Debian's Prometheus with ``remote_read`` pointed at ``lake dashboard`` answers
``/api/v1/query_range`` equal to the same computation over the events; a matcher the lake refuses comes back
as an error or warning Prometheus shows."""

from __future__ import annotations

import random
import shutil
import subprocess
import time

import pytest
import requests

from metrics_lake.core.inventory import Change, Inventory
from tests.app.test_dashboard import ingest
from tests.app.test_dashboard_browser import served
from tests.app.test_protocol_clients import wait_http
from tests.helpers import free_port_pair

PROMETHEUS = shutil.which("prometheus")
ROLES = {"web-1": "web", "web-2": "web", "db-1": "db"}
STEP_S = 60


def events(start_ms: int, minutes: int) -> list[dict]:
    """``m.lat`` samples at random (odd) milliseconds and a ``m.count`` counter every 10 s, per server."""
    rng = random.Random(11)
    out = []
    for server in ROLES:
        for _ in range(minutes * 20):
            ts = rng.randrange(start_ms, start_ms + minutes * 60_000) | 1  # never on a step boundary
            out.append({"ts": ts, "server": server, "metric": "m.lat", "value": round(rng.uniform(1, 900), 3)})
        total = rng.randrange(1000)
        for ts in range(start_ms + 1, start_ms + minutes * 60_000, 10_000):
            total += rng.randrange(50)
            out.append({"ts": ts, "server": server, "metric": "m.count", "value": float(total)})
    return out


def in_range(samples: list[tuple[int, float]], t_ms: int, range_ms: int) -> list[tuple[int, float]]:
    """Samples of a range selector ``[range]`` evaluated at ``t_ms``: Prometheus 2.x's closed interval."""
    return sorted(s for s in samples if t_ms - range_ms <= s[0] <= t_ms)


def extrapolated_rate(samples: list[tuple[int, float]], t_ms: int, range_ms: int) -> float | None:
    """``rate()`` as Prometheus computes it (promql/functions.go ``extrapolatedRate``) on a counter without resets."""
    points = in_range(samples, t_ms, range_ms)
    if len(points) < 2:
        return None
    (first_t, first_v), (last_t, last_v) = points[0], points[-1]
    result = last_v - first_v
    to_start, to_end = (first_t - (t_ms - range_ms)) / 1000, (t_ms - last_t) / 1000
    sampled = (last_t - first_t) / 1000
    average = sampled / (len(points) - 1)
    if result > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / result))
    threshold = average * 1.1
    interval = sampled + (to_start if to_start < threshold else average / 2)
    interval += to_end if to_end < threshold else average / 2
    return result * (interval / sampled) / (range_ms / 1000)


@pytest.mark.slow
def test_prometheus_answers_promql_over_the_lake(settings, store, log, tmp_path):
    assert PROMETHEUS, "Debian's prometheus is needed (.ci/run installs it)"
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - now_ms % 60_000 - 40 * 60_000
    Inventory(store).append([Change(server, {"role": role}) for server, role in ROLES.items()])
    sent = events(start_ms, 30)
    ingest(store, log, sent, [])
    series = {}
    for e in sent:
        series.setdefault((e["metric"], e["server"]), []).append((e["ts"], e["value"]))

    with served(settings) as url:
        port, _ = free_port_pair()
        config = tmp_path / "prometheus.yml"
        config.write_text(f"remote_read:\n  - url: {url}api/v1/read\n    read_recent: true\n")
        log_file = (tmp_path / "prometheus.log").open("w")
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready")
            lo_s, hi_s = start_ms // 1000 + 300, start_ms // 1000 + 30 * 60

            def query_range(promql: str) -> dict:
                answer = requests.get(
                    f"{api}/query_range",
                    params={"query": promql, "start": lo_s, "end": hi_s, "step": STEP_S},
                    timeout=60,
                ).json()
                assert answer["status"] == "success", answer
                assert not answer.get("warnings"), answer
                return {r["metric"].get("server"): r for r in answer["data"]["result"]}

            steps = range(lo_s * 1000, hi_s * 1000 + 1, STEP_S * 1000)
            highs = query_range('max_over_time(m_lat{server="web-1"}[1m])')
            assert highs["web-1"]["metric"] == {"server": "web-1", "role": "web"}  # the name is dropped
            assert [(int(t * 1000), float(v)) for t, v in highs["web-1"]["values"]] == [
                (t, max(v for _, v in in_range(series[("m.lat", "web-1")], t, 60_000)))
                for t in steps
                if in_range(series[("m.lat", "web-1")], t, 60_000)
            ]

            rates = query_range("rate(m_count[2m])")
            assert set(rates) == set(ROLES)
            for server, result in rates.items():
                expected = [(t, extrapolated_rate(series[("m.count", server)], t, 120_000)) for t in steps]
                expected = [(t, r) for t, r in expected if r is not None]
                assert [int(t * 1000) for t, _ in result["values"]] == [t for t, _ in expected]
                assert [float(v) for _, v in result["values"]] == pytest.approx([r for _, r in expected], rel=1e-9)

            counts = query_range('sum by (server) (count_over_time(m_lat{role="web"}[5m]))')
            assert set(counts) == {"web-1", "web-2"}  # an inventory label selects the web servers
            for server, result in counts.items():
                for t, v in result["values"]:
                    assert int(v) == len(in_range(series[("m.lat", server)], int(t * 1000), 300_000))

            refused = requests.get(f"{api}/query", params={"query": '{server="web-1"}', "time": hi_s}).json()
            shown = " ".join([refused.get("error", ""), *refused.get("warnings", [])])
            assert "needs a __name__ matcher" in shown, refused
        finally:
            prometheus.terminate()
            prometheus.wait(60)
