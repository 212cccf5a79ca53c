"""Ctrl-C at any moment: ``run`` interrupted while Spark's JVM starts, while its first load runs, and once it applies
units prints one line saying what was kept (exit 130), no traceback and no JVM message, and leaves no Spark JVM
behind; ``snapshot`` the same. A restart then goes on from what was kept: every target equals the source (read by
the tests' own reader)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from waiting import wait_until

pytestmark = [pytest.mark.pg, pytest.mark.spark]

PROGRESS = ("unit ", "snapshot ", "target ", "Spark ready")  # the lines a run prints as it goes


def _jvms_of(pid: int) -> list[int]:
    """Spark JVMs started by process ``pid`` (its scratch folder, named by its pid, is in their command line)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "SparkSubmit" in cmd and f"/{pid}-" in cmd:
            out.append(int(p.name))
    return out


def _interrupt(cfg: Path, args: list[str], when: Any, meanwhile: Any = None) -> list[str]:
    """Start ``mirrorline ARGS``, SIGINT it once ``when(stderr so far)`` holds (calling ``meanwhile()`` every half
    second until then), and return its stderr's lines that are not progress; asserts exit 130 and that no JVM of it
    is left."""
    log = cfg.parent / f"interrupt-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mirrorline.cli.main", *args, "-c", str(cfg)], stderr=out)
        deadline = time.monotonic() + 120
        last = 0.0
        while not when(log.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            if meanwhile is not None and time.monotonic() - last > 0.5:
                meanwhile()
                last = time.monotonic()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130, log.read_text()
    wait_until(
        lambda: not _jvms_of(proc.pid),
        timeout=15,
        interval=0.2,
        what=f"no Spark JVM of pid {proc.pid} is left",
        context=lambda: f"a Spark JVM of pid {proc.pid} outlived it: {_jvms_of(proc.pid)}",
    )
    return [line for line in log.read_text().splitlines() if not line.startswith(PROGRESS)]


def test_ctrl_c_at_any_moment_says_what_was_kept_in_one_line(pg: Any, tmp_path: Path) -> None:
    pg.execute(
        "CREATE TABLE public.items (id integer PRIMARY KEY, v text);"
        "INSERT INTO public.items SELECT g, md5(g::text) FROM generate_series(1, 200000) g"
    )
    urls = {"sqlite": f"sqlite:///{tmp_path / 't.db'}", "duckdb": f"duckdb:///{tmp_path / 't.duckdb'}"}
    cfg = configs.write(
        tmp_path / "m.toml", source=pg.dsn, log="log", apply={"latency": "100ms"}, tables=["public.items"], targets=urls
    )
    start = time.monotonic()
    moments = {
        "while the JVM starts": lambda _err: time.monotonic() - start > 1.5,
        "while the first load runs": lambda err: "snapshot " in err,
        "once units are applied": lambda err: "unit " in err,
    }
    n = 0

    def change() -> None:
        nonlocal n
        n += 1
        pg.execute(f"UPDATE public.items SET v = 'change {n}' WHERE id % 997 = {n % 997}")

    for what, when in moments.items():
        start = time.monotonic()
        change()
        lines = _interrupt(cfg, ["run"], when, change)
        assert len(lines) == 1 and lines[0].startswith("mirrorline run: interrupted; kept: captured "), (what, lines)
    pg.execute("DELETE FROM public.items WHERE id % 5 = 0")
    # small chunks: the load is many tasks, the first progress line comes while most of it is still to do
    lines = _interrupt(cfg, ["snapshot", "--target", "sqlite", "--chunk-mb", "0.25"], lambda err: "snapshot " in err)
    assert lines == ["mirrorline snapshot: interrupted"], lines
    r = subprocess.run(
        [sys.executable, "-m", "mirrorline.cli.main", "run", "--once", "-c", str(cfg)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for kind, url in urls.items():
        oracle.assert_same(pg.dsn, kind, url, "public.items")


def test_ctrl_c_while_run_starts_says_nothing_moved_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C before ``run`` has built its pipeline (reading its configuration, importing, on a busy machine more
    than a second after the start) is the same one line, saying that nothing moved."""
    import argparse

    from mirrorline.cli import run_cmd

    def interrupted(_args: argparse.Namespace) -> Any:
        signal.raise_signal(signal.SIGINT)  # through run's own handler, as a Ctrl-C then
        raise AssertionError("the handler did not interrupt")

    monkeypatch.setattr(run_cmd, "load_config", interrupted)  # (run's own name for _common's)
    previous = signal.getsignal(signal.SIGINT)
    try:
        code = run_cmd.run(argparse.Namespace(config=str(tmp_path / "m.toml"), once=False, forget_removed=False))
    finally:
        signal.signal(signal.SIGINT, previous)
    lines = capsys.readouterr().err.splitlines()
    assert code == 130 and len(lines) == 1, lines
    assert lines[0].startswith("mirrorline run: interrupted; kept: captured 0 changes;") and "as they were" in lines[0]


def test_a_stop_at_once_that_python_dropped_is_raised_again() -> None:
    """A KeyboardInterrupt raised in a weakref callback or a finaliser is dropped (``Exception ignored in ...``);
    the stop is raised again until the main thread takes it up (the race test_ctrl_c_at_any_moment once lost)."""
    import gc
    import weakref

    from mirrorline.cli._common import Interrupt

    stop = Interrupt(every=0.2)
    previous = signal.signal(signal.SIGINT, lambda *_: stop.raise_now())

    class Thing:
        pass

    dropped = []
    t = Thing()
    _ref = weakref.ref(t, lambda _: (dropped.append(True), stop.raise_now()))
    try:
        del t  # the callback raises: Python reports it and goes on
        gc.collect()
        assert dropped == [True]
        with pytest.raises(KeyboardInterrupt):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.05)
        stop.taken()
        time.sleep(0.5)  # (no further one once taken)
    finally:
        stop.taken()
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_inside_a_duckdb_statement() -> Exception:
    """SIGINT to this process while DuckDB runs a long statement: the error DuckDB raises for it (a signal landing
    before DuckDB runs the statement is a plain KeyboardInterrupt: tried again, up to five times)."""
    import os
    import threading

    import duckdb

    conn = duckdb.connect(config={"threads": 1})  # (with more, a task may run on long before it looks for signals)
    try:
        for _ in range(5):
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            try:
                conn.execute("SELECT max(hash(i)) FROM range(100000000000) t(i)").fetchall()
            except KeyboardInterrupt:
                time.sleep(0.5)
            except Exception as e:  # DuckDB's own error
                return e
    finally:
        conn.close()
    raise AssertionError("DuckDB never took the signal")


def test_a_stop_at_once_a_library_turned_into_its_own_error_is_said_as_the_interrupt() -> None:
    """DuckDB takes the KeyboardInterrupt that lands while it runs a statement and raises ``RuntimeError: Query
    interrupted`` (what CI once saw a Ctrl-C during a DuckDB target's first load become: an internal error, exit 4).
    Once a stop at once was asked for, ``run`` says such an error as the interrupt; before, it is an error."""
    from mirrorline.cli._common import Interrupt
    from mirrorline.cli.run_cmd import _was_interrupt

    stop = Interrupt(every=30.0)  # (raised again only if dropped: not what this test is about)
    assert not _was_interrupt(stop, RuntimeError("Query interrupted"))  # no stop asked for: an error is an error
    previous = signal.signal(signal.SIGINT, lambda *_: stop.raise_now())
    try:
        assert _was_interrupt(stop, _ctrl_c_inside_a_duckdb_statement())
    finally:
        stop.taken()
        signal.signal(signal.SIGINT, previous)


def test_a_command_interrupted_inside_a_duckdb_statement_says_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command (``snapshot``, ``verify``, ``apply``: Python's own Ctrl-C, remembered): a Ctrl-C that DuckDB
    turned into its own error is said as ``interrupted`` (exit 130), not as an internal error."""
    from mirrorline.cli import main, verify_cmd

    def long_statement(_args: Any) -> int:
        raise _ctrl_c_inside_a_duckdb_statement()

    monkeypatch.setattr(verify_cmd, "run", long_statement)
    previous = signal.getsignal(signal.SIGINT)
    try:
        code = main.main(["verify", "-c", str(tmp_path / "m.toml")])
    finally:
        signal.signal(signal.SIGINT, previous)
        main._interrupted.clear()
    assert (code, capsys.readouterr().err.splitlines()) == (130, ["mirrorline verify: interrupted"])
