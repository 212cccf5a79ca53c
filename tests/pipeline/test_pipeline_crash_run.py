"""Exactly once under crashes: ``run`` (capture, snapshot of new targets, compile, apply; DuckDB, PostgreSQL, Delta
and Iceberg targets) killed with SIGKILL at random moments at least 20 times while the source keeps changing,
restarted each time; afterwards every target equals the source."""

from __future__ import annotations

import random

import pytest
from crash_support import KILLS, SourceLoad, finish, kill_loop
from pipeline_support import assert_same, config_text, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.workload import Workload

# its own time limit, about three times what each test takes on 2 cores (the suite's is 900 s)
pytestmark = [pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(600)]


def test_run_killed_at_random_while_the_source_changes(pg, pg_cluster, tmp_path):
    work = Workload(pg.dsn, seed=8)
    work.create()
    urls = {
        "lake": target_url("duckdb", tmp_path, pg_cluster, "lake"),
        "pgt": target_url("postgresql", tmp_path, pg_cluster, f"crash_run_{pg.name[-6:]}"),
        "delta": target_url("delta", tmp_path, pg_cluster, "delta"),
        "ice": target_url("iceberg", tmp_path, pg_cluster, "ice"),
    }
    targets = {"lake": (urls["lake"], "mirror"), "pgt": (urls["pgt"], "update"), "delta": (urls["delta"], "update")}
    targets["ice"] = (urls["ice"], "update")
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(config_text(pg.dsn, tmp_path / "log", targets, max_changes=200, latency="300ms"))
    Capture(cfg.load(conf_file), once=True).run()  # slot and publication exist before the workload
    load = SourceLoad(work).start()
    try:
        landed, mid_apply = kill_loop(["run", "-c", str(conf_file)], tmp_path, random.Random(12))
    finally:
        load.stop()
    assert landed >= KILLS and mid_apply >= KILLS // 2
    # the backlog of the kill loop in bigger units: unit bounds are positions, so changing them on a restart is safe
    conf_file.write_text(config_text(pg.dsn, tmp_path / "log", targets, max_changes=5000, latency="300ms"))
    finish(["run", "--once", "-c", str(conf_file)], tmp_path)
    assert_same(pg.dsn, "duckdb", urls["lake"])
    assert_same(pg.dsn, "postgresql", urls["pgt"])
    assert_same(pg.dsn, "delta", urls["delta"])
    assert_same(pg.dsn, "iceberg", urls["ice"])
