"""Benchmark: capture throughput against a bare pgoutput receiver and pg_recvlogical (test_decoding), on the same WAL
in the same run.

Workload (``--shape``): ``small`` (the default), 1,000,000 changes (200,000 inserts, then 800,000 updates over the
same keys) in transactions of 1,000; or one transaction of ``--changes`` rows that PostgreSQL streams before its
commit, every row a different key: ``insert`` (new rows), ``update`` (``qty`` of every row, the table filled before
the slots) or ``delete`` (every row). Every slot is created before the workload, so each consumer decodes exactly the
same WAL:

- ``bare``: a psycopg2 pgoutput receiver (protocol 2, streaming on) that only reads and counts messages;
- ``recvlogical``: ``pg_recvlogical`` with ``test_decoding`` writing to /dev/null, up to the workload's end LSN;
- ``capture``: mirrorline's capture (``Capture(once=True)``): decode, assemble, write the change log (Parquet);
  each round a log and a publication of its own (a publication belongs to one log).

Each consumer runs ``--rounds`` times (one slot per round); the figures are medians. Prints one JSON line: changes/s
of each and the ratios capture/bare and capture/recvlogical (time ratios: 1.0 = as fast, 1.25 = 25% slower), plus
the client-side CPU seconds of each (the server's decoding is the same for all three; on a loaded machine the CPU
figures show the client's own cost more steadily than wall time).

    .venv/bin/python bench/capture.py [--changes 1000000] [--rounds 3] [--shape small|insert|update|delete]
                                      [--profile]
"""

from __future__ import annotations

import argparse
import json
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import psycopg2.extras

from mirrorline.capture.session import Capture
from mirrorline.config import parse as parse_config
from mirrorline.pgcluster import PgCluster
from mirrorline.position import format_lsn, parse_lsn

TXN = 1000
CPU: dict[str, list[float]] = {"bare": [], "recvlogical": [], "capture": []}  # client CPU seconds per run


def big_workload(c: PgCluster, changes: int, shape: str) -> tuple[int, int]:
    """One transaction of ``changes`` rows of ``shape``; the table holds ``changes`` rows already for an update or a
    delete (:func:`fill`). Returns the WAL position after it and 1 (its one commit)."""
    sql = {
        "insert": "INSERT INTO bench SELECT g, 0, md5(g::text), now() "
        f"FROM generate_series({changes + 1}, {2 * changes}) g",
        "update": "UPDATE bench SET qty = qty + 1",
        "delete": "DELETE FROM bench",
    }[shape]
    ((end,),) = c.execute(f"{sql}; SELECT pg_current_wal_lsn()::text")
    return parse_lsn(end), 1


def fill(c: PgCluster, rows: int) -> None:
    c.execute(f"INSERT INTO bench SELECT g, 0, md5(g::text), now() FROM generate_series(1, {rows}) g")
    c.execute("VACUUM bench")


def workload(c: PgCluster, changes: int) -> tuple[int, int]:
    """``changes`` changes to ``bench``: a fifth inserts, the rest updates of those rows, in transactions of at most
    :data:`TXN` changes. Returns the WAL position after them and how many transactions committed."""
    inserts = max(1, changes // 5)
    commits = 0
    conn = psycopg2.connect(c.dsn())
    conn.autocommit = False
    with conn.cursor() as cur:
        for lo in range(0, inserts, TXN):
            n = min(TXN, inserts - lo)
            cur.execute(
                "INSERT INTO bench SELECT g, 0, md5(g::text), now() FROM generate_series(%s, %s) g", (lo + 1, lo + n)
            )
            conn.commit()
            commits += 1
        done = 0
        while done < changes - inserts:
            lo = done % inserts
            n = min(TXN, changes - inserts - done, inserts - lo)
            cur.execute("UPDATE bench SET qty = qty + 1, at = now() WHERE id BETWEEN %s AND %s", (lo + 1, lo + n))
            conn.commit()
            commits += 1
            done += n
        cur.execute("SELECT pg_current_wal_lsn()::text")
        (end,) = cur.fetchone()  # type: ignore[misc]
    conn.close()
    return int(end.split("/")[0], 16) << 32 | int(end.split("/")[1], 16), commits


def bare(c: PgCluster, slot: str, commits: int) -> tuple[float, int]:
    """Read and count the messages until ``commits`` transactions committed (``read_message`` in a loop, as capture
    reads; it sends no feedback)."""
    conn = psycopg2.connect(c.dsn(), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    msgs = done = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    cur.start_replication(
        slot_name=slot, decode=False, options={"proto_version": "2", "publication_names": "bench", "streaming": "on"}
    )
    read = cur.read_message
    while done < commits:
        msg = read()
        if msg is None:
            select.select([cur], [], [], 1.0)
            continue
        msgs += 1
        if msg.payload[0] in (67, 99):  # 'C', or a streamed transaction's Stream Commit 'c'
            done += 1
    elapsed = time.perf_counter() - t0
    CPU["bare"].append(time.process_time() - c0)
    conn.close()
    return elapsed, msgs


def recvlogical(c: PgCluster, slot: str, end: int) -> float:
    t0 = time.perf_counter()
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [
            c.bin("pg_recvlogical"),
            "-d",
            c.dsn(),
            "--slot",
            slot,
            "--start",
            "-E",
            format_lsn(end),
            "-f",
            "/dev/null",
            "--no-loop",
        ],
        check=True,
    )
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU["recvlogical"].append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    return time.perf_counter() - t0


def capture(c: PgCluster, slot: str, folder: Path, profile: bool) -> tuple[float, int]:
    config = parse_config(
        {
            "source": {"dsn": c.dsn(), "slot": slot, "publication": slot},  # one per round: a log owns its own
            "log": {"path": str(folder / slot)},
            "tables": {"public.bench": {}},
        },
        folder / "bench.toml",
    )
    cap = Capture(config, once=True)
    t0 = time.perf_counter()
    c0 = time.process_time()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        stats = cap.run()
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    else:
        stats = cap.run()
    CPU["capture"].append(time.process_time() - c0)
    return time.perf_counter() - t0, stats.changes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", choices=("small", "insert", "update", "delete"), default="small")
    ap.add_argument("--profile", action="store_true", help="cProfile the capture runs (stderr)")
    args = ap.parse_args()
    with PgCluster() as c, tempfile.TemporaryDirectory(prefix="mirrorline-bench-") as tmp:
        c.execute("CREATE TABLE bench (id bigint PRIMARY KEY, qty int NOT NULL, note text, at timestamptz)")
        c.execute("CREATE PUBLICATION bench FOR TABLE bench")
        if args.shape in ("update", "delete"):
            fill(c, args.changes)
        rounds = range(args.rounds)
        for r in rounds:
            c.execute(f"SELECT pg_create_logical_replication_slot('bare_{r}', 'pgoutput')")
            c.execute(f"SELECT pg_create_logical_replication_slot('recv_{r}', 'test_decoding')")
            c.execute(f"CREATE PUBLICATION cap_{r} FOR TABLE bench")
            c.execute(f"SELECT pg_create_logical_replication_slot('cap_{r}', 'pgoutput')")
        ((start,),) = c.execute("SELECT pg_current_wal_lsn()::text")
        t0 = time.perf_counter()
        end, commits = workload(c, args.changes) if args.shape == "small" else big_workload(c, args.changes, args.shape)
        load_s = time.perf_counter() - t0
        times: dict[str, list[float]] = {"bare": [], "recvlogical": [], "capture": []}
        msgs = 0
        for r in rounds:
            order = ["bare", "recvlogical", "capture"]
            order = order[r % 3 :] + order[: r % 3]  # who reads the WAL first changes from round to round
            for who in order:
                if who == "bare":
                    t, msgs = bare(c, f"bare_{r}", commits)
                elif who == "recvlogical":
                    t = recvlogical(c, f"recv_{r}", end)
                else:
                    t, captured = capture(c, f"cap_{r}", Path(tmp), args.profile)
                    if captured != args.changes:
                        raise SystemExit(f"capture got {captured} changes, expected {args.changes}")
                times[who].append(t)
        med = {k: statistics.median(v) for k, v in times.items()}
        wal = end - parse_lsn(str(start))
        log_bytes = sum(f.stat().st_size for f in (Path(tmp) / "cap_0").rglob("*") if f.is_file())
        print(
            json.dumps(
                {
                    "bench": "capture",
                    "changes": args.changes,
                    "shape": args.shape,
                    "rounds": args.rounds,
                    "workload_s": round(load_s, 2),
                    "bare_msgs": msgs,
                    "seconds": {k: round(v, 3) for k, v in med.items()},
                    "changes_per_s": {k: round(args.changes / v) for k, v in med.items()},
                    "capture_vs_bare": round(med["capture"] / med["bare"], 3),
                    "capture_vs_recvlogical": round(med["capture"] / med["recvlogical"], 3),
                    # sizing: the WAL the workload wrote and the change log that holds the same changes
                    "wal_bytes_per_change": round(wal / args.changes, 1),
                    "log_bytes_per_change": round(log_bytes / args.changes, 1),
                    "client_cpu_s": {k: round(statistics.median(v), 3) for k, v in CPU.items()},
                    "all_seconds": {k: [round(x, 3) for x in v] for k, v in times.items()},
                }
            )
        )


if __name__ == "__main__":
    main()
