"""Benchmark: compile generated units of work into net row changes on Spark (local[2]).

For each size: a generated unit (about 5 changes per key, 3 tables, inserts/updates/deletes, some unchanged-TOAST
updates and key changes) is written to Parquet in the log row layout (not timed); then, timed, it is compiled from
that Parquet, the net rows written to Parquet (compile_changes(out=...): nothing is skipped), with the unit's
statistics as ``run`` has them from the log's segment footers (``log.stats.table_stats`` of the unit: the tables'
first and last positions, TRUNCATEs and key changes, so no job counts them). The anchor, measured in the same run:
the Parquet scan alone (every column read and materialized, nothing written), the floor of any compile.

Where the seconds go (``stages`` of each size): each Spark stage of the timed compile, read from Spark's status API
(the UI's REST endpoint, enabled for this benchmark only): its wall seconds, the CPU and garbage-collection seconds
of its tasks summed over both cores, and the bytes it shuffled, in the order they ran (the scan and the shuffle's
write; the fold, its sort and the Parquet write of the net rows; with key changes that leave columns unsent, the
handoffs' second pass). ``gc_share``: the tasks' GC seconds over their run seconds.

Scaling (``--scaling``, on the largest size): the same log compiled by child processes on ``local[1]``,
``local[2]``, and a Spark standalone cluster on this machine (``mirrorline.sparkcluster``) with one and with two
one-core workers; the JSON line carries ``"scaling": {"local_1": ..., "local_2": ..., "cluster_1": ...,
"cluster_2": ...}`` in changes/s and the ratios ``local_2 / local_1`` and ``cluster_2 / cluster_1``.

"One core" is one core: on a machine of two, a ``local[1]`` JVM still runs its garbage collector and JIT compiler
threads (and the driver) on the other core, which flatters the one-core figure. So ``local_1`` runs pinned to CPU 0
(``sched_setaffinity``, inherited by the JVM); ``cluster_1``'s worker (and its executor) runs on CPU 0 and its
driver on CPU 1, as a driver on a machine of its own; ``cluster_2``'s workers run on CPU 0 and CPU 1 each, and its
driver shares them (there is no third core). CPU 0 and 1 are the first two this process may run on. The one-core
runs without pinning are reported as ``unpinned``, with their ratios to the same two-core figures.
``--repeat N`` compiles N times on each (the four in turn) and reports the medians, with every run under ``each``.

Prints ONE JSON line; progress goes to stderr.
    .venv/bin/python bench/compile.py [--sizes 1000000,10000000] [--scaling [--repeat N]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


class PeakMemory:
    """Samples the RSS of this process plus its children (the JVM) every 0.2 s; ``peak_mib`` is the largest sum."""

    def __init__(self) -> None:
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            total = _rss_kib(me) + sum(_rss_kib(c) for c in _children(me))
            self.peak_kib = max(self.peak_kib, total)
            self._stop.wait(0.2)

    def reset(self) -> None:
        self.peak_kib = 0

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mib(self) -> int:
        return self.peak_kib // 1024


def log(msg: str) -> None:
    print(f"[bench compile] {msg}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,10000000", help="comma-separated unit sizes (changes)")
    ap.add_argument("--workdir", help="where to write the Parquet files (default: a temporary folder)")
    ap.add_argument("--scaling", action="store_true", help="also compile the largest size on 1 and 2 cores/workers")
    ap.add_argument("--one", nargs=2, metavar=("MASTER", "SRC"), help=argparse.SUPPRESS)  # a scaling child
    ap.add_argument("--repeat", type=int, default=1, help="with --scaling: compile N times on each, report medians")
    ap.add_argument("--cpus", help=argparse.SUPPRESS)  # a scaling child's CPUs, e.g. "0" or "0,1"
    args = ap.parse_args()
    if args.one:
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        return _one(*args.one)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    import pyarrow.parquet as pq

    from mirrorline.compile import generated
    from mirrorline.compile.spark import compile_changes
    from mirrorline.log.rows import SPARK_DDL
    from mirrorline.log.stats import table_stats
    from mirrorline.sparkenv import get_spark

    work = Path(args.workdir or tempfile.mkdtemp(prefix="mirrorline-bench-compile-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    scaling: dict[str, Any] | None = None
    with PeakMemory() as mem:
        t0 = time.monotonic()
        spark = get_spark(conf={"spark.ui.enabled": "true"})  # the status API: where the seconds go
        log(f"spark up in {time.monotonic() - t0:.1f}s ({spark.sparkContext.master})")
        for size in sizes:
            src = work / f"unit-{size}"
            if src.exists():
                shutil.rmtree(src)
            src.mkdir()
            t0 = time.monotonic()
            table = generated.generate(size, seed=size)
            # several files, as log segments would be, so that the scan runs in parallel
            step = max(1, -(-size // 8))
            for i, off in enumerate(range(0, size, step)):
                pq.write_table(table.slice(off, step), src / f"seg-{i:05d}.parquet", row_group_size=256_000)
            stats = table_stats(table, sketch=False)
            del table
            log(f"{size} changes generated and written in {time.monotonic() - t0:.1f}s")

            df = spark.read.schema(SPARK_DDL).parquet(str(src))
            # warm-up on a slice (JIT, class loading), not counted
            compile_changes(df.limit(20_000)).release()

            t0 = time.monotonic()
            df.write.format("noop").mode("overwrite").save()
            scan_s = time.monotonic() - t0
            log(f"{size}: scan alone {scan_s:.1f}s")

            mem.reset()
            out = work / f"net-{size}"
            started = _stage_ids(spark)
            t0 = time.monotonic()
            # the compile materializes its result once, as Parquet at ``out``: nothing is skipped
            batch = compile_changes(spark.read.schema(SPARK_DDL).parquet(str(src)), out=str(out), stats=stats)
            seconds = time.monotonic() - t0
            stages = _stages(spark, started)
            counts = batch.counts()
            batch.release()
            net_rows = sum(sum(k.values()) for k in counts.values())
            results.append(
                {
                    "changes": size,
                    "seconds": round(seconds, 2),
                    "changes_per_s": round(size / seconds),
                    "net_rows": net_rows,
                    "compression": round(size / max(net_rows, 1), 2),
                    "net_by_kind": {k: sum(c[k] for c in counts.values()) for k in "DUI"},
                    "peak_rss_mib": mem.peak_mib,
                    "anchor_scan_seconds": round(scan_s, 2),
                    "vs_anchor": round(seconds / scan_s, 2),
                    "stages": stages,
                    "gc_share": round(
                        sum(st["gc_s"] for st in stages) / max(sum(st["run_s"] for st in stages), 1e-9), 2
                    ),
                }
            )
            log(
                f"{size}: {seconds:.1f}s, {size / seconds:,.0f} changes/s, {net_rows} net rows, peak {mem.peak_mib} MiB"
            )
            if args.scaling and size == max(sizes):
                scaling = _scaling(src, size, args.repeat)
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "compile",
                "master": spark.sparkContext.master,
                "anchor": "parquet scan alone (noop write of every column)",
                "loadavg": [round(x, 2) for x in os.getloadavg()],
                "sizes": results,
                **({"scaling": scaling} if scaling is not None else {}),
            }
        )
    )
    return 0


def _stage_list(spark: Any) -> list[dict[str, Any]]:
    import urllib.request

    sc = spark.sparkContext
    with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages", timeout=30) as r:
        return list(json.load(r))


def _stage_ids(spark: Any) -> set[int]:
    """The stages that ran before now (the warm-up's, the anchor's)."""
    return {int(st["stageId"]) for st in _stage_list(spark)}


def _stages(spark: Any, before: set[int]) -> list[dict[str, Any]]:
    """The completed stages not in ``before``, in the order they ran, with their wall, CPU and GC seconds (the last
    two summed over the stage's tasks) and the bytes they shuffled; stages of less than 0.1 s are left out."""
    from datetime import datetime

    def at(text: str) -> float:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%Z").timestamp()

    out = []
    for st in sorted(_stage_list(spark), key=lambda st: int(st["stageId"])):
        if int(st["stageId"]) in before or st.get("status") != "COMPLETE":
            continue
        wall = at(st["completionTime"]) - at(st["submissionTime"])
        if wall < 0.1:
            continue
        out.append(
            {
                "stage": int(st["stageId"]),
                "tasks": int(st["numTasks"]),
                "wall_s": round(wall, 2),
                "run_s": round(st["executorRunTime"] / 1000, 2),
                "cpu_s": round(st["executorCpuTime"] / 1e9, 2),
                "gc_s": round(st.get("jvmGcTime", 0) / 1000, 2),
                "shuffle_write_mb": round(st["shuffleWriteBytes"] / 2**20),
            }
        )
    return out


def _one(master: str, src: str) -> int:
    """A scaling child: compile the log at ``src`` on ``master`` (after a warm-up on a slice); print changes/s."""
    import pyarrow.parquet as pq

    from mirrorline.compile.spark import compile_changes
    from mirrorline.log.rows import SPARK_DDL
    from mirrorline.log.stats import table_stats
    from mirrorline.sparkenv import get_spark

    spark = get_spark(master, conf={"spark.executor.memory": "2g"} if master.startswith("spark:") else None)
    df = spark.read.schema(SPARK_DDL).parquet(src)
    _warm(df)
    size = df.count()
    stats = table_stats(pq.read_table(src), sketch=False)  # as in the main run: what run has from the log
    out = tempfile.mkdtemp(prefix="mirrorline-bench-net-")
    t0 = time.monotonic()
    compile_changes(spark.read.schema(SPARK_DDL).parquet(src), out=out, stats=stats).release()
    seconds = time.monotonic() - t0
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"master": master, "seconds": round(seconds, 2), "changes_per_s": round(size / seconds)}))
    return 0


def _warm(df: Any) -> None:
    """Warm every executor up (class loading, code generation, JIT) as a pipeline that has run for a while is: the
    whole fold on every change of one key in 50, so that each scan and fold task, on every executor, runs the same
    code as the timed compile on a share of the rows. (A slice of the first rows, as before, ran in one task: on a
    cluster of two workers, one executor started the timed compile cold.) Keys moved by key changes may leave a
    sampled key's sequence invalid: the warm-up only needs the plan to run, so that error is expected."""
    from pyspark.sql import functions as F

    from mirrorline.compile.spark import compile_changes
    from mirrorline.errors import InvalidSequenceError

    with contextlib.suppress(InvalidSequenceError):
        compile_changes(df.where(F.xxhash64("table", "key") % 50 == 0)).release()


def _scaling(src: Path, size: int, repeat: int = 1) -> dict[str, Any]:
    """changes/s of the same log on local[1], local[2], and a standalone cluster of one and of two 1-core workers."""
    import subprocess

    from mirrorline.sparkcluster import SparkCluster

    def child(master: str, cpus: str | None = None) -> float:
        pin = ["--cpus", cpus] if cpus else []
        done = subprocess.run(
            [sys.executable, __file__, "--one", master, str(src), *pin], capture_output=True, text=True, check=True
        )
        rate = float(json.loads(done.stdout.strip().splitlines()[-1])["changes_per_s"])
        log(f"scaling {master}{' on CPUs ' + cpus if cpus else ''}: {rate:,.0f} changes/s")
        return rate

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit("--scaling needs two CPUs this process may run on")
    cpu0, cpu1 = allowed[:2]
    runs: dict[str, list[float]] = {"local_1": [], "local_2": [], "cluster_1": [], "cluster_2": []}
    for _ in range(repeat):  # the four in turn, so that a slow spell of the machine falls on all of them alike
        runs["local_1"].append(child("local[1]", str(cpu0)))
        runs["local_2"].append(child("local[2]"))
        with SparkCluster(workers=1, cores=1, memory="3g", cpus=[{cpu0}]) as c:
            runs["cluster_1"].append(child(c.master, str(cpu1)))
        with SparkCluster(workers=2, cores=1, memory="3g", cpus=[{cpu0}, {cpu1}]) as c:
            runs["cluster_2"].append(child(c.master))
    out: dict[str, Any] = {k: statistics.median(v) for k, v in runs.items()}
    out["local_2_vs_1"] = round(out["local_2"] / out["local_1"], 2)
    out["cluster_2_vs_1"] = round(out["cluster_2"] / out["cluster_1"], 2)
    if repeat > 1:
        out["each"] = runs
    unpinned = {"local_1": child("local[1]")}
    with SparkCluster(workers=1, cores=1, memory="3g") as c:
        unpinned["cluster_1"] = child(c.master)
    unpinned["local_2_vs_1"] = round(out["local_2"] / unpinned["local_1"], 2)
    unpinned["cluster_2_vs_1"] = round(out["cluster_2"] / unpinned["cluster_1"], 2)
    out["unpinned"] = unpinned
    out["changes"] = size
    return out


if __name__ == "__main__":
    sys.exit(main())
