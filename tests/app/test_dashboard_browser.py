"""The dashboard in a real browser: Debian's chromium, headless, driven by Selenium through chromium-driver.

``lake dashboard`` runs as a process over a lake with known events; the
page must draw a panel per stored query with the expected number of points,
and the range picker must change the resolution. A screenshot is saved to
``.test-artifacts/dashboard.png`` (``LAKE_TEST_ARTIFACTS`` overrides the folder).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from metrics_lake.core.kernels.stored_queries import load_stored_queries
from tests.app.test_dashboard import HOUR_MS, START_MS, ingest, make_events
from tests.helpers import LAKE, expected_query_results

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ARTIFACTS = Path(os.environ.get("LAKE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-artifacts"))
QUERIES_TOML = """
[[queries]]
name = "hopping"
description = "5-minute windows every minute"
query = "FROM * SELECT m.lat WINDOW 5m EVERY 1m COMPUTE count, max, percentile(99)"

[[queries]]
name = "per_server"
query = "FROM web-* SELECT m.lat WINDOW 15m COMPUTE count, sum PER SERVER"
"""


def browser() -> webdriver.Chrome:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "chromium and chromium-driver are needed (.ci/run installs them with apt-get)"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture
def dashboard(tmp_path, settings, store, log):
    queries_file = tmp_path / "queries.toml"
    queries_file.write_text(QUERIES_TOML)
    events = make_events(1, START_MS, START_MS + 2 * HOUR_MS, 3000)
    ingest(store, log, events)
    process = subprocess.Popen(
        [LAKE, "dashboard", "--port", "0", "--file", str(queries_file), "--refresh", "0"],
        env={**os.environ, "LAKE_ROOT": settings.root},
        stderr=subprocess.PIPE,
        text=True,
    )
    url: list[str] = []
    started = threading.Event()

    def watch() -> None:
        for line in process.stderr:
            found = re.search(r"dashboard on (http://\S+/)", line)
            if found:
                url.append(found.group(1))
                started.set()

    threading.Thread(target=watch, daemon=True).start()
    assert started.wait(60), "lake dashboard did not start"
    try:
        yield url[0], events, load_stored_queries(queries_file)
    finally:
        process.terminate()
        process.wait(30)


def wait_refreshed(driver, since: float) -> None:
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return Number(document.body.dataset.refreshed || 0)") > since * 1000
    )


def panel_facts(driver) -> dict[str, dict]:
    facts = {}
    for panel in driver.find_elements(By.CSS_SELECTOR, "[data-query]"):
        name = panel.get_attribute("data-query")
        assert panel.get_attribute("data-error") is None, panel.get_attribute("data-error")
        facts[name] = {
            "step": int(panel.get_attribute("data-step")),
            "points": int(panel.get_attribute("data-points")),
            "traces": len(panel.find_elements(By.CSS_SELECTOR, ".scatterlayer .trace")),
        }
    return facts


def test_the_dashboard_draws_every_stored_query_and_the_range_picker_changes_resolution(dashboard):
    url, events, queries = dashboard
    to = START_MS + 2 * HOUR_MS
    expected = expected_query_results(events, queries)
    driver = browser()
    try:
        started = time.time()
        driver.get(f"{url}?range=1h&to={to}")
        wait_refreshed(driver, started)
        facts = panel_facts(driver)
        assert set(facts) == {"hopping", "per_server"}
        hopping = [k for k in expected if k[0] == "hopping" and k[3] == "count" and to - HOUR_MS <= k[2] < to]
        assert facts["hopping"] == {"step": 60, "points": len(hopping), "traces": 3}
        assert facts["per_server"]["step"] == 900 and facts["per_server"]["points"] == 4
        assert facts["per_server"]["traces"] == 2 * 4  # fleet + web-1..3, count and sum each
        assert "complete up to" in driver.find_element(By.ID, "freshness").text
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))

        clicked = time.time()
        driver.find_element(By.CSS_SELECTOR, "button[data-range='7d']").click()
        wait_refreshed(driver, clicked)
        week = panel_facts(driver)
        assert week["hopping"]["step"] == 900 and week["hopping"]["points"] == 8  # 2 h of data in 15-minute steps
        assert week["per_server"]["step"] == 900
        assert driver.execute_script("return document.body.dataset.range") == "7d"
        driver.save_screenshot(str(ARTIFACTS / "dashboard-7d.png"))
    finally:
        driver.quit()
