"""One behaviour, many targets: every test runs against PostgreSQL, SQLite and DuckDB, in update and mirror mode,
with net batches built on Spark."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from apply_support import ITEMS, KINDS, MODES, ORDERS, SQL_KINDS, P, batch, fetch, net, open_target, sql

from mirrorline.apply.stage import Stager
from mirrorline.errors import TargetError
from mirrorline.model import Column, TableSchema

pytestmark = pytest.mark.spark

SCHEMAS = {ITEMS.table: ITEMS, ORDERS.table: ORDERS}
COLS = ["id", "name", "qty", "note"]


def seed(spark: Any, target: Any) -> None:
    rows = [
        net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": i * 10, "note": f"note{i}"})
        for i in range(1, 6)
    ]
    target.apply(batch(spark, rows, P(0), P(0x100)), SCHEMAS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_net_deletes_updates_inserts_and_exactly_once(
    kind: str, mode: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    t = open_target(kind, request, tmp_path, mode)
    seed(spark, t)
    assert fetch(t, "public.items", COLS)[0] == (1, "n1", 10, "note1")
    rows = [
        net("public.items", "D", [1]),
        net("public.items", "U", [2], {"id": 2, "qty": 99}, unchanged=["name", "note"]),  # unchanged columns kept
        net("public.items", "U", [3], {"id": 3, "name": "N3", "qty": 33, "note": None}),
        net("public.items", "D", [4]),  # replace: delete then insert of one key
        net("public.items", "I", [4], {"id": 4, "name": "new4", "qty": 4, "note": "r"}),
        net("public.items", "I", [9], {"id": 9, "name": "n9", "qty": 9, "note": "y"}),
    ]
    b2 = batch(spark, rows, P(0x100), P(0x200, 3))
    res = t.apply(b2, SCHEMAS)
    assert res.rows["public.items"] == {"D": 2, "U": 2, "I": 2}
    expected = [
        (2, "n2", 99, "note2"),
        (3, "N3", 33, None),
        (4, "new4", 4, "r"),
        (5, "n5", 50, "note5"),
        (9, "n9", 9, "y"),
    ]
    assert fetch(t, "public.items", COLS) == expected
    assert t.applied_position() == P(0x200, 3)
    # exactly once: the same unit again (or an older one) changes nothing
    assert t.apply(b2, SCHEMAS).noop
    assert t.apply(batch(spark, [net("public.items", "D", [2])], P(0x80), P(0x100)), SCHEMAS).noop
    assert fetch(t, "public.items", COLS) == expected
    assert t.applied_position() == P(0x200, 3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_truncate_first_then_inserts(kind: str, mode: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path, mode)
    seed(spark, t)
    rows = [net("public.items", "I", [3], {"id": 3, "name": "again", "qty": 1, "note": None})]
    t.apply(batch(spark, rows, P(0x100), P(0x200), truncated={"public.items": P(0x180)}), SCHEMAS)
    assert fetch(t, "public.items", COLS) == [(3, "again", 1, None)]


@pytest.mark.parametrize("kind", KINDS)
def test_seed000_example2_update_through_a_worktable(kind: str, spark: Any, request: Any, tmp_path: Path) -> None:
    # 000 example 2: three updates of k = 1 compile to "update T set c = 16 where k = 1"
    schema = TableSchema("public.T", (Column("k", "integer", nullable=False), Column("c", "integer")), key=("k",))
    t = open_target(kind, request, tmp_path)
    t.apply(batch(spark, [net("public.T", "I", [1], {"k": 1, "c": 10})], P(0), P(1)), {"public.T": schema})
    t.apply(batch(spark, [net("public.T", "U", [1], {"k": 1, "c": 16})], P(1), P(4)), {"public.T": schema})
    assert fetch(t, "public.T", ["k", "c"]) == [(1, 16)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_unchanged_column_sets_differ_per_row(kind: str, mode: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path, mode)
    seed(spark, t)
    rows = [
        net("public.items", "U", [1], {"id": 1, "qty": 1}, unchanged=["name", "note"]),
        net("public.items", "U", [2], {"id": 2, "name": "x", "qty": 2}, unchanged=["note"]),
        net("public.items", "U", [3], {"id": 3, "name": "y", "qty": 3, "note": "z"}),
        net("public.items", "U", [4], {"id": 4}, unchanged=["name", "qty", "note"]),
    ]
    t.apply(batch(spark, rows, P(0x100), P(0x200)), SCHEMAS)
    assert fetch(t, "public.items", COLS)[:4] == [
        (1, "n1", 1, "note1"),
        (2, "x", 2, "note2"),
        (3, "y", 3, "z"),
        (4, "n4", 40, "note4"),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_tables_and_columns_created_from_the_logged_schema(kind: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path)
    schema = TableSchema(
        "sales.orders", (Column("id", "bigint", nullable=False), Column("total", "numeric(10,2)")), key=("id",)
    )
    t.apply(
        batch(spark, [net("sales.orders", "I", [1], {"id": 1, "total": "12.50"})], P(0), P(1)), {"sales.orders": schema}
    )
    wider = TableSchema("sales.orders", (*schema.columns, Column("paid", "boolean")), key=("id",), version=2)
    t.apply(
        batch(spark, [net("sales.orders", "I", [2], {"id": 2, "total": "3.00", "paid": "t"})], P(1), P(2)),
        {"sales.orders": wider},
    )
    got = [(int(a), str(b), c) for a, b, c in fetch(t, "sales.orders", ["id", "total", "paid"])]
    assert got == [(1, "12.50", None), (2, "3.00", True if kind != "sqlite" else 1)]


def test_a_type_the_postgresql_target_lacks_is_refused_before_any_data(
    spark: Any, request: Any, tmp_path: Path
) -> None:
    """A user type (enum, domain, composite) must exist in a PostgreSQL target, as for PostgreSQL's own subscriber;
    the other kinds hold any type they have no counterpart of as its text (test_type_matrix)."""
    kind = "postgresql"
    t = open_target(kind, request, tmp_path)
    seed(spark, t)
    bad_type = "no_such_type"
    schema = TableSchema(
        "public.docs", (Column("id", "integer", nullable=False), Column("body", bad_type)), key=("id",)
    )
    rows = [net("public.items", "D", [1]), net("public.docs", "I", [1], {"id": 1, "body": "x"})]
    with pytest.raises(TargetError) as e:
        t.apply(batch(spark, rows, P(0x100), P(0x200)), {**SCHEMAS, "public.docs": schema})
    assert e.value.context == {"table": "public.docs", "column": "body", "type": bad_type}
    assert len(fetch(t, "public.items", COLS)) == 5
    assert t.applied_position() == P(0x100)


class _Boom(Stager):
    """Fault injection: a real stager that raises when the unit reaches a given table."""

    def __init__(self, inner: Stager, table: str) -> None:
        self.inner, self.table = inner, table

    def stage(self, s: Any, ts: Any, kind: str) -> Any:
        if ts.table == self.table:
            raise RuntimeError("injected failure mid-apply")
        return self.inner.stage(s, ts, kind)

    def rows(self, ts: Any, kind: str) -> Any:
        if ts.table == self.table:
            raise RuntimeError("injected failure mid-apply")
        return self.inner.rows(ts, kind)

    def finish(self, s: Any, table: str) -> None:
        self.inner.finish(s, table)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_mid_apply_leaves_data_and_position_untouched(
    kind: str, spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    t = open_target(kind, request, tmp_path)
    seed(spark, t)
    rows = [
        net("public.items", "D", [1]),
        net("public.items", "D", [2]),
        net("public.orders", "I", [7], {"id": 7, "item": 3, "status": "new"}),
    ]
    b = batch(spark, rows, P(0x100), P(0x200))
    real = type(t).stager
    monkeypatch.setattr(type(t), "stager", lambda self, *a: _Boom(real(self, *a), "public.orders"))
    with pytest.raises(RuntimeError, match="injected"):
        t.apply(b, SCHEMAS)
    if kind in ("delta", "iceberg"):  # a commit per table: items went in with its own position, the target's stays
        assert len(fetch(t, "public.items", COLS)) == 3
        assert t.applied_positions().table("public.items") == P(0x200)
    else:
        assert len(fetch(t, "public.items", COLS)) == 5
    assert t.applied_position() == P(0x100)
    monkeypatch.setattr(type(t), "stager", real)
    t.apply(b, SCHEMAS)
    assert [r[0] for r in fetch(t, "public.items", COLS)] == [3, 4, 5]
    assert fetch(t, "public.orders", ["id", "item", "status"]) == [(7, 3, "new")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_seed003_example_with_two_apply_threads(kind: str, mode: str, spark: Any, request: Any, tmp_path: Path) -> None:
    """003's example (TABLE1..3, keycol/othercol) with two apply threads: per-table positions, same result."""
    schemas = {
        f"public.table{i}": TableSchema(
            f"public.table{i}", (Column("keycol", "text", nullable=False), Column("othercol", "text")), key=("keycol",)
        )
        for i in (1, 2, 3)
    }
    t = open_target(kind, request, tmp_path, mode, threads=2)
    before = [net("public.table1", "I", [v], {"keycol": v, "othercol": "old"}) for v in ("kv2", "kv3")]
    before.append(net("public.table2", "I", ["kv1"], {"keycol": "kv1", "othercol": "old"}))
    t.apply(batch(spark, before, P(0), P(0x10), tables=["public.table1", "public.table2"]), schemas)
    # the unit: I t1 kv1, D t1 kv2, D t2 kv1, I t2 kv1, U t1 kv3, I t3 kv1, I t2 kv2, I t3 kv2, (I+D t2 kv3), I t1 kv4
    unit = [
        net("public.table1", "I", ["kv1"], {"keycol": "kv1", "othercol": "ov1"}),
        net("public.table1", "D", ["kv2"]),
        net("public.table2", "D", ["kv1"]),
        net("public.table2", "I", ["kv1"], {"keycol": "kv1", "othercol": "ov1"}),
        net("public.table1", "U", ["kv3"], {"keycol": "kv3", "othercol": "ov3"}),
        net("public.table3", "I", ["kv1"], {"keycol": "kv1", "othercol": "ov1"}),
        net("public.table2", "I", ["kv2"], {"keycol": "kv2", "othercol": "ov2"}),
        net("public.table3", "I", ["kv2"], {"keycol": "kv2", "othercol": "ov2"}),
        net("public.table1", "I", ["kv4"], {"keycol": "kv4", "othercol": "ov4"}),
    ]
    res = t.apply(batch(spark, unit, P(0x10), P(0x20)), schemas)
    assert sorted(res.applied) == sorted(schemas)
    assert fetch(t, "public.table1", ["keycol", "othercol"]) == [("kv1", "ov1"), ("kv3", "ov3"), ("kv4", "ov4")]
    assert fetch(t, "public.table2", ["keycol", "othercol"]) == [("kv1", "ov1"), ("kv2", "ov2")]
    assert fetch(t, "public.table3", ["keycol", "othercol"]) == [("kv1", "ov1"), ("kv2", "ov2")]
    state = t.applied_positions()
    assert state.tables == {name: P(0x20) for name in schemas}
    assert state.unit_end == P(0x20) and state.position == P(0x20)


@pytest.mark.parametrize("kind", KINDS)
def test_per_table_positions_let_a_restart_apply_only_what_is_missing(
    kind: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    t = open_target(kind, request, tmp_path, threads=2)
    seed(spark, t)
    # a target-only constraint makes the orders lane fail; the items lane commits with its own position
    if kind == "duckdb":  # DuckDB cannot add a CHECK constraint afterwards: create the table with it
        sql(t, 'CREATE TABLE "main"."orders" (id BIGINT PRIMARY KEY, item INTEGER CHECK (item < 100), status VARCHAR)')
    t.ensure_schema([ORDERS])
    if kind == "sqlite":
        sql(
            t,
            'CREATE TRIGGER no_big_orders BEFORE INSERT ON "orders" WHEN NEW.item > 100 '
            "BEGIN SELECT RAISE(ABORT, 'item too big'); END",
        )
    elif kind == "postgresql":
        sql(t, 'ALTER TABLE "public"."orders" ADD CONSTRAINT small_items CHECK (item < 100)')
    elif kind == "delta":
        t.delta_table("public.orders").alter.add_constraint({"small_items": "item < 100"})
    elif kind == "iceberg":  # no constraints: a file where the table's data files go makes its write fail
        blocker = Path(t.location) / "warehouse" / "public" / "orders" / "data"
        blocker.write_text("not a folder")
    rows = [
        net("public.items", "I", [20], {"id": 20, "name": "n20", "qty": 1, "note": None}),
        net("public.orders", "I", [1], {"id": 1, "item": 500, "status": "new"}),
    ]
    b = batch(spark, rows, P(0x100), P(0x200))
    with pytest.raises(TargetError):
        t.apply(b, SCHEMAS)
    state = t.applied_positions()
    assert state.table("public.items") == P(0x200) and state.table("public.orders") == P(0x100)
    assert state.position == P(0x100)
    # fix the target and apply the same unit again: items is not applied twice (a second insert of 20 would fail)
    if kind == "sqlite":
        sql(t, "DROP TRIGGER no_big_orders")
    elif kind == "postgresql":
        sql(t, 'ALTER TABLE "public"."orders" DROP CONSTRAINT small_items')
    elif kind == "delta":
        t.delta_table("public.orders").alter.drop_constraint("small_items")
    elif kind == "iceberg":
        blocker.unlink()
    else:
        sql(t, 'DROP TABLE "main"."orders"')
    res = t.apply(b, SCHEMAS)
    assert res.applied == ["public.orders"] and res.skipped == ["public.items"]
    assert fetch(t, "public.orders", ["id", "item"]) == [(1, 500)]
    assert t.applied_position() == P(0x200)


def test_a_unit_that_would_skip_or_repeat_changes_is_refused(spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target("sqlite", request, tmp_path, threads=2)
    seed(spark, t)  # applied up to 0/100
    gap = batch(spark, [net("public.items", "D", [1])], P(0x150), P(0x200))
    with pytest.raises(TargetError, match="skip the changes in between"):
        t.apply(gap, SCHEMAS)
    t.apply(
        batch(spark, [net("public.orders", "I", [1], {"id": 1, "item": 1, "status": "a"})], P(0x100), P(0x180)), SCHEMAS
    )
    # the target is at 0/180 now: a unit 0/100..0/200 would apply 0/100..0/180 a second time
    both = batch(spark, [net("public.items", "D", [1]), net("public.orders", "D", [1])], P(0x100), P(0x200))
    with pytest.raises(TargetError, match="twice"):
        t.apply(both, SCHEMAS)
    assert len(fetch(t, "public.items", COLS)) == 5


# driver Arrow staging of the whole unit, or table by table flattened by Spark (driver_rows=1)
PATHS = [pytest.param({}, id="whole"), pytest.param({"driver_rows": 1}, id="by-table")]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_key_change_keeps_columns_not_sent(
    kind: str, mode: str, path: dict[str, Any], spark: Any, request: Any, tmp_path: Path
) -> None:
    """Inserts marking columns unchanged (a key-changing update of TOASTed values) take them from the target's rows
    at moved_from, read before the deletes: moved keys, two column sets, a swap of two keys, an update too."""
    t = open_target(kind, request, tmp_path, mode, **path)
    seed(spark, t)
    rows = [
        net("public.items", "D", [1], pos=P(0x110)),
        net("public.items", "I", [11], {"id": 11, "name": "m11", "qty": 110}, ["note"], P(0x110), moved_from=[1]),
        net("public.items", "D", [2], pos=P(0x120)),
        net("public.items", "I", [12], {"id": 12, "qty": 120}, ["name", "note"], P(0x120), moved_from=[2]),
        net("public.items", "D", [3], pos=P(0x130)),  # 3 and 4 swap keys: each takes the other's note
        net("public.items", "D", [4], pos=P(0x140)),
        net("public.items", "I", [3], {"id": 3, "name": "s3", "qty": 3}, ["note"], P(0x150), moved_from=[4]),
        net("public.items", "I", [4], {"id": 4, "name": "s4", "qty": 4}, ["note"], P(0x150, 1), moved_from=[3]),
        net("public.items", "U", [5], {"id": 5, "qty": 55}, ["name", "note"], P(0x160)),
        net("public.items", "I", [13], {"id": 13, "name": "n13", "qty": 13, "note": "plain"}, pos=P(0x170)),
    ]
    res = t.apply(batch(spark, rows, P(0x100), P(0x200)), SCHEMAS)
    assert res.rows["public.items"] == {"D": 4, "U": 1, "I": 5}
    assert fetch(t, "public.items", COLS) == [
        (11, "m11", 110, "note1"),
        (12, "n2", 120, "note2"),
        (13, "n13", 13, "plain"),
        (3, "s3", 3, "note4"),
        (4, "s4", 4, "note3"),
        (5, "n5", 55, "note5"),
    ]
    assert t.applied_position() == P(0x200)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_key_change_from_a_missing_row_is_an_error(
    kind: str, mode: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    from mirrorline.errors import ApplyError

    t = open_target(kind, request, tmp_path, mode)
    seed(spark, t)
    rows = [
        net("public.items", "D", [1], pos=P(0x110)),
        net("public.items", "I", [11], {"id": 11, "name": "m", "qty": 1}, ["note"], P(0x110), moved_from=[1]),
        net("public.items", "I", [20], {"id": 20, "name": "m", "qty": 1}, ["note"], P(0x120, 2), moved_from=[99]),
    ]
    with pytest.raises(ApplyError) as e:
        t.apply(batch(spark, rows, P(0x100), P(0x200)), SCHEMAS)
    ctx = e.value.context
    assert (ctx["table"], ctx["key"], ctx["moved_from"], ctx["position"]) == (
        "public.items",
        ["20"],
        ["99"],
        str(P(0x120, 2)),
    )
    assert "note" in str(e.value) and "99" in str(e.value)
    assert len(fetch(t, "public.items", COLS)) == 5 and t.applied_position() == P(0x100)
    # no moved_from at all (a unit stored before moved_from existed): an error too, never a NULL
    rows = [net("public.items", "I", [21], {"id": 21, "name": "m", "qty": 1}, ["note"], P(0x130))]
    with pytest.raises(ApplyError, match="names no row"):
        t.apply(batch(spark, rows, P(0x100), P(0x200)), SCHEMAS)
    assert len(fetch(t, "public.items", COLS)) == 5


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_target_keeps_its_connection_between_units_and_closes_it_at_the_end(
    kind: str, spark: Any, request: Any, tmp_path: Path
) -> None:
    t = open_target(kind, request, tmp_path)
    t.apply(
        batch(spark, [net("public.items", "I", [1], {"id": 1, "name": "a", "qty": 1, "note": None})], P(0), P(0x10)),
        {ITEMS.table: ITEMS},
    )
    kept = list(t._idle)
    t.apply(
        batch(spark, [net("public.items", "I", [2], {"id": 2, "name": "b", "qty": 2, "note": None})], P(0x10), P(0x20)),
        {ITEMS.table: ITEMS},
    )
    assert len(kept) == 1 and t._idle == kept  # the same connection served the second unit, and is idle again
    t.close()
    assert t._idle == []
    assert fetch(t, "public.items", ["id"]) == [(1,), (2,)]  # a new connection after close
    t.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_snapshot_chunk_loads_by_the_kinds_bulk_path_and_the_session_is_reset_after(
    kind: str, request: Any, tmp_path: Path
) -> None:
    t = open_target(kind, request, tmp_path)
    t.ensure_schema([ITEMS])
    chunk = tmp_path / "chunk.csv"
    chunk.write_text('id,name,qty,note\n1,"a, ""b""",3,\n2,"",4,"x\ny"\n')
    s = t.session()
    s.bulk_begin()
    s.begin()
    assert s.load_chunk(ITEMS, chunk) == 2
    s.commit()
    s.close()
    assert fetch(t, "public.items", COLS) == [(1, 'a, "b"', 3, None), (2, "", 4, "x\ny")]
    if kind == "sqlite":  # the load turned durability down for its one transaction; the next user has it back
        s = t.session()
        assert s.query("PRAGMA synchronous") == [(1,)]  # NORMAL
        s.close()
    t.close()


@pytest.mark.parametrize("kind", SQL_KINDS)
@pytest.mark.parametrize("bound", ["rows", "bytes"])
def test_a_worktable_is_loaded_a_slice_at_a_time_whole(
    kind: str, bound: str, request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's rows go into a worktable a slice at a time, of at most ``LOAD_ROWS`` rows and about
    ``SLICE_BYTES`` bytes (bounded memory, however large the unit and wide its rows): every row arrives once, values
    that need quoting or are NULL as they were, across slice boundaries."""
    import pyarrow as pa

    from mirrorline import limits

    monkeypatch.setattr(limits, "LOAD_ROWS" if bound == "rows" else "SLICE_BYTES", 10 if bound == "rows" else 200)
    values = [None if i % 7 == 3 else f'v{i}, "q"\n{i}' for i in range(25)]
    data = pa.table({"k": [str(i) for i in range(25)], "v": values})
    t = open_target(kind, request, tmp_path)
    s = t.session()
    s.begin()
    s.load("mirrorline_w_slices", ["k", "v"], data)
    got = s.query('SELECT "k", "v" FROM mirrorline_w_slices')
    s.rollback()
    s.close()
    t.close()
    assert sorted(got, key=lambda r: int(r[0])) == [(str(i), v) for i, v in enumerate(values)]


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_inserts_loaded_chunk_by_chunk_are_not_held_until_the_commit(kind: str, request: Any, tmp_path: Path) -> None:
    """An inserts-only unit's rows go in chunk by chunk as the driver reads them; once a chunk is in, the process
    no longer holds it, though the transaction is still open (DuckDB held every registered table's Arrow buffers
    until the commit: a unit of 500 MB of inserts held 500 MB). 40 chunks of 1 MB: what Arrow holds stays within a
    few chunks' worth."""
    import pyarrow as pa

    t = open_target(kind, request, tmp_path)
    t.ensure_schema([ITEMS])
    note = "n" * 1_000
    held: list[int] = []

    def chunks() -> Any:
        for k in range(40):
            ids = range(k * 1_000, (k + 1) * 1_000)
            yield pa.table(
                {
                    "id": [str(i) for i in ids],
                    "name": ["x"] * 1_000,
                    "qty": ["1"] * 1_000,
                    "note": [note + str(i) for i in ids],
                }
            )
            held.append(pa.total_allocated_bytes())

    s = t.session()
    s.begin()
    base = pa.total_allocated_bytes()
    assert s.insert_rows(ITEMS, chunks()) == 40_000
    s.commit()
    s.close()
    t.close()
    assert max(held) - base < 8 * 1_000 * 1_010, f"Arrow held {(max(held) - base) >> 20} MB while the chunks went in"


def test_duckdb_lets_go_of_a_big_append_without_writing_it_again(request: Any, tmp_path: Path) -> None:
    """DuckDB: rows appended after a table's partial last row group are whole row groups written as they fill; as
    the target lets go of the file after an append of at least a row group's rows, the checkpoint does not vacuum
    (merging the partial row group with them would write every appended row again): they stay as written, and the
    next close after a small append vacuums as DuckDB does."""
    import duckdb
    import pyarrow as pa

    t = open_target("duckdb", request, tmp_path)
    t.ensure_schema([ITEMS])

    def append(first: int, n: int) -> None:
        ids = range(first, first + n)
        rows = pa.table({"id": [str(i) for i in ids], "name": ["x"] * n, "qty": ["1"] * n, "note": ["n"] * n})
        s = t.session()
        s.begin()
        assert s.insert_rows(ITEMS, [rows]) == n
        s.commit()
        s.close()  # (the last session out: the target lets go of the file, DuckDB checkpoints)

    def row_groups() -> list[int]:
        schema, table = t.dialect.names(ITEMS.table)
        c = duckdb.connect(t.location, read_only=True)
        try:
            return [
                int(n)
                for _, n in c.execute(
                    "SELECT row_group_id, sum(count) FROM pragma_storage_info(?) WHERE column_id = 0"
                    " AND segment_type <> 'VALIDITY' GROUP BY 1 ORDER BY 1",
                    [f'"{schema}"."{table}"'],
                ).fetchall()
            ]
        finally:
            c.close()

    append(0, 20_000)
    assert row_groups() == [20_000]
    append(20_000, 2 * 122_880 + 4_240)
    assert row_groups() == [20_000, 122_880, 122_880, 4_240]  # as written: not merged into the first
    append(300_000, 10)
    assert sum(row_groups()) == 270_010 and len(row_groups()) <= 4  # a small append's close vacuums again
    assert len(fetch(t, ITEMS.table, ["id"])) == 270_010


def test_duckdb_knows_the_state_a_unit_committed_without_opening_the_file_again(
    spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """DuckDB: the target lets go of the file after each unit, having read the state the unit committed: the look
    at its position after the unit opens nothing, and once anyone else changed the file it is read from the file."""
    import duckdb

    from mirrorline.apply import state as applied
    from mirrorline.apply.duckdb.dialect import CATALOG
    from mirrorline.apply.duckdb.home import Home
    from mirrorline.apply.duckdb.session import DuckdbSession
    from mirrorline.apply.sql import lit

    t = open_target("duckdb", request, tmp_path)
    real, opened = Home.enter, []

    def counting(home: Home) -> Any:
        if home.path == os.path.realpath(t.location) and home._users == 0:  # the file attached
            opened.append(home.path)
        return real(home)

    monkeypatch.setattr(Home, "enter", counting)
    seed(spark, t)
    assert len(opened) == 1 and t.applied_position() == P(0x100) and len(opened) == 1
    rows = [net("public.items", "I", [9], {"id": 9, "name": "n9", "qty": 9, "note": "y"})]
    t.apply(batch(spark, rows, P(0x100), P(0x200, 1)), SCHEMAS)
    assert t.applied_position() == P(0x200, 1) and len(opened) == 2
    other = duckdb.connect(t.location)  # another writer while the target has let go of the file
    other.execute("CREATE TABLE main.elsewhere (x int)")
    other.close()
    assert t.applied_position() == P(0x200, 1) and len(opened) == 3  # read from the file again
    assert fetch(t, "public.items", ["id"])[-1] == (9,)

    # the next unit's look at the positions before it writes: from memory too, while the file is as it was left
    reads: list[str] = []
    real_query = DuckdbSession.query

    def query(self: DuckdbSession, sql: str, params: Any = ()) -> Any:
        if "mirrorline_applied" in sql:
            reads.append(sql)
        return real_query(self, sql, params)

    monkeypatch.setattr(DuckdbSession, "query", query)
    rows = [net("public.items", "I", [10], {"id": 10, "name": "n10", "qty": 1, "note": "y"})]
    t.apply(batch(spark, rows, P(0x200, 1), P(0x300)), SCHEMAS)
    assert len(reads) == 1  # (the state the unit committed, read as it lets go of the file)
    # another applier moves the target on while this one has let go of the file: the next unit sees it and skips
    with duckdb.connect(":memory:") as c:
        c.execute(f"ATTACH {lit(t.location)} AS {CATALOG}")
        s = DuckdbSession(c, CATALOG)
        s.begin()
        applied.write(s, [], P(0x500), unit=True)
        s.commit()
        s.disconnect()
        c.execute(f"DETACH {CATALOG}")
    rows = [net("public.items", "I", [11], {"id": 11, "name": "n11", "qty": 1, "note": "y"})]
    result = t.apply(batch(spark, rows, P(0x300), P(0x400)), SCHEMAS)
    assert result.skipped == ["public.items"] and t.applied_position() == P(0x500)
    ids = {int(r[0]) for r in fetch(t, "public.items", ["id"])}
    assert 10 in ids and 11 not in ids


def test_duckdb_schemas_named_like_a_database_or_the_file_are_those_schemas(spark: Any, tmp_path: Path) -> None:
    """DuckDB: a source schema named like one of DuckDB's databases (``memory``, ``temp``, ``system``) or like the
    target's file holds its tables, read back by a reader of the test's own; the file is free between units."""
    import duckdb

    from mirrorline.apply import target_class
    from mirrorline.model import Column, TableSchema

    names = ["memory.t", "temp.t", "system.t", "sales.t", "public.t"]
    schemas = {
        n: TableSchema(n, (Column("id", "integer", nullable=False), Column("v", "text")), key=("id",)) for n in names
    }
    path = str(tmp_path / "sales.duckdb")
    t = target_class("duckdb")("d", path)
    try:
        rows = [net(n, "I", [i], {"id": i, "v": n}) for i, n in enumerate(names)]
        t.apply(batch(spark, rows, P(0), P(0x100)), schemas)
        rows = [net(n, "U", [i], {"id": i, "v": n.upper()}) for i, n in enumerate(names)]
        t.apply(batch(spark, rows, P(0x100), P(0x200)), schemas)
        assert t.applied_position() == P(0x200)
    finally:
        t.close()
    with duckdb.connect(path, read_only=True) as c:
        got = c.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE table_name = 't' ORDER BY schema_name"
        ).fetchall()
        assert got == [("main", "t"), ("memory", "t"), ("sales", "t"), ("system", "t"), ("temp", "t")]
        for i, n in enumerate(names):
            schema = "main" if n == "public.t" else n.split(".")[0]
            assert c.execute(f'SELECT id, v FROM sales."{schema}".t').fetchall() == [(i, n.upper())]


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_the_columns_of_a_units_tables_are_read_in_one_look(kind: str, request: Any, tmp_path: Path) -> None:
    """``tables_columns`` (what a unit reads before it writes) gives each table's columns in their order, as
    ``table_columns`` does one table at a time: one name in two schemas, names with quotes, dots and spaces, and a
    table the target lacks (None)."""
    t = open_target(kind, request, tmp_path)
    made = [
        TableSchema("public.t one", (Column("id", "bigint", nullable=False), Column("b", "text")), key=("id",)),
        TableSchema("sales.t one", (Column("x", "integer"), Column("id", "bigint", nullable=False)), key=("id",)),
        TableSchema(
            'public.we"ird.name', (Column('c "1"', "text"), Column("k", "integer", nullable=False)), key=("k",)
        ),
    ]
    t.ensure_schema(made)
    asked = ["sales.t one", "public.nope", "public.t one", 'public.we"ird.name']
    with t.transaction() as s:
        got = s.tables_columns(asked)
        one_by_one = {name: s.table_columns(name) for name in asked}
    assert list(got) == asked
    assert got == one_by_one
    assert got["public.nope"] is None
    assert got["sales.t one"] == ["x", "id"] and got['public.we"ird.name'] == ['c "1"', "k"]
