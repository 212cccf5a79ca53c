"""Benchmark: lag of a running ``mirrorline run`` under live pgbench load, beside PostgreSQL's logical replication.

Setup (not timed, except where said): one throwaway PostgreSQL cluster. Database ``bench_src``: ``pgbench -i -s
--scale``, ``pgbench_history`` (no key) set to ``REPLICA IDENTITY FULL``, and a table ``bench_heartbeat``.

- The yardstick, PostgreSQL's logical replication: a publication of the four pgbench tables and the heartbeat; database
  ``bench_sub`` of the same cluster gets the same tables (created by ``pgbench -i -I dtp``: same DDL, no data) and a
  subscription to it (its slot created beforehand with ``pg_create_logical_replication_slot``, since CREATE
  SUBSCRIPTION to the same cluster would hang creating it), seeded by ``copy_data`` and waited for until every table
  is ready (``subscription_sync_s``).
- mirrorline: a configuration (source, a log folder, ``[apply] latency = --latency``, the four pgbench tables and the
  heartbeat) with
  three targets: ``sqlite`` and ``duckdb`` files and ``pg``, database ``bench_ml`` of the same cluster. ``mirrorline
  run -c CONFIG`` is started as a process of its own (its stdout and stderr in ``run.log``); it loads the new targets
  itself (``snapshot``: rows and seconds of each target's last progress line), then replicates. Once every target is
  loaded (``loaded_s``) a no-op update of one ``pgbench_branches`` row is made each second until every target has
  applied a unit with changes. Reported, in seconds from the process's start: ``first_unit_s`` (its first unit line,
  which may only move a target's position), ``first_change_unit_s`` and ``first_change_unit_per_target_s`` (the first
  unit with changes: the first real compile), and ``live_s`` (every target live: ``status`` says ``live`` and the lag
  is 0; see below for DuckDB). The load starts after that.

Phases, each ``--phase-seconds`` long, ``pgbench -n -T`` (the default TPC-B-like script: 3 updates, 1 select, 1 insert
per transaction) on ``bench_src``: ``r300`` (``-R 300 -c 2 -j 2``), ``r1000`` (``-R 1000 -c 2 -j 2``), ``unthrottled``
(``-c 4 -j 2``); pgbench's own ``tps`` is reported. A thread updates the heartbeat row with ``clock_timestamp()``
every 0.1 s from the first phase until everything is drained. Once a second during each phase:

- mirrorline, per target: the lag in seconds of ``mirrorline status`` (the age of the oldest change in the change log
  the target has not applied; 0 when it has applied all the log holds, so changes not yet captured into the log do not
  count), from :func:`mirrorline.status.status` called in this process (what ``status --json`` prints as
  ``targets[].lag_seconds``) for ``sqlite`` and ``pg``. For ``duckdb`` ``status`` cannot be used while ``run`` holds
  the file open (DuckDB lets one process open a file; ``duckdb_status_error`` shows what status reports then, and
  probing it when ``run`` has just closed it would make ``run`` fail), so its lag is computed with the same formula
  from the applied position ``run`` records in the log's reader registry (``<log>/readers/duckdb.json``, written
  right after each unit's commit).
- mirrorline's ``heartbeat_lag`` for ``sqlite`` and ``pg``: ``clock_timestamp()`` minus the heartbeat value the
  target holds, read from the SQLite file and from ``bench_ml``: end to end, from the source's commit through capture,
  the log and the unit (the lag above starts once a change is in the log), measured as the subscriber's heartbeat lag
  (overstates by up to 0.1 s). Not for ``duckdb``, which this process cannot open while ``run`` holds it.
- the subscriber: ``replay_lag`` of its walsender in ``pg_stat_replication`` (NULL, caught up, counts as 0), and the
  heartbeat's lag: ``clock_timestamp()`` minus the heartbeat value the subscriber holds (overstates by up to 0.1 s).

Per phase and series: ``p50``, ``p99``, ``max``, ``slope`` (least squares, seconds of lag per second of the phase: > 0
means falling behind) and ``end`` (the last sample). Per phase the units ``run`` printed during it (one stderr line per
unit: ``unit A..B: N changes, compiled in Xs, applied: sqlite Ys, duckdb Zs, pg Ws``): how many, changes p50 and sum,
compile p50, apply p50 per target, whole unit p50 (compile + the slowest target's apply: targets apply in parallel).
``cpu_s``: the CPU seconds used from the phase's start to 2 s before its end, by mirrorline's Python process, its
Spark JVM, this benchmark's own probes, the source's walsenders (mirrorline's and the subscriber's apart), the
subscriber's apply worker, pgbench, the other PostgreSQL processes (pgbench's backends, mirrorline's target
connection) and the rest, beside the machine's busy time and capacity (cores x wall). ``cpu_per_1000_changes``:
mirrorline's tree and walsender per 1,000 changes applied (and per target), the subscriber's apply worker and
walsender per 1,000 changes of the source, and the ratio of the two (per target over the subscriber).

After the phases: the source's WAL position is taken and one marker update committed after it; ``drain_s`` is how long
each mirrorline target (applied position past that WAL position, from the reader registry) and the subscriber
(``replay_lsn`` past the marker) took to apply everything, bounded by ``--drain-timeout``. ``peak_rss_mb``: the
highest resident memory of ``run``'s process tree from its start to here (``total`` at one moment; ``python``,
``jvm`` and ``other``, Spark's Python workers, each its own peak), sampled every half second; ``peak_pss_mb`` the
same in proportional set size (a page shared by several processes, as Spark's forked Python workers share most of
theirs, counted once in all: what the tree takes from the machine). Then ``run`` is stopped (SIGTERM).

``restart`` (unless ``--restart-transactions 0``): with ``run`` stopped, ``pgbench -n -c 1 -t N`` (N =
``--restart-transactions``, default 1,000: about 4,000 changes) and a marker update; then ``run`` is started again (a
new process, a new JVM; its output in ``run_restart.log``), and reported, in seconds from that process's start:
``first_change_unit_s`` (the first unit with changes, per target too: what the pipeline pays for a cold JVM, after
capturing what waited in the slot), ``first_change_unit_from_spark_s`` (the same from the moment Spark began to
start, which ``run``'s "Spark ready: started in Xs, warmed up in Ys" line gives; ``spark_start_after_s``: when that
was, after the process's start: Python's imports and the configuration) and ``caught_up_s``
per target (applied position past the marker, from the reader registry); the units it printed until then (changes,
compile seconds). Then it is stopped again.

Then every target, and the subscriber, is compared with the source exactly: each of the four tables read
whole, values normalised (integers; ``char(n)`` fillers with trailing blanks stripped; ``mtime`` as an ISO string at
microsecond precision), sorted, compared as multisets (``pgbench_history`` may hold duplicate rows): ``equal`` per
target, with row counts. Prints one JSON line.

    .venv/bin/python bench/live.py [--phase-seconds 120] [--scale 10] [--latency 500ms]
                                   [--phases r300,r1000,unthrottled] [--restart-transactions 1000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2

from mirrorline.config import Config
from mirrorline.config import load as load_config
from mirrorline.pgcluster import PgCluster
from mirrorline.position import parse_lsn

SRC_DB, SUB_DB, ML_DB = "bench_src", "bench_sub", "bench_ml"
SUB = "bench_sub"  # subscription, its slot and its walsender's application_name
PUB = "bench_pub"
HEARTBEAT_EVERY = 0.1
# table -> (column, kind): kind "int", "text" (char(n): trailing blanks stripped) or "ts"
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "pgbench_accounts": (("aid", "int"), ("bid", "int"), ("abalance", "int"), ("filler", "text")),
    "pgbench_branches": (("bid", "int"), ("bbalance", "int"), ("filler", "text")),
    "pgbench_tellers": (("tid", "int"), ("bid", "int"), ("tbalance", "int"), ("filler", "text")),
    "pgbench_history": (
        ("tid", "int"),
        ("bid", "int"),
        ("aid", "int"),
        ("delta", "int"),
        ("mtime", "ts"),
        ("filler", "text"),
    ),
}
PHASES: list[tuple[str, list[str]]] = [
    ("r300", ["-R", "300", "-c", "2", "-j", "2"]),
    ("r1000", ["-R", "1000", "-c", "2", "-j", "2"]),
    ("unthrottled", ["-c", "4", "-j", "2"]),
]
TOUCH = "UPDATE pgbench_branches SET bbalance = bbalance WHERE bid = 1"

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu() -> dict[int, tuple[int, str, str, float]]:
    """Every process: pid -> (parent pid, command name, command line, CPU seconds used so far)."""
    out: dict[int, tuple[int, str, str, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmdline = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(d)] = (int(fields[1]), comm, cmdline, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def _cpu_kind(
    pid: int, procs: dict[int, tuple[int, str, str, float]], run_pid: int, sub_senders: frozenset[int] = frozenset()
) -> str:
    """Who a process works for: mirrorline's Python process, its Spark JVM, this benchmark (its probes), the
    source's walsenders, the subscriber's apply worker, pgbench, or any other PostgreSQL process (pgbench's backends,
    mirrorline's target connections, background workers) or anything else on the machine."""
    ppid, comm, cmdline, _ = procs[pid]
    if pid == run_pid:
        return "mirrorline_python"
    if pid == os.getpid():
        return "bench_probe"
    p = ppid
    while p > 1 and p in procs:
        if p == run_pid:
            return "mirrorline_jvm" if comm == "java" else "mirrorline_other"
        p = procs[p][0]
    if comm == "pgbench":
        return "pgbench"
    if "walsender" in cmdline:
        return "pg_walsender_subscriber" if pid in sub_senders else "pg_walsender_mirrorline"
    if "logical replication" in cmdline:  # the subscriber's apply worker (PostgreSQL 15: "... worker for ...")
        return "pg_subscriber_apply"
    if comm == "postgres" or cmdline.startswith("postgres"):
        return "pg_other"
    return "other"


def _busy_seconds() -> float:
    """The machine's CPU seconds used (all cores, everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK


class CpuMeter:
    """CPU seconds by who used them between :meth:`start` and :meth:`stop`, from ``/proc`` (processes that ended
    in between are counted in ``unaccounted``, the machine's busy time minus what the processes show)."""

    def __init__(self, run_pid: int, sub_senders: Callable[[], frozenset[int]] = frozenset) -> None:
        self.run_pid = run_pid
        self.sub_senders = sub_senders  # the subscriber's walsenders' pids (the others serve mirrorline)
        self.before: dict[int, tuple[int, str, str, float]] = {}
        self.busy = 0.0
        self.t0 = 0.0

    def start(self) -> None:
        self.before, self.busy, self.t0 = proc_cpu(), _busy_seconds(), time.monotonic()

    def stop(self) -> dict[str, float]:
        after, busy, wall = proc_cpu(), _busy_seconds(), time.monotonic() - self.t0
        senders = self.sub_senders()
        used: dict[str, float] = collections.defaultdict(float)
        for pid, (_, comm, _, cpu) in after.items():
            prev = self.before.get(pid)
            base = prev[3] if prev is not None and prev[1] == comm else 0.0
            used[_cpu_kind(pid, after, self.run_pid, senders)] += max(0.0, cpu - base)
        out = {k: round(v, 1) for k, v in sorted(used.items())}
        out["unaccounted"] = round(max(0.0, (busy - self.busy) - sum(used.values())), 1)
        out["busy"] = round(busy - self.busy, 1)
        out["capacity"] = round(wall * (os.cpu_count() or 1), 1)
        return out


def _pss(pid: str) -> int:
    """The process's proportional set size in bytes: its resident pages, each shared page divided among the
    processes sharing it (Spark's Python workers are forked from one daemon and share most of their pages)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def _tree_rss(root: int) -> dict[str, dict[str, int]]:
    """Resident bytes now (``rss``) and proportional bytes (``pss``) of process ``root`` and its descendants, by
    kind: ``python`` (root itself), ``jvm`` (its Java children), ``other`` (Spark's Python workers and anything else
    it started)."""
    procs: dict[int, tuple[int, str, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            rss = int(Path(f"/proc/{d}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        procs[int(d)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), comm, rss)
    out = {m: {"python": 0, "jvm": 0, "other": 0} for m in ("rss", "pss")}
    for pid, (_, comm, rss) in procs.items():
        p = pid
        while p > 1 and p in procs and p != root:
            p = procs[p][0]
        if p != root:
            continue
        kind = "python" if pid == root else "jvm" if comm == "java" else "other"
        out["rss"][kind] += rss
        out["pss"][kind] += _pss(str(pid))
    return out


class RssMeter:
    """The peak memory of ``mirrorline run``'s process tree (sampled every half second in a thread): resident
    (``rss``, shared pages counted in each process) and proportional (``pss``, shared pages divided among the
    processes sharing them: what the tree takes from the machine). Besides the whole run's peak, the peak since the
    last :meth:`mark` (one sampler for both: reading every process's ``smaps_rollup`` takes CPU from the work
    measured)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peak = _no_peak()
        self.window = _no_peak()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="rss-meter", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while not self._stop.wait(0.5):
            sample = _tree_rss(self.root)
            with self._lock:
                for peak in (self.peak, self.window):
                    for m, now in sample.items():
                        for k, v in now.items():
                            peak[m][k] = max(peak[m][k], v)
                        peak[m]["total"] = max(peak[m]["total"], sum(now.values()))

    def mark(self) -> None:
        """Start a new window: :meth:`since_mark` gives the peaks from now on."""
        with self._lock:
            self.window = _no_peak()

    def since_mark(self) -> dict[str, dict[str, float]]:
        """The peaks in MB since the last :meth:`mark` (as :meth:`stop` gives them)."""
        with self._lock:
            return _mb(self.window)

    def stop(self) -> dict[str, dict[str, float]]:
        """The peaks in MB (``total`` the tree's at one moment; the others each kind's own peak)."""
        self._stop.set()
        self._thread.join(timeout=5)
        return _mb(self.peak)


def _no_peak() -> dict[str, dict[str, int]]:
    return {m: {"total": 0, "python": 0, "jvm": 0, "other": 0} for m in ("rss", "pss")}


def _mb(peak: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    return {m: {k: round(v / 2**20) for k, v in p.items()} for m, p in peak.items()}


UNIT_RE = re.compile(r"^unit (\S+)\.\.(\S+): (\d+) changes, (compiled|reused) in ([0-9.]+)s, applied: (.*)$")
# a target's seconds, and for an apply of a second or more its phases: "pg 12.72s [insert 12.10, commit 0.40]"
APPLIED_RE = re.compile(r"(\S+) ([0-9.]+)s(?: \[([^\]]*)\])?")
# the snapshot's progress lines, e.g. "snapshot pg: 7/7 chunks (100%), 200,022 rows, 148,166 rows/s, 1 s"
SNAPSHOT_RE = re.compile(r"^snapshot (\S+): .*?([0-9,]+) rows, [0-9,]+ rows/s, ([0-9]+) s$")
RECONCILED_RE = re.compile(r"^target (\S+): ")
FINAL_RE = re.compile(r"^captured \d+ changes; applied \d+ units")
SPARK_READY_RE = re.compile(r"^Spark ready: started in ([0-9.]+)s, warmed up in ([0-9.]+)s$")
SPARK_LARGE_RE = re.compile(r"^Spark warmed up for large units in ([0-9.]+)s")


def say(msg: str) -> None:
    print(f"[bench/live] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ figures


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over t."""
    if len(points) < 2:
        return None
    mt = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else None


def r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def lag_figures(points: list[tuple[float, float | None]]) -> dict[str, Any]:
    """p50 / p99 / max / slope / end of a lag series sampled as (seconds into the phase, lag or None)."""
    ok = [(t, y) for t, y in points if y is not None]
    ys = [y for _, y in ok]
    return {
        "p50": r(pct(ys, 0.5)),
        "p99": r(pct(ys, 0.99)),
        "max": r(max(ys) if ys else None),
        "slope": r(slope(ok), 4),
        "end": r(ys[-1] if ys else None),
        "samples": len(ys),
        "missing": len(points) - len(ys),
    }


# ------------------------------------------------------------------------------------------------ mirrorline run


@dataclasses.dataclass
class Unit:
    t: float  # monotonic time its line was read
    changes: int
    compiled: bool
    compile_s: float
    apply_s: dict[str, float]
    phases: dict[str, dict[str, float]]  # target -> phase -> seconds (applies of a second or more)


class RunLog:
    """Reads ``mirrorline run``'s merged stdout/stderr: copies it to a file and parses the lines it relies on."""

    def __init__(self, proc: subprocess.Popen[bytes], path: Path) -> None:
        self.proc = proc
        self.path = path
        self.lock = threading.Lock()
        self.units: list[Unit] = []
        self.first_unit: dict[str, float] = {}  # target -> monotonic time of its first unit line
        self.first_change_unit: dict[str, float] = {}  # ... of its first unit with changes
        self.spark_started: float | None = None  # monotonic time Spark's start began (from run's "Spark ready" line)
        self.warm_large: float | None = None  # seconds of run's idle warm-up for large units, once it has ended
        self.reconciled: set[str] = set()
        self.snapshot: dict[str, tuple[int, float]] = {}  # target -> (rows, seconds) of its last progress line
        self.final = ""
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.unparsed_units = 0
        self.thread = threading.Thread(target=self._read, name="run-log", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.path, "wb") as f:
            for raw in self.proc.stdout:
                now = time.monotonic()
                f.write(raw)
                f.flush()
                self._parse(raw.decode("utf-8", "replace").rstrip("\r\n"), now)

    def _parse(self, line: str, now: float) -> None:
        with self.lock:
            self.tail.append(line)
            m = UNIT_RE.match(line)
            if m:
                found = APPLIED_RE.findall(m.group(6))
                applied = {n: float(s) for n, s, _ in found}
                phases = {
                    n: {k: float(v) for k, v in (p.split(" ") for p in ph.split(", "))} for n, _, ph in found if ph
                }
                u = Unit(now, int(m.group(3)), m.group(4) == "compiled", float(m.group(5)), applied, phases)
                self.units.append(u)
                for n in applied:
                    self.first_unit.setdefault(n, now)
                    if u.changes:
                        self.first_change_unit.setdefault(n, now)
                return
            if line.startswith("unit "):
                self.unparsed_units += 1
            m = SNAPSHOT_RE.match(line)
            if m:
                self.snapshot[m.group(1)] = (int(m.group(2).replace(",", "")), float(m.group(3)))
            m = RECONCILED_RE.match(line)
            if m:
                self.reconciled.add(m.group(1))
            if FINAL_RE.match(line):
                self.final = line
            m = SPARK_LARGE_RE.match(line)
            if m:
                self.warm_large = float(m.group(1))
            m = SPARK_READY_RE.match(line)
            if m and self.spark_started is None:
                self.spark_started = now - float(m.group(1)) - float(m.group(2))

    def units_between(self, t0: float, t1: float) -> list[Unit]:
        with self.lock:
            return [u for u in self.units if t0 <= u.t < t1]

    def tail_text(self) -> str:
        with self.lock:
            return "\n".join(self.tail)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            self.thread.join(timeout=10)
            raise RuntimeError(
                f"mirrorline run exited with status {self.proc.returncode}; the end of its output:\n{self.tail_text()}"
            )


def unit_figures(units: list[Unit], targets: list[str]) -> dict[str, Any]:
    real = [u for u in units if u.changes > 0]
    return {
        "units": len(units),
        "units_with_changes": len(real),
        "changes_sum": sum(u.changes for u in units),
        "changes_p50": pct([float(u.changes) for u in real], 0.5),
        "compile_p50_s": r(pct([u.compile_s for u in real if u.compiled], 0.5)),
        "apply_p50_s": {n: r(pct([u.apply_s[n] for u in real if n in u.apply_s], 0.5)) for n in targets},
        "unit_p50_s": r(pct([u.compile_s + max(u.apply_s.values(), default=0.0) for u in real], 0.5)),
    }


# ------------------------------------------------------------------------------------------------ lag probes


class Heartbeat(threading.Thread):
    """Updates the heartbeat row on the source every HEARTBEAT_EVERY seconds."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.dsn = dsn
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.updates = 0  # committed so far (each one change every copy applies)

    def run(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                while not self.stopping.is_set():
                    cur.execute("UPDATE bench_heartbeat SET t = clock_timestamp() WHERE id = 1")
                    self.updates += 1
                    self.stopping.wait(HEARTBEAT_EVERY)
            conn.close()
        except BaseException as e:
            self.error = e

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


def registry_lag(log_path: Path, name: str) -> tuple[int | None, float | None]:
    """(applied LSN, lag seconds) of a target from the log's reader registry, lag as ``status`` computes it: the
    age of the oldest change in the log after the applied position, 0 when there is none."""
    from mirrorline.log.reader import ChangeLog
    from mirrorline.log.retention import readers

    try:
        cl = ChangeLog(str(log_path))
        st = readers(cl).get(name)
        if st is None or st.applied is None:
            return None, None
        durable = cl.durable()
        if durable is None or st.applied >= durable:
            return st.applied.lsn, 0.0
        first = cl.first_ts_after(st.applied)
        return st.applied.lsn, max(0.0, time.time() - first / 1e6) if first is not None else 0.0
    except Exception:  # a segment removed by retention while it was read: a missing sample
        return None, None


class Probe:
    """One sample of every lag: mirrorline's targets and the subscriber."""

    def __init__(self, config: Config, cluster: PgCluster) -> None:
        self.config = config
        self.status_config = dataclasses.replace(
            config, targets={n: t for n, t in config.targets.items() if t.kind != "duckdb"}
        )
        self.registry_targets = [n for n, t in config.targets.items() if t.kind == "duckdb"]
        self.sub = psycopg2.connect(cluster.dsn(SUB_DB))
        self.sub.autocommit = True
        self.src = psycopg2.connect(cluster.dsn(SRC_DB))
        self.src.autocommit = True
        # the targets whose copy of the heartbeat this process can read while run applies (not DuckDB's: see above)
        self.beat_targets = {n: t for n, t in config.targets.items() if t.kind in ("sqlite", "postgresql")}
        self._beat_conns: dict[str, Any] = {}

    def close(self) -> None:
        self.sub.close()
        self.src.close()
        for c in self._beat_conns.values():
            c.close()

    def heartbeats(self) -> dict[str, float | None]:
        """target -> the age in seconds of the heartbeat value it holds (None: not readable now), as the
        subscriber's heartbeat lag: end to end, from the source's commit (overstates by up to HEARTBEAT_EVERY)."""
        out: dict[str, float | None] = {}
        for n, t in self.beat_targets.items():
            try:
                conn = self._beat_conns.get(n)
                if t.kind == "sqlite":
                    if conn is None:
                        conn = self._beat_conns[n] = sqlite3.connect(t.location, timeout=1, isolation_level=None)
                    row = conn.execute('SELECT "t" FROM "bench_heartbeat" WHERE "id" = 1').fetchone()
                    out[n] = time.time() - datetime.fromisoformat(row[0]).timestamp() if row else None
                else:
                    if conn is None:
                        conn = self._beat_conns[n] = psycopg2.connect(t.location)
                        conn.autocommit = True
                    with conn.cursor() as cur:
                        cur.execute(
                            'SELECT EXTRACT(epoch FROM clock_timestamp() - "t")::float8 '
                            'FROM "public"."bench_heartbeat" WHERE "id" = 1'
                        )
                        row = cur.fetchone()
                    out[n] = float(row[0]) if row else None
            except (sqlite3.Error, psycopg2.Error, ValueError, TypeError):  # not loaded yet, or busy: no sample
                out[n] = None
                with contextlib.suppress(Exception):
                    self._beat_conns.pop(n).close()
        return out

    def mirrorline(self) -> dict[str, tuple[str | None, float | None]]:
        """target -> (state, lag seconds); state None where it came from the reader registry."""
        from mirrorline.status import status

        out: dict[str, tuple[str | None, float | None]] = {}
        try:
            st = status(self.status_config)
            for t in st.targets:
                out[t.name] = (t.state, t.lag_seconds if not t.error else None)
        except Exception as e:
            say(f"status failed: {type(e).__name__}: {e}")
        for n in self.registry_targets:
            out[n] = (None, registry_lag(self.config.log.path, n)[1])
        return out

    def subscriber_senders(self) -> frozenset[int]:
        """The pids of the subscriber's walsenders (its apply worker's and any table sync's)."""
        with self.src.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_replication WHERE application_name LIKE %s", (SUB + "%",))
            return frozenset(int(p) for (p,) in cur.fetchall())

    def subscriber(self) -> tuple[float | None, float | None]:
        """(replay_lag, heartbeat lag) in seconds."""
        with self.src.cursor() as cur:
            cur.execute(
                "SELECT COALESCE(EXTRACT(epoch FROM replay_lag), 0)::float8 FROM pg_stat_replication "
                "WHERE application_name = %s",
                (SUB,),
            )
            row = cur.fetchone()
            replay = float(row[0]) if row else None
        with self.sub.cursor() as cur:
            cur.execute("SELECT EXTRACT(epoch FROM clock_timestamp() - t)::float8 FROM bench_heartbeat WHERE id = 1")
            row = cur.fetchone()
            beat = float(row[0]) if row else None
        return replay, beat

    def replay_lsn(self) -> int | None:
        with self.src.cursor() as cur:
            cur.execute("SELECT replay_lsn::text FROM pg_stat_replication WHERE application_name = %s", (SUB,))
            row = cur.fetchone()
        return parse_lsn(row[0]) if row and row[0] else None

    def wal_lsn(self) -> int:
        with self.src.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            return parse_lsn(cur.fetchone()[0])


# ------------------------------------------------------------------------------------------------ setup


def pg_args(cluster: PgCluster) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(cluster.port), "-U", cluster.user]


def run_checked(cmd: list[str], log: Path, timeout: float) -> None:
    with open(log, "ab") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed ({proc.returncode}): {log.read_text()[-2000:]}")


def setup_source(cluster: PgCluster, scale: int, work: Path) -> float:
    cluster.create_database(SRC_DB)
    t0 = time.monotonic()
    run_checked(
        [cluster.bin("pgbench"), "-i", "-q", "-s", str(scale), *pg_args(cluster), SRC_DB],
        work / "pgbench_init.log",
        3600,
    )
    seconds = time.monotonic() - t0
    cluster.execute("ALTER TABLE pgbench_history REPLICA IDENTITY FULL", SRC_DB)
    cluster.execute("CREATE TABLE bench_heartbeat (id int PRIMARY KEY, t timestamptz NOT NULL)", SRC_DB)
    cluster.execute("INSERT INTO bench_heartbeat VALUES (1, clock_timestamp())", SRC_DB)
    return seconds


def setup_subscriber(cluster: PgCluster, work: Path, timeout: float = 900) -> float:
    """Publication, the same tables in SUB_DB, slot, subscription; waits until every table is synchronised."""
    cluster.execute(f"CREATE PUBLICATION {PUB} FOR TABLE {', '.join(TABLES)}, bench_heartbeat", SRC_DB)
    cluster.create_database(SUB_DB)
    run_checked([cluster.bin("pgbench"), "-i", "-I", "dtp", *pg_args(cluster), SUB_DB], work / "pgbench_init.log", 600)
    cluster.execute("CREATE TABLE bench_heartbeat (id int PRIMARY KEY, t timestamptz NOT NULL)", SUB_DB)
    cluster.execute(f"SELECT pg_create_logical_replication_slot('{SUB}', 'pgoutput')", SRC_DB)
    t0 = time.monotonic()
    cluster.execute(
        f"CREATE SUBSCRIPTION {SUB} CONNECTION '{cluster.dsn(SRC_DB)}' PUBLICATION {PUB} "
        f"WITH (create_slot = false, slot_name = '{SUB}', copy_data = true)",
        SUB_DB,
    )
    deadline = t0 + timeout
    while True:
        ((n, ready),) = cluster.execute(
            "SELECT count(*), count(*) FILTER (WHERE srsubstate = 'r') FROM pg_subscription_rel", SUB_DB
        )
        if n == len(TABLES) + 1 and ready == n:
            return time.monotonic() - t0
        if time.monotonic() > deadline:
            raise TimeoutError(f"subscription not synchronised after {timeout:.0f}s ({ready}/{n} tables ready)")
        time.sleep(0.5)


def write_config(path: Path, work: Path, cluster: PgCluster, latency: str, segment_seconds: str = "250ms") -> None:
    q = json.dumps  # a JSON string is a valid TOML basic string
    tables = "\n".join(f'[tables."public.{t}"]\n' for t in [*TABLES, "bench_heartbeat"])
    path.write_text(
        f'[source]\ndsn = {q(cluster.dsn(SRC_DB))}\nslot = "mirrorline"\n\n'
        f"[log]\npath = {q(str(work / 'log'))}\nsegment_seconds = {q(segment_seconds)}\n\n"
        f"[apply]\nlatency = {q(latency)}\n\n"
        f"{tables}\n"
        f"[targets.sqlite]\nurl = {q('sqlite:///' + str(work / 'target.sqlite'))}\n\n"
        f"[targets.duckdb]\nurl = {q('duckdb:///' + str(work / 'target.duckdb'))}\n\n"
        f"[targets.pg]\nurl = {q(cluster.url(ML_DB))}\n"
    )


def start_run(config_path: Path, work: Path, log_name: str = "run.log") -> tuple[subprocess.Popen[bytes], RunLog]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mirrorline.cli.main", "run", "-c", str(config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=str(work),
        start_new_session=True,
    )
    return proc, RunLog(proc, work / log_name)


def stop_run(proc: subprocess.Popen[bytes], timeout: float = 120) -> int | None:
    """SIGTERM, then SIGKILL of its process group (it leads its own session: the Spark JVM too)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            say(f"mirrorline run did not stop within {timeout:.0f}s of SIGTERM: SIGKILL")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind (the JVM), or itself
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        return None
    return proc.returncode


def wait_live(runlog: RunLog, probe: Probe, cluster: PgCluster, t_start: float, timeout: float) -> dict[str, Any]:
    """Until every target is loaded, has applied a unit with changes, and is live with lag 0. Touches a row each
    second from when every target is loaded until each has applied a unit with changes (something to apply)."""
    targets = sorted(probe.config.targets)
    deadline = time.monotonic() + timeout
    conn = psycopg2.connect(cluster.dsn(SRC_DB))
    conn.autocommit = True
    last_touch = 0.0
    loaded_at: float | None = None
    try:
        while True:
            runlog.check_alive()
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(
                    f"targets not live {timeout:.0f}s after mirrorline run started; the end of its "
                    f"output:\n{runlog.tail_text()}"
                )
            with runlog.lock:
                reconciled = set(runlog.reconciled)
                first = dict(runlog.first_unit)
                changed = dict(runlog.first_change_unit)
            if loaded_at is None and (reconciled >= set(targets) or first):
                loaded_at = now
                say(f"targets loaded after {now - t_start:.1f}s: touching a row each second until each applies a unit")
            if loaded_at is not None and not set(changed) >= set(targets) and now - last_touch >= 1.0:
                with conn.cursor() as cur:
                    cur.execute(TOUCH)
                last_touch = now
            if set(changed) >= set(targets):
                lags = probe.mirrorline()
                live = all(lags.get(n, (None, None))[1] == 0.0 and lags[n][0] in (None, "live") for n in targets)
                if live:
                    return {
                        "loaded_s": r(loaded_at - t_start, 2) if loaded_at is not None else None,
                        "first_unit_s": r(min(first.values()) - t_start, 2),
                        "first_change_unit_s": r(min(changed.values()) - t_start, 2),
                        "first_change_unit_per_target_s": {n: r(changed[n] - t_start, 2) for n in targets},
                        "live_s": r(time.monotonic() - t_start, 2),
                    }
            time.sleep(0.5)
    finally:
        conn.close()


def duckdb_status_error(config: Config) -> str | None:
    """What ``status`` says of the DuckDB target while ``run`` holds it (called only once it holds it)."""
    from mirrorline.status import status

    only = dataclasses.replace(config, targets={n: t for n, t in config.targets.items() if t.kind == "duckdb"})
    try:
        st = status(only)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    errs = [t.error for t in st.targets if t.error]
    return errs[0].splitlines()[0] if errs else None


# ------------------------------------------------------------------------------------------------ phases


def parse_pgbench(text: str) -> dict[str, Any]:
    def num(pattern: str) -> float | None:
        m = re.search(pattern, text, re.M)
        return float(m.group(1)) if m else None

    def count(pattern: str) -> int | None:
        x = num(pattern)
        return None if x is None else int(x)

    return {
        "tps": r(num(r"^tps = ([0-9.]+)"), 1),
        "transactions": count(r"^number of transactions actually processed: (\d+)"),
        "failed": count(r"^number of failed transactions: (\d+)"),
        "latency_avg_ms": r(num(r"^latency average = ([0-9.]+) ms"), 2),
        "schedule_lag_avg_ms": r(num(r"^rate limit schedule lag: avg ([0-9.]+)"), 2),
    }


def run_phase(
    name: str,
    extra: list[str],
    seconds: int,
    cluster: PgCluster,
    probe: Probe,
    runlog: RunLog,
    work: Path,
    children: list[subprocess.Popen[Any]],
    samples_out: dict[str, Any],
    heartbeat: Heartbeat | None = None,
) -> dict[str, Any]:
    out_path = work / f"pgbench_{name}.log"
    cmd = [cluster.bin("pgbench"), "-n", "-T", str(seconds), *extra, *pg_args(cluster), SRC_DB]
    say(f"phase {name}: pgbench {' '.join(extra)} for {seconds}s")
    targets = sorted(probe.config.targets)
    ml: dict[str, list[tuple[float, float | None]]] = {n: [] for n in targets}
    ml_beat: dict[str, list[tuple[float, float | None]]] = {n: [] for n in sorted(probe.beat_targets)}
    replay: list[tuple[float, float | None]] = []
    beat: list[tuple[float, float | None]] = []
    with open(out_path, "wb") as f:
        t0 = time.monotonic()
        pb = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd="/")
        children.append(pb)
        meter = CpuMeter(runlog.proc.pid, probe.subscriber_senders)
        meter.start()
        beats0 = heartbeat.updates if heartbeat is not None else 0
        cpu: dict[str, float] | None = None
        nxt = t0
        last_say = t0
        while pb.poll() is None:
            now = time.monotonic()
            if now - t0 > seconds + 120:
                pb.kill()
                raise TimeoutError(f"pgbench of phase {name} still running {seconds + 120}s after its start")
            runlog.check_alive()
            if cpu is None and now - t0 >= seconds - 2:  # before pgbench ends and its backends exit
                cpu = meter.stop()
            if now >= nxt:
                t = now - t0
                lags = probe.mirrorline()
                for n in targets:
                    ml[n].append((t, lags.get(n, (None, None))[1]))
                for n, v in probe.heartbeats().items():
                    ml_beat[n].append((t, v))
                try:
                    rp, hb = probe.subscriber()
                except psycopg2.Error as e:
                    say(f"subscriber probe failed: {e}")
                    rp, hb = None, None
                replay.append((t, rp))
                beat.append((t, hb))
                nxt = max(nxt + 1.0, time.monotonic())
                if now - last_say >= 15:
                    last_say = now
                    shown = ", ".join(f"{n} {r(ml[n][-1][1], 1)}" for n in targets)
                    say(f"phase {name} {t:.0f}s: lag {shown}; subscriber replay {r(rp)}, heartbeat {r(hb, 2)}")
            time.sleep(max(0.0, min(0.2, nxt - time.monotonic())))
        t1 = time.monotonic()
        beats = (heartbeat.updates if heartbeat is not None else 0) - beats0
        if cpu is None:  # the last window was missed (a slow sample): pgbench's backends are gone by now
            cpu = meter.stop()
    text = out_path.read_text(errors="replace")
    if pb.returncode != 0:
        say(f"phase {name}: pgbench exited with {pb.returncode}: {text.strip()[-500:]}")
    samples_out[name] = {
        "mirrorline": ml,
        "mirrorline_heartbeat_lag": ml_beat,
        "subscriber_replay_lag": replay,
        "subscriber_heartbeat_lag": beat,
    }
    fig = parse_pgbench(text)
    units = runlog.units_between(t0, t1)
    res: dict[str, Any] = {
        "pgbench": " ".join(extra),
        "seconds": r(t1 - t0, 1),
        "pgbench_exit": pb.returncode,
        "cpu_s": cpu,
        **fig,
        # pgbench's TPC-B-like transaction changes 4 rows of the replicated tables (3 updates, 1 insert)
        "source_changes_per_s": r(fig["tps"] * 4, 1) if fig["tps"] is not None else None,
        "lag": {n: lag_figures(ml[n]) for n in targets},
        "heartbeat_lag": {n: lag_figures(v) for n, v in ml_beat.items()},
        "subscriber": {"replay_lag": lag_figures(replay), "heartbeat_lag": lag_figures(beat)},
        **unit_figures(units, targets),
    }
    res["applied_changes_per_s"] = r(res["changes_sum"] / (t1 - t0), 1)
    res["cpu_per_1000_changes"] = cpu_per_1000(cpu, res["changes_sum"], fig["tps"], t1 - t0, len(targets), beats)
    say(
        f"phase {name}: tps {fig['tps']}, {res['units']} units, lag end "
        + ", ".join(f"{n} {res['lag'][n]['end']}" for n in targets)
        + f"; subscriber replay {res['subscriber']['replay_lag']['end']}"
    )
    return res


def cpu_per_1000(
    cpu: Mapping[str, float], applied: float, tps: float | None, seconds: float, targets: int, beats: int = 0
) -> dict[str, Any]:
    """CPU seconds per 1,000 changes: mirrorline's whole tree (Python, JVM, Spark's workers) and its walsender per
    1,000 changes applied, and per target; the subscriber's apply worker and walsender per 1,000 changes of the
    source (pgbench's transaction changes 4 rows of the replicated tables; ``beats``: the heartbeat's updates in the
    phase, which both apply); ``per_target_over_subscriber`` their ratio (the issue's aim: at most 2)."""
    window = cpu.get("capacity", 0.0) / (os.cpu_count() or 1)  # the meter stops 2 s before the phase ends
    scale = seconds / window if window else 1.0
    ml = sum(cpu.get(k, 0.0) for k in ("mirrorline_python", "mirrorline_jvm", "mirrorline_other"))
    ml = (ml + cpu.get("pg_walsender_mirrorline", 0.0)) * scale
    sub = (cpu.get("pg_subscriber_apply", 0.0) + cpu.get("pg_walsender_subscriber", 0.0)) * scale
    source = (tps or 0.0) * 4 * seconds + beats
    out: dict[str, Any] = {"mirrorline": None, "mirrorline_per_target": None, "subscriber": None}
    if applied:
        out["mirrorline"] = round(ml / applied * 1000, 3)
        out["mirrorline_per_target"] = round(ml / applied * 1000 / max(1, targets), 3)
    if source:
        out["subscriber"] = round(sub / source * 1000, 3)
    if out["mirrorline_per_target"] is not None and out["subscriber"]:
        out["per_target_over_subscriber"] = round(out["mirrorline_per_target"] / out["subscriber"], 2)
    return out


def drain(probe: Probe, cluster: PgCluster, runlog: RunLog, timeout: float) -> dict[str, Any]:
    """Commit a marker after the current WAL position; wait until every target and the subscriber have it."""
    before = probe.wal_lsn()
    cluster.execute(TOUCH, SRC_DB)
    after = probe.wal_lsn()
    t0 = time.monotonic()
    targets = sorted(probe.config.targets)
    done: dict[str, float] = {}
    while len(done) < len(targets) + 1 and time.monotonic() - t0 < timeout:
        runlog.check_alive()
        for n in targets:
            if n not in done:
                lsn, _ = registry_lag(probe.config.log.path, n)
                if lsn is not None and lsn >= before:
                    done[n] = time.monotonic() - t0
        if "subscriber" not in done:
            lsn = probe.replay_lsn()
            if lsn is not None and lsn >= after:
                done["subscriber"] = time.monotonic() - t0
        time.sleep(0.2)
    return {n: r(done.get(n), 2) for n in [*targets, "subscriber"]}


def restart(
    config_path: Path,
    work: Path,
    cluster: PgCluster,
    probe: Probe,
    children: list[subprocess.Popen[Any]],
    transactions: int,
    timeout: float,
) -> tuple[dict[str, Any], subprocess.Popen[bytes], RunLog]:
    """With ``run`` stopped: ``transactions`` pgbench transactions and a marker; then ``run`` again, until every
    target has applied the marker (see the module's notes). Returns the figures and the new process."""
    run_checked(
        [cluster.bin("pgbench"), "-n", "-c", "1", "-t", str(transactions), *pg_args(cluster), SRC_DB],
        work / "pgbench_restart.log",
        600,
    )
    before = probe.wal_lsn()
    cluster.execute(TOUCH, SRC_DB)
    say(f"restart: {transactions} transactions committed while run was stopped; starting run again")
    t0 = time.monotonic()
    proc, runlog = start_run(config_path, work, "run_restart.log")
    children.append(proc)
    targets = sorted(probe.config.targets)
    done: dict[str, float] = {}
    while len(done) < len(targets):
        runlog.check_alive()
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"targets not caught up {timeout:.0f}s after the restart:\n{runlog.tail_text()}")
        for n in targets:
            if n not in done:
                lsn, _ = registry_lag(probe.config.log.path, n)
                if lsn is not None and lsn >= before:
                    done[n] = time.monotonic() - t0
        time.sleep(0.1)
    with runlog.lock:
        changed = dict(runlog.first_change_unit)
        units = [u for u in runlog.units if u.changes]
        spark = runlog.spark_started
    res = {
        "transactions": transactions,
        "first_change_unit_s": r(min(changed.values()) - t0, 2) if changed else None,
        "first_change_unit_from_spark_s": r(min(changed.values()) - spark, 2) if changed and spark else None,
        "spark_start_after_s": r(spark - t0, 2) if spark else None,
        "first_change_unit_per_target_s": {n: r(changed[n] - t0, 2) if n in changed else None for n in targets},
        "caught_up_s": {n: r(done[n], 2) for n in targets},
        "units": [{"changes": u.changes, "compile_s": u.compile_s} for u in units],
    }
    say(
        f"restart: first unit with changes after {res['first_change_unit_s']}s "
        f"({res['first_change_unit_from_spark_s']}s from Spark's start), caught up: {res['caught_up_s']}"
    )
    return res, proc, runlog


# ------------------------------------------------------------------------------------------------ comparison


def _norm(v: Any, kind: str) -> Any:
    if v is None:
        return None
    if kind == "int":
        return int(v) if not isinstance(v, Decimal) or v == v.to_integral_value() else str(v)
    if kind == "text":
        return str(v).rstrip(" ")
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v.strip())
        except ValueError:
            return v
    if isinstance(v, datetime):
        if v.tzinfo is not None:
            v = v.astimezone(UTC).replace(tzinfo=None)
        return v.isoformat(timespec="microseconds")
    return str(v)


def _rows(raw: list[tuple[Any, ...]], kinds: list[str]) -> list[tuple[Any, ...]]:
    rows = [tuple(_norm(v, k) for v, k in zip(row, kinds, strict=True)) for row in raw]
    rows.sort(key=lambda row: tuple((x is None, x if x is not None else 0) for x in row))
    return rows


def read_table(
    kind: str, where: str, table: str, columns: tuple[tuple[str, str], ...] | None = None
) -> list[tuple[Any, ...]]:
    """A table of the source or a target (``where``: a DSN, a file, or a Delta folder) as sorted rows of canonical
    values. ``columns``: (name, kind) to read; default: pgbench's own."""
    columns = columns or TABLES[table]
    cols = ", ".join(f'"{c}"' for c, _ in columns)
    kinds = [k for _, k in columns]
    if kind == "delta":
        from deltalake import DeltaTable

        data = DeltaTable(str(Path(where) / table)).to_pyarrow_table(columns=[c for c, _ in columns])
        return _rows(list(zip(*(data[c].to_pylist() for c, _ in columns), strict=True)), kinds)
    if kind == "postgresql":
        conn = psycopg2.connect(where)
        try:
            with conn.cursor() as cur:
                cur.execute(f'SELECT {cols} FROM "public"."{table}"')
                return _rows(cur.fetchall(), kinds)
        finally:
            conn.close()
    if kind == "sqlite":
        sconn = sqlite3.connect(f"file:{where}?mode=ro", uri=True)
        try:
            return _rows(sconn.execute(f'SELECT {cols} FROM "{table}"').fetchall(), kinds)
        finally:
            sconn.close()
    import duckdb

    dconn = duckdb.connect(where, read_only=True)
    try:
        return _rows(dconn.execute(f'SELECT {cols} FROM "main"."{table}"').fetchall(), kinds)
    finally:
        dconn.close()


def differences(src: list[tuple[Any, ...]], got: list[tuple[Any, ...]]) -> dict[str, Any] | None:
    """None when the two sorted row lists are equal as multisets, else what is missing and extra in ``got``."""
    if got == src:
        return None
    a, b = collections.Counter(src), collections.Counter(got)
    missing, extra = a - b, b - a
    return {
        "missing": sum(missing.values()),
        "extra": sum(extra.values()),
        "missing_example": repr(next(iter(missing))) if missing else None,
        "extra_example": repr(next(iter(extra))) if extra else None,
    }


def compare_table(
    source_dsn: str, kind: str, where: str, table: str, columns: tuple[tuple[str, str], ...] | None = None
) -> dict[str, Any] | str | None:
    """None when ``table`` of a copy (``kind``, ``where``: see :func:`read_table`) equals the source's, every row
    and column; else its differences, or why it could not be read."""
    try:
        got = read_table(kind, where, table, columns)
    except Exception as e:
        return f"cannot read: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
    return differences(read_table("postgresql", source_dsn, table, columns), got)


def compare_all(cluster: PgCluster, work: Path) -> tuple[dict[str, int], dict[str, Any]]:
    copies = {
        "sqlite": ("sqlite", str(work / "target.sqlite")),
        "duckdb": ("duckdb", str(work / "target.duckdb")),
        "pg": ("postgresql", cluster.dsn(ML_DB)),
        "subscriber": ("postgresql", cluster.dsn(SUB_DB)),
    }
    source_rows: dict[str, int] = {}
    result: dict[str, Any] = {n: {"equal": True, "rows": {}, "differences": {}} for n in copies}
    for table in TABLES:
        src = read_table("postgresql", cluster.dsn(SRC_DB), table)
        source_rows[table] = len(src)
        for name, (kind, where) in copies.items():
            res = result[name]
            try:
                got = read_table(kind, where, table)
            except Exception as e:
                res["equal"] = False
                res["rows"][table] = None
                res["differences"][table] = f"cannot read: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
                continue
            res["rows"][table] = len(got)
            diff = differences(src, got)
            if diff is not None:
                res["equal"] = False
                res["differences"][table] = diff
            del got
        say(
            f"compared {table}: source {len(src)} rows; "
            + ", ".join(f"{n} {result[n]['rows'].get(table)}" for n in copies)
        )
    for res in result.values():
        if not res["differences"]:
            del res["differences"]
    return source_rows, result


# ------------------------------------------------------------------------------------------------ main


def bench(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    children: list[subprocess.Popen[Any]] = []
    samples: dict[str, Any] = {}
    heartbeat: Heartbeat | None = None
    proc: subprocess.Popen[bytes] | None = None
    probe: Probe | None = None
    with PgCluster() as cluster:
        try:
            say(f"source: pgbench -i -s {args.scale}")
            out["setup"] = {"pgbench_init_s": r(setup_source(cluster, args.scale, work), 2)}
            say("subscriber: publication, tables, slot, subscription (copy_data)")
            out["setup"]["subscription_sync_s"] = r(setup_subscriber(cluster, work), 2)
            cluster.create_database(ML_DB)
            config_path = work / "mirrorline.toml"
            write_config(config_path, work, cluster, args.latency, args.segment_seconds)
            config = load_config(config_path)
            probe = Probe(config, cluster)

            say("starting mirrorline run (it loads the three targets itself)")
            t_start = time.monotonic()
            proc, runlog = start_run(config_path, work)
            children.append(proc)
            rss = RssMeter(proc.pid)
            out.update(wait_live(runlog, probe, cluster, t_start, args.start_timeout))
            out["snapshot"] = {n: {"rows": rows, "s": secs} for n, (rows, secs) in sorted(runlog.snapshot.items())}
            out["duckdb_status_error"] = duckdb_status_error(config)
            out["lag_source"] = {
                n: ("log reader registry" if t.kind == "duckdb" else "status")
                for n, t in sorted(config.targets.items())
            }
            say(f"every target live after {out['live_s']}s (first unit after {out['first_unit_s']}s)")

            heartbeat = Heartbeat(cluster.dsn(SRC_DB))
            heartbeat.start()
            # the targets hold the heartbeat of the setup until its first updates pass through: not a phase's lag
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                v is not None and v < 2.0 for v in probe.heartbeats().values()
            ):
                time.sleep(0.2)
            out["phases"] = {}
            for name, extra in [ph for ph in PHASES if ph[0] in args.phases.split(",")]:
                out["phases"][name] = run_phase(
                    name, extra, args.phase_seconds, cluster, probe, runlog, work, children, samples, heartbeat
                )
                if heartbeat.error is not None:
                    raise RuntimeError(f"heartbeat failed: {heartbeat.error}")

            say(f"draining (at most {args.drain_timeout:.0f}s)")
            out["drain_s"] = drain(probe, cluster, runlog, args.drain_timeout)
            out["drained"] = all(v is not None for v in out["drain_s"].values())
            say(f"drained: {out['drain_s']}")
            heartbeat.stop()
            out["units_total"] = len(runlog.units)
            out["unparsed_unit_lines"] = runlog.unparsed_units
            peaks = rss.stop()
            out["peak_rss_mb"], out["peak_pss_mb"] = peaks["rss"], peaks["pss"]
            say(f"peak memory of run's processes (MB): resident {peaks['rss']}, proportional {peaks['pss']}")
            say("stopping mirrorline run (SIGTERM)")
            out["mirrorline_exit"] = stop_run(proc)
            runlog.thread.join(timeout=30)
            out["mirrorline_final"] = runlog.final or (runlog.tail_text().splitlines() or [""])[-1]
            if args.restart_transactions > 0:
                out["restart"], proc, runlog = restart(
                    config_path, work, cluster, probe, children, args.restart_transactions, args.start_timeout
                )
                out["restart"]["mirrorline_exit"] = stop_run(proc)
                runlog.thread.join(timeout=30)
            probe.close()
            probe = None

            say("comparing every copy with the source, row by row")
            out["source_rows"], out["equal"] = compare_all(cluster, work)
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            if probe is not None:
                probe.close()
            for c in children:
                if c is proc:
                    stop_run(c, timeout=60)
                elif c.poll() is None:
                    c.kill()
                    c.wait(timeout=30)
            if args.keep:
                (work / "samples.json").write_text(json.dumps(samples))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase-seconds", type=int, default=120)
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--latency", default="500ms", help="mirrorline's [apply] latency")
    p.add_argument("--segment-seconds", default="250ms", help="mirrorline's [log] segment_seconds")
    p.add_argument(
        "--phases", default=",".join(n for n, _ in PHASES), help="which phases to run, in their order (comma-separated)"
    )
    p.add_argument(
        "--restart-transactions",
        type=int,
        default=1_000,
        help="pgbench transactions committed while run is stopped before the restart (0: no restart)",
    )
    p.add_argument("--keep", metavar="DIR", help="keep the configuration, change log, targets, logs and samples here")
    p.add_argument("--start-timeout", type=float, default=900, help="seconds for every target to become live")
    p.add_argument("--drain-timeout", type=float, default=300, help="seconds to apply everything after the load")
    args = p.parse_args()
    out: dict[str, Any] = {
        "latency": args.latency,
        "segment_seconds": args.segment_seconds,
        "scale": args.scale,
        "phase_seconds": args.phase_seconds,
    }
    run_in_folder(bench, args, out, "live", say)


def run_in_folder(
    fn: Callable[[argparse.Namespace, Path, dict[str, Any]], None],
    args: argparse.Namespace,
    out: dict[str, Any],
    name: str,
    tell: Callable[[str], None],
) -> None:
    """``fn(args, folder, out)`` in ``args.keep`` (kept) or a temporary folder, then ``out`` printed as one JSON
    line; an error is told (``tell``) with its trace, added to ``out`` and exits 1. SIGTERM (``timeout``, a
    supervisor) exits through the same ``finally`` blocks, so that ``run``, its JVM and the clusters stop too."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.keep:
            work = Path(args.keep).resolve()
            work.mkdir(parents=True, exist_ok=True)
            fn(args, work, out)
        else:
            with tempfile.TemporaryDirectory(prefix=f"mirrorline-bench-{name}-") as tmp:
                os.chmod(tmp, 0o755)
                fn(args, Path(tmp), out)
    except Exception as e:
        tell(traceback.format_exc().rstrip())
        out["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
