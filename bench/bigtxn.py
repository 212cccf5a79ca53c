"""Benchmark: one big transaction where nothing folds, beside PostgreSQL's own logical replication, in the same run.

Setup (not timed): one throwaway PostgreSQL cluster (its default ``logical_decoding_work_mem``, 64MB). Database
``bench_src`` holds the tables of ``--tables``, each of ``--rows`` rows:

- ``narrow``: ``id bigint PRIMARY KEY, n int, t text, at timestamptz``, about 100 bytes a row;
- ``wide``: the same plus ``body text`` of 2,048 bytes stored out of line (``STORAGE EXTERNAL``): a TOASTed column,
  which an UPDATE that does not touch it leaves unsent. PostgreSQL moves a value out of line only once its row is
  over about 2 kB (``TOAST_TUPLE_THRESHOLD``; ``toast_tuple_target`` does not lower that), so a row of ~1 kB keeps
  its text inline and every UPDATE sends it: the setup checks that the table's TOAST relation holds the bodies.

PostgreSQL's own replication: a publication of the tables, database ``bench_sub`` with the same tables and a
subscription with ``streaming = on`` (seeded by ``copy_data``). mirrorline: ``mirrorline run`` as a process of its
own (``[apply] latency = --latency``) with three targets, ``sqlite`` and ``duckdb`` files and ``pg`` (database
``bench_ml`` of the same cluster), which it loads itself by a snapshot. The transactions start once every target and
the subscriber hold a marker committed after the snapshot, and ``run`` has said that its idle warm-up for large units
has ended (``warm_wait_s``, ``warm_large_s``): a pipeline that has run a while, as a nightly batch meets it.

Then, per table, three transactions, each one statement touching every row once (nothing folds: every change a
different key), committed one after the other, each waited for before the next:

- ``update``: ``UPDATE t SET n = n + 1`` (on ``wide``, ``body`` unsent);
- ``insert``: ``--rows`` new rows;
- ``delete``: those rows deleted.

Timed from the moment the COMMIT returned: ``subscriber_s`` (the subscriber's copy shows the transaction: a row it
changed, polled every 20 ms; the subscriber applies a transaction atomically), ``mirrorline_s`` per target (the
target's applied position in the log's reader registry, written right after each unit's commit, past the WAL position
taken just before the COMMIT) and ``last_target_s``; ``ratio`` = subscriber_s / last_target_s (> 1: mirrorline's
last target had it sooner). The seconds split by phase: ``durable_s`` (the log holds the transaction, fsynced:
capture received its commit and made its streamed changes log content), and from ``run``'s unit lines for the
units that carried it: ``compile_s`` and ``apply_s`` per target (targets apply side by side), the latter by phase in
``apply_phases_s`` (``stage``: net rows into worktables, waiting for rows still being read; ``delete``, ``update``,
``insert``; ``commit``; ``other``: connecting, locks, the target's state). ``statement_s``: how
long the source took to run the statement. ``peak_pss_mb`` / ``peak_rss_mb``: the peak memory of ``run``'s process
tree (Python, JVM, Spark's Python workers) during that transaction's replication (proportional: shared pages
counted once), and over the whole run (``peak``).

At the end every target and the subscriber are compared with the source, every row and column, through this
benchmark's own readers (``equal``). Prints one JSON line.

    .venv/bin/python bench/bigtxn.py [--rows 1000000] [--tables narrow,wide] [--shapes update,insert,delete]
                                     [--latency 500ms] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import psycopg2

from live import RssMeter, RunLog, compare_table, run_in_folder, start_run, stop_run
from mirrorline.log.layout import parse_segment_name
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import readers
from mirrorline.pgcluster import PgCluster
from mirrorline.position import parse_lsn

SRC_DB, SUB_DB, ML_DB = "bench_src", "bench_sub", "bench_ml"
SUB, PUB = "bench_sub", "bench_pub"
TARGETS = ("sqlite", "duckdb", "pg")
DDL = {
    "narrow": "CREATE TABLE narrow (id bigint PRIMARY KEY, n int NOT NULL, t text, at timestamptz)",
    "wide": "CREATE TABLE wide (id bigint PRIMARY KEY, n int NOT NULL, t text, body text, at timestamptz) "
    "; ALTER TABLE wide ALTER COLUMN body SET STORAGE EXTERNAL",
}
ROWS = {
    "narrow": "SELECT g, g, md5(g::text), now() FROM generate_series({lo}, {hi}) g",
    "wide": "SELECT g, g, md5(g::text), repeat(md5(g::text), 64), now() FROM generate_series({lo}, {hi}) g",
}
COLUMNS = {
    "narrow": (("id", "int"), ("n", "int"), ("t", "text"), ("at", "ts")),
    "wide": (("id", "int"), ("n", "int"), ("t", "text"), ("body", "text"), ("at", "ts")),
}
MARK = "CREATE TABLE bench_mark (id int PRIMARY KEY, v int NOT NULL)"


def say(msg: str) -> None:
    print(f"[bench/bigtxn] {msg}", file=sys.stderr, flush=True)


def shape_sql(table: str, shape: str, rows: int) -> tuple[str, str, Any]:
    """The transaction's statement, and a query on the subscriber with the value it gives once the transaction
    is there."""
    if shape == "update":
        return f"UPDATE {table} SET n = n + 1", f"SELECT n FROM {table} WHERE id = {rows}", rows + 1
    if shape == "insert":
        sql = f"INSERT INTO {table} " + ROWS[table].format(lo=rows + 1, hi=2 * rows)
        return sql, f"SELECT count(*) FROM {table} WHERE id = {2 * rows}", 1
    return f"DELETE FROM {table} WHERE id > {rows}", f"SELECT count(*) FROM {table} WHERE id = {2 * rows}", 0


def setup(cluster: PgCluster, tables: list[str], rows: int) -> None:
    for db in (SRC_DB, SUB_DB, ML_DB):
        cluster.create_database(db)
    for db in (SRC_DB, SUB_DB):
        for t in tables:
            cluster.execute(DDL[t], db)
        cluster.execute(MARK, db)
    for t in tables:
        cluster.execute(f"INSERT INTO {t} " + ROWS[t].format(lo=1, hi=rows), SRC_DB)
    if "wide" in tables:
        ((toast,),) = cluster.execute(
            "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'wide'", SRC_DB
        )
        if not toast:
            raise RuntimeError("wide.body is stored inline, not TOASTed: the benchmark would not be what it says")
    cluster.execute("INSERT INTO bench_mark VALUES (1, 0)", SRC_DB)
    cluster.execute(f"CREATE PUBLICATION {PUB} FOR TABLE {', '.join(tables)}, bench_mark", SRC_DB)
    cluster.execute(f"SELECT pg_create_logical_replication_slot('{SUB}', 'pgoutput')", SRC_DB)
    cluster.execute(
        f"CREATE SUBSCRIPTION {SUB} CONNECTION '{cluster.dsn(SRC_DB)}' PUBLICATION {PUB} "
        f"WITH (create_slot = false, slot_name = '{SUB}', copy_data = true, streaming = on)",
        SUB_DB,
    )
    deadline = time.monotonic() + 1800
    while True:
        ((n, ready),) = cluster.execute(
            "SELECT count(*), count(*) FILTER (WHERE srsubstate = 'r') FROM pg_subscription_rel", SUB_DB
        )
        if n == len(tables) + 1 and ready == n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"subscription not synchronised ({ready}/{n} tables ready)")
        time.sleep(0.5)


def write_config(path: Path, work: Path, cluster: PgCluster, tables: list[str], latency: str) -> None:
    q = json.dumps  # a JSON string is a valid TOML basic string
    path.write_text(
        f'[source]\ndsn = {q(cluster.dsn(SRC_DB))}\nslot = "mirrorline"\n\n'
        f"[log]\npath = {q(str(work / 'log'))}\n\n"
        f"[apply]\nlatency = {q(latency)}\n\n"
        + "".join(f'[tables."public.{t}"]\n' for t in [*tables, "bench_mark"])
        + f"\n[targets.sqlite]\nurl = {q('sqlite:///' + str(work / 'target.sqlite'))}\n\n"
        f"[targets.duckdb]\nurl = {q('duckdb:///' + str(work / 'target.duckdb'))}\n\n"
        f"[targets.pg]\nurl = {q(cluster.url(ML_DB))}\n"
    )


def commit(cluster: PgCluster, sql: str) -> tuple[int, float, float]:
    """Runs ``sql`` as one transaction: (the WAL position just before its COMMIT, when the COMMIT returned, the
    statement's seconds)."""
    conn = psycopg2.connect(cluster.dsn(SRC_DB))
    try:
        with conn.cursor() as cur:
            t0 = time.monotonic()
            cur.execute(sql)
            statement = time.monotonic() - t0
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            before = parse_lsn(cur.fetchone()[0])
        conn.commit()
        return before, time.monotonic(), statement
    finally:
        conn.close()


class Waiter:
    """Polls, every 20 ms, when the log, each target and the subscriber have a transaction."""

    def __init__(self, cluster: PgCluster, log_path: Path, runlog: RunLog) -> None:
        self.log_path, self.runlog = log_path, runlog
        self.sub = psycopg2.connect(cluster.dsn(SUB_DB))
        self.sub.autocommit = True

    def close(self) -> None:
        self.sub.close()

    def _durable_lsn(self) -> int:
        """The last commit LSN the log holds, from its segments' names (no file is read: retention may remove
        one meanwhile)."""
        with contextlib.suppress(FileNotFoundError):
            names = (parse_segment_name(n) for n in os.listdir(self.log_path / "segments"))
            return max((last for _, last, _ in filter(None, names)), default=0)
        return 0

    def _registry(self) -> dict[str, int]:
        """Each target's applied LSN from the log's reader registry (its small files only: the poll must not take
        the cores from the work it times)."""
        try:
            return {n: st.applied.lsn for n, st in readers(ChangeLog(str(self.log_path))).items() if st.applied}
        except (OSError, ValueError):  # a file replaced while it was read: a missing sample
            return {}

    def wait(self, before: int, probe: str, want: Any, t0: float, timeout: float) -> dict[str, float | None]:
        """Seconds from ``t0`` until each has the transaction whose commit record is at or after WAL position
        ``before`` (``probe`` gives ``want`` on the subscriber once it has it); None for what did not within
        ``timeout``."""
        got: dict[str, float | None] = {k: None for k in ("durable", *TARGETS, "subscriber")}
        deadline = t0 + timeout
        while any(v is None for v in got.values()) and time.monotonic() < deadline:
            self.runlog.check_alive()
            now = time.monotonic()
            if got["durable"] is None and self._durable_lsn() >= before:
                got["durable"] = now - t0
            if any(got[n] is None for n in TARGETS):
                states = self._registry()
                for name in TARGETS:
                    applied = states.get(name)
                    if got[name] is None and applied is not None and applied >= before:
                        got[name] = now - t0
            if got["subscriber"] is None:
                with self.sub.cursor() as cur:
                    cur.execute(probe)
                    row = cur.fetchone()
                if row is not None and row[0] == want:
                    got["subscriber"] = now - t0
            time.sleep(0.02)
        return {k: None if v is None else round(v, 3) for k, v in got.items()}


def wait_live(cluster: PgCluster, waiter: Waiter, timeout: float) -> float:
    """Seconds until every target and the subscriber hold a marker: one committed every 5 s until they do (the
    first ones may come before ``run`` has made its slot, and reach the targets by the snapshot)."""
    t_start = time.monotonic()
    for k in range(1, int(timeout / 5) + 2):
        before, t0, _ = commit(cluster, "UPDATE bench_mark SET v = v + 1")
        got = waiter.wait(before, "SELECT v FROM bench_mark WHERE id = 1", k, t0, 5)
        if all(v is not None for v in got.values()):
            return round(time.monotonic() - t_start, 1)
    raise RuntimeError(f"not every copy had the marker after {timeout:.0f}s: {got}")


def one(
    cluster: PgCluster,
    waiter: Waiter,
    runlog: RunLog,
    meter: RssMeter,
    table: str,
    shape: str,
    rows: int,
    timeout: float,
) -> dict[str, Any]:
    sql, probe, want = shape_sql(table, shape, rows)
    meter.mark()
    say(f"{table} {shape}: one transaction of {rows:,} rows")
    before, t0, statement = commit(cluster, sql)
    got = waiter.wait(before, probe, want, t0, timeout)
    peaks = meter.since_mark()
    deadline = time.monotonic() + 60  # the unit's line follows every target's apply and the unit's release
    while True:
        time.sleep(0.5)
        units = [u for u in runlog.units_between(t0, time.monotonic()) if u.changes]
        if sum(u.changes for u in units) >= rows or time.monotonic() > deadline:
            break
    last = max((got[n] for n in TARGETS if got[n] is not None), default=None)
    done = all(got[n] is not None for n in TARGETS)
    out = {
        "statement_s": round(statement, 3),
        "subscriber_s": got["subscriber"],
        "mirrorline_s": {n: got[n] for n in TARGETS},
        "last_target_s": last if done else None,
        "ratio": round(got["subscriber"] / last, 2) if done and last and got["subscriber"] is not None else None,
        "durable_s": got["durable"],
        "units": len(units),
        "changes": sum(u.changes for u in units),
        "compile_s": round(sum(u.compile_s for u in units), 3),
        "apply_s": {n: round(sum(u.apply_s.get(n, 0.0) for u in units), 3) for n in TARGETS},
        "apply_phases_s": {n: phases_of(units, n) for n in TARGETS},
        "peak_pss_mb": peaks["pss"],
        "peak_rss_mb": peaks["rss"],
    }
    say(
        f"{table} {shape}: subscriber {out['subscriber_s']}s, mirrorline {out['mirrorline_s']} (durable "
        f"{out['durable_s']}s, compile {out['compile_s']}s, apply {out['apply_s']}), ratio {out['ratio']}, "
        f"peak PSS {peaks['pss']['total']} MB"
    )
    return out


def phases_of(units: list[Any], target: str) -> dict[str, float]:
    """A target's apply seconds by phase (run's unit lines: stage, delete, update, insert, commit, other), summed
    over ``units``."""
    out: dict[str, float] = {}
    for u in units:
        for k, v in u.phases.get(target, {}).items():
            out[k] = round(out.get(k, 0.0) + v, 2)
    return out


def wait_warm(runlog: RunLog, timeout: float) -> float | None:
    """Seconds until ``run`` says its idle warm-up for large units has ended (it starts after 10 s without a unit),
    or None when it did not within ``timeout``: a pipeline that has run a while, as a nightly batch meets it."""
    t0 = time.monotonic()
    while runlog.warm_large is None and time.monotonic() - t0 < timeout:
        runlog.check_alive()
        time.sleep(0.2)
    return None if runlog.warm_large is None else round(time.monotonic() - t0, 1)


def bench(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    tables = args.tables.split(",")
    with PgCluster() as cluster:
        proc = None
        try:
            say(f"source and subscriber: {', '.join(tables)} of {args.rows:,} rows")
            t0 = time.monotonic()
            setup(cluster, tables, args.rows)
            out["setup_s"] = round(time.monotonic() - t0, 1)
            config_path = work / "mirrorline.toml"
            write_config(config_path, work, cluster, tables, args.latency)
            say("starting mirrorline run (it loads the three targets itself)")
            proc, runlog = start_run(config_path, work)
            whole = RssMeter(proc.pid)
            waiter = Waiter(cluster, work / "log", runlog)
            out["live_s"] = wait_live(cluster, waiter, args.start_timeout)
            say("waiting for run's idle warm-up for large units")
            out["warm_wait_s"] = wait_warm(runlog, 300)  # (None: it failed, or is slow; the transactions go on)
            out["warm_large_s"] = runlog.warm_large
            out["results"] = {}
            for table in tables:
                for shape in args.shapes.split(","):
                    out["results"][f"{table}_{shape}"] = one(
                        cluster, waiter, runlog, whole, table, shape, args.rows, args.timeout
                    )
            waiter.close()
            peaks = whole.stop()
            for m in ("pss", "rss"):  # the whole run's peak, each transaction's too (sampled at other moments)
                out[f"peak_{m}_mb"] = {
                    k: max([v, *(res[f"peak_{m}_mb"][k] for res in out["results"].values())])
                    for k, v in peaks[m].items()
                }
            out["mirrorline_exit"] = stop_run(proc)
            proc = None
            say("comparing every copy with the source, row by row")
            copies = {
                "sqlite": ("sqlite", str(work / "target.sqlite")),
                "duckdb": ("duckdb", str(work / "target.duckdb")),
                "pg": ("postgresql", cluster.dsn(ML_DB)),
                "subscriber": ("postgresql", cluster.dsn(SUB_DB)),
            }
            out["equal"] = {n: True for n in copies}
            for table in tables:
                for name, (kind, where) in copies.items():
                    diff = compare_table(cluster.dsn(SRC_DB), kind, where, table, COLUMNS[table])
                    if diff is not None:
                        out["equal"][name] = False
                        out.setdefault("differences", {})[f"{name}.{table}"] = diff
        finally:
            if proc is not None:
                stop_run(proc, timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of each table, and of each transaction")
    p.add_argument("--tables", default="narrow,wide", help="narrow, wide or both (comma-separated)")
    p.add_argument("--shapes", default="update,insert,delete", help="the transactions, in their order")
    p.add_argument("--latency", default="500ms", help="mirrorline's [apply] latency")
    p.add_argument("--keep", metavar="DIR", help="keep the configuration, change log, targets and run's log here")
    p.add_argument("--start-timeout", type=float, default=1800, help="seconds for every target to be loaded")
    p.add_argument("--timeout", type=float, default=900, help="seconds for each transaction to reach every copy")
    args = p.parse_args()
    out: dict[str, Any] = {"bench": "bigtxn", "rows": args.rows, "latency": args.latency}
    run_in_folder(bench, args, out, "bigtxn", say)


if __name__ == "__main__":
    main()
