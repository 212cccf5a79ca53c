"""The rule "kept by the table's actions": written once (``model.kept_kinds``), and the changes apply's
failure path re-applies one by one (``reference.kept_changes``) are those the bulk path folded. With ``actions = "IU"``
a TRUNCATE is not applied, and a key change is only the insert of its new key: a unit that fails in bulk and is
re-applied serially must leave the target as the bulk path would have."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mirrorline.compile.reference import kept_changes
from mirrorline.config import parse
from mirrorline.log import LogWriter
from mirrorline.log.rows import changes_to_table
from mirrorline.log.stats import table_stats
from mirrorline.model import Change, Column, Op, TableSchema, kept_kinds
from mirrorline.pipeline import Applier
from mirrorline.position import ZERO, Position

T = "public.t"
P = Position(1, 0)


def test_kept_kinds() -> None:
    assert kept_kinds("IUD") == frozenset("IUDT")
    assert kept_kinds("iu") == frozenset("IU")
    assert kept_kinds(["D"]) == frozenset("DT")


def test_kept_changes_follow_the_fold() -> None:
    trunc = Change(P, 0, 1, T, Op.TRUNCATE)
    ins = Change(P, 0, 1, T, Op.INSERT, ("1",), {"id": "1", "v": "a"})
    upd = Change(P, 0, 1, T, Op.UPDATE, ("1",), {"id": "1", "v": "b"})
    dele = Change(P, 0, 1, T, Op.DELETE, ("1",))
    moved = Change(P, 0, 1, T, Op.UPDATE, ("2",), {"id": "2"}, frozenset({"v"}), old_key=("1",))
    every = [trunc, ins, upd, dele, moved]
    assert list(kept_changes(every, None)) == every
    assert list(kept_changes(every, {"public.other": "I"})) == every
    assert list(kept_changes(every, {T: "IUD"})) == every
    iu = list(kept_changes(every, {T: "IU"}))
    assert iu[:2] == [ins, upd]
    assert (iu[2].op, iu[2].key, iu[2].old_key, iu[2].unchanged, iu[2].new) == (
        Op.INSERT,
        ("2",),
        ("1",),
        frozenset({"v"}),
        {"id": "2"},
    )
    assert len(iu) == 3
    ud = list(kept_changes(every, {T: "UD"}))
    assert ud[:3] == [trunc, upd, dele]
    assert (ud[3].op, ud[3].key, ud[3].new, ud[3].old_key) == (Op.DELETE, ("1",), None, None)
    assert list(kept_changes(every, {T: "ID"})) == [trunc, ins, dele, moved]  # a key change is a D and an I
    assert list(kept_changes(every, {T: "U"})) == [upd]


def test_the_statistics_keep_what_the_fold_keeps() -> None:
    rows = changes_to_table(
        [
            Change(Position(5, 0), 0, 1, T, Op.TRUNCATE),
            Change(Position(6, 0), 0, 1, T, Op.UPDATE, ("2",), {"id": "2"}, old_key=("1",)),
            Change(Position(7, 0), 0, 1, T, Op.INSERT, ("3",), {"id": "3"}),
        ]
    )
    st = table_stats(rows)[T]
    assert st.first_kept(frozenset("IU")) == Position(6, 0)  # no TRUNCATE without D; the key change's I
    assert st.first_kept(frozenset("D")) == Position(5, 0)
    assert st.first_kept(frozenset("U")) is None


SCHEMA = TableSchema(T, (Column("id", "bigint", nullable=False), Column("v", "text"), Column("big", "text")), ("id",))


def _log(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "log") as w:
        w.record_schema(SCHEMA)
        w.add_transaction(100, 1, [Change(ZERO, 0, 1, T, Op.TRUNCATE)])
        w.add_transaction(
            200,
            1,
            [
                Change(ZERO, 0, 1, T, Op.INSERT, ("3",), {"id": "3", "v": "c", "big": "B3"}),
                Change(ZERO, 0, 1, T, Op.INSERT, ("4",), {"id": "4", "v": "bad", "big": "B4"}),
                # the key changes, the TOASTed column not sent: with "IU" only the new key is inserted, big from row 1
                Change(ZERO, 0, 1, T, Op.UPDATE, ("10",), {"id": "10", "v": "a2"}, frozenset({"big"}), old_key=("1",)),
            ],
        )


def _target(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Callable[[str], list[Any]]]:
    """Target ``x``'s URL, its table ``t`` holding rows 1 and 2 and refusing ``v = 'bad'``, and a reader of its
    rows (the test's own connection)."""
    rows = [(1, "a", "B1"), (2, "b", "B2")]
    if kind == "sqlite":
        db = sqlite3.connect(tmp_path / "t.db")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, big TEXT)")
        db.execute(
            "CREATE TRIGGER no_bad BEFORE INSERT ON t WHEN NEW.v = 'bad' BEGIN SELECT RAISE(ABORT, 'bad value'); END"
        )
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        db.commit()
        db.close()

        def read_sqlite(query: str) -> list[Any]:
            db = sqlite3.connect(tmp_path / "t.db")
            try:
                return db.execute(query).fetchall()
            finally:
                db.close()

        return f"sqlite:///{tmp_path / 't.db'}", read_sqlite
    if kind == "duckdb":
        import duckdb

        dd = duckdb.connect(str(tmp_path / "t.duckdb"))
        dd.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR CHECK (v <> 'bad'), big VARCHAR)")
        dd.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        dd.close()

        def read_duckdb(query: str) -> list[Any]:
            with duckdb.connect(str(tmp_path / "t.duckdb")) as dd:
                return dd.execute(query).fetchall()

        return f"duckdb:///{tmp_path / 't.duckdb'}", read_duckdb
    pg = request.getfixturevalue("pg")
    pg.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text CHECK (v <> 'bad'), big text)")
    pg.execute("INSERT INTO t VALUES (1, 'a', 'B1'), (2, 'b', 'B2')")
    return pg.url, lambda query: [tuple(r) for r in pg.execute(query)]


def _conf(tmp_path: Path, url: str) -> Any:
    """Table T with ``actions = "IU"``, replicated to target ``x`` at ``url`` (changes that fail set aside)."""
    return parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "tables": {T: {"actions": "IU"}},
            "targets": {"x": {"url": url, "on_error": "reject"}},
        },
        tmp_path / "m.toml",
    )


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "postgresql"])
def test_a_unit_failing_in_bulk_is_re_applied_with_the_same_actions(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    _log(tmp_path)
    url, read = _target(kind, tmp_path, request)
    conf = _conf(tmp_path, url)
    a = Applier(conf, spark=spark)
    reports = a.catch_up()
    a.close()
    assert reports and reports[-1].results["x"].serial == [T] and reports[-1].results["x"].rejects == 1
    want = [(1, "a", "B1"), (2, "b", "B2"), (3, "c", "B3"), (10, "a2", "B1")]
    got = read("SELECT id, v, big FROM t ORDER BY id")
    rejected = read("SELECT key FROM mirrorline_rejects")
    assert got == want
    assert [r[0] for r in rejected] == ['["4"]']


@pytest.mark.spark
def test_a_table_stopped_by_an_error_is_reported_by_status_until_it_applies_again(tmp_path: Path, spark: Any) -> None:
    from mirrorline.errors import ApplyError
    from mirrorline.status import status

    _log(tmp_path)
    db = sqlite3.connect(tmp_path / "t.db")
    db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, big TEXT)")
    db.execute(
        "CREATE TRIGGER no_bad BEFORE INSERT ON t WHEN NEW.v = 'bad' BEGIN SELECT RAISE(ABORT, 'bad value'); END"
    )
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", [(1, "a", "B1"), (2, "b", "B2")])
    db.commit()
    conf = parse(
        {
            "log": {"path": str(tmp_path / "log")},
            "tables": {T: {"actions": "IU"}},
            "targets": {"x": {"url": f"sqlite:///{tmp_path / 't.db'}"}},
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, spark=spark)
    with pytest.raises(ApplyError, match="bad value"):
        a.catch_up()
    a.close()
    (x,) = status(conf).targets  # the table stopped alone (the target's other tables would go on)
    assert "bad value" in x.stopped_tables[T]["error"] and x.tables[T] == "stopped" and not x.error
    assert any(p.startswith(f"target x: table {T} stopped since") for p in status(conf).problems())
    db.execute("DROP TRIGGER no_bad")
    db.commit()
    db.close()
    a = Applier(conf, spark=spark)
    assert a.catch_up()
    a.close()
    (x,) = status(conf).targets
    assert x.error == "" and not x.stopped_tables and not any(p.startswith("target x") for p in status(conf).problems())


@pytest.mark.spark
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "postgresql"])
def test_without_deletes_an_insert_replaces_a_kept_row_in_bulk(
    tmp_path: Path, spark: Any, kind: str, request: pytest.FixtureRequest
) -> None:
    """With ``actions = "IU"`` the fold sends every first insert of a key as a replace (the row may be kept at the
    target from before a delete the table does not replicate): a new key and a key kept at the target both apply in
    bulk, the kept row replaced, and the serial path does the same with a unit it re-applies."""
    with LogWriter(tmp_path / "log") as w:
        w.record_schema(SCHEMA)
        w.add_transaction(
            200,
            1,
            [
                Change(ZERO, 0, 1, T, Op.INSERT, ("1",), {"id": "1", "v": "again", "big": "N1"}),  # kept: replaced
                Change(ZERO, 0, 1, T, Op.INSERT, ("5",), {"id": "5", "v": "new", "big": "N5"}),  # a new key
            ],
        )
        w.add_transaction(
            300,
            1,
            [
                Change(ZERO, 0, 1, T, Op.INSERT, ("2",), {"id": "2", "v": "again", "big": "N2"}),
                Change(ZERO, 0, 1, T, Op.INSERT, ("6",), {"id": "6", "v": "bad", "big": "N6"}),  # rejected: serial
            ],
        )
    url, read_rows = _target(kind, tmp_path, request)
    conf = _conf(tmp_path, url)

    def read() -> list[Any]:
        return read_rows("SELECT id, v, big FROM t ORDER BY id")

    a = Applier(conf, spark=spark)
    first = a.catch_up(Position(200, 1))
    assert [r.results["x"].serial for r in first] == [[]]  # in bulk
    assert read() == [(1, "again", "N1"), (2, "b", "B2"), (5, "new", "N5")]
    second = a.catch_up()
    a.close()
    assert second[-1].results["x"].serial == [T] and second[-1].results["x"].rejects == 1
    assert read() == [(1, "again", "N1"), (2, "again", "N2"), (5, "new", "N5")]
