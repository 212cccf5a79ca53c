"""Helpers for the tests of the large-unit routes (compile.inserts, compile.updates): two tables, a pipeline that
catches a log of about 1,000 changes up in one large unit, the rows the tables hold in each target, and a spy on a
route's compile function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from patching import patch_where_used

from mirrorline.config import parse
from mirrorline.model import Column, TableSchema
from mirrorline.pipeline import Applier

# two tables: a one-column key, and a two-column key
A = TableSchema(
    "public.a", (Column("id", "bigint", nullable=False), Column("v", "text"), Column("w", "integer")), ("id",)
)
B = TableSchema(
    "public.b",
    (Column("k1", "text", nullable=False), Column("k2", "integer", nullable=False), Column("note", "text")),
    ("k1", "k2"),
)


def one_unit_pipeline(
    tmp_path: Path, catch_up_changes: int = 500, spark: Any = None, warm_up: Any = None, **urls: str
) -> Applier:
    """A pipeline on the log at ``tmp_path / "log"`` (targets: ``urls``, else one SQLite file) whose units are large
    once ``catch_up_changes`` changes are behind (the log advances by whole transactions: at most that many)."""
    targets = {n: {"url": u} for n, u in (urls or {"t": f"sqlite:///{tmp_path / 't.db'}"}).items()}
    conf = parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "targets": targets,
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, spark=spark, warm_up=warm_up)
    a.small_unit, a.catch_up_changes = 100, catch_up_changes
    return a


def spy_route(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[bool]:
    """Record whether each call of ``module.name`` (a route's compile) gave a batch; it still does the real work."""
    calls: list[bool] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    patch_where_used(monkeypatch, module, name, spy)
    return calls


def ab_rows(tmp_path: Path, pg: Any) -> dict[str, tuple[list[Any], list[Any]]]:
    """The rows of tables ``a`` (id, v, w) and ``b`` (k1, k2, note), in key order, in each of the targets of
    :func:`one_unit_pipeline` ``(tmp_path, s=<tmp_path/t.db>, d=<tmp_path/t.duckdb>, p=pg.url)``."""
    import sqlite3

    import duckdb

    qa, qb = "SELECT id, v, w FROM a ORDER BY id", "SELECT k1, k2, note FROM b ORDER BY k1, k2"
    db = sqlite3.connect(tmp_path / "t.db")
    dd = duckdb.connect(str(tmp_path / "t.duckdb"))
    try:
        return {
            "sqlite": (db.execute(qa).fetchall(), db.execute(qb).fetchall()),
            "duckdb": (dd.execute(qa).fetchall(), dd.execute(qb).fetchall()),
            "pg": (pg.execute(qa), pg.execute(qb)),
        }
    finally:
        db.close()
        dd.close()


_KILLED_RUN = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[3])
from large_units import one_unit_pipeline

a = one_unit_pipeline(Path(sys.argv[1]), p=sys.argv[2])
a.catch_up()
"""


def kill_while_copying(tmp_path: Path, pg: Any, table: str) -> None:
    """Run :func:`one_unit_pipeline` ``(tmp_path, p=pg.url)``'s catch-up in a process of its own and SIGKILL it
    while PostgreSQL copies rows into ``table`` (its COPY seen in ``pg_stat_activity``); return once the server has
    ended the dead session's COPY."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psycopg2
    from waiting import wait_until

    script = tmp_path / "run.py"
    script.write_text(_KILLED_RUN)
    tests_dir = str(Path(__file__).parent)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), pg.url, tests_dir], start_new_session=True)
    watch = psycopg2.connect(pg.dsn)
    watch.autocommit = True
    cur = watch.cursor()

    def copying() -> bool:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
            "AND query LIKE %s",
            (f'COPY "public"."{table}" %',),
        )
        return bool(cur.fetchone()[0])

    def run_copying() -> bool:
        if copying():
            return True
        assert proc.poll() is None, "the run ended before its COPY was seen"
        return False

    try:
        wait_until(run_copying, timeout=180, interval=0.005, what=f"the run copies rows into {table}")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(60)
    deadline = time.monotonic() + 30
    while copying() and time.monotonic() < deadline:  # the server ends the dead session's COPY
        time.sleep(0.1)
    watch.close()
