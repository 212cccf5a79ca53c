"""Worktable rows of one unit, derived once and shared by every target applying it (NetBatch.derive, ArrowStager)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from mirrorline.apply import rows as work_rows
from mirrorline.apply.stage import ArrowStager
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.model import Column, TableSchema
from mirrorline.position import Position

TS = TableSchema("public.t", (Column("id", "integer"), Column("v", "text")), ("id",))


def _batch() -> NetBatch:
    rows = [
        {"table": "public.t", "kind": "D", "key": ["1"], "new": None, "unchanged": [], "lsn": 5, "seq": 0},
        {"table": "public.t", "kind": "U", "key": ["3"], "new": [("id", "3"), ("v", "c")], "unchanged": [],
         "lsn": 6, "seq": 0},
        {"table": "public.t", "kind": "U", "key": ["2"], "new": [("id", "2"), ("v", "b")], "unchanged": [],
         "lsn": 7, "seq": 0},
        {"table": "public.t", "kind": "I", "key": ["4"], "new": [("id", "4"), ("v", "d")], "unchanged": [],
         "lsn": 8, "seq": 0},
    ]  # fmt: skip
    return NetBatch(Position(1, 0), Position(9, 0), ["public.t"], rows=pa.Table.from_pylist(rows, schema=NET_ARROW))


def test_derive_computes_once_per_key_while_others_wait() -> None:
    batch = _batch()
    calls: list[str] = []

    def make() -> str:
        calls.append("x")
        time.sleep(0.05)  # the other threads arrive while it runs
        return "value"

    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(batch.derive("k", make))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["value"] * 4 and calls == ["x"]
    assert batch.derive("other", lambda: "second") == "second"


def test_derive_does_not_remember_a_failure_and_release_drops_what_it_derived() -> None:
    batch = _batch()

    def fail() -> str:
        raise OSError("disk full")

    with pytest.raises(OSError):
        batch.derive("k", fail)
    assert batch.derive("k", lambda: "then") == "then"
    batch.release()
    assert batch.derive("k", lambda: "after release") == "after release"


def test_targets_of_one_unit_share_its_worktable_rows() -> None:
    """Two targets' stagers of the same batch get the same flattened rows (one flatten), in key order."""
    batch = _batch()
    a, b = ArrowStager(batch, whole=True), ArrowStager(batch, whole=True)
    for kind in work_rows.KINDS:
        assert a.rows(TS, kind) is b.rows(TS, kind)
    updates = a.rows(TS, "U")
    assert updates is not None and updates.column("v").to_pylist() == ["b", "c"]
    other = ArrowStager(_batch(), whole=True)  # another unit: its own rows
    assert other.rows(TS, "U") is not updates
    assert other.rows(TS, "U") == updates


def test_the_rows_of_a_table_and_kind_are_the_net_rows_themselves_when_nothing_else_is_there() -> None:
    """Selecting copies every column (the images too): a unit of one table and one kind, a big transaction's, is
    passed on as it is; a mixed one is filtered."""
    mixed = _batch().rows
    assert mixed is not None
    updates = work_rows.select(mixed, "public.t", "U")
    assert updates.column("key").to_pylist() == [["3"], ["2"]]
    assert work_rows.select(updates, "public.t", "U") is updates
    assert work_rows.select(mixed, "public.t") is mixed
    assert work_rows.select(updates, "public.t", "D").num_rows == 0
    assert work_rows.select(mixed, "public.other").num_rows == 0


def test_a_duckdb_worktable_is_the_arrow_rows_in_place_and_no_transaction_leaves_one_behind(tmp_path: Any) -> None:
    """DuckDB scans a worktable's Arrow rows where they are (registered, not copied into a temp table); dropping
    it, or a rollback, lets go of them."""
    import duckdb

    from mirrorline.apply.duckdb.session import DuckdbSession

    conn = duckdb.connect(str(tmp_path / "t.duckdb"))
    s = DuckdbSession(conn)
    rows = pa.table({"a": ["1", "2"], "b": ["x", None]})
    s.begin()
    s.load("mirrorline_w1_u", ["k0", "v"], rows)
    assert s.query("SELECT k0, v FROM mirrorline_w1_u ORDER BY k0") == [("1", "x"), ("2", None)]
    assert s.query("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE 'mirrorline_w%'") == [(0,)]  # no copy
    s.drop_worktable("mirrorline_w1_u")
    with pytest.raises(duckdb.CatalogException):
        s.query("SELECT * FROM mirrorline_w1_u")
    s.rollback()
    s.begin()
    s.load("mirrorline_w2_u", ["k0", "v"], rows)
    s.rollback()  # e.g. a unit that failed: its worktables go with the transaction
    with pytest.raises(duckdb.CatalogException):
        s.query("SELECT * FROM mirrorline_w2_u")
    s.disconnect()
    conn.close()


def test_a_duckdb_target_bounds_what_its_database_holds_in_memory(tmp_path: Any) -> None:
    """DuckDB's default lets a database take 80% of the machine's memory inside run's own process; a target opens
    its file with :data:`~mirrorline.limits.DUCKDB_MEMORY`, and a transaction of more rows than that still commits
    (DuckDB writes them out as it goes)."""
    from mirrorline import limits
    from mirrorline.apply import open_target
    from mirrorline.config import TargetConfig

    path = str(tmp_path / "t.duckdb")
    t = open_target(TargetConfig(name="d", url=f"duckdb:///{path}", kind="duckdb", location=path))
    s = t.session()
    try:
        limit = s.query("SELECT current_setting('memory_limit')")[0][0]
        assert limit.replace(" ", "") == f"{limits.DUCKDB_MEMORY >> 20}.0MiB", limit
        s.begin()
        s.execute("SET memory_limit = '64MB'")  # (this session alone, to keep the test small)
        s.execute("CREATE TABLE big AS SELECT i AS id, repeat(md5(i::VARCHAR), 64) AS body FROM range(100000) t(i)")
        s.commit()
        assert s.query("SELECT count(*), sum(length(body)) FROM big") == [(100_000, 100_000 * 2048)]
    finally:
        s.close()
        t.close()


def test_a_duckdb_target_and_a_reader_in_its_process_share_its_file(tmp_path: Any) -> None:
    """A reader in run's process (a test's own, an embedding program's) reads the target's file through the process's
    home of it (``reading``) while the target holds it, and the target opens it while such a reader holds it; a
    plain second open of the file in the process is refused by DuckDB while the target holds it, and one that holds
    the file keeps the target out with an error that says so. Between units the file is free."""
    import duckdb

    from mirrorline import limits
    from mirrorline.apply import open_target
    from mirrorline.apply.duckdb.home import reading
    from mirrorline.apply.lock import TargetBusy
    from mirrorline.config import TargetConfig

    path = str(tmp_path / "t.duckdb")
    t = open_target(TargetConfig(name="d", url=f"duckdb:///{path}", kind="duckdb", location=path), open_wait=0.2)
    try:
        with t.transaction() as s:  # the target holds the file
            s.execute("CREATE TABLE items (id INTEGER)")
            s.execute("INSERT INTO items VALUES (1)")
            with reading(path) as reader:  # (the unit's table is not committed yet)
                found = reader.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'items'").fetchone()
                assert found == (0,)
            with pytest.raises(duckdb.Error, match="already attached"):
                duckdb.connect(path)
        with reading(path) as reader:  # a reader holds the file: the target opens it beside it
            with t.transaction() as s:
                s.execute("INSERT INTO items VALUES (2)")
                limit = s.query("SELECT current_setting('memory_limit')")[0][0]
            assert reader.execute("SELECT count(*) FROM items").fetchone() == (2,)
        assert limit.replace(" ", "") == f"{limits.DUCKDB_MEMORY >> 20}.0MiB", limit
        with duckdb.connect(path) as plain:  # between units the file is free; held so, it keeps the target out
            assert plain.execute("SELECT count(*) FROM items").fetchone() == (2,)
            with pytest.raises(TargetBusy, match="holds the DuckDB database"), t.transaction() as s:
                s.execute("INSERT INTO items VALUES (3)")
        with t.transaction() as s:
            s.execute("INSERT INTO items VALUES (3)")
        with duckdb.connect(path, read_only=True) as plain:
            assert plain.execute("SELECT count(*) FROM items").fetchone() == (3,)
    finally:
        t.close()
