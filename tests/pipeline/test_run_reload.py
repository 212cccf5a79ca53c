"""``run`` takes its configuration up again on SIGHUP, which ``mirrorline reload`` sends: a target added is loaded
beside the others and then applied (its folder missing at first: that load fails, stops only that target, and is
tried again until it works); a target removed is no longer applied (``target drop`` refuses it until then, naming
the run); the others stay current all along. An invalid file is refused by ``reload`` (nothing sent) and by ``run``
itself (it goes on as it was). Every target is read by the tests' own reader."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from crash_support import mirrorline_process
from waiting import wait_until

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def _same(pg: Any, kind: str, url: str) -> bool:
    try:
        oracle.assert_same(pg.dsn, kind, url, "public.items")
    except (AssertionError, Exception):
        return False
    return True


_wait = partial(wait_until, timeout=120.0, interval=0.3)  # this module's waits


def test_targets_added_and_removed_on_sighup(pg: Any, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE public.items (id integer PRIMARY KEY, v text); INSERT INTO public.items VALUES (1, 'a')")
    urls = {
        "keep": f"sqlite:///{tmp_path / 'keep.db'}",
        "gone": f"sqlite:///{tmp_path / 'gone.db'}",
        "late": f"sqlite:///{tmp_path / 'later' / 'late.db'}",  # its folder does not exist yet
    }
    cfg = tmp_path / "m.toml"

    def write(names: list[str]) -> None:
        configs.write(
            cfg,
            source=pg.dsn,
            log="log",
            apply={"latency": "100ms"},
            tables=["public.items"],
            targets={n: urls[n] for n in names},
        )

    write(["keep", "gone"])
    log = tmp_path / "run.log"
    proc = mirrorline_process("run", "-c", str(cfg), log_file=log)
    try:
        _wait(
            lambda: _same(pg, "sqlite", urls["keep"]) and _same(pg, "sqlite", urls["gone"]),
            what="both targets are current",
        )
        good = cfg.read_text()
        cfg.write_text(good + '[targets.bad]\nurl = "mysql://nowhere/x"\n')
        r = _cli("reload", "-c", str(cfg))
        assert r.returncode == 2 and "targets.bad.url" in r.stderr, r.stderr  # refused here: nothing sent
        proc.send_signal(signal.SIGHUP)  # and by run itself, which goes on as it was
        _wait(
            lambda: "configuration not reloaded (run goes on as it was)" in log.read_text(), what="run refuses the file"
        )
        assert proc.poll() is None
        write(["keep", "late"])
        r = _cli("target", "drop", "-c", str(cfg), "gone")  # out of the file, but the live run still applies it
        assert r.returncode == 3 and f"still applied by the live `mirrorline run` (pid {proc.pid})" in r.stderr
        r = _cli("reload", "-c", str(cfg))
        assert r.returncode == 0 and f"pid {proc.pid}" in r.stdout, r.stderr
        _wait(lambda: "target gone removed from the configuration" in log.read_text(), what="the removal is said")
        r = _cli("target", "drop", "-c", str(cfg), "gone")
        assert r.returncode == 0 and "target gone unregistered" in r.stderr, r.stderr
        _wait(lambda: "target late: loading failed" in log.read_text(), what="the failed load is said")
        pg.execute("INSERT INTO public.items VALUES (2, 'b')")
        _wait(lambda: _same(pg, "sqlite", urls["keep"]), what="the kept target is current")
        (tmp_path / "later").mkdir()
        _wait(lambda: _same(pg, "sqlite", urls["late"]), what="the added target is loaded and current")
        pg.execute("UPDATE public.items SET v = 'c'")
        _wait(
            lambda: _same(pg, "sqlite", urls["keep"]) and _same(pg, "sqlite", urls["late"]),
            what="both configured targets are current",
        )
        assert not _same(pg, "sqlite", urls["gone"])  # no longer applied
        assert proc.poll() is None, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    r = _cli("reload", "-c", str(cfg))  # no run now
    assert r.returncode == 3 and "no mirrorline run writes the change log" in r.stderr, r.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mirrorline.cli.main", *args], capture_output=True, text=True)


def test_tables_added_and_removed_on_sighup(pg: Any, tmp_path: Path) -> None:
    """A table added to the file while ``run`` is live (one quiet since it was created, with rows, under a name with a
    space and capitals) is captured from then on and loaded into every target, each pausing in turn; a table that the
    source lacks is refused, and run goes on as it was; a table removed is no longer applied. SQLite, DuckDB and Delta
    targets, read by the tests' own reader."""
    pg.execute("CREATE TABLE public.items (id integer PRIMARY KEY, v text); INSERT INTO public.items VALUES (1, 'a')")
    urls = {
        "sqlite": f"sqlite:///{tmp_path / 't.db'}",
        "duckdb": f"duckdb:///{tmp_path / 't.duckdb'}",
        "delta": f"delta:///{tmp_path / 'lake'}",
    }
    cfg = tmp_path / "m.toml"
    odd = 'sales."Order Items"'

    def write(tables: list[str]) -> None:
        configs.write(cfg, source=pg.dsn, log="log", apply={"latency": "100ms"}, tables=tables, targets=urls)

    def same(table: str) -> bool:
        try:
            for kind, url in urls.items():
                oracle.assert_same(pg.dsn, kind, url, table)
        except (AssertionError, Exception):
            return False
        return True

    write(["public.items"])
    log = tmp_path / "run.log"
    proc = mirrorline_process("run", "-c", str(cfg), log_file=log)
    try:
        _wait(lambda: same("public.items"), timeout=240, what="the targets are current")
        pg.execute(
            'CREATE SCHEMA sales; CREATE TABLE sales."Order Items" (n integer, "Qty" numeric(8,2), note text, '
            "PRIMARY KEY (note, n)); INSERT INTO sales.\"Order Items\" SELECT i, i / 4.0, 'x' || i "
            "FROM generate_series(1, 500) i; INSERT INTO public.items VALUES (2, 'b')"
        )
        write(["public.items", "public.nowhere"])
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: "no table public.nowhere" in log.read_text(), what="run refuses the missing table")
        assert "configuration not reloaded (run goes on as it was)" in log.read_text()
        pg.execute("UPDATE public.items SET v = 'still applied' WHERE id = 1")
        _wait(lambda: same("public.items"), what="the targets stay current")
        write(["public.items", odd])
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: "added sales.Order Items" in log.read_text(), what="the added table is said")
        pg.execute(
            'UPDATE sales."Order Items" SET "Qty" = -1 WHERE n % 7 = 0; DELETE FROM sales."Order Items" WHERE n < 20;'
            "INSERT INTO sales.\"Order Items\" VALUES (1000, 1.5, 'late'); INSERT INTO public.items VALUES (3, 'c')"
        )
        _wait(lambda: same("sales.Order Items"), timeout=240, what="the added table is loaded and current everywhere")
        _wait(lambda: same("public.items"), what="the other table stays current")
        write([odd])
        proc.send_signal(signal.SIGHUP)
        _wait(lambda: "removed public.items" in log.read_text(), what="the removed table is said")
        time.sleep(2)
        pg.execute(
            "INSERT INTO public.items VALUES (4, 'd'); UPDATE sales.\"Order Items\" SET note = 'after' WHERE n = 1000"
        )
        _wait(lambda: same("sales.Order Items"), what="the kept table is current")
        time.sleep(2)
        for kind, url in urls.items():  # no longer applied: the target keeps the rows it had
            got = oracle.read(kind, oracle.location(url), "public.items", ["id"])
            assert got is not None and sorted(r[0] for r in got) == [1, 2, 3], (kind, got)
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
