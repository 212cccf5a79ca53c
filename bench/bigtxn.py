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

Timed from the moment the COMMIT returned, each polled every 100 ms (a poll takes the cores from the work it
times): ``subscriber_s`` (the subscriber's copy shows the transaction: a row it changed; the subscriber applies a
transaction atomically), ``mirrorline_s`` per target (the target's applied position in the log's reader registry,
written right after each unit's commit, past the WAL position taken just before the COMMIT) and ``last_target_s``;
``ratio`` = subscriber_s / last_target_s (> 1: mirrorline's last target had it sooner). The seconds split by phase:
``sent_s`` and ``subscriber_sent_s`` (mirrorline's walsender and the subscriber's have decoded the WAL past the
position taken just before the COMMIT: what is left of the source's decoding after its commit), ``durable_s`` (the
log holds the transaction, fsynced: capture received its commit and made its streamed changes log content), and from
``run``'s unit lines for the units that carried it: ``compile_s`` and ``apply_s`` per target (targets apply side by
side), the latter by phase in ``apply_phases_s`` (``stage``: net rows into worktables, waiting for rows still being
read; ``delete``, ``update``, ``insert``; ``commit``; ``other``: connecting, locks, the target's state).
``statement_s``: how long the source took to run the statement. ``peak_pss_mb`` / ``peak_rss_mb``: the peak memory
of ``run``'s process tree (Python, JVM, Spark's Python workers) during that transaction's replication
(proportional: shared pages counted once), and over the whole run (``peak``). ``cpu_s``: the CPU seconds each
used from just before the statement until every copy had the transaction (as ``bench/live`` counts them, with
mirrorline's PostgreSQL target's backends as ``pg_target_mirrorline``); ``python_threads_cpu_s``: ``run``'s Python
process by thread (capture, each target's lane, the log's writer...); ``cpu_per_1000_changes``: mirrorline's tree,
walsender and target backends per 1,000 changes per target beside the subscriber's apply worker and walsender (the
machine is shared by both, so CPU seconds say more steadily than wall seconds what each costs).

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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2

from live import CpuMeter, RssMeter, RunLog, compare_table, proc_cpu, run_in_folder, start_run, stop_run
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
    """Polls, every 100 ms, when the log, each target and the subscriber have a transaction."""

    def __init__(self, cluster: PgCluster, log_path: Path, runlog: RunLog) -> None:
        self.log_path, self.runlog = log_path, runlog
        self.sub = psycopg2.connect(cluster.dsn(SUB_DB))
        self.sub.autocommit = True

        self.src = psycopg2.connect(cluster.dsn(SRC_DB))
        self.src.autocommit = True

    def close(self) -> None:
        self.sub.close()
        self.src.close()

    def subscriber_senders(self) -> frozenset[int]:
        """The pids of the subscriber's walsenders (the others serve mirrorline)."""
        with self.src.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_replication WHERE application_name LIKE %s", (SUB + "%",))
            return frozenset(int(p) for (p,) in cur.fetchall())

    def _sent(self) -> dict[str, int]:
        """How far each walsender has read the WAL (``sent``: mirrorline's, ``subscriber_sent``: the subscriber's;
        a logical walsender's sent position is the end of the last record it decoded)."""
        out: dict[str, int] = {}
        with self.src.cursor() as cur:
            cur.execute("SELECT application_name LIKE %s, sent_lsn::text FROM pg_stat_replication", (SUB + "%",))
            for sub, lsn in cur.fetchall():
                if lsn is not None:
                    k = "subscriber_sent" if sub else "sent"
                    out[k] = max(out.get(k, 0), parse_lsn(lsn))
        return out

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
        passed: dict[str, float | None] = {"sent": None, "subscriber_sent": None}  # (not waited for)
        deadline = t0 + timeout
        while any(v is None for v in got.values()) and time.monotonic() < deadline:
            self.runlog.check_alive()
            now = time.monotonic()
            if None in passed.values():
                for k, sent in self._sent().items():
                    if passed[k] is None and sent > before:
                        passed[k] = now - t0
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
            time.sleep(0.1)
        return {k: None if v is None else round(v, 3) for k, v in (got | passed).items()}


def wait_live(cluster: PgCluster, waiter: Waiter, timeout: float) -> float:
    """Seconds until every target and the subscriber hold a marker: one committed every 5 s until they do (the
    first ones may come before ``run`` has made its slot, and reach the targets by the snapshot)."""
    t_start = time.monotonic()
    for k in range(1, int(timeout / 5) + 2):
        before, t0, _ = commit(cluster, "UPDATE bench_mark SET v = v + 1")
        got = waiter.wait(before, "SELECT v FROM bench_mark WHERE id = 1", k, t0, 5)
        if all(got[name] is not None for name in ("durable", *TARGETS, "subscriber")):
            return round(time.monotonic() - t_start, 1)
    raise RuntimeError(f"not every copy had the marker after {timeout:.0f}s: {got}")


_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of process ``pid``: tid -> (the name the OS shows, CPU seconds used so far). mirrorline names its
    threads at the OS as in Python (``mirrorline.osthreads``)."""
    out: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                stat = (task / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                out[int(task.name)] = (
                    stat[stat.index("(") + 1 : stat.rindex(")")],
                    (int(fields[11]) + int(fields[12])) / _TICK,
                )
    return out


class ThreadSampler:
    """The CPU seconds of each thread of process ``pid`` between :meth:`start` and :meth:`stop`, summed by name with
    a pool's number cut off (``ahead-pg_0`` -> ``ahead-pg``): sampled every second, so that a thread that ended
    meanwhile (a lane's pool) counts up to its last sample."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first: dict[int, tuple[str, float]] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        self.last.update(thread_cpu(self.pid))

    def _main(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def start(self) -> None:
        self.first = thread_cpu(self.pid)
        self.last = dict(self.first)
        self._stop.clear()
        self._thread = threading.Thread(target=self._main, name="thread-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()
        out: dict[str, float] = {}
        for tid, (name, cpu) in self.last.items():
            base = name.rsplit("_", 1)[0] if name.rsplit("_", 1)[-1].isdigit() else name
            used = cpu - self.first.get(tid, (name, 0.0))[1]
            out[base] = out.get(base, 0.0) + used
        return {n: round(c, 1) for n, c in sorted(out.items()) if c >= 0.1}


def target_backends_cpu(database: str) -> dict[int, float]:
    """The CPU seconds used so far by each PostgreSQL backend connected to ``database`` (mirrorline's PostgreSQL
    target: its writes are its apply's work, as the subscriber's apply worker's are its own)."""
    return {
        pid: cpu
        for pid, (_, _, cmdline, cpu) in proc_cpu().items()
        if cmdline.startswith("postgres: ") and f" {database} " in cmdline
    }


class TxnCpu:
    """CPU seconds by who used them while one transaction ran at the source and reached every copy: the
    processes as ``bench/live`` counts them, mirrorline's PostgreSQL target's backends apart from the other
    PostgreSQL processes, and mirrorline's Python process by thread. ``per_1000_changes``: mirrorline's whole tree,
    its walsender and its PostgreSQL target's backends per 1,000 changes per target, beside the subscriber's apply
    worker and walsender per 1,000 changes."""

    def __init__(self, run_pid: int, senders: Callable[[], frozenset[int]]) -> None:
        self.run_pid = run_pid
        self.meter = CpuMeter(run_pid, senders)
        self.threads = ThreadSampler(run_pid)
        self.backends: dict[int, float] = {}

    def start(self) -> None:
        self.meter.start()
        self.threads.start()
        self.backends = target_backends_cpu(ML_DB)

    def stop(self, changes: int) -> dict[str, Any]:
        used = self.meter.stop()
        by_thread = self.threads.stop()
        backends = target_backends_cpu(ML_DB)
        target = sum(max(0.0, c - self.backends.get(p, 0.0)) for p, c in backends.items())
        used["pg_target_mirrorline"] = round(target, 1)
        used["pg_other"] = round(max(0.0, used.get("pg_other", 0.0) - target), 1)
        ml = sum(used.get(k, 0.0) for k in ("mirrorline_python", "mirrorline_jvm", "mirrorline_other"))
        ml += used.get("pg_walsender_mirrorline", 0.0) + target
        sub = used.get("pg_subscriber_apply", 0.0) + used.get("pg_walsender_subscriber", 0.0)
        k = max(changes, 1) / 1000
        return {
            "cpu_s": used,
            "python_threads_cpu_s": by_thread,
            "cpu_per_1000_changes": {
                "mirrorline_per_target": round(ml / k / len(TARGETS), 4),
                "subscriber": round(sub / k, 4),
                "ratio": round(ml / len(TARGETS) / sub, 2) if sub else None,
            },
        }


def one(
    cluster: PgCluster,
    waiter: Waiter,
    runlog: RunLog,
    meter: RssMeter,
    cpu: TxnCpu,
    table: str,
    shape: str,
    rows: int,
    timeout: float,
) -> dict[str, Any]:
    sql, probe, want = shape_sql(table, shape, rows)
    meter.mark()
    say(f"{table} {shape}: one transaction of {rows:,} rows")
    cpu.start()
    before, t0, statement = commit(cluster, sql)
    got = waiter.wait(before, probe, want, t0, timeout)
    used = cpu.stop(rows)
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
        "sent_s": got["sent"],
        "subscriber_sent_s": got["subscriber_sent"],
        "durable_s": got["durable"],
        "units": len(units),
        "changes": sum(u.changes for u in units),
        "compile_s": round(sum(u.compile_s for u in units), 3),
        "apply_s": {n: round(sum(u.apply_s.get(n, 0.0) for u in units), 3) for n in TARGETS},
        "apply_phases_s": {n: phases_of(units, n) for n in TARGETS},
        "peak_pss_mb": peaks["pss"],
        "peak_rss_mb": peaks["rss"],
        **used,
    }
    say(
        f"{table} {shape}: subscriber {out['subscriber_s']}s (its walsender past the commit "
        f"{out['subscriber_sent_s']}s), mirrorline {out['mirrorline_s']} (walsender past the commit "
        f"{out['sent_s']}s, durable {out['durable_s']}s, compile {out['compile_s']}s, apply {out['apply_s']}), "
        f"ratio {out['ratio']}, "
        f"peak PSS {peaks['pss']['total']} MB, CPU per 1,000 changes {used['cpu_per_1000_changes']}"
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
            cpu = TxnCpu(proc.pid, waiter.subscriber_senders)
            out["live_s"] = wait_live(cluster, waiter, args.start_timeout)
            say("waiting for run's idle warm-up for large units")
            out["warm_wait_s"] = wait_warm(runlog, 300)  # (None: it failed, or is slow; the transactions go on)
            out["warm_large_s"] = runlog.warm_large
            out["results"] = {}
            for table in tables:
                for shape in args.shapes.split(","):
                    out["results"][f"{table}_{shape}"] = one(
                        cluster, waiter, runlog, whole, cpu, table, shape, args.rows, args.timeout
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
