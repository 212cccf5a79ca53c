"""PostgreSQL's parallel path: worktables loaded by Spark tasks (UNLOGGED, unit-unique names), then the driver's
set-based statements and position; the worktables are gone afterwards, whatever happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apply_support import ITEMS, ORDERS, P, batch, change, fetch, net, open_target, sql

from mirrorline.apply.postgresql.dialect import POSTGRESQL
from mirrorline.errors import ApplyError
from mirrorline.model import Column, TableSchema

pytestmark = [pytest.mark.pg, pytest.mark.spark]

SCHEMAS = {ITEMS.table: ITEMS, ORDERS.table: ORDERS}


def leftover_worktables(t: Any) -> list[Any]:
    return sql(t, "SELECT relname FROM pg_class WHERE relname LIKE 'mirrorline_w%'")


@pytest.mark.parametrize(("mode", "threads"), [("update", 1), ("mirror", 2)])
def test_worktables_loaded_from_spark_tasks(mode: str, threads: int, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target("postgresql", request, tmp_path, mode, threads=threads, parallel_rows=0)
    seed = [net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": i, "note": "x"}) for i in range(200)]
    seed += [net("public.orders", "I", [i], {"id": i, "item": i, "status": "new"}) for i in range(50)]
    b = batch(spark, seed, P(0), P(0x100))
    b.net = b.net.repartition(4)  # several tasks, each loading its share of both tables
    t.apply(b, SCHEMAS)
    assert len(fetch(t, "public.items", ["id"])) == 200 and leftover_worktables(t) == []
    unit = [net("public.items", "D", [i]) for i in range(0, 50)]
    unit += [net("public.items", "U", [i], {"id": i, "qty": -i}, unchanged=["name", "note"]) for i in range(50, 100)]
    unit += [net("public.items", "I", [i], {"id": i, "name": "new", "qty": 0, "note": None}) for i in range(300, 320)]
    unit += [net("public.orders", "U", [i], {"id": i, "item": i, "status": "paid"}) for i in range(10)]
    t.apply(batch(spark, unit, P(0x100), P(0x200)), SCHEMAS)
    items = fetch(t, "public.items", ["id", "name", "qty", "note"])
    assert len(items) == 170
    assert (60, "n60", -60, "x") in items and (310, "new", 0, None) in items and (150, "n150", 150, "x") in items
    assert sorted(fetch(t, "public.orders", ["id", "status"]))[:11] == [(i, "paid") for i in range(10)] + [(10, "new")]
    assert t.applied_position() == P(0x200)
    assert leftover_worktables(t) == []


def test_parallel_path_failure_goes_serial_and_cleans_up(spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target("postgresql", request, tmp_path, parallel_rows=0)
    t.ensure_schema([ITEMS])
    sql(t, 'ALTER TABLE "public"."items" ADD CONSTRAINT named CHECK (name IS NOT NULL)')
    changes = [
        change(
            "public.items",
            "I",
            [i],
            {"id": i, "name": None if i == 3 else "ok", "qty": 1, "note": None},
            pos=P(0x10, i),
        )
        for i in range(5)
    ]
    rows = [net(c.table, "I", c.key, dict(c.new or {}), pos=c.pos) for c in changes]
    with pytest.raises(ApplyError) as e:
        t.apply(batch(spark, rows, P(0), P(0x10, 4)), {ITEMS.table: ITEMS}, changes)
    assert e.value.context["key"] == ["3"] and e.value.context["position"] == "0/10:3"
    assert fetch(t, "public.items", ["id"]) == [] and leftover_worktables(t) == []


@pytest.mark.parametrize("mode", ["update", "mirror"])
def test_spark_task_staging_keeps_columns_not_sent(mode: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = open_target("postgresql", request, tmp_path, mode, parallel_rows=0)
    seed = [net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": i, "note": f"toast{i}"}) for i in range(20)]
    t.apply(batch(spark, seed, P(0), P(0x100)), {ITEMS.table: ITEMS})
    unit = [net("public.items", "D", [i], pos=P(0x110, i)) for i in range(10)]
    unit += [
        net(
            "public.items",
            "I",
            [100 + i],
            {"id": 100 + i, "name": "moved", "qty": i},
            ["note"],
            P(0x110, i),
            moved_from=[i],
        )
        for i in range(10)
    ]
    b = batch(spark, unit, P(0x100), P(0x200))
    b.net = b.net.repartition(3)
    t.apply(b, {ITEMS.table: ITEMS})
    items = fetch(t, "public.items", ["id", "name", "note"])
    assert len(items) == 20 and (105, "moved", "toast5") in items and (15, "n15", "toast15") in items
    assert not [r for r in items if r[2] is None] and leftover_worktables(t) == []


def test_units_share_one_connection_and_one_the_server_ended_is_replaced(
    spark: Any, request: Any, tmp_path: Path
) -> None:
    import time

    import psycopg2

    t = open_target("postgresql", request, tmp_path)
    items = [net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": i, "note": None}) for i in range(3)]
    t.apply(batch(spark, items, P(0), P(0x10)), SCHEMAS)
    pid = sql(t, "SELECT pg_backend_pid()")[0][0]
    t.apply(
        batch(
            spark, [net("public.items", "U", [1], {"id": 1, "qty": 5}, unchanged=["name", "note"])], P(0x10), P(0x20)
        ),
        SCHEMAS,
    )
    assert sql(t, "SELECT pg_backend_pid()")[0][0] == pid  # one backend served both units and the queries

    # a unit that fails (a bad value) rolls back; its connection serves the next unit
    bad = [change("public.items", "I", [7], {"id": 7, "name": "x", "qty": "not a number", "note": None}, pos=P(0x30))]
    with pytest.raises(ApplyError):
        t.apply(
            batch(spark, [net(c.table, "I", c.key, dict(c.new or {}), pos=c.pos) for c in bad], P(0x20), P(0x30)),
            SCHEMAS,
            bad,
        )
    assert sql(t, "SELECT pg_backend_pid()")[0][0] == pid and t.applied_position() == P(0x20)

    # the server ends the idle connection: the next unit opens a new one and lands
    admin = psycopg2.connect(request.getfixturevalue("pg").dsn)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            if cur.fetchone()[0] == 0:
                break
            time.sleep(0.05)
    admin.close()
    t.apply(batch(spark, [net("public.items", "D", [0])], P(0x20), P(0x40)), SCHEMAS)
    assert fetch(t, "public.items", ["id", "qty"]) == [(1, 5), (2, 2)] and t.applied_position() == P(0x40)
    assert sql(t, "SELECT pg_backend_pid()")[0][0] != pid


def test_rows_copied_as_they_come_an_error_making_one_is_raised_as_itself(pg: Any) -> None:
    """``insert_rows`` feeds one COPY chunk by chunk; a chunk that cannot be made (here: its producer raises) fails
    the COPY, which psycopg2 reports as a cancelled statement: the producer's own error is what is raised, and
    nothing is loaded."""
    import pyarrow as pa

    from mirrorline.apply.postgresql import PgSession

    T = TableSchema("public.t", (Column("id", "integer"), Column("v", "text")), ("id",))
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    s = PgSession(pg.dsn)
    try:

        def chunks() -> Any:
            yield pa.table({"id": ["1", "2"], "v": ["a", None]})
            raise ValueError("the second chunk cannot be made")

        s.begin()
        with pytest.raises(ValueError, match="second chunk"):
            s.insert_rows(T, chunks())
        s.rollback()
        s.begin()
        assert s.insert_rows(T, iter([pa.table({"id": ["3"], "v": ["c"]})])) == 1
        s.commit()
    finally:
        s.disconnect()
    assert pg.execute("SELECT id, v FROM t") == [(3, "c")]


def test_a_large_worktable_gets_the_memory_of_its_join_for_its_transaction_only(pg: Any) -> None:
    """A worktable of many rows raises ``work_mem`` for the rest of its transaction (its join is then not split into
    batches on disk), never below the server's setting; apply's sessions run without JIT."""
    from mirrorline.apply.postgresql import PgSession

    s = PgSession(pg.dsn)
    try:
        assert s.query("SHOW jit") == [("off",)]
        s.begin()
        s.fit_join(10)
        assert s.query("SHOW work_mem") == [("4MB",)]
        s.fit_join(1_000_000)
        assert s.query("SELECT pg_size_bytes(current_setting('work_mem'))")[0][0] == 1_000_000 * 200 // 1024 * 1024
        s.commit()
        assert s.query("SHOW work_mem") == [("4MB",)]
        s.execute("SET work_mem = '1GB'")  # a server (or role) that gives more already: left as it is
        s.commit()
        s.begin()
        s.fit_join(10_000_000)
        assert s.query("SHOW work_mem") == [("1GB",)]
        s.commit()
    finally:
        s.disconnect()


def test_a_large_worktable_is_merge_joined_along_the_key_index(pg: Any) -> None:
    """From MERGE_MIN_ROWS worktable rows, a table whose key leads a btree index is joined by a merge join (the
    target's rows changed in the index's order, not the worktable's), for the rest of the transaction or until a
    table that cannot be; a table without such an index, a key that may hold NULLs, a small worktable and the next
    transaction get the planner's own choice."""
    from mirrorline.apply.postgresql import PgSession
    from mirrorline.apply.postgresql.session import MERGE_MIN_ROWS

    pg.execute('CREATE SCHEMA "we ird"')
    pg.execute('CREATE TABLE "we ird"."t.1" (a int NOT NULL, "b c" bigint NOT NULL, v text, PRIMARY KEY ("b c", a))')
    pg.execute('CREATE TABLE "we ird".plain (id bigint NOT NULL, v text)')  # no index: a merge would sort it all
    pg.execute('CREATE TABLE "we ird".other (id bigint NOT NULL, v text, UNIQUE (v, id))')  # the key not leading
    pg.execute('CREATE TABLE "we ird".nul (id bigint, v text)')
    pg.execute('CREATE INDEX ON "we ird".nul (id)')
    cols = (Column("a", "integer", nullable=False), Column("b c", "bigint", nullable=False), Column("v", "text"))
    keyed = TableSchema("we ird.t.1", cols, key=("a", "b c"))
    plain = TableSchema("we ird.plain", (Column("id", "bigint", nullable=False), Column("v", "text")), key=("id",))
    other = TableSchema("we ird.other", plain.columns, key=("id",))
    nul = TableSchema("we ird.nul", (Column("id", "bigint"), Column("v", "text")), key=("id",))
    s = PgSession(pg.dsn)

    def hashing() -> str:
        return str(s.query("SHOW enable_hashjoin")[0][0])

    try:
        s.begin()
        s.before_joins(keyed, MERGE_MIN_ROWS - 1)
        assert hashing() == "on"
        s.before_joins(keyed, MERGE_MIN_ROWS)
        assert hashing() == "off"
        s.execute("CREATE TEMP TABLE w (_ml_k0 text, _ml_k1 text, v text)")
        s.execute("INSERT INTO w SELECT g::text, g::text, 'x' FROM generate_series(1, 100000) g")
        s.execute('INSERT INTO "we ird"."t.1" SELECT g, g, NULL FROM generate_series(1, 100000) g')
        s.execute('ANALYZE w, "we ird"."t.1"')
        update = POSTGRESQL.join_update(keyed, "w", ["v"], None)
        plan = "\n".join(r[0] for r in s.query("EXPLAIN " + update))
        assert "Merge Join" in plan and "Hash" not in plan, plan
        for t in (plain, other, nul):
            s.before_joins(t, MERGE_MIN_ROWS * 10)
            assert hashing() == "on", t.table
        s.before_joins(keyed, MERGE_MIN_ROWS)
        s.commit()
        assert hashing() == "on"
    finally:
        s.disconnect()
    pg.execute(f'ALTER DATABASE "{pg.name}" SET enable_hashjoin = off')  # a database that turned them off: left so
    s = PgSession(pg.dsn)
    try:
        s.begin()
        s.before_joins(keyed, MERGE_MIN_ROWS)
        s.before_joins(plain, MERGE_MIN_ROWS)
        assert hashing() == "off"
        s.rollback()
    finally:
        s.disconnect()
