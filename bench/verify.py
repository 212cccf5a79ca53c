"""Benchmark: what ``verify`` and ``verify --diff`` cost on 1M rows.

A throwaway PostgreSQL, ``pgbench -i -s 10`` (``pgbench_accounts``: 1M rows, ``filler char(84)``), snapshotted into
one target (``--kind``, default duckdb). Timed, each ``--reps`` times (median):

- ``copy_anchor_s``: the physical limit of reading the source once, ``COPY pgbench_accounts TO STDOUT`` to nowhere
  (one connection, as psql would);
- ``verify_s``: ``verify`` of the equal target (counts and checksums of both sides);
- ``diff_equal_s``: ``verify --diff`` of the equal target (the same, plus the key-bucket sums);
- ``diff_s``: ``verify --diff 10`` after ``--changed`` rows were changed at the target behind mirrorline's back (the
  bucket pass, then the rows of the differing buckets read again on both sides and matched), with the number of rows
  it found differing (must equal ``--changed``).

Ratios: each to ``copy_anchor_s`` and ``diff_s`` to ``verify_s``. Prints ONE JSON line; progress goes to stderr.
    .venv/bin/python bench/verify.py [--scale 10] [--kind duckdb] [--changed 25] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

from mirrorline import config as C
from mirrorline.pgcluster import PgCluster
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.verify import verify

DB = "bench_verify"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def change_target(kind: str, location: str, n: int) -> None:
    """``n`` accounts' balance changed at the target, through its own client."""
    sql = f"UPDATE {{t}} SET abalance = abalance + 1 WHERE aid <= {n}"
    if kind == "duckdb":
        import duckdb

        con = duckdb.connect(location)
        con.execute(sql.format(t="main.pgbench_accounts"))
        con.close()
    elif kind == "sqlite":
        import sqlite3

        db = sqlite3.connect(location)
        db.execute(sql.format(t="pgbench_accounts"))
        db.commit()
        db.close()
    else:
        raise SystemExit(f"--kind {kind}: use duckdb or sqlite")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--kind", default="duckdb")
    ap.add_argument("--changed", type=int, default=25)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    out: dict[str, object] = {"bench": "verify", "rows": args.scale * 100_000, "kind": args.kind, "reps": args.reps}
    with PgCluster() as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.create_database(DB)
        pg = ["-h", "127.0.0.1", "-p", str(cluster.port), "-U", cluster.user]
        subprocess.run(
            [cluster.bin("pgbench"), "-i", "-q", "-s", str(args.scale), *pg, DB],
            check=True,
            cwd="/",
            capture_output=True,
        )
        location = str(Path(tmp) / f"target.{args.kind}")
        conf = Path(tmp) / "m.toml"
        conf.write_text(
            f'[source]\ndsn = "{cluster.dsn(DB)}"\nslot = "bench"\n[log]\npath = "{Path(tmp) / "log"}"\n'
            '[tables."public.pgbench_accounts"]\n'
            f'[targets.t]\nurl = "{args.kind}:///{location}"\n'
        )
        cfg = C.load(conf)
        t0 = time.monotonic()
        snapshot_target(cfg, "t", options=Options(progress=False))
        log(f"snapshot: {time.monotonic() - t0:.1f}s")

        def copy_once() -> float:
            conn = psycopg2.connect(cluster.dsn(DB))
            t0 = time.monotonic()
            with conn.cursor() as cur:

                class Sink:
                    def write(self, data: object) -> int:
                        return 0

                cur.copy_expert("COPY pgbench_accounts TO STDOUT", Sink())
            conn.close()
            return time.monotonic() - t0

        def timed(**kw: int) -> tuple[float, object]:
            t0 = time.monotonic()
            report = verify(cfg, **kw)
            return time.monotonic() - t0, report

        copy = statistics.median(copy_once() for _ in range(args.reps))
        plain, equal_diff = [], []
        for _ in range(args.reps):
            s, rep = timed()
            assert rep.ok, rep.text()  # type: ignore[attr-defined]
            plain.append(s)
            s, rep = timed(diff=10)
            assert rep.ok, rep.text()  # type: ignore[attr-defined]
            equal_diff.append(s)
        change_target(args.kind, location, args.changed)
        diffs, found = [], 0
        for _ in range(args.reps):
            s, rep = timed(diff=10)
            diffs.append(s)
            (check,) = rep.targets[0].tables  # type: ignore[attr-defined]
            found = check.differing_rows
        out.update(
            copy_anchor_s=round(copy, 3),
            verify_s=round(statistics.median(plain), 3),
            diff_equal_s=round(statistics.median(equal_diff), 3),
            diff_s=round(statistics.median(diffs), 3),
            differing_rows_found=found,
            changed=args.changed,
        )
        out["verify_vs_copy"] = round(out["verify_s"] / copy, 2)  # type: ignore[operator]
        out["diff_vs_copy"] = round(out["diff_s"] / copy, 2)  # type: ignore[operator]
        out["diff_vs_verify"] = round(out["diff_s"] / out["verify_s"], 2)  # type: ignore[operator]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
