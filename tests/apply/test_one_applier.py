"""One applier per target: a lock at the target, held while a unit is applied. ``verify`` and ``apply
--once`` run three times each beside a live ``run`` on a table without a key (where a unit applied twice would leave
extra copies) and a keyed one, under load: every verify says equal, every apply ends cleanly, and afterwards every
target equals the source as a multiset (the tests' own reader)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import configs
import oracle
import psycopg2
import pytest
from crash_support import mirrorline_process
from pipeline_support import target_url
from waiting import wait_until

from mirrorline import config as cfg
from mirrorline.apply import open_target

KINDS = ("postgresql", "sqlite", "delta")
TABLES = ("public.bag", "public.keyed")


def _config(pg: Any, tmp_path: Path, urls: dict[str, str]) -> Path:
    return configs.write(
        tmp_path / "m.toml",
        source=pg.dsn,
        log={"path": tmp_path / "log", "segment_seconds": "100ms"},
        apply={"latency": "200ms"},
        tables=TABLES,
        targets=urls,
    )


@pytest.mark.pg
@pytest.mark.parametrize("kind", KINDS)
def test_the_lock_excludes_a_second_holder_and_names_the_first(
    pg: Any, pg_cluster: Any, tmp_path: Path, kind: str
) -> None:
    url = target_url(kind, tmp_path, pg_cluster, f"lk_{kind[:2]}_{pg.name[-6:]}")
    path = _config(pg, tmp_path, {"t": url})
    t = open_target(cfg.load(path).targets["t"])
    other = open_target(cfg.load(path).targets["t"])
    try:
        held = t.try_lock()
        assert held is not None
        assert other.try_lock() is None  # (another connection, another open file: as another process would be)
        assert f"pid {os.getpid()}" in other.lock_holder() or "backend pid" in other.lock_holder()
        t.unlock(held)
        again = other.try_lock()
        assert again is not None
        other.unlock(again)
    finally:
        t.close()
        other.close()


class _Load(threading.Thread):
    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop, self.errors, self.n = dsn, threading.Event(), [], 0

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    self.n += 1
                    i = self.n
                    cur.execute(
                        "INSERT INTO public.bag VALUES (%s, 'x'), (%s, 'x'); INSERT INTO public.keyed VALUES (%s, 'k');"
                        "DELETE FROM public.bag WHERE ctid = (SELECT min(ctid) FROM public.bag WHERE a = %s);"
                        "UPDATE public.keyed SET v = v || '+' WHERE id = %s",
                        (i % 7, i % 7, i, (i * 3) % 7, i // 2),
                    )
                    time.sleep(0.02)
        except BaseException as e:  # pragma: no cover - asserted by the test
            self.errors.append(e)
        finally:
            conn.close()


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mirrorline.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


_READER = """
import json, sys, time, duckdb
path, n = sys.argv[1], int(sys.argv[2])
ok, t0 = 0, time.monotonic()
for _ in range(n):
    for attempt in range(200):  # run holds the file while it applies a unit: a read waits for the unit's end
        try:
            con = duckdb.connect(path, read_only=True)
            break
        except duckdb.Error as e:
            if "lock" not in str(e).lower():
                raise
            time.sleep(0.05)
    else:
        continue
    con.execute("SELECT count(*) FROM keyed").fetchone()
    con.close()
    ok += 1
    time.sleep(0.2)  # a reader that holds the file keeps run waiting: this one lets go between reads
print(json.dumps({"ok": ok, "seconds": time.monotonic() - t0}))
"""


def _read_only_reads(path: str, n: int) -> dict[str, Any]:
    """``n`` reads of a DuckDB file by another process, each opening it read-only (retried while a writer holds it)."""
    import json

    out = subprocess.run([sys.executable, "-c", _READER, path, str(n)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout))


def _fail_if_ended(run: subprocess.Popen[bytes], tmp_path: Path) -> bool:
    """False while ``run`` runs (a wait goes on); fails with its log's tail once it ended."""
    assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
    return False


def _all_same(pg: Any, urls: dict[str, str]) -> bool:
    import duckdb

    try:
        for kind, url in urls.items():
            for t in TABLES:
                oracle.assert_same(pg.dsn, kind, url, t)
    except AssertionError:
        return False
    except duckdb.IOException as e:  # run holds a DuckDB target's file while it applies a unit: read it again
        if "lock" not in str(e).lower():
            raise
        return False
    return True


@pytest.mark.pg
@pytest.mark.spark
def test_verify_and_apply_beside_a_live_run(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    pg.execute(
        "CREATE TABLE public.bag (a integer, b text); ALTER TABLE public.bag REPLICA IDENTITY FULL;"
        "CREATE TABLE public.keyed (id integer PRIMARY KEY, v text); INSERT INTO public.bag VALUES (1, 'x'), (1, 'x')"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"la_{k[:2]}_{pg.name[-6:]}") for k in KINDS}
    path = _config(pg, tmp_path, urls)
    run = mirrorline_process("run", "-c", str(path), log_file=tmp_path / "run.log")
    load = _Load(pg.dsn)
    try:
        wait_until(
            lambda: _all_same(pg, urls) or _fail_if_ended(run, tmp_path),
            timeout=240,
            interval=1,
            what="run loads the targets",
        )
        load.start()
        for i in range(2):  # (each round 50-60 s: verify and apply each start their own Spark)
            v = _cli("verify", "-c", str(path))
            assert v.returncode == 0, f"verify {i}: {v.returncode}\n{v.stdout}\n{v.stderr}"
            a = _cli("apply", "--once", "--target", "postgresql", "-c", str(path))
            assert a.returncode == 0, f"apply {i}: {a.returncode}\n{a.stdout}\n{a.stderr}"
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        load.stop.set()
        load.join(30)
        assert not load.errors and load.n > 20
        wait_until(lambda: _all_same(pg, urls), timeout=120, interval=1, what="the targets catch up after the load")
    finally:
        load.stop.set()
        run.terminate()
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            run.kill()
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.pg
@pytest.mark.spark
def test_status_and_verify_beside_a_live_run_on_duckdb(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    """DuckDB lets one process open a database to write it, and keeps writers out while another has it open. Beside a
    live ``run``, which holds a DuckDB target's file only while it applies a unit: ``status`` reports it (no error,
    ``--check`` OK), ``verify`` compares it, and any other DuckDB client reads it read-only between units, under a
    load."""
    from mirrorline import status as status_mod

    pg.execute(
        "CREATE TABLE public.bag (a integer, b text); ALTER TABLE public.bag REPLICA IDENTITY FULL;"
        "CREATE TABLE public.keyed (id integer PRIMARY KEY, v text); INSERT INTO public.keyed VALUES (1, 'a')"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"dk_{k[:2]}_{pg.name[-6:]}") for k in ("duckdb", "sqlite")}
    path = _config(pg, tmp_path, urls)
    conf = cfg.load(path)
    run = mirrorline_process("run", "-c", str(path), log_file=tmp_path / "run.log")
    try:

        def duck() -> Any:
            st = status_mod.status(conf)
            return st, next(t for t in st.targets if t.name == "duckdb")

        wait_until(
            lambda: (
                (duck()[1].state == "live" and _all_same(pg, {"sqlite": urls["sqlite"]}))
                or _fail_if_ended(run, tmp_path)
            ),
            timeout=240,
            interval=1,
            what="run loads the targets",
        )
        st, t = duck()
        assert not t.error and t.position is not None and st.problems(max_lag=60) == [], st.problems()
        pg.execute("INSERT INTO public.keyed VALUES (10, 'v'); INSERT INTO public.bag VALUES (1, 'x')")
        v = _cli("verify", "-c", str(path))
        assert v.returncode == 0, f"verify: {v.returncode}\n{v.stdout}\n{v.stderr}"
        assert "duckdb" in v.stdout and "could not be compared" not in v.stdout, v.stdout
        pg.execute("UPDATE public.keyed SET v = 'after verify'")
        wait_until(
            lambda: duck()[1].lag_bytes == 0 and _all_same(pg, {"sqlite": urls["sqlite"]}),
            timeout=120,
            interval=0.5,
            what="the targets are current after verify",
            context=lambda: (duck()[1], (tmp_path / "run.log").read_text()[-2000:]),
        )
        # any DuckDB client reads the replica while run keeps it current under a load: run holds the file only
        # while it applies a unit, so another process opens it read-only between units
        pg.execute("DELETE FROM public.keyed")  # the load inserts ids from 1
        load = _Load(pg.dsn)
        load.start()
        try:
            reads = _read_only_reads(oracle.location(urls["duckdb"]), 15)
        finally:
            load.stop.set()
            load.join(30)
        assert reads["ok"] == 15 and reads["seconds"] < 60, reads
        assert not load.errors and load.n > 20
        wait_until(  # the tests' own reader opens the file too, while run is live
            lambda: _all_same(pg, urls) or _fail_if_ended(run, tmp_path),
            timeout=120,
            interval=0.5,
            what="the DuckDB target catches up after the load",
        )
        assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        run.terminate()
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            run.kill()
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert "Traceback" not in log and "stopped" not in log, log[-3000:]
