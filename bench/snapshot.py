"""Snapshot throughput against its anchors, in one run, between the same two databases:

- PostgreSQL target: ``mirrorline snapshot`` (Spark tasks, each COPYing its chunk straight into the target) against
  ``psql -c "COPY t TO STDOUT" | psql -c "COPY t FROM STDIN"`` (the limit for PostgreSQL);
- SQLite target: ``mirrorline snapshot`` against a plain Python bulk insert (a server-side cursor's rows into
  ``executemany`` in one transaction).

Prints one JSON line: seconds and rows/s of each, and the ratios (snapshot / anchor: aim <= 1.25 for PostgreSQL,
<= 1.0 for SQLite). ``--rows N`` (default 10,000,000, about 1 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

from mirrorline import config as C
from mirrorline.apply.sqlite import SQLITE
from mirrorline.model import Column, TableSchema
from mirrorline.pgcluster import PgCluster
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.sparkenv import get_spark

DDL = (
    "CREATE TABLE bench (id bigint PRIMARY KEY, a integer NOT NULL, b text, c numeric(12,2), "
    "ts timestamp with time zone)"
)
SCHEMA = TableSchema(
    "public.bench",
    (
        Column("id", "bigint", nullable=False),
        Column("a", "integer", nullable=False),
        Column("b", "text"),
        Column("c", "numeric(12,2)"),
        Column("ts", "timestamp with time zone"),
    ),
    ("id",),
)


def fill(c: PgCluster, rows: int) -> int:
    c.execute(DDL, "src")
    step = 1_000_000
    for lo in range(1, rows + 1, step):
        hi = min(lo + step - 1, rows)
        c.execute(
            f"INSERT INTO bench SELECT g, g % 100000, md5(g::text) || '-' || repeat('x', g % 24), "
            f"(g % 1000000) / 100.0, timestamptz '2024-01-01' + g * interval '1 second' "
            f"FROM generate_series({lo}, {hi}) g",
            "src",
        )
    c.execute("VACUUM ANALYZE bench", "src")
    return int(c.execute("SELECT pg_relation_size('bench')", "src")[0][0])


def copy_pipe(c: PgCluster) -> float:
    c.execute(DDL, "dst")
    psql = c.bin("psql").replace("/lib/postgresql/", "/lib/postgresql/")
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(c.port), PGUSER=c.user)
    t0 = time.monotonic()
    out = subprocess.Popen(
        [psql, "-X", "-q", "-d", "src", "-c", "COPY bench TO STDOUT"], stdout=subprocess.PIPE, env=env
    )
    inp = subprocess.run(
        [psql, "-X", "-q", "-d", "dst", "-c", "COPY bench FROM STDIN"], stdin=out.stdout, env=env, check=True
    )
    assert out.stdout is not None
    out.stdout.close()
    assert out.wait() == 0 and inp.returncode == 0
    secs = time.monotonic() - t0
    c.execute("DROP TABLE bench", "dst")
    c.execute("CHECKPOINT", "dst")
    return secs


def plain_sqlite(c: PgCluster, path: Path) -> float:
    t0 = time.monotonic()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    for stmt in SQLITE.create_table(SCHEMA):
        db.execute(stmt)
    src = psycopg2.connect(c.dsn("src"))
    db.execute("BEGIN")
    with src.cursor(name="bench") as cur:
        cur.itersize = 10_000
        cur.execute("SELECT id, a, b, c::text, ts::text FROM bench")
        while rows := cur.fetchmany(10_000):
            db.executemany("INSERT INTO bench VALUES (?, ?, ?, ?, ?)", rows)
    db.execute("COMMIT")
    db.close()
    src.close()
    return time.monotonic() - t0


def _warm(x: int) -> int:
    import mirrorline.snapshot.tasks  # noqa: F401

    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--chunk-mb", type=float, default=64.0)
    args = ap.parse_args()
    spark = get_spark()
    spark.sparkContext.parallelize(range(4), 4).map(_warm).collect()  # Python workers started, modules imported
    with (
        PgCluster({"max_wal_size": "8GB", "checkpoint_timeout": "30min"}) as c,
        tempfile.TemporaryDirectory(prefix="mirrorline-bench-") as tmp,
    ):
        c.create_database("src")
        c.create_database("dst")
        heap = fill(c, args.rows)
        pipe = copy_pipe(c)
        cfg_file = Path(tmp) / "bench.toml"
        cfg_file.write_text(
            f'[source]\ndsn = "{c.dsn("src")}"\n[log]\npath = "log"\n[tables."public.bench"]\n'
            f'[targets.pg]\nurl = "{c.url("dst")}"\n[targets.lite]\nurl = "sqlite:///{tmp}/snap.sqlite"\n'
        )
        cfg = C.load(cfg_file)
        opts = Options(chunk_mb=args.chunk_mb, progress=False)
        t0 = time.monotonic()
        res = snapshot_target(cfg, "pg", options=opts)
        ours_pg = time.monotonic() - t0
        assert res.rows["public.bench"] == args.rows, res.rows
        c.execute("CHECKPOINT", "dst")
        plain = plain_sqlite(c, Path(tmp) / "plain.sqlite")
        t0 = time.monotonic()
        res = snapshot_target(cfg, "lite", options=opts)
        ours_lite = time.monotonic() - t0
        assert res.rows["public.bench"] == args.rows, res.rows
    n = args.rows
    print(
        json.dumps(
            {
                "bench": "snapshot",
                "rows": n,
                "heap_mb": round(heap / 2**20),
                "cores": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 1),
                "copy_pipe_s": round(pipe, 2),
                "snapshot_pg_s": round(ours_pg, 2),
                "plain_sqlite_s": round(plain, 2),
                "snapshot_sqlite_s": round(ours_lite, 2),
                "copy_pipe_rows_s": round(n / pipe),
                "snapshot_pg_rows_s": round(n / ours_pg),
                "plain_sqlite_rows_s": round(n / plain),
                "snapshot_sqlite_rows_s": round(n / ours_lite),
                "pg_ratio_vs_copy_pipe": round(ours_pg / pipe, 3),
                "sqlite_ratio_vs_plain": round(ours_lite / plain, 3),
                "aim": {"pg_ratio_vs_copy_pipe": "<= 1.25", "sqlite_ratio_vs_plain": "<= 1.0"},
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
