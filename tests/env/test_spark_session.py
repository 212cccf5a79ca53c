"""The harness's SparkSession: local, on this interpreter, Python workers usable."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.spark


def test_session_is_local_with_two_cores(spark):
    assert spark.sparkContext.master == "local[2]"


def test_python_workers_run_this_interpreter(spark):
    rdd = spark.sparkContext.parallelize([0, 1], 2)
    assert set(rdd.map(lambda _: __import__("sys").executable).collect()) == {sys.executable}


def test_python_tasks_share_one_daemon_and_keep_one_idle_worker(spark):
    """SQL's Python tasks (``mapInArrow``) and an RDD's (a snapshot's chunks) are served by one daemon; a job of two
    tasks side by side starts two workers, and once it ends one stays for the next job (each holds its own ~100 MB);
    the next job of two runs as well."""
    import os
    import time

    def processes() -> dict[int, tuple[int, str]]:
        procs: dict[int, tuple[int, str]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                procs[int(d)] = (ppid, cmd)
        return procs

    def daemons_and_workers() -> tuple[set[int], list[int]]:
        """The JVM's Python daemons in this test's process tree, and the workers they forked."""
        procs = processes()

        def mine(pid: int) -> bool:
            while pid > 1 and pid in procs:
                if pid == os.getpid():
                    return True
                pid = procs[pid][0]
            return False

        forked = {p for p, (_, cmd) in procs.items() if "pyspark.daemon" in cmd and mine(p)}
        daemons = {p for p in forked if procs[p][0] not in forked}
        return daemons, [p for p in forked if procs[p][0] in daemons]

    def rdd_job() -> set[int]:
        rdd = spark.sparkContext.parallelize([0, 1], 2)
        return set(rdd.map(lambda _: (__import__("time").sleep(1.0), __import__("os").getpid())[1]).collect())

    def sql_job(it):  # (a Python task of SQL's: mapInArrow)
        yield from it

    spark.range(0, 10, 1, 2).mapInArrow(sql_job, "id long").collect()
    assert len(rdd_job()) == 2  # side by side: two workers
    deadline = time.monotonic() + 10
    while len(daemons_and_workers()[1]) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    daemons, workers = daemons_and_workers()
    assert len(daemons) == 1 and len(workers) == 1
    assert len(rdd_job()) == 2


def test_class_archive_is_used_only_when_complete(tmp_path, monkeypatch):
    """The JVM maps the class archive only once ``build_class_archive`` renamed it into place; while a build runs,
    its JVM writes the archive under a temporary name given by the environment."""
    from mirrorline import sparkenv

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MIRRORLINE_CLASS_ARCHIVE_BUILD", raising=False)
    path = sparkenv.class_archive()
    assert path.parent == tmp_path / "mirrorline" and path.suffix == ".jsa"
    assert sparkenv._archive_opts() == ""
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert sparkenv._archive_opts().startswith(f"-XX:SharedArchiveFile={path} ")
    monkeypatch.setenv("MIRRORLINE_CLASS_ARCHIVE_BUILD", str(tmp_path / "building.jsa"))
    assert sparkenv._archive_opts() == f"-XX:ArchiveClassesAtExit={tmp_path / 'building.jsa'}"


def test_archives_of_environments_that_are_gone_are_pruned(tmp_path):
    """Each archive is built for one interpreter (one virtual environment); those whose interpreter no longer
    exists are removed with the file naming it. An archive with no such file (made before it was recorded) stays."""
    from mirrorline import sparkenv

    live, gone, legacy = (tmp_path / f"spark-4.0.0-{k}.jsa" for k in ("aaa", "bbb", "ccc"))
    for a in (live, gone, legacy):
        a.write_bytes(b"archive")
    (tmp_path / "spark-4.0.0-aaa.jsa.python").write_text(sys.executable)
    (tmp_path / "spark-4.0.0-bbb.jsa.python").write_text(str(tmp_path / "gone-venv" / "bin" / "python") + "\n")
    assert sparkenv.prune_class_archives(tmp_path) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "spark-4.0.0-aaa.jsa",
        "spark-4.0.0-aaa.jsa.python",
        "spark-4.0.0-ccc.jsa",
    ]


def test_the_jvms_banner_is_not_printed_and_its_errors_are():
    """Spark's launcher always adds an incubator module, and every JVM then prints a banner on stderr: mirrorline
    passes the JVM's stderr on without it. What else the JVM says still reaches stderr (here: an error logged through
    log4j)."""
    import subprocess

    code = (
        "from mirrorline.sparkenv import get_spark; s = get_spark(); assert s.range(3).count() == 3; "
        "s._jvm.org.apache.logging.log4j.LogManager.getLogger('mirrorline.test').error('said by the JVM')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Using incubator modules" not in r.stderr
    assert "said by the JVM" in r.stderr, r.stderr[-2000:]


IDLE_JVM = """
import json
from pyspark.sql import functions as F
from mirrorline import sparkenv
spark = sparkenv.get_spark("local[2]")
runtime = spark._jvm.java.lang.Runtime.getRuntime()
rows = spark.range(0, 4_000_000).selectExpr("id % 1000 AS k", "CAST(id AS STRING) AS s")
rows.groupBy("k").agg(F.max("s")).collect()
grown = int(runtime.totalMemory())
freed = sparkenv.shrink()
bean = spark._jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
    spark._jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
)
ratios = [int(bean.getVMOption(n).getValue()) for n in ("MinHeapFreeRatio", "MaxHeapFreeRatio")]
print(json.dumps({"grown": grown, "freed": freed, "total": int(runtime.totalMemory()), "again": sparkenv.shrink(),
                  "ratios": ratios}))
"""


def test_an_idle_jvm_gives_back_the_heap_its_work_left_unused() -> None:
    """After a job that grew the heap (mostly with garbage), ``shrink`` (run calls it when idle) collects it once, and
    the serial collector gives back what is unused beyond the idle MaxHeapFreeRatio in that one collection; called
    again with nothing grown, it collects nothing. (A JVM of its own: the suite's shared one holds other tests'
    heap.)"""
    import json
    import subprocess

    from mirrorline import sparkenv

    r = subprocess.run([sys.executable, "-c", IDLE_JVM], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    grown, freed, total = got["grown"], got["freed"], got["total"]
    assert freed == grown - total and total < 0.6 * grown, (grown >> 20, total >> 20)  # in steps: ~5% at first
    assert got["again"] == 0
    assert tuple(got["ratios"]) == sparkenv.WORK_FREE  # (the idle ratios only for shrink's collection)
