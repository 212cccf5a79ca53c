"""Benchmark: the cost of one small unit of work in a warm pipeline.

A pgbench-shaped table (``accounts``: keyed, updated at random; ``history``: inserts only, no key) on a throwaway
PostgreSQL; a workload of ``--units`` x ``--size`` changes in transactions of 5 changes (pgbench's shape: 3 updates,
1 select, 1 insert) is captured into the change log (not timed), then applied to one target of each kind by a
pipeline whose Spark is started and warmed up (as ``mirrorline run`` is), ``max_changes = --size``: each unit is
timed, compile and apply per target, and the p50 / p90 over the units is reported, after ``--skip`` units not counted
(the first units after the warm-up). The anchor: the same changes replayed one statement at a time by a single
psycopg2 connection into PostgreSQL (what a row-by-row apply costs), per unit.

    .venv/bin/python bench/unit.py [--sizes 1000,10000] [--units 20] [--skip 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2

from mirrorline.capture.session import Capture
from mirrorline.compile.warmup import warm_up
from mirrorline.config import parse as parse_config
from mirrorline.pgcluster import PgCluster
from mirrorline.pipeline import Applier
from mirrorline.sparkenv import get_spark

ACCOUNTS = 100_000
DDL = [
    "CREATE TABLE accounts (aid int PRIMARY KEY, bid int, abalance int, filler char(84))",
    "CREATE TABLE history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22))",
    "ALTER TABLE history REPLICA IDENTITY FULL",
]


def say(msg: str) -> None:
    print(f"[bench/unit] {msg}", file=sys.stderr, flush=True)


def workload(dsn: str, changes: int, seed: int) -> None:
    """pgbench-like transactions of 4 changes: 3 updates of random accounts, 1 history insert (batched 50 at a time
    in one server round trip each, so that generating the workload is quick)."""
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        txns = changes // 4
        for lo in range(0, txns, 50):
            n = min(50, txns - lo)
            stmts = []
            for i in range(n):
                x = seed * 1_000_003 + lo + i
                a = [(x * 7919 + j * 104729) % ACCOUNTS + 1 for j in range(3)]
                stmts.append(
                    "BEGIN;"
                    + "".join(
                        f"UPDATE accounts SET abalance = abalance + {j + 1} WHERE aid = {aid};"
                        for j, aid in enumerate(a)
                    )
                    + f"INSERT INTO history VALUES ({i}, 1, {a[0]}, 5, now(), 'x');COMMIT;"
                )
            conn.autocommit = True
            cur.execute("".join(stmts))
    conn.close()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p * (len(xs) - 1)))]


def one(size: int, units: int, skip: int, source: PgCluster, target: PgCluster, work: Path) -> dict[str, Any]:
    db = f"src_{size}"
    source.create_database(db)
    for s in DDL:
        source.execute(s, db)
    tdb = f"t_{size}"
    target.create_database(tdb)

    def config(max_changes: int) -> Any:
        return parse_config(
            {
                "source": {"dsn": source.dsn(db), "slot": f"ml_{size}"},
                "log": {"path": str(work / f"log_{size}")},
                "apply": {"max_changes": max_changes, "latency": "1s"},
                "tables": {"public.accounts": {}, "public.history": {}},
                "targets": {
                    "pg": {"url": target.url(tdb)},
                    "sqlite": {"url": f"sqlite:///{work / f'{size}.sqlite'}"},
                    "duckdb": {"url": f"duckdb:///{work / f'{size}.duckdb'}"},
                },
            },
            work / "bench.toml",
        )

    conf = config(size)
    Capture(conf, once=True).run()  # slot and publication
    say(f"size {size}: {ACCOUNTS} accounts, applied as one unit (not timed)")
    source.execute(f"INSERT INTO accounts SELECT g, 1, 0, '' FROM generate_series(1, {ACCOUNTS}) g", db)
    Capture(conf, once=True).run()
    seed = Applier(config(10 * ACCOUNTS), spark=get_spark())
    seed.catch_up()
    seed.close()
    say(f"size {size}: workload of {(units + skip) * size} changes")
    workload(source.dsn(db), (units + skip) * size, size)
    Capture(conf, once=True).run()
    applier = Applier(conf, spark=get_spark())
    reports = []
    while True:
        t0 = time.monotonic()
        r = applier.step()
        if r is None:
            break
        reports.append((time.monotonic() - t0, r))
    applier.close()
    timed = [(s, r) for s, r in reports[skip:] if r.changes]
    compile_s = [r.compile_seconds for _, r in timed]
    apply_s = {n: [r.apply_seconds[n] for _, r in timed] for n in conf.targets}
    total = [s for s, _ in timed]
    return {
        "units": len(timed),
        "changes_p50": statistics.median(r.changes for _, r in timed),
        "unit_p50_s": round(statistics.median(total), 3),
        "unit_p90_s": round(pct(total, 0.9), 3),
        "compile_p50_s": round(statistics.median(compile_s), 3),
        **{f"apply_{n}_p50_s": round(statistics.median(v), 3) for n, v in apply_s.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--units", type=int, default=20)
    p.add_argument("--skip", type=int, default=3)
    args = p.parse_args()
    spark = get_spark()
    out: dict[str, Any] = {"warm_up_s": round(warm_up(spark), 2)}
    with tempfile.TemporaryDirectory(prefix="mirrorline-bench-") as tmp, PgCluster() as source, PgCluster() as target:
        for size in (int(s) for s in args.sizes.split(",")):
            out[str(size)] = one(size, args.units, args.skip, source, target, Path(tmp))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
