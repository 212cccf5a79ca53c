"""The failure path on every database target: a bulk apply that fails is rolled back and re-applied serially in log
order; on_error = "stop" names the first failing change, "reject" records it in mirrorline_rejects and applies the
rest. Also, on every target kind (Delta included, whose checks run before its commit): values that do not convert,
rows missing at the target, and the types each target holds."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from apply_support import ITEMS, KINDS, MODES, SQL_KINDS, P, batch, change, fetch, net, open_target, sql

from mirrorline.apply import serial
from mirrorline.errors import ApplyError
from mirrorline.model import Column, TableSchema

pytestmark = pytest.mark.spark

SCHEMAS = {ITEMS.table: ITEMS}
COLS = ["id", "name", "qty", "note"]


def items_with_check(t: Any) -> None:
    """The target's own table, with a constraint the source does not have."""
    text = t.dialect.text_type
    sql(
        t,
        f"CREATE TABLE {t.dialect.table('public.items')} (id INTEGER PRIMARY KEY, name {text}, "
        f"qty BIGINT CHECK (qty >= 0), note {text})",
    )


def unit(spark: Any) -> tuple[Any, list[Any]]:
    """Seeded rows 10 and 11; the unit: I 1, U 10 (qty -1: breaks the target's check), I 2, D 11."""
    changes = [
        change("public.items", "I", [1], {"id": 1, "name": "a", "qty": 1, "note": None}, pos=P(0x200, 0)),
        change("public.items", "U", [10], {"id": 10, "name": "ten", "qty": -1, "note": None}, pos=P(0x200, 1)),
        change("public.items", "I", [2], {"id": 2, "name": "b", "qty": 2, "note": None}, pos=P(0x300, 0)),
        change("public.items", "D", [11], pos=P(0x300, 1)),
    ]
    rows = [net(c.table, c.op.value, c.key, dict(c.new) if c.new else None, pos=c.pos) for c in changes]
    return batch(spark, rows, P(0x100), P(0x300, 1), changes=len(changes)), changes


def seed(spark: Any, t: Any) -> None:
    rows = [net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": 1, "note": None}) for i in (10, 11)]
    t.apply(batch(spark, rows, P(0), P(0x100)), SCHEMAS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", SQL_KINDS)
def test_stop_names_the_first_failing_change(kind: str, mode: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path, mode)
    items_with_check(t)
    seed(spark, t)
    b, changes = unit(spark)
    with pytest.raises(ApplyError) as e:
        t.apply(b, SCHEMAS, lambda: iter(changes))
    ctx = e.value.context
    assert (ctx["target"], ctx["table"], ctx["key"], ctx["position"], ctx["op"]) == (
        "t1",
        "public.items",
        ["10"],
        str(P(0x200, 1)),
        "U",
    )
    assert ctx["db_message"] and "check" in ctx["db_message"].lower()
    assert "public.items" in str(e.value) and "0/200:1" in str(e.value)
    assert fetch(t, "public.items", COLS) == [(10, "n10", 1, None), (11, "n11", 1, None)]
    assert t.applied_position() == P(0x100)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", SQL_KINDS)
def test_reject_records_the_change_and_the_rest_lands(
    kind: str, mode: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    t = open_target(kind, request, tmp_path, mode, on_error="reject")
    items_with_check(t)
    seed(spark, t)
    b, changes = unit(spark)
    res = t.apply(b, SCHEMAS, changes)
    assert res.rejects == 1 and res.serial == ["public.items"]
    assert fetch(t, "public.items", COLS) == [(1, "a", 1, None), (10, "n10", 1, None), (2, "b", 2, None)]
    rejects = sql(t, 'SELECT lsn, seq, position, "table", "key", op, image, error FROM mirrorline_rejects')
    assert len(rejects) == 1
    lsn, seq, position, table, key, op, image, error = rejects[0]
    assert (lsn, seq, position, table, json.loads(key), op) == (0x200, 1, "0/200:1", "public.items", ["10"], "U")
    assert json.loads(image)["qty"] == "-1" and error
    assert t.applied_position() == P(0x300, 1)
    assert t.apply(b, SCHEMAS, changes).noop


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_reject_sets_many_failing_changes_aside_in_one_pass(
    kind: str, spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Every third insert breaks the target's check: all of them are recorded, the others land. On engines with
    savepoints each change is applied once (a reject rolls back to the savepoint taken before it); DuckDB has none,
    so there the pass restarts after each reject."""
    t = open_target(kind, request, tmp_path, "update", on_error="reject")
    items_with_check(t)
    seed(spark, t)
    changes = [
        change(
            "public.items",
            "I",
            [100 + i],
            {"id": 100 + i, "name": f"r{i}", "qty": -1 if i % 3 == 0 else i, "note": None},
            pos=P(0x200 + i, 0),
        )
        for i in range(30)
    ]
    rows = [net(c.table, c.op.value, c.key, dict(c.new) if c.new else None, pos=c.pos) for c in changes]
    b = batch(spark, rows, P(0x100), P(0x200 + 29, 0), changes=len(changes))
    calls: list[Any] = []
    apply_change = serial._apply_change

    def counted(target: Any, s: Any, ts: Any, c: Any) -> None:
        calls.append(c.pos)
        apply_change(target, s, ts, c)

    monkeypatch.setattr(serial, "_apply_change", counted)
    res = t.apply(b, SCHEMAS, changes)
    assert res.rejects == 10 and res.serial == ["public.items"]
    assert sorted(r[0] for r in fetch(t, "public.items", COLS)) == [10, 11] + [100 + i for i in range(30) if i % 3]
    rejected = sql(t, "SELECT lsn, seq FROM mirrorline_rejects ORDER BY lsn")
    assert [tuple(r) for r in rejected] == [(0x200 + i, 0) for i in range(0, 30, 3)]
    assert t.applied_position() == P(0x200 + 29, 0)
    if kind == "duckdb":
        assert len(calls) > len(changes)
    else:
        assert sorted(calls) == [c.pos for c in changes]


@pytest.mark.parametrize("kind", KINDS)
def test_a_value_that_does_not_convert_is_a_clear_error(kind: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path)
    c = change("public.items", "I", [5], {"id": 5, "name": "x", "qty": "lots", "note": None}, pos=P(0x10, 2))
    b = batch(spark, [net("public.items", "I", [5], dict(c.new or {}), pos=c.pos)], P(0), P(0x10, 2))
    with pytest.raises(ApplyError) as e:
        t.apply(b, SCHEMAS, [c])
    assert e.value.context["key"] == ["5"] and e.value.context["position"] == "0/10:2"
    assert "lots" in e.value.context["db_message"]
    assert fetch(t, "public.items", COLS) == []


@pytest.mark.parametrize("kind", KINDS)
def test_an_update_of_a_row_missing_at_the_target_is_not_skipped(
    kind: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    t = open_target(kind, request, tmp_path)
    c = change("public.items", "U", [7], {"id": 7, "name": "x", "qty": 1, "note": None}, pos=P(0x10))
    b = batch(spark, [net("public.items", "U", [7], dict(c.new or {}), pos=c.pos)], P(0), P(0x10))
    with pytest.raises(ApplyError, match="no row with this key") as e:
        t.apply(b, SCHEMAS, [c])
    assert e.value.context["position"] == "0/10:0"
    # without the changes, the bulk failure is still reported, never dropped
    with pytest.raises(ApplyError, match="changes were not given"):
        t.apply(b, SCHEMAS)
    # mirror mode applies an update as delete + insert: the row lands
    (tmp_path / "m").mkdir()
    m = open_target(kind, request, tmp_path / "m", "mirror")  # PostgreSQL: the same (still empty) database
    m.apply(b, SCHEMAS, [c])
    assert fetch(m, "public.items", COLS) == [(7, "x", 1, None)]


TYPED = TableSchema(
    "public.typed",
    (
        Column("id", "integer", nullable=False),
        Column("flag", "boolean"),
        Column("blob", "bytea"),
        Column("amount", "numeric(10,2)"),
        Column("at", "timestamp with time zone"),
        Column("day", "date"),
        Column("ratio", "double precision"),
        Column("doc", "jsonb"),
        Column("tags", "integer[]"),
        Column("uid", "uuid"),
    ),
    key=("id",),
)
VALUES = {
    "id": "1",
    "flag": "t",
    "blob": "\\x00ff41",
    "amount": "12.50",
    "at": "2024-01-02 03:04:05.5+00",
    "day": "2024-02-29",
    "ratio": "0.25",
    "doc": '{"a": 1}',
    "tags": "{1,2}",
    "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
}


@pytest.mark.parametrize("kind", KINDS)
def test_values_arrive_as_postgresql_text_and_land_typed(kind: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path)
    nulls = dict.fromkeys(VALUES, None) | {"id": "2"}
    rows = [net("public.typed", "I", ["1"], VALUES), net("public.typed", "I", ["2"], nulls)]
    t.apply(batch(spark, rows, P(0), P(1)), {"public.typed": TYPED})
    got = fetch(t, "public.typed", list(VALUES))
    assert got[1] == (2, *([None] * (len(VALUES) - 1)))
    _, flag, blob, amount, at, day, ratio, doc, tags, uid = got[0]
    assert bytes(blob) == b"\x00\xffA" and ratio == 0.25
    assert str(amount) == "12.50"
    assert str(day) == "2024-02-29" and str(uid) == VALUES["uid"]
    assert (doc if isinstance(doc, dict) else json.loads(doc)) == {"a": 1}
    if kind == "sqlite":
        assert (flag, at, tags) == (1, "2024-01-02 03:04:05.5+00", "{1,2}")
    else:
        assert flag is True and at.isoformat().startswith("2024-01-02T03:04:05.5")
        assert tags in ([1, 2], "{1,2}")
    assert base64.b16encode(bytes(blob)) == b"00FF41"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", SQL_KINDS)
def test_serial_path_key_change_keeps_the_old_rows_unsent_columns(
    kind: str, mode: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    """The failure path replays a key-changing update that did not send note: the new key keeps the old row's note."""
    t = open_target(kind, request, tmp_path, mode, on_error="reject")
    items_with_check(t)
    t.apply(
        batch(
            spark,
            [
                net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": 1, "note": f"toast{i}"})
                for i in (10, 11)
            ],
            P(0),
            P(0x100),
        ),
        SCHEMAS,
    )
    changes = [
        change(
            "public.items",
            "U",
            [12],
            {"id": 12, "name": "moved", "qty": 2},
            pos=P(0x200, 0),
            unchanged=["note"],
            old_key=[10],
        ),
        change("public.items", "U", [11], {"id": 11, "name": "bad", "qty": -1}, pos=P(0x200, 1), unchanged=["note"]),
    ]
    rows = [
        net("public.items", "D", [10], pos=P(0x200, 0)),
        net("public.items", "I", [12], {"id": 12, "name": "moved", "qty": 2}, ["note"], P(0x200, 0), moved_from=[10]),
        net("public.items", "U", [11], {"id": 11, "name": "bad", "qty": -1}, ["note"], P(0x200, 1)),
    ]
    res = t.apply(batch(spark, rows, P(0x100), P(0x200, 1), changes=2), SCHEMAS, changes)
    assert res.serial == ["public.items"] and res.rejects == 1
    assert fetch(t, "public.items", COLS) == [(11, "n11", 1, "toast11"), (12, "moved", 2, "toast10")]


DIRECT_KINDS = [pytest.param("postgresql", marks=pytest.mark.pg), "sqlite", "duckdb"]
DUPLICATE = {"postgresql": "duplicate key", "sqlite": "UNIQUE constraint failed", "duckdb": "Duplicate key"}


def counting_direct_inserts(t: Any, monkeypatch: Any) -> list[int]:
    """The rows each call of the session's direct insert (``insert_rows``) was given, as it is called."""
    copied: list[int] = []
    s = t.session()  # for its class; closed, so the target lets go of its database as after any unit
    session_class = type(s)
    s.close()
    insert_rows = session_class.insert_rows

    def counted(self: Any, ts: Any, data: Any) -> int:
        chunks = list(data)
        copied.append(sum(c.num_rows for c in chunks))
        return insert_rows(self, ts, chunks)

    monkeypatch.setattr(session_class, "insert_rows", counted)
    return copied


@pytest.mark.parametrize("on_error", ["stop", "reject"])
@pytest.mark.parametrize("kind", DIRECT_KINDS)
def test_inserts_loaded_straight_into_the_table_take_the_failure_path(
    kind: str, on_error: str, spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """PostgreSQL (by COPY), SQLite (INSERTs of many rows of parameters, converted) and DuckDB (INSERT ... SELECT
    of each chunk, registered) load net inserts straight into the table. A key already at the target (a row put there
    by hand) fails that load: the unit rolls back and the serial pass names the insert (stop) or sets it aside
    (reject) while the rest lands; the direct path was taken, and nothing was applied twice."""
    t = open_target(kind, request, tmp_path, on_error=on_error)
    seed(spark, t)
    sql(t, f"INSERT INTO {t.dialect.table('public.items')} VALUES (2, 'by hand', 9, NULL)")
    copied = counting_direct_inserts(t, monkeypatch)
    changes = [
        change("public.items", "I", [1], {"id": 1, "name": "a", "qty": 1, "note": None}, pos=P(0x200, 0)),
        change("public.items", "I", [2], {"id": 2, "name": "b", "qty": 2, "note": None}, pos=P(0x200, 1)),
        change("public.items", "D", [11], pos=P(0x300, 0)),
    ]
    rows = [net(c.table, c.op.value, c.key, dict(c.new) if c.new else None, pos=c.pos) for c in changes]
    b = batch(spark, rows, P(0x100), P(0x300, 0), changes=len(changes))
    if on_error == "stop":
        with pytest.raises(ApplyError) as e:
            t.apply(b, SCHEMAS, changes)
        ctx = e.value.context
        assert (ctx["table"], ctx["key"], ctx["position"], ctx["op"]) == ("public.items", ["2"], "0/200:1", "I")
        assert DUPLICATE[kind] in ctx["db_message"]
        assert sorted(fetch(t, "public.items", COLS)) == [
            (2, "by hand", 9, None),
            (10, "n10", 1, None),
            (11, "n11", 1, None),
        ]
        assert t.applied_position() == P(0x100)
    else:
        res = t.apply(b, SCHEMAS, changes)
        assert res.rejects == 1
        assert sorted(fetch(t, "public.items", COLS)) == [
            (1, "a", 1, None),
            (2, "by hand", 9, None),
            (10, "n10", 1, None),
        ]
        assert [tuple(r) for r in sql(t, "SELECT lsn, seq, op FROM mirrorline_rejects")] == [(0x200, 1, "I")]
        assert t.applied_position() == P(0x300, 0)
    assert copied == [2]  # the bulk path tried the two inserts at once, straight into the table


@pytest.mark.parametrize("on_error", ["stop", "reject"])
def test_a_value_sqlite_cannot_take_fails_its_direct_insert_by_name(
    on_error: str, spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """SQLite's direct insert converts and checks each value in SQL as a worktable's insert-select does: a value that
    is not of its column's type ('lots' for a bigint: a malformed log) fails the load by table, column, type and
    value; stop names the insert and writes nothing, reject sets it aside and applies the rest."""
    t = open_target("sqlite", request, tmp_path, on_error=on_error)
    seed(spark, t)
    copied = counting_direct_inserts(t, monkeypatch)
    changes = [
        change("public.items", "I", [1], {"id": 1, "name": "a", "qty": 1, "note": None}, pos=P(0x200, 0)),
        change("public.items", "I", [2], {"id": 2, "name": "b", "qty": "lots", "note": None}, pos=P(0x200, 1)),
        change("public.items", "I", [3], {"id": 3, "name": "c", "qty": "-7", "note": "x"}, pos=P(0x200, 2)),
    ]
    rows = [net(c.table, c.op.value, c.key, dict(c.new) if c.new else None, pos=c.pos) for c in changes]
    b = batch(spark, rows, P(0x100), P(0x300, 0), changes=len(changes))
    seeded = [(10, "n10", 1, None), (11, "n11", 1, None)]
    if on_error == "stop":
        with pytest.raises(ApplyError, match=r"public\.items\.qty: 'lots' is not a valid bigint value") as e:
            t.apply(b, SCHEMAS, changes)
        assert (e.value.context["key"], e.value.context["position"]) == (["2"], "0/200:1")
        assert sorted(fetch(t, "public.items", COLS)) == seeded and t.applied_position() == P(0x100)
    else:
        assert t.apply(b, SCHEMAS, changes).rejects == 1
        assert sorted(fetch(t, "public.items", COLS)) == [(1, "a", 1, None), (3, "c", -7, "x"), *seeded]
        assert [tuple(r) for r in sql(t, "SELECT lsn, seq, op FROM mirrorline_rejects")] == [(0x200, 1, "I")]
    assert copied == [3]
