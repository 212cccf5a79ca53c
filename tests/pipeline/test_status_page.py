"""``run``'s status page (``[metrics] listen``: ``/`` beside ``/metrics``), read by a real browser: Debian's
chromium, headless, driven by Selenium through Debian's chromedriver (both installed by ``./dev setup``; the test
is skipped, saying so, where they are missing). Every target shows live; a table made to fail at one target shows
stopped with its reason within 10 s; the lag chart holds points. ``MIRRORLINE_SCREENSHOT=FILE`` keeps a picture of
the page (the README's). The page's HTML alone (names escaped, the chart's points) is tested without a browser."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from snapshot_support import RunnerThread, create_items, write_config
from waiting import wait_until

from mirrorline.pgcluster import free_port
from mirrorline.pipeline import Runner
from mirrorline.statuspage import Page, StoppedTable, TargetRow, render


def test_the_page_escapes_names_and_draws_a_line_per_target() -> None:
    now = time.time()
    page = Page(
        now=now,
        targets=[TargetRow("a<b", "live", "0/10:0", 0.5, 10), TargetRow("c", "stopped", "", None, None, "down")],
        stopped=[StoppedTable("a<b", 'public."x&y"', "refused <bad>", now - 5, "fix it")],
        history=[(now - 30, {"a<b": 1.0, "c": 2.0}), (now - 20, {"a<b": 3.0}), (now - 10, {"a<b": 0.0, "c": 4.0})],
        log_bytes=2048,
        slot="s",
        slot_retained_bytes=10 << 20,
        capture_running=True,
    )
    doc = render(page)
    assert "a&lt;b" in doc and "a<b" not in doc and "refused &lt;bad&gt;" in doc and "x&amp;y" in doc
    assert 'data-target="a&lt;b" data-points="3"' in doc and 'data-target="c" data-points="2"' in doc
    assert (
        '<meta http-equiv="refresh"' in doc and "<script" not in doc and "http://" not in doc.replace("http-equiv", "")
    )
    assert "10.0 MB" in doc and "2.0 kB" in doc


def _browser() -> Any:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no chromium and chromedriver on this machine (./dev setup installs Debian's): no browser test")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (./dev setup installs it)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=420,1400"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.mark.pg
@pytest.mark.spark
def test_the_status_page_in_a_browser(pg: Any, spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from selenium.webdriver.common.by import By

    from mirrorline.metrics import RunMetrics

    browser = _browser()
    monkeypatch.setattr(RunMetrics, "sample_seconds", 0.5)
    create_items(pg.dsn, rows=100)
    port = free_port()
    cfg = write_config(
        tmp_path,
        pg.dsn,
        {"cache": f"sqlite:///{tmp_path / 'cache.db'}", "duck": f"duckdb:///{tmp_path / 'duck.duckdb'}"},
        {"public.items": {}},
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    runner = Runner(cfg)
    thread = RunnerThread(runner)
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until(
            lambda: runner.loaded.is_set() or bool(thread.errors), timeout=120, what="run has loaded its targets"
        )
        assert not thread.errors, thread.errors

        def states() -> dict[str, str]:
            browser.get(url)
            rows = browser.find_elements(By.CSS_SELECTOR, "tr.target")
            return {r.get_attribute("data-target"): r.get_attribute("data-state") for r in rows}

        wait_until(lambda: states() == {"cache": "live", "duck": "live"}, timeout=60, interval=0.5, what="both live")
        # the target refuses a row: within 10 s the page shows the table stopped there, with the reason
        with sqlite3.connect(tmp_path / "cache.db") as db:
            db.execute(
                "CREATE TRIGGER no_bad BEFORE INSERT ON items WHEN NEW.name = 'bad' "
                "BEGIN SELECT RAISE(ABORT, 'no bad names here'); END"
            )
        pg.execute("INSERT INTO public.items (id, name, qty) VALUES (2000, 'bad', 1)")
        t0 = time.monotonic()

        def stopped() -> list[Any]:
            browser.get(url)
            return browser.find_elements(By.CSS_SELECTOR, '.stopped-table[data-target="cache"]')

        rows = wait_until(stopped, timeout=30, interval=0.5, what="the page shows the table stopped")
        assert time.monotonic() - t0 < 10, "the page shows it within 10 s of the change it refused"
        assert rows[0].get_attribute("data-table") == "public.items"
        assert "no bad names here" in rows[0].text
        assert states()["duck"] == "live"
        lines = browser.find_elements(By.CSS_SELECTOR, "polyline.lag")
        assert {ln.get_attribute("data-target") for ln in lines} == {"cache", "duck"}
        assert all(int(ln.get_attribute("data-points")) >= 2 for ln in lines)
        shot = os.environ.get("MIRRORLINE_SCREENSHOT")
        browser.save_screenshot(shot or str(tmp_path / "status-page.png"))
    finally:
        browser.quit()
        runner.stop()
        thread.join(60)
