"""The log's cap end to end: a target left behind by ``[log] max_age`` needs a reload; status shows it and
exits 1, apply refuses it naming the command, the other target goes on, and ``snapshot --target`` brings it back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import oracle
import pytest
from snapshot_support import capture_once, create_items, write_config

from mirrorline.cli.main import main
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import needs_reload

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def test_a_target_behind_the_cap_needs_a_reload_and_snapshot_brings_it_back(
    pg: Any, spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    create_items(pg.dsn, rows=200)
    cfg = write_config(
        tmp_path,
        pg.dsn,
        {"fast": f"sqlite:///{tmp_path / 'fast.db'}", "slow": f"sqlite:///{tmp_path / 'slow.db'}"},
        {"public.items": {}},
        log={"max_age": "2s"},
    )
    conf = str(cfg.file)
    assert main(["run", "--once", "-c", conf]) == 0  # both loaded
    pg.execute("UPDATE public.items SET qty = qty + 1 WHERE id <= 100")
    capture_once(cfg)
    time.sleep(2.5)  # the changes are now older than the cap
    assert main(["apply", "--once", "-c", conf, "--target", "fast"]) == 0  # fast applies; retention trims the log
    assert list(needs_reload(ChangeLog(cfg.log.path))) == ["slow"]
    capsys.readouterr()
    assert main(["status", "-c", conf, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {t["name"]: t["state"] for t in doc["targets"]}["slow"] == "needs reload"
    assert any("slow needs a reload" in p for p in doc["problems"])
    assert main(["apply", "--once", "-c", conf, "--target", "slow"]) == 3
    assert "mirrorline snapshot --target slow" in capsys.readouterr().err
    assert main(["snapshot", "-c", conf, "--target", "slow", "--quiet"]) == 0
    assert needs_reload(ChangeLog(cfg.log.path)) == {}
    assert main(["apply", "--once", "-c", conf]) == 0
    for name in ("fast", "slow"):  # read independently before verify is asked
        oracle.assert_same(pg.dsn, "sqlite", f"sqlite:///{tmp_path / name}.db", "public.items")
    assert main(["verify", "-c", conf]) == 0
