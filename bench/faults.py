"""Benchmark: faults survived, and counted. pgbench runs against a throwaway source for several minutes while faults
are injected at random times; mirrorline is restarted after each as a supervisor would; at the end every target is
compared with the source.

- Source: ``pgbench -i -s --scale`` (``pgbench_history`` REPLICA IDENTITY FULL), load ``pgbench -R --rate`` restarted
  whenever it stops (the source restarts under it); ``logical_decoding_work_mem = 64kB``, so that a large
  transaction is streamed while in progress.
- Targets: SQLite, DuckDB, a Delta folder, and PostgreSQL in a cluster of its own (so that it can be stopped while
  the source goes on).
- mirrorline runs either as one ``run`` process or as ``capture`` and ``apply`` processes, switching every ten kills.
- Faults: SIGKILL of a random mirrorline process (``run``, ``capture`` or ``apply``) every 1 to ``--kill-every`` s
  until ``--kills``; among them, at random kills: an immediate restart of the source (``pg_ctl -m immediate``);
  ``pg_terminate_backend`` of the walsender; the PostgreSQL target stopped for ``--outage`` s; the SQLite target
  locked by another writer for ``--lock`` s; a transaction of ``--streamed-rows`` rows (streamed while in progress);
  a ``TRUNCATE pgbench_history``; a schema change (``ALTER TABLE pgbench_history ADD COLUMN ... DEFAULT``, a
  column the later rows fill); ``mirrorline verify`` beside ``run`` (exit 0: every target equal at its point); the
  replication slot dropped while mirrorline is stopped, changes made, mirrorline started again: it must mark every
  target *needs reload* (counted as ``slot_drops_refused_clearly``), after which each target is loaded again with
  ``mirrorline snapshot --target``. A process that exits (killed, or stopped by an error such as the target being
  away) is started again after 0.2 s.
- A fault's recovery: from the fault until every target's applied position (the log's reader registry) has passed
  the source's WAL position at the fault (after a source restart: once it is back).

After the faults the load stops, everything is drained, mirrorline is stopped, and each table of each target is
compared with the source as a multiset, every column the source has. Prints one JSON line: ``kills`` (by process
kind), one count per other fault (``source_restarts``, ``walsender_kills``, ``target_outages``, ``target_locks``,
``streamed_transactions``, ``truncates``, ``schema_changes``, ``verify_runs`` with ``verify_exit_codes``,
``slot_drops`` with ``slot_drops_refused_clearly``), ``recoveries`` (faults recovered from), ``longest_recovery_s``,
``recovery_p50_s``, ``rows_lost`` and ``rows_duplicated`` (over every table and target: must be 0),
``nothing_lost`` (true when both are 0 and every slot drop was refused clearly), ``lag_after_last_fault_s``,
``seconds``.

    .venv/bin/python bench/faults.py [--kills 100] [--kill-every 6] [--scale 1] [--rate 100] [--outage 30] [--lock 10]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from live import TABLES, read_table
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import needs_reload, readers
from mirrorline.pgcluster import PgCluster, _as_server_user

SRC_DB, TGT_DB = "faults_src", "faults_tgt"
TARGETS = ("sqlite", "pg", "duckdb", "delta")
FAULTS = (
    "source_restarts",
    "walsender_kills",
    "target_outages",
    "target_locks",
    "streamed_transactions",
    "truncates",
    "schema_changes",
    "verify_runs",
    "slot_drops",
)


def say(msg: str) -> None:
    print(f"[bench/faults] {msg}", file=sys.stderr, flush=True)


def pg_ctl(cluster: PgCluster, *args: str) -> None:
    cmd = [
        *_as_server_user(),
        cluster.bin("pg_ctl"),
        "-D",
        str(cluster.datadir),
        "-l",
        str(cluster.root / "server.log"),
    ]
    subprocess.run([*cmd, *args], capture_output=True, cwd="/", timeout=120)


def lsn(cluster: PgCluster) -> int:
    for _ in range(100):
        try:
            return int(cluster.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn", SRC_DB)[0][0])
        except Exception:
            time.sleep(0.2)
    raise RuntimeError("the source did not come back")


class Supervisor:
    """Keeps mirrorline running (``run``, or ``capture`` + ``apply``), restarting what exits."""

    def __init__(self, config: Path, work: Path) -> None:
        self.config, self.work = config, work
        self.mode = "run"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts = collections.Counter[str]()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _start(self, kind: str) -> None:
        args = [sys.executable, "-m", "mirrorline.cli.main", kind, "-c", str(self.config)]
        log = open(self.work / f"{kind}.log", "ab")  # noqa: SIM115 (the child writes it)
        self.procs[kind] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(self.work),
            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        self.starts[kind] += 1

    def _loop(self) -> None:
        while not self.stop.wait(0.2):
            with self.lock:
                want = ["run"] if self.mode == "run" else ["capture", "apply"]
                if self.mode.startswith("paused:"):
                    want = []
                for kind in list(self.procs):
                    if kind not in want or self.procs[kind].poll() is not None:
                        self._kill(kind)
                for kind in want:
                    if kind not in self.procs:
                        self._start(kind)

    def _kill(self, kind: str) -> None:
        p = self.procs.pop(kind, None)
        if p is None:
            return
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the JVM too: it leads its own session
        p.wait()

    def kill_random(self, rng: random.Random) -> str | None:
        with self.lock:
            live = [k for k, p in self.procs.items() if p.poll() is None]
            if not live:
                return None
            kind = rng.choice(live)
            self._kill(kind)
            return kind

    def pause(self) -> None:
        """Stop every process and start none until :meth:`resume`."""
        with self.lock:
            self.mode = "paused:" + self.mode
            for kind in list(self.procs):
                self._kill(kind)

    def resume(self) -> None:
        with self.lock:
            self.mode = self.mode.removeprefix("paused:")

    def switch(self) -> None:
        with self.lock:
            self.mode = "split" if self.mode == "run" else "run"

    def shutdown(self) -> None:
        self.stop.set()
        self.thread.join()
        with self.lock:
            for kind, p in list(self.procs.items()):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(60)
                    except subprocess.TimeoutExpired:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                self.procs.pop(kind)


class Load(threading.Thread):
    """pgbench at a fixed rate, started again whenever it stops."""

    def __init__(self, cluster: PgCluster, rate: int, work: Path) -> None:
        super().__init__(daemon=True)
        self.cluster, self.rate, self.work = cluster, rate, work
        self.done = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None

    def run(self) -> None:
        args = [self.cluster.bin("pgbench"), "-n", "-c", "2", "-j", "2", "-R", str(self.rate), "-T", "100000",
                "-h", "127.0.0.1", "-p", str(self.cluster.port), "-U", self.cluster.user, SRC_DB]  # fmt: skip
        with open(self.work / "pgbench.log", "ab") as log:
            while not self.done.is_set():
                self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd="/")
                while self.proc.poll() is None and not self.done.wait(0.5):
                    pass
                if self.proc.poll() is None:
                    self.proc.terminate()
                    self.proc.wait()
                self.done.wait(1.0)


class Recoveries(threading.Thread):
    """Per fault: how long until every target's applied position passed the source's position at the fault."""

    def __init__(self, log_path: Path) -> None:
        super().__init__(daemon=True)
        self.log_path = log_path
        self.pending: list[tuple[str, float, int]] = []
        self.done: list[tuple[str, float]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def fault(self, kind: str, at: float, position: int) -> None:
        with self.lock:
            self.pending.append((kind, at, position))

    def applied(self) -> int | None:
        regs = readers(ChangeLog(self.log_path))
        pos = [regs[t].applied for t in TARGETS if t in regs]
        if len(pos) < len(TARGETS) or any(p is None for p in pos):
            return None
        return min(p.lsn for p in pos if p is not None)

    def sweep(self, low: int, now: float) -> None:
        """The pending faults every target has passed (``low``: the lowest applied position) are recovered from."""
        with self.lock:
            left = []
            for kind, at, position in self.pending:
                if low >= position:
                    self.done.append((kind, now - at))
                else:
                    left.append((kind, at, position))
            self.pending = left

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                low = self.applied()
            except Exception:
                continue
            if low is not None:
                self.sweep(low, time.monotonic())


def columns(src: PgCluster, table: str) -> tuple[tuple[str, str], ...]:
    """The source table's columns now, with the kind the reader canonicalises them as."""
    rows = src.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'public' "
        f"AND table_name = '{table}' ORDER BY ordinal_position",
        SRC_DB,
    )
    kinds = {"integer": "int", "bigint": "int", "timestamp without time zone": "ts"}
    return tuple((str(c), kinds.get(str(t), "text")) for c, t in rows)


def where(tgt: PgCluster, work: Path) -> dict[str, tuple[str, str]]:
    return {
        "sqlite": ("sqlite", str(work / "target.sqlite")),
        "pg": ("postgresql", tgt.dsn(TGT_DB)),
        "duckdb": ("duckdb", str(work / "target.duckdb")),
        "delta": ("delta", str(work / "target.lake")),
    }


def compare(src: PgCluster, tgt: PgCluster, work: Path) -> tuple[int, int, dict[str, Any]]:
    lost = duplicated = 0
    detail: dict[str, Any] = {}
    for table in TABLES:
        cols = columns(src, table)
        want = collections.Counter(read_table("postgresql", src.dsn(SRC_DB), table, cols))
        for name, (kind, path) in where(tgt, work).items():
            lacking = [c for c, _ in cols if c not in target_columns(kind, path, table)]
            if lacking:  # (SQLite would read a missing "column" as a string)
                lost += sum(want.values())
                detail[f"{name}.{table}"] = {"lacks columns": lacking}
                continue
            got = collections.Counter(read_table(kind, path, table, cols))
            missing, extra = sum((want - got).values()), sum((got - want).values())
            lost += missing
            duplicated += extra
            detail[f"{name}.{table}"] = {"rows": sum(got.values()), "missing": missing, "extra": extra}
    return lost, duplicated, detail


def target_columns(kind: str, where: str, table: str) -> set[str]:
    """The columns a target's table has, read as its own clients would."""
    if kind == "postgresql":
        import psycopg2

        conn = psycopg2.connect(where)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
                    "AND table_name = %s",
                    (table,),
                )
                return {r[0] for r in cur.fetchall()}
        finally:
            conn.close()
    if kind == "sqlite":
        sconn = sqlite3.connect(f"file:{where}?mode=ro", uri=True)
        try:
            return {r[1] for r in sconn.execute("SELECT * FROM pragma_table_info(?)", (table,))}
        finally:
            sconn.close()
    if kind == "delta":
        from deltalake import DeltaTable

        return {f.name for f in DeltaTable(str(Path(where) / table)).schema().fields}
    import duckdb

    dconn = duckdb.connect(where, read_only=True)
    try:
        rows = dconn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'main' AND table_name = ?",
            [table],
        ).fetchall()
        return {r[0] for r in rows}
    finally:
        dconn.close()


def mirrorline(config: Path, work: Path, *args: str, timeout: float = 600) -> int:
    """A mirrorline command beside the supervised ones; its exit code."""
    with open(work / f"{args[0]}.log", "ab") as log:
        p = subprocess.run(
            [sys.executable, "-m", "mirrorline.cli.main", *args, "-c", str(config)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(work), timeout=timeout,
        )  # fmt: skip
    return p.returncode


def drop_slot(src: PgCluster, sup: Supervisor, work: Path, config: Path) -> bool:
    """The slot dropped while mirrorline is stopped, a few seconds of load, mirrorline started again: True when it
    marked every target *needs reload*; then each is loaded again."""
    sup.pause()
    for _ in range(100):
        try:
            src.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'mirrorline' "
                "AND active_pid IS NOT NULL",
                SRC_DB,
            )
            src.execute("SELECT pg_drop_replication_slot('mirrorline')", SRC_DB)
            break
        except Exception:
            time.sleep(0.2)
    time.sleep(3)
    sup.resume()
    deadline = time.monotonic() + 120
    marked = False
    while time.monotonic() < deadline:
        if set(needs_reload(ChangeLog(work / "log"))) >= set(TARGETS):
            marked = True
            break
        time.sleep(0.5)
    sup.pause()
    for t in TARGETS:
        code = mirrorline(config, work, "snapshot", "--target", t)
        if code != 0:
            raise RuntimeError(f"snapshot --target {t} exited {code} (see {work / 'snapshot.log'})")
    sup.resume()
    return marked


def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    src = PgCluster({"wal_sender_timeout": "10s", "logical_decoding_work_mem": "64kB"}).start()
    tgt = PgCluster().start()
    sup: Supervisor | None = None
    load: Load | None = None
    rec: Recoveries | None = None
    try:
        src.create_database(SRC_DB)
        subprocess.run([src.bin("pgbench"), "-i", "-q", "-s", str(args.scale), "-h", "127.0.0.1", "-p", str(src.port),
                        "-U", src.user, SRC_DB], check=True, capture_output=True, cwd="/")  # fmt: skip
        src.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL", SRC_DB)
        tgt.create_database(TGT_DB)
        config = work / "mirrorline.toml"
        q = json.dumps
        config.write_text(
            f"[source]\ndsn = {q(src.dsn(SRC_DB))}\n\n[log]\npath = {q(str(work / 'log'))}\n\n"
            '[apply]\nlatency = "300ms"\n\n'
            + "".join(f'[tables."public.{t}"]\n' for t in TABLES)
            + f"\n[targets.sqlite]\nurl = {q('sqlite:///' + str(work / 'target.sqlite'))}\n"
            f"[targets.pg]\nurl = {q(tgt.url(TGT_DB))}\n"
            f"[targets.duckdb]\nurl = {q('duckdb:///' + str(work / 'target.duckdb'))}\n"
            f"[targets.delta]\nurl = {q('delta:///' + str(work / 'target.lake'))}\n"
        )
        sup = Supervisor(config, work)
        sup.thread.start()
        rec = Recoveries(work / "log")
        say("waiting for mirrorline to load the targets")
        deadline = time.monotonic() + 600
        while rec.applied() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the targets were not loaded in 600 s")
            time.sleep(0.5)
        rec.start()
        load = Load(src, args.rate, work)
        load.start()
        t0 = time.monotonic()
        counts: collections.Counter[str] = collections.Counter()
        kills: collections.Counter[str] = collections.Counter()
        # the other faults at random moments among the kills
        others = [f for f in FAULTS for _ in range(getattr(args, f))]
        verify_codes: collections.Counter[int] = collections.Counter()
        refused_clearly = 0
        added = 0
        at_kill = sorted(rng.sample(range(1, max(args.kills, len(others) + 1)), len(others)))
        plan = dict(zip(at_kill, rng.sample(others, len(others)), strict=True))
        last_fault = t0
        n = 0
        while n < args.kills:
            time.sleep(rng.uniform(1.0, args.kill_every))
            kind = sup.kill_random(rng)
            if kind is None:
                continue
            n += 1
            kills[kind] += 1
            last_fault = time.monotonic()
            rec.fault("kill", last_fault, lsn(src))
            if n % 10 == 0:
                sup.switch()
            other = plan.get(n)
            if other == "source_restarts":
                pg_ctl(src, "-m", "immediate", "-w", "restart")
            elif other == "walsender_kills":
                src.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                            "WHERE slot_name = 'mirrorline' AND active_pid IS NOT NULL", SRC_DB)  # fmt: skip
            elif other == "target_outages":
                pg_ctl(tgt, "-m", "fast", "-w", "stop")
                time.sleep(args.outage)
                pg_ctl(tgt, "-w", "start")
            elif other == "target_locks":
                db = sqlite3.connect(work / "target.sqlite", timeout=30)
                db.execute("BEGIN EXCLUSIVE")
                time.sleep(args.lock)
                db.rollback()
                db.close()
            elif other == "streamed_transactions":
                src.execute(
                    "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) SELECT 1 + g % 10, 1, g, -g, now() "
                    f"FROM generate_series(1, {args.streamed_rows}) g",
                    SRC_DB,
                )
            elif other == "truncates":
                src.execute("TRUNCATE pgbench_history", SRC_DB)
            elif other == "schema_changes":
                added += 1
                src.execute(f"ALTER TABLE pgbench_history ADD COLUMN extra_{added} integer DEFAULT {added}", SRC_DB)
            elif other == "verify_runs":
                code = mirrorline(config, work, "verify")
                verify_codes[code] += 1
                if code != 0:
                    say(f"verify exited {code}: see {work / 'verify.log'}")
            elif other == "slot_drops":
                refused_clearly += drop_slot(src, sup, work, config)
            if other is not None:
                counts[other] += 1
                last_fault = time.monotonic()
                rec.fault(other, last_fault, lsn(src))
                say(f"{other[:-1].replace('_', ' ')} after kill {n}")
            if n % 10 == 0:
                say(f"{n} kills ({dict(kills)}), {len(rec.done)} recoveries, {len(rec.pending)} pending")
        load.done.set()
        load.join()
        end = lsn(src)
        # a change past it, of every table (a schema change reaches the targets with its table's next change)
        src.execute(
            "UPDATE pgbench_branches SET bbalance = bbalance WHERE bid = 1; UPDATE pgbench_tellers SET tbalance = "
            "tbalance WHERE tid = 1; UPDATE pgbench_accounts SET abalance = abalance WHERE aid = 1; INSERT INTO "
            "pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 0, now())",
            SRC_DB,
        )
        rec.fault("end", time.monotonic(), end)
        say("load stopped: draining")
        deadline = time.monotonic() + 600
        while True:
            low = rec.applied()
            if low is not None and low >= end:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("mirrorline did not catch up in 600 s after the last fault")
            time.sleep(0.2)
        lag_after = time.monotonic() - last_fault
        rec.stop.set()
        rec.join()
        rec.sweep(low, time.monotonic())  # what the thread had not looked at since the targets passed the end
        sup.shutdown()
        sup = None
        lost, duplicated, detail = compare(src, tgt, work)
        durations = [d for k, d in rec.done if k != "end"]
        return {
            "kills": sum(kills.values()),
            "kills_by_process": dict(kills),
            **{f: counts[f] for f in FAULTS},
            "verify_exit_codes": {str(k): v for k, v in sorted(verify_codes.items())},
            "slot_drops_refused_clearly": refused_clearly,
            "nothing_lost": lost == 0 and duplicated == 0 and refused_clearly == counts["slot_drops"],
            "recoveries": len(durations),
            "unrecovered": len(rec.pending),
            "longest_recovery_s": round(max(durations), 2) if durations else None,
            "recovery_p50_s": round(statistics.median(durations), 2) if durations else None,
            "rows_lost": lost,
            "rows_duplicated": duplicated,
            "lag_after_last_fault_s": round(lag_after, 2),
            "seconds": round(time.monotonic() - t0, 1),
            "tables": detail,
        }
    finally:
        if load is not None:
            load.done.set()
            if load.proc is not None and load.proc.poll() is None:
                load.proc.terminate()
        if rec is not None:
            rec.stop.set()
        if sup is not None:
            sup.shutdown()
        src.stop()
        tgt.stop()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--kill-every", type=float, default=6.0, help="at most this many seconds between kills")
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--rate", type=int, default=100, help="pgbench transactions per second")
    p.add_argument("--source-restarts", type=int, default=2)
    p.add_argument("--walsender-kills", type=int, default=3)
    p.add_argument("--target-outages", type=int, default=1)
    p.add_argument("--target-locks", type=int, default=1)
    p.add_argument("--streamed-transactions", type=int, default=2)
    p.add_argument("--streamed-rows", type=int, default=20_000, help="rows of each streamed transaction")
    p.add_argument("--truncates", type=int, default=1)
    p.add_argument("--schema-changes", type=int, default=2)
    p.add_argument("--verify-runs", type=int, default=2)
    p.add_argument("--slot-drops", type=int, default=1)
    p.add_argument("--outage", type=float, default=30.0, help="seconds the PostgreSQL target is stopped")
    p.add_argument("--lock", type=float, default=10.0, help="seconds the SQLite target is locked")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", help="a folder to work in and keep (logs of every process); default: a temporary one")
    args = p.parse_args(argv)
    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        out = bench(args, Path(args.work))
    else:
        with tempfile.TemporaryDirectory(prefix="mirrorline-faults-") as d:
            out = bench(args, Path(d))
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
