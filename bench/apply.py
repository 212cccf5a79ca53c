"""Benchmark: catching a PostgreSQL target up, side by side in one run.

For each workload, on the same WAL:

- (a) ``pg_logical``: PostgreSQL's own logical replication. The subscription is created disabled before the
  workload, enabled after it, and timed until the subscriber has confirmed the workload's last change.
- (b) ``mirrorline``: the same changes already captured in the change log (capture is not timed here: see
  bench/capture.py), applied by a pipeline that is already running: Spark started (its start-up time reported
  separately as ``spark_startup_s``) and warmed up by a synthetic unit of 60,000 changes through the general fold
  and Arrow, and one of 300,000 inserts and updates through their own route
  (:func:`mirrorline.compile.warmup.warm_up`, reported as ``mirrorline_warm_up_s``; ``mirrorline run``
  itself warms the small-unit plan at start, its live units warm the rest, and the second, ``warm_large``, runs
  in the background once it has had no unit for 10 s; with ``--changes`` below those sizes, units of that many);
  timed: compile + apply until the target's applied position is the log's end.
- (b2) ``mirrorline_jit_warm``: (b) again on a copy of the log into a second empty target, in the same process: a
  pipeline that has been running for a while, whose JVM has compiled units of this size before (the first large unit
  after start-up pays about a second of JIT compilation that the warm-up does not cover). A unit's plan holds nothing
  of the unit's own (tests/compile/test_compile_codegen.py), so any later unit of the same shape runs the classes the
  JIT compiled for the first, not only the same unit again.
- (c) ``copy``: the resulting net rows loaded by plain COPY into an empty table (the physical limit).
- (f) ``floor``: the least the prescribed method can cost here, with no compile work at all: a Spark scan of the
  unit's changes from the log (``floor_scan_s``: every column to a no-op sink, JIT-warm, median of 3) plus the net
  rows COPYed by the driver into a text worktable and moved by INSERT ... SELECT into the empty table
  (``floor_worktable_s``). ``a_over_floor`` is the best a/b that compiling with Spark and applying through
  worktables could reach on this machine, in today's log layout.
- (u) ``distinct_keys`` only: ``update_floor_s``, the same rows updated by one bare statement on a copy of the
  seeded table (``UPDATE bench SET v = 1, at = now()``: no worktable, no join, one transaction), the least an update
  of every row costs PostgreSQL here; ``a_over_update_floor`` bounds what a/b any set-based apply into PostgreSQL
  could reach on this workload.
- (g) with ``--layouts``, update-heavy only: the *bare fold* (group by key, last image and first op, net rows to the
  driver through Arrow; none of the fold's rules) of the same unit in three log layouts (a map of strings as today,
  text columns, typed columns), each with the changes in position order (shuffled by key) and split into key
  buckets (no shuffle): ``layout_fold_<layout>_<way>_s``, and ``a_over_layout_floor_<layout>_<way>`` = a / (that
  + ``floor_worktable_s``). See bench/layout_floor.py.

- (h) with ``--history``: (b) into another PostgreSQL target whose table is kept in versions (``history =
  "versions"``: a version per source transaction that changed a key), from another copy of the log, in the same
  process after (b2): ``history_s``, ``history_over_plain`` (h / b2: the same work into a plain table, JIT-warm as (h)
  is), ``history_versions`` (the rows it holds), ``a_over_history``. Its current versions are compared with the
  source by the benchmark's own reader. For ``distinct_keys`` its table is seeded as a snapshot leaves it.
- (d) with ``--iceberg``: (b) into an Iceberg target (the embedded catalog in a folder) from another copy of the log,
  in the same process after (b) and (b2): ``iceberg_s``, ``a_over_iceberg`` (PostgreSQL's subscriber beside it), its
  units' apply phases (``iceberg_unit_apply_s``: ``check`` reads the rows of the unit's keys, ``commit`` is pyiceberg's
  transaction: the copy-on-write delete of those keys and the append). For ``distinct_keys`` the Iceberg table is
  seeded with the source's rows by a plain pyiceberg append before the workload. Its copy is compared with the
  source by pyiceberg's own scan.

``--unit-changes N`` catches up in units of at most N changes (``[apply] max_changes``; default: one unit), and
``mirrorline_unit_compile_s`` gives each unit's compile seconds (a unit after the first is compiled while the one
before it is applied, the two sharing the cores); ``mirrorline_unit_apply_s`` each unit's apply seconds (``all``)
and their phases (``ApplyResult.phases``: ``stage``, ``insert``, ``update``, ``commit``, ...), the same for (b2).

Workloads: ``update_heavy``: N/5 inserts then 4N/5 updates over the same keys; ``insert_only``: N inserts;
``distinct_keys``: N updates of a table of N rows that every target already holds (as loaded by a snapshot), each
row updated once: every change a different key, nothing folds. All in transactions of 1,000. Prints one JSON line:
seconds of each, changes/s, and the ratios a/b (how many times faster mirrorline catches up than PostgreSQL's own)
and b/c (how far from the physical limit), and the same for (b2). Every copy is compared with the source, row by
row, by the benchmark's own reader (:func:`content`).
``--runs N`` runs it N times, each in a new process, and prints the medians (ratios taken per run, then their
median) with each run's main figures under ``each``: (a) varies by a second or more from run to run here.
``mirrorline_compile_s`` is the time until a unit was handed to apply: an inserts-only unit is handed over at once,
its Spark check and the driver's read of its rows running on while PostgreSQL loads them (compile/inserts.py), so
its (b) holds that work and its compile figure does not.

    .venv/bin/python bench/apply.py [--changes 1000000] [--workloads update_heavy,insert_only,distinct_keys]
                                    [--runs 1] [--layouts] [--unit-changes N] [--iceberg] [--history]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2

from mirrorline.capture.session import Capture
from mirrorline.compile.warmup import LARGE_WARM_UP_KEYS, WARM_UP_ROWS, warm_up
from mirrorline.config import parse as parse_config
from mirrorline.pgcluster import PgCluster
from mirrorline.pipeline import Applier
from mirrorline.sparkenv import get_spark, startup_seconds

TXN = 1000
DDL = "CREATE TABLE bench (id bigint PRIMARY KEY, v bigint NOT NULL, pad text, at timestamptz)"


def say(msg: str) -> None:
    print(f"[bench/apply] {msg}", file=sys.stderr, flush=True)


SEED = "INSERT INTO bench SELECT g, 0, md5(g::text), '2026-01-01 00:00+00' FROM generate_series(1, %s) g"
# the table as history mode keeps it (apply/history.py), its seeded rows versions opened at position 1
HISTORY_DDL = (
    "CREATE TABLE bench (id bigint, v bigint NOT NULL, pad text, at timestamptz, _ml_start_lsn bigint NOT NULL "
    "DEFAULT 1, _ml_start_at timestamptz, _ml_end_lsn bigint, _ml_end_at timestamptz, _ml_deleted boolean NOT NULL "
    "DEFAULT false, PRIMARY KEY (id, _ml_start_lsn))"
)


def run_workload(dsn: str, kind: str, changes: int) -> int:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        inserts = {"update_heavy": changes // 5, "distinct_keys": 0}.get(kind, changes)
        for lo in range(0, inserts, TXN):
            cur.execute(
                "INSERT INTO bench SELECT g, 0, md5(g::text), now() FROM generate_series(%s, %s) g",
                (lo + 1, min(lo + TXN, inserts)),
            )
            conn.commit()
        if kind == "update_heavy":
            rounds = (changes - inserts) // inserts
            for r in range(rounds):
                for lo in range(0, inserts, TXN):
                    cur.execute(
                        "UPDATE bench SET v = %s, at = now() WHERE id BETWEEN %s AND %s",
                        (r + 1, lo + 1, min(lo + TXN, inserts)),
                    )
                    conn.commit()
        if kind == "distinct_keys":  # the table was seeded with ``changes`` rows before capture began
            for lo in range(0, changes, TXN):
                cur.execute(
                    "UPDATE bench SET v = 1, at = now() WHERE id BETWEEN %s AND %s", (lo + 1, min(lo + TXN, changes))
                )
                conn.commit()
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        end = int(cur.fetchone()[0])
    conn.close()
    return end


def content(cluster: PgCluster, db: str, where: str = "") -> tuple[int, str]:
    """The table's rows (``where``: those for which it holds) and a digest of all of them in key order: the
    benchmark's own reader, not mirrorline's."""
    row = cluster.execute(
        "SELECT count(*), md5(coalesce(string_agg(concat_ws(',', id, v, pad, extract(epoch FROM at)), ';' "
        f"ORDER BY id), '')) FROM bench{where}",
        db,
    )[0]
    return int(row[0]), str(row[1])


def wait_confirmed(source: PgCluster, db: str, slot: str, end_lsn: int, timeout: float = 1800) -> None:
    conn = psycopg2.connect(source.dsn(db))
    conn.autocommit = True
    deadline = time.monotonic() + timeout
    with conn.cursor() as cur:
        while time.monotonic() < deadline:
            cur.execute(
                "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
            row = cur.fetchone()
            if row and row[0] is not None and int(row[0]) >= end_lsn:
                return
            time.sleep(0.02)
    raise TimeoutError(f"subscription did not catch up within {timeout}s")


def catch_up(applier: Applier, name: str = "pg") -> tuple[float, list[float], list[dict[str, float]]]:
    """Seconds to catch target ``name`` up (the pipeline running: Spark started, connection open, state table
    ready), each unit's compile seconds, and each unit's apply seconds by phase (ApplyResult.phases, with ``all``)."""
    applier.targets[name].applied_positions()
    t0 = time.monotonic()
    reports = applier.catch_up()
    seconds = time.monotonic() - t0
    applier.close()
    phases = [
        {"all": round(r.apply_seconds[name], 3), **{k: round(v, 3) for k, v in r.results[name].phases.items()}}
        for r in reports
    ]
    return seconds, [round(r.compile_seconds, 3) for r in reports], phases


def seed_iceberg(conf: Any, dsn: str) -> None:
    """The Iceberg target's table created and given the source's rows by a plain pyiceberg append (as a snapshot
    would leave it; the log starts after them)."""
    import pyarrow as pa

    from mirrorline.apply import open_target
    from mirrorline.model import Column, TableSchema

    ts = TableSchema(
        "public.bench",
        (
            Column("id", "bigint", nullable=False),
            Column("v", "bigint", nullable=False),
            Column("pad", "text"),
            Column("at", "timestamp with time zone"),
        ),
        key=("id",),
    )
    (tc,) = conf.targets.values()
    t = open_target(tc)
    t.ensure_schema([ts])
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT id, v, pad, at FROM bench")
        rows = cur.fetchall()
    conn.close()
    table = t.table("public.bench")  # type: ignore[attr-defined]
    cols = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    data = pa.table({n: list(c) for n, c in zip(("id", "v", "pad", "at"), cols, strict=True)})
    table.append(data.cast(table.schema().as_arrow()))
    t.close()


def iceberg_same(folder: Path, source: PgCluster, db: str) -> bool:
    """Does the Iceberg table in ``folder``, read by pyiceberg's own scan, hold the source's rows?"""
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("mirrorline", uri=f"sqlite:///{folder / '_catalog.sqlite'}")
    data = cat.load_table(("public", "bench")).scan().to_arrow().sort_by("id")
    cat.engine.dispose()
    got = list(zip(*(data[c].to_pylist() for c in ("id", "v", "pad", "at")), strict=True))
    conn = psycopg2.connect(source.dsn(db))
    with conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")
        cur.execute("SELECT id, v, pad, at FROM bench ORDER BY id")
        want = cur.fetchall()
    conn.close()
    return got == want


def scan_seconds(log_path: Path) -> float:
    """Median of three Spark scans of every change in the log (all columns, to a no-op sink) with a JIT-warm JVM:
    the least that compiling the unit with Spark can cost on this machine."""
    from mirrorline.log.reader import ChangeLog
    from mirrorline.log.spark import read_spark

    log = ChangeLog(str(log_path))
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        read_spark(log, None, log.durable(), spark=get_spark()).write.format("noop").mode("overwrite").save()
        times.append(time.monotonic() - t0)
    return sorted(times)[1]


def worktable_seconds(dsn: str, rows: io.BytesIO) -> float:
    """The prescribed apply of the net rows (all inserts here), from the driver, without compile: COPY into an
    unlogged worktable, INSERT ... SELECT in key order into the empty target table, commit."""
    conn = psycopg2.connect(dsn)
    t0 = time.monotonic()
    with conn.cursor() as cur:
        cur.execute("CREATE UNLOGGED TABLE w (id text, v text, pad text, at text)")
        cur.copy_expert("COPY w FROM STDIN", rows)
        cur.execute("INSERT INTO bench SELECT id::bigint, v::bigint, pad, at::timestamptz FROM w ORDER BY 1")
        cur.execute("DROP TABLE w")
    conn.commit()
    seconds = time.monotonic() - t0
    conn.close()
    return seconds


def update_floor_seconds(target: PgCluster, db: str, rows: int) -> float:
    """One bare ``UPDATE`` of every row of a seeded copy of the table (its own database, vacuumed and analysed as
    the targets are), committed: what updating that many rows costs PostgreSQL here, with nothing to join."""
    target.create_database(db)
    target.execute(DDL, db)
    target.execute(SEED % rows, db)
    target.execute("VACUUM ANALYZE bench", db)
    conn = psycopg2.connect(target.dsn(db))
    t0 = time.monotonic()
    with conn.cursor() as cur:
        cur.execute("UPDATE bench SET v = 1, at = now()")
    conn.commit()
    seconds = time.monotonic() - t0
    conn.close()
    return round(seconds, 3)


def one(
    kind: str,
    changes: int,
    source: PgCluster,
    target: PgCluster,
    work: Path,
    layouts: bool = False,
    unit_changes: int | None = None,
    iceberg: bool = False,
    history: bool = False,
) -> dict[str, Any]:
    db = f"src_{kind}"
    source.create_database(db)
    source.execute(DDL, db)
    seeded = kind == "distinct_keys"  # the rows every replica holds already, as after a snapshot
    if seeded:
        source.execute(SEED % changes, db)
    source.execute("CREATE PUBLICATION pgpub FOR TABLE bench", db)
    if history:  # (its table made by mirrorline, or below: seeded as a snapshot leaves it, a version per row)
        target.create_database(f"mlh_{kind}")
    for tdb in (f"sub_{kind}", f"ml_{kind}", f"mlw_{kind}", f"copy_{kind}", f"floor_{kind}"):
        target.create_database(tdb)
        target.execute(DDL, tdb)
        if seeded and tdb.startswith(("sub_", "ml")):
            target.execute(SEED % changes, tdb)
            target.execute("VACUUM ANALYZE bench", tdb)
    sub_slot = f"sub_{kind}"
    target.execute(
        f"CREATE SUBSCRIPTION {sub_slot} CONNECTION '{source.dsn(db)}' PUBLICATION pgpub "
        f"WITH (enabled = false, copy_data = false, slot_name = '{sub_slot}')",
        f"sub_{kind}",
    )

    def config(log: str, tdb: str, name: str = "pg", url: str = "", mode: str = "none") -> Any:
        return parse_config(
            {
                "source": {"dsn": source.dsn(db), "slot": f"ml_{kind}"},
                "log": {"path": str(work / log)},
                "apply": {"max_changes": unit_changes or changes * 2, "latency": "1s"},
                "tables": {"public.bench": {}},
                "targets": {name: {"url": url or target.url(tdb), "history": mode}},
            },
            work / "bench.toml",
        )

    ice_url = f"iceberg:///{work / f'ice_{kind}'}"
    if iceberg and seeded:  # the rows the replica holds already, written by a plain append
        seed_iceberg(config(f"log4_{kind}", "", "ice", ice_url), source.dsn(db))

    conf = config(f"log_{kind}", f"ml_{kind}")
    Capture(conf, once=True).run()  # slot + publication before the workload
    say(f"{kind}: running the workload ({changes} changes)")
    end_lsn = run_workload(source.dsn(db), kind, changes)

    say(f"{kind}: capturing it into the log (not timed)")
    Capture(conf, once=True).run()

    say(f"{kind}: (a) PostgreSQL logical replication catching up")
    t0 = time.monotonic()
    target.execute(f"ALTER SUBSCRIPTION {sub_slot} ENABLE", f"sub_{kind}")
    wait_confirmed(source, db, sub_slot, end_lsn)
    a = time.monotonic() - t0
    target.execute(f"ALTER SUBSCRIPTION {sub_slot} DISABLE", f"sub_{kind}")
    assert content(target, f"sub_{kind}") == content(source, db), "the subscriber differs from the source"

    # the same log for (b2): retention removes what (b)'s target applied
    shutil.copytree(work / f"log_{kind}", work / f"log2_{kind}")
    shutil.copytree(work / f"log_{kind}", work / f"log3_{kind}")  # for the floor's scan
    if iceberg:
        shutil.copytree(work / f"log_{kind}", work / f"log4_{kind}")
    if history:
        shutil.copytree(work / f"log_{kind}", work / f"log5_{kind}")
    conf2 = config(f"log2_{kind}", f"mlw_{kind}")

    say(f"{kind}: (b) mirrorline catching up from the log")
    applier = Applier(conf, spark=get_spark())
    # stands for a pipeline that has been running a while (at a size below the warm-up's, a warm-up that size)
    warm = warm_up(applier.spark, min(WARM_UP_ROWS, max(8_000, changes)), min(LARGE_WARM_UP_KEYS, max(1_000, changes)))
    b, compiles, applies = catch_up(applier)
    want = content(source, db)
    for tdb in (f"ml_{kind}",):
        got = content(target, tdb)
        assert got == want, f"mirrorline target differs: {got} != {want}"

    say(f"{kind}: (b2) again, into another target, now that the JVM has compiled units this size")
    b2, compiles2, applies2 = catch_up(Applier(conf2, spark=get_spark()))
    got = content(target, f"mlw_{kind}")
    assert got == want, f"mirrorline target differs: {got} != {want}"

    ice: dict[str, Any] = {}
    if iceberg:
        say(f"{kind}: (d) mirrorline catching up into an Iceberg target")
        d, compiles4, applies4 = catch_up(Applier(config(f"log4_{kind}", "", "ice", ice_url), spark=get_spark()), "ice")
        assert iceberg_same(work / f"ice_{kind}", source, db), "the Iceberg target differs from the source"
        ice = {
            "iceberg_s": round(d, 3),
            "a_over_iceberg": round(a / d, 2),
            "iceberg_unit_compile_s": compiles4,
            "iceberg_unit_apply_s": applies4,
        }

    hist: dict[str, Any] = {}
    if history:
        say(f"{kind}: (h) mirrorline catching up into a PostgreSQL target keeping every version (history mode)")
        if seeded:
            target.execute(HISTORY_DDL, f"mlh_{kind}")
            target.execute(SEED % changes, f"mlh_{kind}")
            target.execute("VACUUM ANALYZE bench", f"mlh_{kind}")
        h, compiles5, applies5 = catch_up(
            Applier(config(f"log5_{kind}", f"mlh_{kind}", mode="versions"), spark=get_spark())
        )
        got = content(target, f"mlh_{kind}", " WHERE _ml_end_lsn IS NULL")
        assert got == want, f"the history target's current versions differ: {got} != {want}"
        versions = int(target.execute("SELECT count(*) FROM bench", f"mlh_{kind}")[0][0])
        hist = {
            "history_s": round(h, 3),
            "history_versions": versions,
            "history_over_plain": round(h / b2, 2),
            "a_over_history": round(a / h, 2),
            "history_unit_compile_s": compiles5,
            "history_unit_apply_s": applies5,
        }

    say(f"{kind}: (c) COPY of the net rows into an empty table")
    buf = io.BytesIO()
    sconn = psycopg2.connect(source.dsn(db))
    with sconn.cursor() as cur:
        cur.copy_expert("COPY bench TO STDOUT", buf)
    sconn.close()
    buf.seek(0)
    tconn = psycopg2.connect(target.dsn(f"copy_{kind}"))
    t0 = time.monotonic()
    with tconn.cursor() as cur:
        cur.copy_expert("COPY bench FROM STDIN", buf)
    tconn.commit()
    c = time.monotonic() - t0
    tconn.close()
    say(f"{kind}: (f) the method's floor: a Spark scan of the log + worktable COPY and INSERT ... SELECT")
    floors: dict[str, float] = {}
    scan = scan_seconds(work / f"log3_{kind}")
    buf.seek(0)
    worktable = worktable_seconds(target.dsn(f"floor_{kind}"), buf)
    if seeded:
        say(f"{kind}: (u) the update's floor: one bare UPDATE of every row")
        floors["update_floor_s"] = update_floor_seconds(target, f"updfloor_{kind}", changes)
        floors["a_over_update_floor"] = round(a / floors["update_floor_s"], 2)
    target.execute(f"ALTER SUBSCRIPTION {sub_slot} SET (slot_name = NONE)", f"sub_{kind}")
    target.execute(f"DROP SUBSCRIPTION {sub_slot}", f"sub_{kind}")
    if layouts:
        import pyarrow as pa

        from layout_floor import layout_floors

        say(f"{kind}: the bare fold in each log layout (bench/layout_floor.py)")
        types = {"id": pa.int64(), "v": pa.int64(), "pad": pa.string(), "at": pa.timestamp("us", tz="UTC")}
        folds = layout_floors(get_spark(), work / f"log3_{kind}", work / "layouts", types, "id", int(want[0]))
        for name, s in folds.items():
            floors[f"layout_fold_{name}_s"] = s
            floors[f"a_over_layout_floor_{name}"] = round(a / (s + worktable), 2)
    return {
        "changes": changes,
        "net_rows": int(want[0]),
        "pg_logical_s": round(a, 3),
        "mirrorline_s": round(b, 3),
        "mirrorline_compile_s": round(sum(compiles), 3),
        "mirrorline_units": len(compiles),
        "mirrorline_unit_compile_s": compiles,
        "mirrorline_unit_apply_s": applies,
        "mirrorline_warm_up_s": round(warm, 2),
        "mirrorline_jit_warm_s": round(b2, 3),
        "mirrorline_jit_warm_compile_s": round(sum(compiles2), 3),
        "mirrorline_jit_warm_unit_compile_s": compiles2,
        "mirrorline_jit_warm_unit_apply_s": applies2,
        "copy_s": round(c, 3),
        "floor_scan_s": round(scan, 3),
        "floor_worktable_s": round(worktable, 3),
        "floor_s": round(scan + worktable, 3),
        "a_over_floor": round(a / (scan + worktable), 2),
        "pg_logical_changes_per_s": round(changes / a),
        "mirrorline_changes_per_s": round(changes / b),
        "a_over_b": round(a / b, 2),
        "b_over_c": round(b / c, 2),
        "a_over_b2": round(a / b2, 2),
        "b2_over_c": round(b2 / c, 2),
        **floors,
        **ice,
        **hist,
    }


def repeated(
    runs: int,
    changes: int,
    workloads: str,
    layouts: bool = False,
    unit_changes: int | None = None,
    iceberg: bool = False,
    history: bool = False,
) -> dict[str, Any]:
    """The benchmark run ``runs`` times, each in a process of its own (a new JVM, so that (b) is the first large
    unit after start-up every time) with clusters of its own: the median of every figure, ratios taken per run."""
    import statistics
    import subprocess

    outs = []
    for i in range(runs):
        say(f"run {i + 1} of {runs}")
        done = subprocess.run(
            [sys.executable, __file__, "--changes", str(changes), "--workloads", workloads]
            + (["--layouts"] if layouts else [])
            + (["--unit-changes", str(unit_changes)] if unit_changes else [])
            + (["--iceberg"] if iceberg else [])
            + (["--history"] if history else []),
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        outs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    merged: dict[str, Any] = {"runs": runs, "spark_startup_s": statistics.median(o["spark_startup_s"] for o in outs)}
    for kind in workloads.split(","):
        fields = outs[0][kind]
        merged[kind] = {
            k: round(statistics.median(o[kind][k] for o in outs), 3) for k in fields if not isinstance(fields[k], list)
        }
        merged[kind]["each"] = {
            k: [o[kind][k] for o in outs]
            for k in (
                "pg_logical_s",
                "mirrorline_s",
                "mirrorline_jit_warm_s",
                "a_over_b",
                "a_over_b2",
                "mirrorline_unit_compile_s",
                "mirrorline_jit_warm_unit_compile_s",
                *(("iceberg_s", "a_over_iceberg") if iceberg else ()),
                *(("history_s", "history_over_plain") if history else ()),
            )
        }
    return merged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--changes", type=int, default=1_000_000)
    p.add_argument("--workloads", default="update_heavy,insert_only,distinct_keys")
    p.add_argument(
        "--runs", type=int, default=1, help="run it this many times, each in a new process; report the medians"
    )
    p.add_argument(
        "--layouts",
        action="store_true",
        help="update-heavy: also time the bare fold in other log layouts (bench/layout_floor.py)",
    )
    p.add_argument(
        "--unit-changes",
        type=int,
        default=None,
        help="catch up in units of at most this many changes (default: the workload in one unit)",
    )
    p.add_argument("--iceberg", action="store_true", help="also catch up into an Iceberg target (d)")
    p.add_argument(
        "--history", action="store_true", help="also catch up into a PostgreSQL target keeping every version (h)"
    )
    args = p.parse_args()
    if args.runs > 1:
        print(
            json.dumps(
                repeated(
                    args.runs, args.changes, args.workloads, args.layouts, args.unit_changes, args.iceberg, args.history
                )
            )
        )
        return
    t0 = time.monotonic()
    spark = get_spark()
    spark.range(1000).selectExpr("sum(id)").collect()  # first job: class loading, code generation
    out: dict[str, object] = {"spark_startup_s": round(startup_seconds() or (time.monotonic() - t0), 2)}
    with tempfile.TemporaryDirectory(prefix="mirrorline-bench-") as tmp, PgCluster() as source, PgCluster() as target:
        for kind in args.workloads.split(","):
            out[kind] = one(
                kind,
                args.changes,
                source,
                target,
                Path(tmp),
                args.layouts and kind == "update_heavy",
                args.unit_changes,
                args.iceberg,
                args.history,
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
