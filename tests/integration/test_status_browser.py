"""The status page in a real headless browser: Debian's chromium driven through chromium-driver (selenium).

The page loads, lists the batches this test ran with the numbers of ``ssc.batchInfos()``, draws the stream
graph, and shows a new batch without being reloaded. ``scripts/services.sh start chromium`` installs the
browser; without it the test skips, or fails when services are required (``CI=true``), as for the other
services (tests/support.py). Every wait is bounded; the browser is quit and the context stopped.
"""

from __future__ import annotations

import operator
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from dstreams import ManualClock, StreamingContext

from ..support import service_unavailable

WAIT_S = 30
BATCHES = 3
RECORDS_PER_PARTITION, PARTITIONS = 4, 2


def _executable(names: tuple[str, ...]) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium through chromium-driver (Debian's packages, never a download)."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        service_unavailable("selenium is not installed: pip install -e '.[test]'")
    chromium = _executable(("chromium", "chromium-browser"))
    driver_path = _executable(("chromedriver",))
    if chromium is None or driver_path is None:
        service_unavailable("chromium and chromium-driver are not installed: run `bash scripts/services.sh start "
                            "chromium` (apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,2000",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except WebDriverException as e:
        service_unavailable(f"headless chromium ({chromium}) did not start through {driver_path}: {e.msg}")
    try:
        driver.set_page_load_timeout(WAIT_S)
        driver.set_script_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()


def _rows(driver: Any) -> dict[int, dict[str, str]]:
    """The batches table: batch time (ms) -> the text of each cell, by its data-field."""
    script = """
        const out = {};
        for (const row of document.querySelectorAll('#batches tr[data-batch-time]')) {
          const cells = {};
          for (const td of row.querySelectorAll('td[data-field]')) cells[td.dataset.field] = td.textContent;
          out[row.dataset.batchTime] = cells;
        }
        return out;"""
    return {int(k): v for k, v in driver.execute_script(script).items()}


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.slow
def test_the_page_shows_the_batches_and_updates(browser, sc):  # no browser: skip before Spark starts
    from selenium.webdriver.support.ui import WebDriverWait

    clock = ManualClock()
    ssc = StreamingContext(sc, 1, clock=clock)
    words = ssc.generatorStream(RECORDS_PER_PARTITION, PARTITIONS,
                                recordFunc=lambda seed, t, p, n: [f"w{t}-{p}-{j % 3}" for j in range(n)])
    counts = words.map(lambda w: (w, 1)).runningReduce(operator.add)
    counts.foreachRDD(lambda rdd: rdd.count())
    words.window(2, 1).count().foreachRDD(lambda rdd: rdd.collect())
    ssc.start()
    try:
        start = ssc.startTime.ms
        for i in range(BATCHES):
            clock.advance(1000)
            ssc.awaitBatch(start + i * 1000, WAIT_S)
        url = ssc.uiWebUrl
        assert url is not None
        browser.get(url)
        wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.1)
        times = [start + i * 1000 for i in range(BATCHES)]
        wait.until(lambda d: set(times) <= set(_rows(d)), f"the page lists the batches {times}")
        rows = _rows(browser)
        infos = {i.batch_time_ms: i for i in ssc.batchInfos()}
        assert set(rows) == set(infos) == set(times)
        for t, cells in rows.items():
            info = infos[t]
            assert _number(cells["num_records"]) == info.numRecords() == RECORDS_PER_PARTITION * PARTITIONS
            assert _number(cells["scheduling_delay_ms"]) == info.schedulingDelay()
            assert _number(cells["processing_delay_ms"]) == info.processingDelay()
            assert _number(cells["total_delay_ms"]) == info.totalDelay()
            assert cells["status"] == "ok"
        # newest first
        assert [int(r.get_attribute("data-batch-time")) for r in
                browser.find_elements("css selector", "#batches tr[data-batch-time]")] == sorted(times, reverse=True)
        # the Spark jobs of each batch (found by its job group; the tests' Spark UI is off: ids without links)
        wait.until(lambda d: all(c["spark_jobs"].startswith("#") for c in _rows(d).values()), "the jobs column")
        # the stream graph: one box per stream with its kind, the edges between them
        kinds = browser.execute_script(
            "return [...document.querySelectorAll('#graph g.node')].map(g => g.dataset.kind)")
        assert sorted(set(kinds)) == ["output", "source", "state", "transform", "window"]
        assert len(browser.find_elements("css selector", "#graph path.edge")) == len(kinds) - 1  # a tree here
        assert browser.find_element("id", "total-completed").text == str(BATCHES)
        assert browser.find_element("id", "state").text == "ACTIVE"
        assert browser.find_element("css selector", "#sources tr[data-source='000-GeneratorInputNode']")
        row = browser.find_element("css selector", "#state-table tr[data-stream='002-AutoRunningReduceNode']")
        assert row.find_element("css selector", "td.kept-in").text == "RDD (auto)"
        assert browser.find_element("id", "event-time").text.endswith("no event-time stream")
        assert browser.find_elements("css selector", "#chart-processing path.line")

        # A new batch shows up without a reload (the marker set on this page load survives).
        browser.execute_script("window.__dstreamsTestMarker = 42;")
        clock.advance(1000)
        newest = start + BATCHES * 1000
        ssc.awaitBatch(newest, WAIT_S)
        wait.until(lambda d: newest in _rows(d), "the new batch to appear without a reload")
        assert browser.execute_script("return window.__dstreamsTestMarker") == 42
        info = next(i for i in ssc.batchInfos() if i.batch_time_ms == newest)
        assert _number(_rows(browser)[newest]["processing_delay_ms"]) == info.processingDelay()
        wait.until(lambda d: d.find_element("id", "total-completed").text == str(BATCHES + 1), "the totals")
        screenshots = os.environ.get("DSTREAMS_TEST_TMP") or tempfile.gettempdir()
        browser.save_screenshot(os.path.join(screenshots, "dstreams-status-page.png"))
    finally:
        ssc.stop(stopSparkContext=False)
