"""``run`` serves its metrics over HTTP for Prometheus: lag per target, unit durations as histograms,
changes and rows applied, capture's counters and the slot's retained WAL, scraped from a running ``run``; a bad
``[metrics] listen`` is refused at start."""

from __future__ import annotations

import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import configs
import pytest
from prometheus_client.parser import text_string_to_metric_families
from snapshot_support import RunnerThread, create_items, write_config
from waiting import wait_until

from mirrorline import config as C
from mirrorline.pgcluster import free_port
from mirrorline.pipeline import Runner

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def _served(address: tuple[str, int]) -> set[str]:
    """Every metric name ``run`` serves, as a query names it: a family's samples (``_total``, ``_bucket``, ...),
    and the family itself where it has none yet (a counter with labels before its first increment)."""
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as r:
        text = r.read().decode()
    names = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update(
            {"counter": [fam.name + "_total"], "histogram": [fam.name + x for x in ("_bucket", "_count", "_sum")]}.get(
                fam.type, []
            )
        )
        names.update(s.name for s in fam.samples)
    return names


def _contrib_metrics() -> dict[str, set[str]]:
    """The metrics each panel of contrib/grafana/mirrorline.json and each rule of contrib/prometheus/alerts.yml
    names, by panel title or alert name."""
    import json
    import re

    import yaml

    root = Path(__file__).resolve().parents[2] / "contrib"
    names = re.compile(r"\bmirrorline_[a-z_]+")
    out: dict[str, set[str]] = {}
    dash = json.loads((root / "grafana" / "mirrorline.json").read_text())
    for panel in dash["panels"]:
        out[f"panel {panel['title']}"] = {n for t in panel["targets"] for n in names.findall(t["expr"])}
    rules = yaml.safe_load((root / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            out[f"alert {rule['alert']}"] = set(names.findall(rule["expr"]))
    return out


def _scrape(address: tuple[str, int]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _fail_on(errors: list[BaseException]) -> bool:
    """False while the runner's thread raised nothing (a wait goes on); fails with what it raised."""
    assert not errors, errors
    return False


def test_run_serves_its_metrics(pg: Any, spark: Any, tmp_path: Path) -> None:
    create_items(pg.dsn, rows=100)
    port = free_port()
    cfg = write_config(
        tmp_path,
        pg.dsn,
        {"cache": f"sqlite:///{tmp_path / 'cache.db'}"},
        {"public.items": {}},
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    assert cfg.metrics.listen == ("127.0.0.1", port)
    runner = Runner(cfg)
    thread = RunnerThread(runner)
    errors = thread.errors
    thread.start()

    try:
        wait_until(
            lambda: (runner.metrics_address is not None and runner.loaded.is_set()) or _fail_on(errors),
            timeout=120,
            what="run serves its metrics and has loaded its target",
        )
        address = runner.metrics_address
        assert address is not None
        pg.execute("INSERT INTO public.items (id, name, qty) SELECT g, 'm' || g, g FROM generate_series(1001, 1050) g")
        applied = ("mirrorline_changes_applied_total", (("target", "cache"),))
        got = wait_until(
            lambda: ((m := _scrape(address)).get(applied, 0) >= 50 and m) or _fail_on(errors),
            timeout=120,
            interval=0.2,
            what="50 changes are applied",
            context=lambda: _scrape(address),
        )
        assert got[("mirrorline_rows_applied_total", (("kind", "I"), ("target", "cache")))] >= 50
        assert got[("mirrorline_unit_apply_seconds_count", (("target", "cache"),))] >= 1
        assert got[("mirrorline_unit_compile_seconds_count", ())] >= 1
        assert ("mirrorline_target_lag_seconds", (("target", "cache"),)) in got
        assert got[("mirrorline_target_lag_bytes", (("target", "cache"),))] >= 0
        assert got[("mirrorline_capture_changes", ())] >= 50
        assert got[("mirrorline_slot_retained_wal_bytes", (("slot", "mirrorline"),))] > 0
        assert got[("mirrorline_capture_running", ())] == 1
        # every metric the Grafana dashboard and the alert rules of contrib/ name is served (neither rots)
        served = _served(address)
        wanted = _contrib_metrics()
        assert len(wanted) >= 15 and all(wanted.values()), wanted
        missing = {where: names - served for where, names in wanted.items() if names - served}
        assert not missing, missing
        stopped = ("mirrorline_table_stopped", (("table", "public.items"), ("target", "cache")))
        assert got[stopped] == 0 and got[("mirrorline_target_stopped", (("target", "cache"),))] == 0
        # the target refuses a row: the table is stopped alone at it, and the metrics say so
        with sqlite3.connect(tmp_path / "cache.db") as db:
            db.execute(
                "CREATE TRIGGER no_bad BEFORE INSERT ON items WHEN NEW.name = 'bad' "
                "BEGIN SELECT RAISE(ABORT, 'no'); END"
            )
        pg.execute("INSERT INTO public.items (id, name, qty) VALUES (2000, 'bad', 1)")
        wait_until(
            lambda: _scrape(address).get(stopped) == 1 or _fail_on(errors),
            timeout=180,
            interval=0.2,
            what="the metrics say the table is stopped",
            context=lambda: _scrape(address),
        )
    finally:
        runner.stop()
        thread.join(60)
    assert not errors, errors
    with pytest.raises(OSError):  # the server stops with run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.parametrize("listen", ["9187", "localhost", "127.0.0.1:99999", "a b:1"])
def test_a_bad_listen_address_is_refused(tmp_path: Path, listen: str) -> None:
    (tmp_path / "m.toml").write_text(f'[log]\npath = "log"\n[metrics]\nlisten = "{listen}"\n')
    with pytest.raises(C.ConfigError, match=r"metrics\.listen"):
        C.load(tmp_path / "m.toml")


def test_metrics_open_to_other_hosts_are_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Served beyond this machine (no authentication), the metrics start with a warning; on loopback, quietly."""
    import logging

    from mirrorline.metrics import RunMetrics, loopback

    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("10.1.2.3") and not loopback("db.example")
    for listen, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
        conf = configs.load(tmp_path / "m.toml", log="log", metrics={"listen": f"{listen}:{free_port()}"})
        m = RunMetrics(conf, dict, lambda: None)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mirrorline.metrics"):
            m.start()
        m.stop()
        assert any("without authentication" in r.message for r in caplog.records) is warned, listen
