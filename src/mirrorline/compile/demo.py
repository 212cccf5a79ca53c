"""The compile demo: a generated unit of work compiled into net row changes on Spark, with the figures printed.

The heart of mirrorline in a few lines of output: many row changes in, few net row changes out. (The embedded
``mirrorline demo``, a throwaway PostgreSQL replicated into SQLite and DuckDB, is :mod:`mirrorline.demo`.)
Run it as ``python -m mirrorline.compile.demo [CHANGES] [KEEP_DIR]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO


def run_demo(changes: int, keep: str | None, *, seed: int = 1, out: TextIO | None = None) -> int:
    """Generate ``changes`` changes on three tables, compile them on Spark, print what happened. Returns 0.

    ``keep``: a folder to keep the demo's files in (the unit as log segments, the net rows), else a temporary one.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mirrorline.compile import generated
    from mirrorline.compile.spark import compile_changes
    from mirrorline.errors import UsageError
    from mirrorline.log.rows import SPARK_DDL
    from mirrorline.sparkenv import get_spark

    out = out or sys.stdout
    if changes < 1:
        raise UsageError(f"--changes must be at least 1, got {changes}")
    base = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="mirrorline-demo-"))
    log_dir, net_dir = base / "log", base / "net"
    for d in (log_dir, net_dir):
        if d.exists():
            shutil.rmtree(d)
    log_dir.mkdir(parents=True)

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say("mirrorline compile demo: a generated unit of work compiled into net row changes on Spark")
    t0 = time.monotonic()
    unit = generated.generate(changes, seed=seed)
    segment = 100_000
    for i, off in enumerate(range(0, changes, segment)):
        pq.write_table(unit.slice(off, segment), log_dir / f"segment-{i:06d}.parquet")
    ops = {r["values"]: r["counts"] for r in pc.value_counts(unit.column("op")).to_pylist()}
    key_changes = int(pc.sum(pc.is_valid(unit.column("old_key"))).as_py() or 0)
    toast = int(pc.sum(pc.greater(pc.list_value_length(unit.column("unchanged")), 0)).as_py() or 0)
    by_table = unit.group_by("table").aggregate([("table", "count")]).to_pylist()
    per_table = {r["table"]: r["table_count"] for r in by_table}
    say(
        f"generated {changes:,} changes on {len(per_table)} tables in {time.monotonic() - t0:.1f}s: "
        f"{ops.get('I', 0):,} inserts, {ops.get('U', 0):,} updates ({key_changes:,} changing the key, {toast:,} "
        f"with an unchanged TOAST column), {ops.get('D', 0):,} deletes"
    )

    t0 = time.monotonic()
    spark = get_spark()
    say(f"spark {spark.version} ({spark.sparkContext.master}) ready in {time.monotonic() - t0:.1f}s")
    t0 = time.monotonic()
    batch = compile_changes(spark.read.schema(SPARK_DDL).parquet(str(log_dir)))
    try:
        batch.frame().write.parquet(str(net_dir))
        seconds = time.monotonic() - t0
        counts = batch.counts()
    finally:
        batch.release()
    net = sum(sum(c.values()) for c in counts.values())
    say(
        f"compiled {batch.changes:,} changes into {net:,} net row changes in {seconds:.1f}s "
        f"({batch.changes / max(net, 1):.1f} changes per net row, {batch.changes / seconds:,.0f} changes/s)"
    )
    say("per table, in the order apply takes them (first seen in the unit): deletes, updates, inserts")
    width = max(len(t) for t in batch.tables) if batch.tables else 0
    for t in batch.tables:
        c = counts[t]
        say(f"  {t:<{width}}  {c['D']:>9,} D  {c['U']:>9,} U  {c['I']:>9,} I   (from {per_table.get(t, 0):,} changes)")
    if keep:
        say(f"files kept in {base}: log/ (the unit, in the log row layout) and net/ (the net rows, Parquet)")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_demo(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000, sys.argv[2] if len(sys.argv) > 2 else None))
