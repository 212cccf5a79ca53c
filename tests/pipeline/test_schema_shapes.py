"""Schema changes whatever came before them, on table shapes nobody here chose: a table quiet since the
snapshot (its first logged schema version is already the changed shape), a change made while nothing applied, a
table without a key, the key not first, several ``ALTER``s in one statement. Every kind, Delta included; every table
read back by the tests' own reader (``tests/support/oracle.py``) and compared with the source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from pipeline_support import capture_and_apply, target_url
from waiting import wait_until

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.snapshot.run import snapshot_target

KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")

DDL = """
CREATE TABLE public.s_drop (id integer PRIMARY KEY, gone text, keep integer);
CREATE TABLE public.s_ren (id integer PRIMARY KEY, old_name text);
CREATE TABLE public.s_wide (id integer PRIMARY KEY, n integer);
CREATE TABLE public.s_bag (a integer, b text, c integer);
ALTER TABLE public.s_bag REPLICA IDENTITY FULL;
CREATE TABLE public.s_last (b text, a integer PRIMARY KEY);
CREATE TABLE public.s_multi (id integer PRIMARY KEY, b text, x integer);
CREATE TABLE public.s_add (id integer PRIMARY KEY, v text);
CREATE TABLE public.busy (id integer PRIMARY KEY, v text);
INSERT INTO public.s_drop VALUES (1, 'g1', 1), (2, 'g2', 2);
INSERT INTO public.s_ren VALUES (1, 'o1'), (2, 'o2');
INSERT INTO public.s_wide VALUES (1, 1), (2, 2);
INSERT INTO public.s_bag VALUES (100, 'x', 1), (100, 'x', 1), (200, 'y', 2);
INSERT INTO public.s_last VALUES ('one', 1);
INSERT INTO public.s_multi VALUES (1, 'b1', 1), (2, 'b2', 2);
INSERT INTO public.s_add VALUES (1, 'one');
INSERT INTO public.busy VALUES (1, 'b');
"""
TABLES = ("s_drop", "s_ren", "s_wide", "s_bag", "s_last", "s_multi", "s_add", "busy")

ALTERS = """
ALTER TABLE public.s_drop DROP COLUMN gone;
ALTER TABLE public.s_ren RENAME COLUMN old_name TO new_name;
ALTER TABLE public.s_wide ALTER COLUMN n TYPE bigint;
ALTER TABLE public.s_bag DROP COLUMN b;
ALTER TABLE public.s_multi DROP b, ADD COLUMN c integer NOT NULL DEFAULT 7, ADD b text;
ALTER TABLE public.s_add ADD COLUMN c integer NOT NULL DEFAULT 0;
"""
DML = """
INSERT INTO public.s_drop VALUES (3, 3); UPDATE public.s_drop SET keep = 10 WHERE id = 1;
INSERT INTO public.s_ren VALUES (3, 'n3'); UPDATE public.s_ren SET new_name = 'n1' WHERE id = 1;
INSERT INTO public.s_wide VALUES (3, 9000000000); UPDATE public.s_wide SET n = n + 1 WHERE id = 1;
INSERT INTO public.s_bag VALUES (300, 3); DELETE FROM public.s_bag WHERE ctid = (SELECT min(ctid) FROM public.s_bag
  WHERE a = 100); UPDATE public.s_bag SET c = 20 WHERE a = 200;
INSERT INTO public.s_last VALUES (NULL, 2), ('three', 3); UPDATE public.s_last SET b = 'uno' WHERE a = 1;
INSERT INTO public.s_multi (id, x, b) VALUES (3, 3, 'new b'); UPDATE public.s_multi SET x = 20 WHERE id = 2;
INSERT INTO public.s_add VALUES (2, 'two', 2); UPDATE public.s_add SET v = 'uno' WHERE id = 1;
"""


def _config(pg: Any, tmp_path: Path, url: str, tables: list[str] | None = None) -> cfg.Config:
    """One target ``t``; ``tables``: the configured ones (default: every table of DDL)."""
    return configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables=[f"public.{t}" for t in TABLES] if tables is None else tables,
        targets={"t": url},
    )


def _same(pg: Any, kind: str, url: str) -> None:
    for t in TABLES:
        oracle.assert_same(pg.dsn, kind, url, f"public.{t}")


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_changes_to_tables_quiet_since_the_snapshot(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str
) -> None:
    """No DML reached the log for these tables between the snapshot and their ALTER: the first schema version the
    log holds is already the changed shape, and only the shape the snapshot recorded tells the target what to do."""
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"q_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    _same(pg, kind, url)
    pg.execute("INSERT INTO public.busy VALUES (2, 'c')")
    pg.execute(ALTERS)
    pg.execute(DML + "INSERT INTO public.busy VALUES (3, 'd')")
    capture_and_apply(conf, spark)
    _same(pg, kind, url)


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_changes_made_while_nothing_applied(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str) -> None:
    """Each table changed once after the snapshot (its first logged version is the snapshot's shape), applied; then,
    with nothing applying, the ALTERs and more rows; a new pipeline follows them."""
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"w_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    pg.execute(
        "UPDATE public.s_drop SET keep = keep; UPDATE public.s_ren SET id = id; UPDATE public.s_wide SET n = n;"
        "INSERT INTO public.s_bag VALUES (400, 'z', 4); UPDATE public.s_last SET b = b;"
        "UPDATE public.s_multi SET x = x; UPDATE public.s_add SET v = v; INSERT INTO public.busy VALUES (2, 'c')"
    )
    capture_and_apply(conf, spark)
    _same(pg, kind, url)
    pg.execute(ALTERS)
    pg.execute(DML)
    capture_and_apply(conf, spark)
    _same(pg, kind, url)


MYVARCHAR = """
CREATE TYPE myvarchar;
CREATE FUNCTION myvarcharin(cstring, oid, integer) RETURNS myvarchar IMMUTABLE STRICT LANGUAGE internal AS 'varcharin';
CREATE FUNCTION myvarcharout(myvarchar) RETURNS cstring IMMUTABLE STRICT LANGUAGE internal AS 'varcharout';
CREATE TYPE myvarchar (input = myvarcharin, output = myvarcharout, alignment = integer, storage = main);
"""


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_a_keyless_table_of_a_type_without_a_btree_operator_class(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str
) -> None:
    """A user-defined base type has no ``=`` and no btree operator class: left out of the index a target builds for
    a table without a key, and matched as its text."""
    pg.execute(
        MYVARCHAR + "CREATE TABLE public.odd (a integer, b myvarchar); ALTER TABLE public.odd REPLICA IDENTITY FULL;"
        "INSERT INTO public.odd VALUES (1, 'x'), (1, 'x'), (2, 'y')"
    )
    url = target_url(kind, tmp_path, pg_cluster, f"odd_{kind[:2]}_{pg.name[-6:]}")
    if kind == "postgresql":
        pg_cluster.execute(MYVARCHAR, url.rsplit("/", 1)[1])  # a user type must exist at a PostgreSQL target
    conf = _config(pg, tmp_path, url, ["public.odd"])
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    oracle.assert_same(pg.dsn, kind, url, "public.odd")
    pg.execute(
        "DELETE FROM public.odd WHERE ctid = (SELECT min(ctid) FROM public.odd WHERE a = 1);"
        "UPDATE public.odd SET b = 'z' WHERE a = 2; INSERT INTO public.odd VALUES (3, 'w')"
    )
    capture_and_apply(conf, spark)
    oracle.assert_same(pg.dsn, kind, url, "public.odd")


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", ["postgresql", "delta"])
def test_a_schema_renamed_inside_a_transaction_is_never_followed_silently(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str
) -> None:
    """Case 5: ``ALTER SCHEMA s1 RENAME TO s2; CREATE SCHEMA s1; CREATE TABLE s1.t1`` and rows into both tables in
    one transaction, while capture streams (pgoutput sends no new Relation message for the renamed table). Capture
    finds the rename by its look at the catalog: the table stops (``status`` says renamed to s2.t1) and no later
    change of the renamed table reaches the target. At the next start the configured name is another relation: the
    target stops that table alone (the other goes on) until it is reloaded, then it equals the source's new s1.t1."""
    import threading
    import time

    from mirrorline import status as status_mod
    from mirrorline import stopped
    from mirrorline.apply.reshape import SchemaChangeStop
    from mirrorline.pipeline import Applier

    pg.execute(
        "CREATE SCHEMA s1; CREATE TABLE s1.t1 (id integer PRIMARY KEY); CREATE TABLE public.busy (id integer PRIMARY "
        "KEY, v text); INSERT INTO s1.t1 VALUES (0); INSERT INTO public.busy VALUES (1, 'b')"
    )
    url = target_url(kind, tmp_path, pg_cluster, f"sr_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, url, ["s1.t1", "public.busy"])
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    ready = threading.Event()
    cap = Capture(conf, on_ready=lambda _stats: ready.set())
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    try:
        assert ready.wait(60), "capture did not start streaming"
        pg.execute("INSERT INTO s1.t1 VALUES (10)")  # (pgoutput sends the table's Relation message now)
        pg.execute(
            "BEGIN; ALTER SCHEMA s1 RENAME TO s2; CREATE SCHEMA s1; CREATE TABLE s1.t1 (id integer PRIMARY KEY);"
            "INSERT INTO s2.t1 VALUES (1); INSERT INTO s1.t1 VALUES (2); INSERT INTO s2.t1 VALUES (3);"
            "UPDATE public.busy SET v = 'b2'; COMMIT"
        )
        wait_until(lambda: "s1.t1" in cap.stats.gone, timeout=60, interval=0.2, what="capture finds s1.t1 gone")
        assert cap.stats.gone == ["s1.t1"]
        pg.execute("INSERT INTO s2.t1 VALUES (4); UPDATE public.busy SET v = 'b3'")
        time.sleep(2)
    finally:
        cap.stop()
        th.join(30)
    assert stopped.tables(conf.log.path)["s1.t1"]["reason"] == "renamed to s2.t1 at the source"
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
        oracle.assert_same(pg.dsn, kind, url, "public.busy")
        rows = oracle.target(kind, url, "s1.t1", [("id", "integer")])
        assert rows is not None and (4,) not in rows and (10,) in rows, rows  # nothing after the rename was found
        warnings = status_mod.status(conf).warnings
        assert any("table s1.t1 stopped: renamed to s2.t1" in w for w in warnings), warnings
        # restarted: s1.t1 is the new table now, another relation than the one the target holds
        Capture(conf, once=True).run()  # (its publication takes the new s1.t1: changes from now on are sent)
        pg.execute("INSERT INTO s1.t1 VALUES (5); UPDATE public.busy SET v = 'b4'")
        Capture(conf, once=True).run()
        with pytest.raises(SchemaChangeStop, match=r"s1\.t1 is another table at the source now"):
            applier.catch_up()
        oracle.assert_same(pg.dsn, kind, url, "public.busy")  # the other table went on
        assert list(applier.held()) == [("t", "s1.t1")]
        snapshot_target(conf, "t", tables=["s1.t1"])
        pg.execute("INSERT INTO s1.t1 VALUES (6)")
        Capture(conf, once=True).run()
        applier.catch_up()
        for t in ("s1.t1", "public.busy"):
            oracle.assert_same(pg.dsn, kind, url, t)
    finally:
        applier.close()


@pytest.mark.pg
@pytest.mark.spark
def test_names_with_spaces_quotes_and_mixed_case(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    """Tables configured by the names users give them: a space in the name, a mixed-case schema, the
    quoted SQL form in the configuration; loaded and followed at every kind, read back by the tests' reader."""
    pg.execute(
        'CREATE SCHEMA "Sales"; CREATE TABLE "Sales"."Order Items" (id integer PRIMARY KEY, "Unit Price" numeric);'
        'CREATE TABLE public."with space" (id integer PRIMARY KEY, v text);'
        'INSERT INTO "Sales"."Order Items" VALUES (1, 9.5); INSERT INTO public."with space" VALUES (1, \'a\')'
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"nm_{k[:2]}_{pg.name[-6:]}") for k in KINDS}
    conf = configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        tables=['"Sales"."Order Items"', "public.with space"],  # (the quoted SQL form, and a plain name with a space)
        targets=urls,
    )
    assert sorted(conf.tables) == ["Sales.Order Items", "public.with space"]
    Capture(conf, once=True).run()
    for k in urls:
        snapshot_target(conf, k)
    pg.execute(
        'INSERT INTO "Sales"."Order Items" VALUES (2, 1.25); UPDATE "Sales"."Order Items" SET "Unit Price" = '
        '10 WHERE id = 1; DELETE FROM public."with space"; INSERT INTO public."with space" VALUES (2, \'b\')'
    )
    capture_and_apply(conf, spark)
    for k, url in urls.items():
        for t in conf.tables:
            oracle.assert_same(pg.dsn, k, url, t)


def _target_sql(kind: str, url: str, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` at the target as its user would, with a connection of the test's own."""
    if kind == "postgresql":
        import psycopg2

        conn = psycopg2.connect(url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()
    path = url.split(":///", 1)[1]
    if kind == "sqlite":
        import sqlite3

        with sqlite3.connect(path) as sconn:
            return sconn.execute(sql).fetchall()
    import duckdb

    dconn = duckdb.connect(path)
    try:
        return dconn.execute(sql).fetchall()
    finally:
        dconn.close()


INDEXES_OF = {
    "postgresql": "SELECT indexname FROM pg_indexes WHERE tablename IN ('s_bag', 's_wide') ORDER BY 1",
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY 1",
    "duckdb": "SELECT index_name FROM duckdb_indexes() ORDER BY 1",
}


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb"])
def test_indexes_made_at_the_target_outlive_a_rebuild(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A schema change that builds the target's table again (a keyless table at every kind; any change but an added
    column at DuckDB) makes the indexes the target's users had made on it again; one on a column that went is named
    in a warning."""
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"ix_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    wide = "s_wide" if kind != "postgresql" else "public.s_wide"
    bag = "s_bag" if kind != "postgresql" else "public.s_bag"
    _target_sql(kind, url, f"CREATE INDEX user_c ON {bag} (c)")
    _target_sql(kind, url, f"CREATE INDEX user_b ON {bag} (b)")
    _target_sql(kind, url, f"CREATE INDEX user_n ON {wide} (n)")
    before = [r[0] for r in _target_sql(kind, url, INDEXES_OF[kind])]
    assert {"user_b", "user_c", "user_n"} <= set(before)
    pg.execute(ALTERS)
    pg.execute(DML)
    with caplog.at_level("WARNING", logger="mirrorline"):
        capture_and_apply(conf, spark)
    _same(pg, kind, url)
    after = {r[0] for r in _target_sql(kind, url, INDEXES_OF[kind])}
    assert {"user_c", "user_n"} <= after, after
    assert "user_b" not in after
    assert any("index user_b could not be made again" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.pg
@pytest.mark.spark
def test_a_unit_cut_inside_the_transaction_that_brings_a_keyless_tables_new_shape(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path
) -> None:
    """A keyless table changes shape; the first transaction after it changes another table first, then it (as a
    pgbench transaction does: the history row last). The unit is cut before the keyless table's first change of the
    new shape, inside that transaction; the keyless rows before the cut are compiled with the shape they carry, not
    the one in force at the cut (one column more than their rows)."""
    pg.execute(DDL)
    url = target_url("sqlite", tmp_path, pg_cluster, "cut")
    conf = _config(pg, tmp_path, url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    pg.execute("INSERT INTO public.s_bag VALUES (500, 'p', 5), (500, 'p', 5)")
    pg.execute("ALTER TABLE public.s_bag ADD COLUMN extra integer DEFAULT 1")
    pg.execute(
        "BEGIN; UPDATE public.busy SET v = 'first' WHERE id = 1;"
        "INSERT INTO public.s_bag VALUES (600, 'q', 6, 2); COMMIT"
    )
    capture_and_apply(conf, spark)
    _same(pg, "sqlite", url)
