"""The dashboard in a real browser: Debian's chromium, headless, driven by Selenium through chromium-driver.

``lake dashboard`` runs as a process over a lake with known events; the
page must draw a panel per stored query with the expected number of points,
and the range picker must change the resolution. A screenshot is saved to
``.test-artifacts/dashboard.png`` (``LAKE_TEST_ARTIFACTS`` overrides the folder).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from metrics_lake.core.config_store import ALERT, ConfigStore, declared_changes, read_declarations
from metrics_lake.core.kernels.stored_queries import load_stored_queries
from metrics_lake.core.tables.delta import table_uri
from tests.app.test_dashboard import HOUR_MS, START_MS, ingest, make_events
from tests.helpers import LAKE, expected_query_results

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ARTIFACTS = Path(os.environ.get("LAKE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-artifacts"))
ADMIN_TOKEN = "browser-test-admin-token"
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
    config_store = ConfigStore(store)
    current = config_store.current()  # these queries only: the shipped rules (which use shipped queries) go too
    config_store.apply(
        declared_changes(current, read_declarations(queries_file)) + declared_changes(current, {}, ALERT), by="test"
    )
    with served(settings) as url:
        yield url, events, load_stored_queries(queries_file)


@contextlib.contextmanager
def served(settings):
    """``lake dashboard`` over ``settings``' lake as a process; yields its URL."""
    process = subprocess.Popen(
        [LAKE, "dashboard", "--port", "0", "--refresh", "0"],
        env={**os.environ, "LAKE_ROOT": settings.root, "LAKE_ADMIN_TOKEN": ADMIN_TOKEN},
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
        yield url[0]
    finally:
        process.terminate()
        process.wait(30)


# Answers /api/servers without a label filter 1.5 s late; window.slowAnswers counts them once the page had
# 100 ms to draw each (far more than the microtasks drawing takes).
SLOW_UNFILTERED_SERVERS = """
const fetchNow = window.fetch;
window.slowAnswers = 0;
window.fetch = async (url, ...rest) => {
  const answer = await fetchNow(url, ...rest);
  if (String(url).startsWith("/api/servers") && !String(url).includes("select=")) {
    await new Promise(done => setTimeout(done, 1500));
    setTimeout(() => { window.slowAnswers += 1; }, 100);
  }
  return answer;
};
"""


def wait_refreshed(driver, since: float) -> None:
    WebDriverWait(driver, 60).until(
        lambda d: d.execute_script("return Number(document.body.dataset.refreshed || 0)") > since * 1000
    )


def server_names(driver) -> list[str]:
    """The servers the page's status table lists, sorted."""
    rows = driver.find_element(By.ID, "servers").find_elements(By.XPATH, ".//tbody/tr/td[2]")
    return sorted(r.text for r in rows)


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


def test_a_query_added_through_the_form_is_previewed_saved_and_gets_its_panel(dashboard, store, log):
    url, events, _ = dashboard
    to = START_MS + 2 * HOUR_MS
    text = "FROM web-* SELECT m.lat WINDOW 10m COMPUTE max, count"
    driver = browser()
    try:
        started = time.time()
        driver.get(f"{url}?range=1h&to={to}")
        wait_refreshed(driver, started)
        driver.find_element(By.ID, "add-query").click()
        driver.find_element(By.ID, "qf-name").send_keys("web_max")
        driver.find_element(By.ID, "qf-text").send_keys(text.replace("10m", "0m"))
        driver.find_element(By.ID, "qf-preview").click()
        state = lambda d: d.find_element(By.ID, "qf-status").get_attribute("data-state")  # noqa: E731
        WebDriverWait(driver, 30).until(lambda d: state(d) == "error")
        assert "WINDOW '0m'" in driver.find_element(By.ID, "qf-status").text  # the clause is named
        field = driver.find_element(By.ID, "qf-text")
        field.clear()
        field.send_keys(text)
        driver.find_element(By.ID, "qf-preview").click()
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "qf-chart").get_attribute("data-points"))
        assert int(driver.find_element(By.ID, "qf-chart").get_attribute("data-points")) == 6  # 10-minute windows, 1 h
        driver.find_element(By.ID, "qf-token").send_keys("wrong")
        driver.find_element(By.ID, "qf-save").click()
        WebDriverWait(driver, 30).until(lambda d: "admin token" in d.find_element(By.ID, "qf-status").text)
        assert ConfigStore(store).current().entries.get("web_max") is None
        token = driver.find_element(By.ID, "qf-token")
        token.clear()
        token.send_keys(ADMIN_TOKEN)
        saved = time.time()
        driver.find_element(By.ID, "qf-save").click()
        wait_refreshed(driver, saved)
        assert ConfigStore(store).current().entry("web_max").query == text
        panel = driver.find_element(By.CSS_SELECTOR, "[data-query='web_max']")
        assert panel.get_attribute("data-backfilled") == "false"

        # The next micro-batch (here in-process, reading the config store) adopts it: every window is still open.
        more = make_events(2, to - 600_000, to, 50)
        ingest(store, log, more, queries=None)
        stored = [
            r
            for r in DeltaTable(table_uri(store, "query_results")).to_pyarrow_table().to_pylist()
            if r["query"] == "web_max"
        ]
        assert stored, "the batch did not adopt web_max"
        time.sleep(1.5)  # the dashboard looks a table's newest version up at most every second
        clicked = time.time()
        driver.find_element(By.CSS_SELECTOR, "button[data-range='1h']").click()
        wait_refreshed(driver, clicked)
        facts = panel_facts(driver)
        windows = {
            k[2]
            for k in expected_query_results(events + more, [ConfigStore(store).current().entry("web_max").parsed()])
            if to - HOUR_MS <= k[2] < to
        }
        assert facts["web_max"]["points"] == len(windows) == 6
        driver.save_screenshot(str(ARTIFACTS / "dashboard-query-form.png"))
    finally:
        driver.quit()


def test_the_alerts_and_servers_panels_show_a_silent_server_and_its_firing_alert(settings, store, log):
    """An absence alert raised by the speed layer (in-process) is listed as firing, its server as silent."""
    from metrics_lake.agents.simulator import FleetSimulator
    from metrics_lake.core.config_store import Change
    from metrics_lake.core.log.consumer import end_offsets
    from metrics_lake.core.log.producer import Producer
    from metrics_lake.core.speed.micro_batch import run_batch_in_process
    from tests.app.test_alerts_api import NOW_MS

    ConfigStore(store).apply([Change("put", "quiet", "ABSENT host.cpu.utilization FROM sim-* FOR 1s", kind=ALERT)])
    for servers, seed in ((4, 0), (3, 1)):  # sim-0003 goes silent
        sim = FleetSimulator(servers=servers, metrics=2, seconds=30, seed=seed, start_ms=NOW_MS + seed * 30_000)
        with Producer(log, settings.topic, partitions=2) as producer:
            producer.send(sim.generate())
        run_batch_in_process(
            store, settings.topic, end_offsets(log, settings.topic), watermark_seconds=60, clock_skew_seconds=300
        )
        time.sleep(1.2)
    with served(settings) as url:
        driver = browser()
        try:
            started = time.time()
            driver.get(f"{url}#alert=quiet")  # the generatorURL Alertmanager links to
            wait_refreshed(driver, started)
            alerts = driver.find_element(By.ID, "alerts")
            assert alerts.get_attribute("data-firing") == "1"
            row = alerts.find_element(By.XPATH, ".//tr[td[2][text()='quiet']]")
            assert row.value_of_css_property("font-weight") == "700"  # the linked rule's alerts stand out
            assert "sim-0003" in alerts.text and "firing" in alerts.text and "no host.cpu.utilization" in alerts.text
            servers = driver.find_element(By.ID, "servers")
            assert servers.get_attribute("data-silent") == "1" and "1 silent, 3 up" in servers.text
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "dashboard-alerts.png"))
        finally:
            driver.quit()


def test_the_label_filter_keeps_the_servers_it_selects_and_names_a_malformed_selector(settings, store, log):
    """Typing a selector in the header's labels box filters the servers panel by inventory labels."""
    from metrics_lake.agents.simulator import FleetSimulator
    from metrics_lake.core.inventory import Inventory, diff
    from metrics_lake.core.log.consumer import end_offsets
    from metrics_lake.core.log.producer import Producer
    from metrics_lake.core.speed.micro_batch import run_batch_in_process
    from tests.app.test_alerts_api import NOW_MS

    teams = {f"sim-{i:04d}": {"team": "payments" if i % 2 else "search", "dc": "eu"} for i in range(4)}
    Inventory(store).append(diff({}, teams, full=True))
    with Producer(log, settings.topic, partitions=2) as producer:
        producer.send(FleetSimulator(servers=4, metrics=1, seconds=30, seed=0, start_ms=NOW_MS).generate())
    run_batch_in_process(
        store, settings.topic, end_offsets(log, settings.topic), watermark_seconds=60, clock_skew_seconds=300
    )
    with served(settings) as url:
        driver = browser()
        try:
            started = time.time()
            driver.get(url)
            wait_refreshed(driver, started)
            assert "4 up" in driver.find_element(By.ID, "servers").text
            for text, shown in (
                ("team=payments", ["sim-0001", "sim-0003"]),
                ("dc=eu,team!=payments", ["sim-0000", "sim-0002"]),
            ):
                field = driver.find_element(By.ID, "select")
                field.clear()
                started = time.time()
                field.send_keys(text + "\n")
                wait_refreshed(driver, started)
                # An auto-refresh that read the cleared field may finish after `started`: wait for the one after Enter.
                redrawn = WebDriverWait(driver, 60, ignored_exceptions=(StaleElementReferenceException,))
                redrawn.until(lambda d, want=shown: server_names(d) == want)
                servers = driver.find_element(By.ID, "servers")
                rows = servers.find_elements(By.XPATH, ".//tbody/tr/td[2]")
                assert sorted(r.text for r in rows) == shown, text
                assert "2 up" in servers.text
            field = driver.find_element(By.ID, "select")
            field.clear()
            started = time.time()
            field.send_keys("1x=y\n")
            wait_refreshed(driver, started)
            redrawn = WebDriverWait(driver, 60, ignored_exceptions=(StaleElementReferenceException,))
            redrawn.until(lambda d: "error:" in d.find_element(By.ID, "servers").text)
            meta = driver.find_element(By.ID, "servers").text
            assert "error:" in meta and "select" in meta and "1x" in meta, meta

            # Overlapping refreshes: the unfiltered list answered last must not replace the filtered one.
            driver.execute_script(SLOW_UNFILTERED_SERVERS)
            driver.execute_script("document.getElementById('select').value = ''; refresh();")
            started = time.time()
            driver.find_element(By.ID, "select").send_keys("team=payments\n")
            wait_refreshed(driver, started)
            WebDriverWait(driver, 30).until(lambda d: d.execute_script("return window.slowAnswers") == 1)
            assert server_names(driver) == ["sim-0001", "sim-0003"]
        finally:
            driver.quit()
