"""Capture's memory stays bounded whatever the size of a transaction: one transaction of 2,000,000 rows with
logical_decoding_work_mem = 64kB (streamed in thousands of blocks, spilled to disk as they arrive) keeps the capture
process's peak RSS (VmHWM) under 300 MB."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import configs
import pytest
from waiting import wait_until

from mirrorline.log.reader import ChangeLog

pytestmark = [pytest.mark.pg, pytest.mark.slow]

ROWS = 2_000_000


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


def test_two_million_row_transaction_keeps_capture_under_300_mb(pg_cluster_factory: Any, tmp_path: Path) -> None:
    cluster = pg_cluster_factory(logical_decoding_work_mem="64kB")
    cluster.execute("CREATE TABLE big (id int PRIMARY KEY, note text)")
    cfg = configs.write(tmp_path / "mirrorline.toml", source=cluster.dsn(), log="log", tables=["public.big"])
    err = tmp_path / "capture.err"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mirrorline.cli.main", "capture", "-c", str(cfg)], stderr=err.open("wb")
    )

    def capturing() -> bool:
        if "capturing" in err.read_text():
            return True
        assert proc.poll() is None, err.read_text()
        return False

    try:
        wait_until(capturing, timeout=60, what="capture says it is capturing", context=err.read_text)
        baseline = peak_rss_mb(proc.pid)
        cluster.execute(f"INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, {ROWS}) g")
        log = ChangeLog(tmp_path / "log")

        def all_logged() -> bool:
            if log.count() >= ROWS:
                return True
            assert proc.poll() is None, err.read_text()
            return False

        wait_until(
            all_logged,
            timeout=240,
            interval=0.5,
            what=f"all {ROWS} rows are captured",
            context=lambda: f"only {log.count()} rows captured",
        )
        peak = peak_rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0, err.read_text()
    print(f"capture peak RSS {peak:.0f} MB (after start {baseline:.0f} MB) for a {ROWS}-row transaction")
    assert peak < 300
    (segment,) = log.segments()
    assert segment.stream and segment.count == ROWS
    first = next(log.read())
    assert first.key == ("1",) and first.new == {"id": "1", "note": "c4ca4238a0b923820dcc509a6f75849b"}
