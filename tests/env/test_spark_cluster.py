"""mirrorline on a real Spark standalone cluster: one master and two one-core workers on 127.0.0.1, started from
PySpark's own ``spark-class`` and stopped whatever happens. ``run --once`` (a separate process whose driver connects
to the cluster) loads every target kind by a snapshot whose chunks the executors read, compiles the changes made
after it on the cluster and applies them; ``verify`` reads the source on the cluster. Each target is then compared
with the source through its own client, and both workers must have run tasks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from crash_support import mirrorline_process
from pipeline_support import assert_same, config_text, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.sparkcluster import SparkCluster
from mirrorline.workload import Workload

pytestmark = [pytest.mark.pg, pytest.mark.slow]

KINDS = ["postgresql", "sqlite", "duckdb", "delta", "iceberg"]


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with SparkCluster(workers=2, cores=1, memory="1g", base=str(tmp_path)) as c:
        yield c


def _run(args: list[str], log: Path) -> int:
    proc = mirrorline_process(*args, log_file=log)
    return proc.wait(timeout=600)


def test_capture_snapshot_compile_apply_and_verify_on_a_standalone_cluster(
    pg: Any, pg_cluster: Any, tmp_path: Path, cluster: SparkCluster
) -> None:
    work = Workload(pg.dsn, seed=21)
    work.create()
    work.run(transactions=200)  # rows for the snapshot
    urls = {k: target_url(k, tmp_path, pg_cluster, f"cl_{k}_{pg.name[-6:]}") for k in KINDS}
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(
        config_text(pg.dsn, tmp_path / "log", {k: (u, "update") for k, u in urls.items()}, max_changes=2000)
        + f'[spark]\nmaster = "{cluster.master}"\npython = "{sys.executable}"\n'
        '[spark.conf]\n"spark.executor.memory" = "512m"\n"spark.cores.max" = 2\n'
    )
    conf = cfg.load(conf_file)
    assert conf.spark.master == cluster.master and conf.spark.scratch == tmp_path / "log" / "scratch"
    Capture(conf, once=True).run()  # slot and publication before the changes the snapshot does not hold
    log = tmp_path / "run.log"
    assert _run(["run", "--once", "-v", "-c", str(conf_file)], log) == 0, log.read_text()[-3000:]
    work.run(transactions=300)
    work.large_transaction(3000)
    assert _run(["run", "--once", "-v", "-c", str(conf_file)], log) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "loaded (whole target)" in text and "unit " in text
    for kind, url in urls.items():
        assert_same(pg.dsn, kind, url)
    assert _run(["verify", "-c", str(conf_file)], tmp_path / "verify.log") == 0, (tmp_path / "verify.log").read_text()
    # both workers ran executors of mirrorline's applications
    for i in range(2):
        apps = list((cluster.dir / f"worker{i}-work").glob("app-*/*/stderr"))
        assert apps, f"worker {i} ran no executor"
    assert _run(["status", "-c", str(conf_file)], tmp_path / "status.log") == 0
    assert f"spark: master {cluster.master}" in (tmp_path / "status.log").read_text()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_each_worker_can_be_given_a_cpu_of_its_own(tmp_path: Path) -> None:
    """What bench/compile --scaling relies on: one worker (and the executors it starts) per CPU; the master is not
    pinned."""
    with SparkCluster(workers=2, cores=1, memory="512m", base=str(tmp_path), cpus=[{0}, {1}]) as c:
        master, *workers = c.procs
        assert [os.sched_getaffinity(p.pid) for p in workers] == [{0}, {1}]
        assert os.sched_getaffinity(master.pid) == os.sched_getaffinity(0)
