"""Exactly once under crashes: ``apply`` killed with SIGKILL at random moments at least 20 times, restarted each time;
afterwards every target equals the source."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
from crash_support import KILLS, finish, kill_loop, mirrorline_process
from pipeline_support import assert_same, config_text, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.log.reader import ChangeLog
from mirrorline.workload import EVENTS, Workload

# its own time limit, about three times what each test takes on 2 cores (the suite's is 900 s)
pytestmark = [pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(600)]


def test_apply_killed_at_random_applies_everything_exactly_once(pg, pg_cluster, tmp_path):
    work = Workload(pg.dsn, seed=7)
    work.create()
    urls = {
        "pgt": target_url("postgresql", tmp_path, pg_cluster, f"crash_apply_{pg.name[-6:]}"),
        "lite": target_url("sqlite", tmp_path, pg_cluster, "lite"),
    }
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(
        config_text(pg.dsn, tmp_path / "log", {n: (u, "update") for n, u in urls.items()}, max_changes=150)
    )
    conf = cfg.load(conf_file)
    Capture(conf, once=True).run()
    work.run(transactions=900)
    work.every_kind()
    work.large_transaction(500)
    work.large_transaction(400, abort=True)
    stats = Capture(conf, once=True).run()
    assert stats.streamed >= 1 and stats.aborted >= 1, "large transactions streamed (logical_decoding_work_mem 64kB)"
    assert all(work.counts[e] >= 1 for e in EVENTS), f"every kind of event happened: {dict(work.counts)}"
    rng = random.Random(11)
    log = ChangeLog(conf.log.path)
    assert (log.count() or 0) > 150 * 20, "enough units that kills land between and inside them"

    def more_work() -> None:  # keep something to apply if a run got far
        work.run(transactions=150)  # several units: the process must not finish before a kill
        Capture(conf, once=True).run()

    # apply --once folds these units on the driver without starting Spark: a unit takes a fraction of a second,
    # so the kills come soon after the start and after a unit, or the process would be done before them
    args = ["apply", "--once", "-c", str(conf_file)]
    landed, mid_apply = kill_loop(args, tmp_path, rng, more_work, start_up=(0.2, 2.0), after_unit=(0.0, 0.3))
    assert landed >= KILLS and mid_apply >= KILLS // 2
    finish(["apply", "--once", "-c", str(conf_file)], tmp_path)
    for name, url in urls.items():
        assert_same(pg.dsn, "postgresql" if name == "pgt" else "sqlite", url)


def _ahead_open(path: Path) -> bool:
    """Is a unit compiling ahead now: the log's last "compiling the next unit" line has no "compiled" line after it,
    and the unit being applied meanwhile has not been reported yet?"""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return False
    for line in reversed(lines):
        if "compiled the next unit" in line or line.startswith("unit "):
            return False
        if "compiling the next unit" in line:
            return True
    return False


def test_apply_killed_while_the_next_unit_compiles_and_this_one_applies(pg, pg_cluster, tmp_path):
    """Kills aimed at the overlap: the targets apply unit N (in parallel) while unit N+1 compiles. Each kill lands
    once the log shows N+1's compile started and not finished; afterwards every target equals the source."""
    work = Workload(pg.dsn, seed=13)
    work.create()
    urls = {
        "pgt": target_url("postgresql", tmp_path, pg_cluster, f"crash_ahead_{pg.name[-6:]}"),
        "lite": target_url("sqlite", tmp_path, pg_cluster, "lite"),
        "duck": target_url("duckdb", tmp_path, pg_cluster, "duck"),
    }
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(
        config_text(pg.dsn, tmp_path / "log", {n: (u, "update") for n, u in urls.items()}, max_changes=200)
    )
    conf = cfg.load(conf_file)
    Capture(conf, once=True).run()
    work.run(transactions=900)
    Capture(conf, once=True).run()
    rng = random.Random(17)
    child_log = tmp_path / "child.log"
    args = ["apply", "-v", "--once", "-c", str(conf_file)]
    landed = attempts = 0
    while landed < KILLS // 2:
        attempts += 1
        assert attempts < KILLS * 2, "no kill landed while a unit compiled ahead"
        child_log.unlink(missing_ok=True)
        proc = mirrorline_process(*args, log_file=child_log)
        deadline = time.monotonic() + 180
        skip = rng.randrange(3)  # not always the first overlap of a run
        while proc.poll() is None and time.monotonic() < deadline:
            if _ahead_open(child_log):
                if skip == 0:
                    break
                skip -= 1
                while proc.poll() is None and _ahead_open(child_log):
                    time.sleep(0.005)
            time.sleep(0.005)
        if proc.poll() is None and _ahead_open(child_log):
            proc.send_signal(signal.SIGKILL)
            landed += 1
        proc.wait()
        if proc.returncode == 0:  # it finished: give the next run something to apply
            work.run(transactions=150)
            Capture(conf, once=True).run()
    finish(["apply", "--once", "-c", str(conf_file)], tmp_path)
    for name, url in urls.items():
        assert_same(pg.dsn, {"pgt": "postgresql", "lite": "sqlite", "duck": "duckdb"}[name], url)
