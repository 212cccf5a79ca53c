"""A SQLite target's checkpoints run after its commits in a thread of their own: a unit's commit does not wait for
its pages to be copied from the WAL into the database file (bench/bigtxn: 11-16 s of a big unit's apply), readers
see the unit at once, and the WAL does not grow without end when units follow one another."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from apply_support import ITEMS, P, batch, fetch, net, open_target

from mirrorline import limits
from mirrorline.apply.sqlite.checkpoint import Checkpointer

pytestmark = pytest.mark.spark

SCHEMAS = {ITEMS.table: ITEMS}
COLS = ["id", "name", "qty", "note"]


def rows(lo: int, hi: int) -> list[Any]:
    return [net("public.items", "I", [i], {"id": i, "name": "x" * 200, "qty": i, "note": None}) for i in range(lo, hi)]


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def test_a_commit_leaves_the_copy_into_the_file_to_the_checkpointer(
    spark: Any, request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = open_target("sqlite", request, tmp_path)
    db, wal = Path(t.location), Path(t.location + "-wal")
    t.apply(batch(spark, rows(0, 10), P(0), P(0x100)), SCHEMAS)
    t.checkpointer.wait_idle(30)
    asked: list[int] = []
    real_due = Checkpointer.due
    monkeypatch.setattr(Checkpointer, "due", lambda self: asked.append(1))
    before = size(db)
    t.apply(batch(spark, rows(10, 5010), P(0x100), P(0x200)), SCHEMAS)
    # committed: read by another connection (from the WAL), while the database file has not grown
    assert len(fetch(t, "public.items", COLS)) == 5010
    assert asked and size(db) == before and size(wal) > 1_000_000
    s = t.session()
    try:
        assert s.query("PRAGMA wal_autocheckpoint") == [(0,)]
    finally:
        s.close()
    real_due(t.checkpointer)
    assert t.checkpointer.wait_idle(30) and t.checkpointer.failed is None
    assert size(db) > before + 1_000_000  # the checkpoint copied the unit's pages
    with sqlite3.connect(t.location) as c:  # the copy is whole: nothing left in the WAL to copy
        busy, pages, done = c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert (busy, pages) == (0, done)


def test_units_back_to_back_keep_the_wal_bounded_and_a_closed_target_leaves_one_file(
    spark: Any, request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SQLITE_WAL_BYTES", 1)  # every unit waits for the checkpoint before it writes
    t = open_target("sqlite", request, tmp_path)
    wal = Path(t.location + "-wal")
    sizes = []
    for k in range(12):
        t.apply(batch(spark, rows(k * 1000, (k + 1) * 1000), P(k * 0x100), P((k + 1) * 0x100)), SCHEMAS)
        sizes.append(size(wal))
    # each unit starts the WAL again from its beginning: it holds about one unit's pages, not twelve
    assert max(sizes) < 3 * sizes[0], sizes
    assert t.checkpointer.runs >= 1
    t.close()
    assert not wal.exists()  # the last connection checkpointed what was left and removed the WAL
    with sqlite3.connect(t.location) as c:
        assert c.execute('SELECT count(*) FROM "items"').fetchone() == (12_000,)
    assert os.stat(t.location).st_size > 12_000 * 200


def test_a_unit_waits_for_the_checkpoint_under_way_only_past_the_wal_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SQLITE_WAL_BYTES", 100 * 16384)
    c = Checkpointer(str(tmp_path / "t.db"))
    c.page_size = 16384
    c._idle.clear()  # a checkpoint under way
    c.pages = 100
    c.settle()  # at the bound: the unit goes on
    c.pages = 101
    done = threading.Event()
    threading.Thread(target=lambda: (c.settle(), done.set()), daemon=True).start()
    assert not done.wait(0.3)  # past it: the unit waits
    c._idle.set()  # until the checkpoint ends
    assert done.wait(5)


def test_a_new_database_gets_large_pages_and_an_existing_one_keeps_its_own(
    spark: Any, request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database file the target creates has ``limits.SQLITE_PAGE_SIZE`` pages; one that exists (made by an earlier
    mirrorline, or by its user) keeps its page size and is applied to as before; the WAL's bound counts bytes."""
    t = open_target("sqlite", request, tmp_path)
    t.apply(batch(spark, rows(0, 100), P(0), P(0x100)), SCHEMAS)
    with sqlite3.connect(t.location) as c:
        assert c.execute("PRAGMA page_size").fetchone() == (limits.SQLITE_PAGE_SIZE,)
    t.checkpointer.wait_idle(30)
    assert t.checkpointer.page_size == limits.SQLITE_PAGE_SIZE

    old = tmp_path / "old" / "target.sqlite"
    old.parent.mkdir()
    with sqlite3.connect(old) as c:  # a file of 4 kB pages, SQLite's default, with a table of its own in it
        c.execute("PRAGMA page_size = 4096")
        c.execute("PRAGMA journal_mode = WAL")
        c.execute('CREATE TABLE "elsewhere" (x INTEGER)')
    monkeypatch.setattr(limits, "SQLITE_WAL_BYTES", 50 * 4096)
    t2 = open_target("sqlite", request, old.parent)
    for k in range(3):
        t2.apply(batch(spark, rows(k * 1000, (k + 1) * 1000), P(k * 0x100), P((k + 1) * 0x100)), SCHEMAS)
    assert t2.checkpointer.page_size == 4096 and t2.checkpointer.runs >= 1
    assert sorted(r[0] for r in fetch(t2, "public.items", ["id"])) == list(range(3000))
    t2.close()
    with sqlite3.connect(old) as c:
        assert c.execute("PRAGMA page_size").fetchone() == (4096,)
        assert c.execute('SELECT count(*) FROM "items"').fetchone() == (3000,)
