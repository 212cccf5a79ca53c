"""Schema changes on the source while replication runs, end to end: a real PostgreSQL through capture, the
log and Spark into each SQL target kind, in ``update`` and ``mirror`` modes, while another table keeps changing.
Columns are added (without a default, with one PostgreSQL keeps out of the WAL, generated), renamed inside a
transaction that changes rows before and after, widened, dropped (or kept), a TRUNCATE shares a transaction with an
added column; after each step every table is read back through the target's own client and compared with the source
(``tests/support/oracle.py``). A narrowing type change and ``on_schema_change = "stop"`` stop the target with a
message naming the table and the reload command; that command fixes it and replication goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from pipeline_support import target_url
from waiting import wait_until

from mirrorline import config as cfg
from mirrorline import status as status_mod
from mirrorline.apply.reshape import SchemaChangeStop, plan, widens
from mirrorline.capture.assembler import infer_attnums
from mirrorline.capture.session import Capture
from mirrorline.capture.source import first_array_element
from mirrorline.model import Column, TableSchema
from mirrorline.pipeline import Applier
from mirrorline.snapshot.run import snapshot_target
from mirrorline.verify import verify

TABLE = "public.sc"
OTHER = "public.other"
DDL = (
    "CREATE TABLE public.sc (id integer PRIMARY KEY, a integer, b varchar(10), n numeric(8,2), d text);"
    "CREATE TABLE public.other (id integer PRIMARY KEY, v text)"
)


def _config(
    pg: Any, tmp_path: Path, urls: dict[str, str], mode: str, tables: dict[str, dict[str, Any]] | None = None
) -> cfg.Config:
    """``tables``: the configured tables with their settings (default: TABLE and OTHER)."""
    return configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables={TABLE: {}, OTHER: {}} if tables is None else tables,
        targets={name: {"url": url, "mode": mode} for name, url in urls.items()},
    )


def _target_columns(kind: str, url: str, table: str) -> list[str]:
    from mirrorline.apply import open_target

    t = open_target(cfg.TargetConfig(name="x", url=url, kind=kind, location=_location(kind, url)))
    try:
        s = t.session()
        try:
            return list(s.table_columns(table) or [])
        finally:
            s.close()
    finally:
        t.close()


def _location(kind: str, url: str) -> str:
    return url if kind == "postgresql" else url.split(":///", 1)[1]


class _Run:
    def __init__(self, pg: Any, conf: cfg.Config, kind: str, url: str, spark: Any) -> None:
        self.pg, self.conf, self.kind, self.url = pg, conf, kind, url
        snapshot_target(conf, "t")  # loaded as a user would (verify compares loaded targets only)
        self.applier = Applier(conf, spark=spark)
        self.n = 100

    def other(self) -> str:  # the other table keeps changing in every step
        self.n += 1
        return f"INSERT INTO public.other VALUES ({self.n}, 'v{self.n}'); UPDATE public.other SET v = v || '+';"

    def step(self, sql: str) -> None:
        self.pg.execute(self.other() + sql + ";" + self.other())
        Capture(self.conf, once=True).run()
        assert self.applier.catch_up()
        self.same()

    def same(self) -> None:
        for t in (TABLE, OTHER):
            oracle.assert_same(self.pg.dsn, self.kind, self.url, t)


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize(
    "kind,mode",
    [(k, m) for k in ("postgresql", "sqlite", "duckdb") for m in ("update", "mirror")],
)
def test_source_schema_changes_are_followed(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str, mode: str
) -> None:
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"sc_{kind[:2]}_{mode[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, {"t": url}, mode)
    Capture(conf, once=True).run()
    r = _Run(pg, conf, kind, url, spark)
    try:
        r.step("INSERT INTO public.sc SELECT i, i, 'b' || i, i / 4.0, 'd' || i FROM generate_series(1, 20) i")
        # added without a default: the earlier rows hold NULL
        r.step("ALTER TABLE public.sc ADD COLUMN e integer; INSERT INTO public.sc (id, e) VALUES (21, 7)")
        # added with a constant default: PostgreSQL keeps it out of the existing rows (and the WAL)
        r.step("ALTER TABLE public.sc ADD COLUMN f text DEFAULT 'dflt'; UPDATE public.sc SET a = -a WHERE id = 3")
        # a generated column is not replicated (pgoutput does not send it; snapshot leaves it out too)
        r.step("ALTER TABLE public.sc ADD COLUMN g integer GENERATED ALWAYS AS (id * 2) STORED")
        assert "g" not in _target_columns(kind, url, TABLE)
        # a rename inside a transaction that changes rows before and after it
        r.step(
            "BEGIN; INSERT INTO public.sc (id, a) VALUES (22, 22); UPDATE public.sc SET a = 100 WHERE id = 1;"
            "ALTER TABLE public.sc RENAME COLUMN a TO a2; UPDATE public.sc SET a2 = 101 WHERE id = 1;"
            "INSERT INTO public.sc (id, a2) VALUES (23, 23); COMMIT"
        )
        assert "a2" in _target_columns(kind, url, TABLE) and "a" not in _target_columns(kind, url, TABLE)
        # widening type changes keep the data, and then hold what the old types could not
        r.step(
            "ALTER TABLE public.sc ALTER COLUMN a2 TYPE bigint; ALTER TABLE public.sc ALTER COLUMN b TYPE text;"
            "ALTER TABLE public.sc ALTER COLUMN n TYPE numeric(14,2);"
            "INSERT INTO public.sc (id, a2, b, n) VALUES (24, 5000000000, repeat('x', 40), 123456789.25)"
        )
        # a dropped column is dropped at the target (the default)
        r.step("ALTER TABLE public.sc DROP COLUMN d; UPDATE public.sc SET b = 'after drop' WHERE id = 2")
        assert "d" not in _target_columns(kind, url, TABLE)
        # TRUNCATE in the same transaction as a schema change
        r.step(
            "BEGIN; TRUNCATE public.sc; ALTER TABLE public.sc ADD COLUMN h date;"
            "INSERT INTO public.sc (id, a2, h) VALUES (1, 1, '2026-11-24'), (2, 2, NULL); COMMIT"
        )
        r.step("INSERT INTO public.sc (id, a2, b) SELECT i, i, 'again' FROM generate_series(3, 30) i")
        # the primary key changes: rows are matched by the new one, and an id may now repeat
        r.step(
            "ALTER TABLE public.sc DROP CONSTRAINT sc_pkey; ALTER TABLE public.sc ADD PRIMARY KEY (id, a2);"
            "INSERT INTO public.sc (id, a2, b) VALUES (1, 999, 'same id'); UPDATE public.sc SET b = 'by new key' "
            "WHERE id = 1 AND a2 = 1; DELETE FROM public.sc WHERE id = 2"
        )
        report = verify(conf)
        assert report.ok, report.text()
    finally:
        r.applier.close()


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", ["postgresql", "sqlite", "duckdb"])
def test_narrowing_stops_and_reload_fixes(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str) -> None:
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"nr_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, {"t": url}, "update", {TABLE: {"dropped_columns": "keep"}, OTHER: {}})
    Capture(conf, once=True).run()
    r = _Run(pg, conf, kind, url, spark)
    try:
        r.step("INSERT INTO public.sc SELECT i, i, 'b' || i, i, 'd' || i FROM generate_series(1, 10) i")
        # kept: the dropped column stays at the target, NULL in later rows
        pg.execute("ALTER TABLE public.sc DROP COLUMN d; INSERT INTO public.sc (id, a) VALUES (11, 11)")
        Capture(conf, once=True).run()
        assert r.applier.catch_up()
        assert "d" in _target_columns(kind, url, TABLE)
        r.same()
        report = verify(conf)
        assert report.ok, report.text()
        # narrowing: the target stops before the unit, naming table, column, both types and the reload command
        pg.execute(
            "ALTER TABLE public.sc ALTER COLUMN a TYPE smallint; UPDATE public.sc SET a = 5 WHERE id = 1;" + r.other()
        )
        Capture(conf, once=True).run()
        with pytest.raises(SchemaChangeStop) as e:
            r.applier.catch_up()
        text = str(e.value)
        assert "public.sc" in text and "a changed type from integer to smallint" in text
        assert "mirrorline snapshot --target t --table public.sc" in e.value.hint
        doc = status_mod.status(conf)
        assert "changed type from integer to smallint" in str(doc)
        # the fix: reload the table (it is created again with the source's shape), and replication goes on
        snapshot_target(conf, "t", tables=[TABLE])
        r.step("UPDATE public.sc SET a = 6 WHERE id = 2")
        assert "d" not in _target_columns(kind, url, TABLE)
    finally:
        r.applier.close()


@pytest.mark.pg
@pytest.mark.spark
def test_on_schema_change_stop(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    pg.execute(DDL)
    url = target_url("sqlite", tmp_path, pg_cluster, "st")
    conf = _config(pg, tmp_path, {"t": url}, "update", {TABLE: {"on_schema_change": "stop"}, OTHER: {}})
    Capture(conf, once=True).run()
    r = _Run(pg, conf, "sqlite", url, spark)
    try:
        r.step("INSERT INTO public.sc (id, a) VALUES (1, 1)")
        pg.execute("ALTER TABLE public.sc ADD COLUMN e integer; INSERT INTO public.sc (id, e) VALUES (2, 2)")
        Capture(conf, once=True).run()
        with pytest.raises(SchemaChangeStop, match=r'column e \(integer\) added \(on_schema_change = "stop"\)'):
            r.applier.catch_up()
        assert "e" not in _target_columns("sqlite", url, TABLE)
        snapshot_target(conf, "t", tables=[TABLE])
        r.step("UPDATE public.sc SET e = 3 WHERE id = 1")
    finally:
        r.applier.close()


# -- the pure parts --------------------------------------------------------------------------------------------------
def _schema(*cols: Column, key: tuple[str, ...] = ("id",), version: int = 1) -> TableSchema:
    return TableSchema("public.t", (Column("id", "integer", attnum=1), *cols), key, version=version)


def test_widens() -> None:
    assert widens("integer", "bigint") and widens("smallint", "integer") and widens("integer", "numeric")
    assert widens("integer", "numeric(12,0)") and not widens("integer", "numeric(8,0)")
    assert widens("character varying(10)", "character varying(20)") and widens("character varying(10)", "text")
    assert widens("numeric(8,2)", "numeric(14,2)") and widens("numeric(8,2)", "numeric")
    assert not widens("numeric(8,2)", "numeric(8,3)") and not widens("numeric", "numeric(20,2)")
    assert widens("real", "double precision") and not widens("double precision", "real")
    assert not widens("bigint", "integer") and not widens("text", "character varying(10)")
    assert not widens("integer", "text") and not widens("text", "integer")


def test_plan_tells_a_rename_from_a_drop_and_an_add() -> None:
    old = _schema(Column("a", "integer", attnum=2), Column("b", "text", attnum=3))
    renamed = _schema(Column("a2", "integer", attnum=2), Column("b", "text", attnum=3), version=2)
    steps = plan(old, renamed, ["id", "a", "b"], target="t")
    assert [(s.kind, s.old, s.column.name) for s in steps] == [("rename", "a", "a2")]
    replaced = _schema(Column("b", "text", attnum=3), Column("a2", "integer", attnum=4), version=2)
    steps = plan(old, replaced, ["id", "a", "b"], target="t")
    assert [(s.kind, s.old or s.column.name) for s in steps] == [("drop", "a"), ("add", "a2")]
    # one statement dropping b and adding a new b: the old b goes first, the new one is added empty
    again = _schema(Column("a", "integer", attnum=2), Column("b", "text", attnum=4), version=2)
    steps = plan(old, again, ["id", "a", "b"], target="t")
    assert [(s.kind, s.old or s.column.name) for s in steps] == [("drop", "b"), ("add", "b")]
    # a kind that alters indexed columns only by building the table again: one rebuild, each column from its origin
    (rebuilt,) = plan(old, again, ["id", "a", "b"], target="t", rebuild=True)
    assert rebuilt.kind == "rebuild" and rebuilt.sources == (("id", "id"), ("a", "a"), ("b", None))
    (rebuilt,) = plan(old, renamed, ["id", "a", "b"], target="t", rebuild=True)
    assert rebuilt.sources == (("id", "id"), ("a2", "a"), ("b", "b"))
    assert [s.kind for s in plan(old, replaced, ["id", "a", "b"], target="t", keep_dropped=True)] == ["add"]
    # already done (a crash after the change committed): nothing left to do
    assert plan(old, renamed, ["id", "a2", "b"], target="t") == []
    # without attnums a rename cannot be told apart: stop rather than guess
    blind = _schema(Column("a", "integer"), version=1)
    with pytest.raises(SchemaChangeStop, match="renamed"):
        plan(blind, _schema(Column("z", "integer"), version=2), ["id", "a"], target="t")


def test_plan_stops_on_narrowing_and_rewritten_defaults_and_rebuilds_for_a_new_key() -> None:
    old = _schema(Column("a", "bigint", attnum=2))
    with pytest.raises(SchemaChangeStop, match="a changed type from bigint to integer") as e:
        plan(old, _schema(Column("a", "integer", attnum=2), version=2), ["id", "a"], target="t")
    assert e.value.hint == "reload the table: mirrorline snapshot --target t --table public.t"
    rekeyed = _schema(Column("a", "bigint", attnum=2), key=("id", "a"), version=2)
    steps = plan(old, rekeyed, ["id", "a"], target="t")
    assert [s.describe() for s in steps] == ["key changed from (id) to (id, a)"]
    # the same key in another order (the snapshot reads the primary key's order, pgoutput the columns'): no step
    assert (
        plan(rekeyed, _schema(Column("a", "bigint", attnum=2), key=("a", "id"), version=3), ["id", "a"], target="t")
        == []
    )
    # kept dropped columns would not survive the table being built again
    wider = _schema(Column("a", "bigint", attnum=2), Column("z", "text", attnum=3))
    with pytest.raises(SchemaChangeStop, match="dropped columns are kept"):
        plan(wider, rekeyed, ["id", "a", "z"], target="t", keep_dropped=True)
    added = Column("r", "double precision", attnum=3, default_unlogged=True)
    with pytest.raises(SchemaChangeStop, match="default PostgreSQL computed"):
        plan(old, _schema(Column("a", "bigint", attnum=2), added, version=2), ["id", "a"], target="t")


def test_first_array_element() -> None:
    assert first_array_element("{5}") == "5"
    assert first_array_element('{"a b"}') == "a b"
    assert first_array_element('{"say \\"hi\\" \\\\ now"}') == 'say "hi" \\ now'
    assert first_array_element("{NULL}") is None
    assert first_array_element('{"NULL"}') == "NULL"
    assert first_array_element("{{1,2}}") == "{1,2}"


@pytest.mark.pg
@pytest.mark.spark
def test_renamed_and_dropped_tables_stop_alone(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    import threading

    from mirrorline import stopped

    pg.execute(
        DDL + "; CREATE TABLE public.third (id integer PRIMARY KEY, v text);"
        "CREATE TABLE public.fourth (id integer PRIMARY KEY, v text)"
    )
    url = target_url("duckdb", tmp_path, pg_cluster, "gone")
    tables: dict[str, dict[str, Any]] = {TABLE: {}, "public.third": {}, "public.fourth": {}, OTHER: {}}
    conf = _config(pg, tmp_path, {"t": url}, "update", tables)
    Capture(conf, once=True).run()
    r = _Run(pg, conf, "duckdb", url, spark)
    try:
        r.step(
            "INSERT INTO public.sc (id, a) VALUES (1, 1); INSERT INTO public.third VALUES (1, 'x');"
            "INSERT INTO public.fourth VALUES (1, 'x')"
        )
        ready = threading.Event()
        cap = Capture(conf, on_ready=lambda _stats: ready.set())
        th = threading.Thread(target=cap.run, daemon=True)
        th.start()
        try:
            assert ready.wait(60), "capture did not start streaming"
            # renamed while capture streams: the Relation message names the table's relid under its new name
            pg.execute(
                "UPDATE public.sc SET a = 2 WHERE id = 1; ALTER TABLE public.sc RENAME TO sc_renamed;" + r.other()
            )
            pg.execute("UPDATE public.sc_renamed SET a = 3 WHERE id = 1")
            # dropped while capture streams: found by its look at the catalog (pgoutput sends nothing for a DROP)
            pg.execute("INSERT INTO public.third VALUES (2, 'y'); DROP TABLE public.third;" + r.other())
            wait_until(
                lambda: len(cap.stats.gone) >= 2, timeout=60, interval=0.2, what="capture finds both tables gone"
            )
        finally:
            cap.stop()
            th.join(30)
        assert sorted(cap.stats.gone) == ["public.sc", "public.third"]
        gone = stopped.tables(conf.log.path)
        assert gone["public.sc"]["reason"] == "renamed to public.sc_renamed at the source"
        assert gone["public.third"]["reason"] == "dropped at the source"
        # renamed while capture was stopped: found at its start, by the oid the log recorded
        pg.execute(
            "UPDATE public.fourth SET v = 'before' WHERE id = 1; ALTER TABLE public.fourth RENAME TO fourth_renamed;"
            "UPDATE public.fourth_renamed SET v = 'after' WHERE id = 1;" + r.other()
        )
        stats = Capture(conf, once=True).run()  # a restart does not refuse the configuration
        assert stats.gone == ["public.fourth", "public.sc", "public.third"]  # every configured table gone
        assert (
            stopped.tables(conf.log.path)["public.fourth"]["reason"] == "renamed to public.fourth_renamed at the source"
        )
        assert r.applier.catch_up()
        oracle.assert_same(pg.dsn, "duckdb", url, OTHER)  # the other tables went on
        rows = oracle.target("duckdb", url, TABLE, [("id", "integer"), ("a", "integer")])
        assert rows is not None and set(rows) == {(1, 2)}, rows  # its changes up to the rename, none after
        third = oracle.target("duckdb", url, "public.third", [("id", "integer"), ("v", "text")])
        assert third is not None and set(third) == {(1, "x"), (2, "y")}, third
        fourth = oracle.target("duckdb", url, "public.fourth", [("id", "integer"), ("v", "text")])
        assert fourth is not None and set(fourth) == {(1, "before")}, fourth  # captured at the restart
        warnings = status_mod.status(conf).warnings
        assert any("table public.sc stopped: renamed to public.sc_renamed" in w for w in warnings), warnings
        assert any("table public.third stopped: dropped at the source" in w for w in warnings), warnings
    finally:
        r.applier.close()
    # verify agrees with status: a table gone from the source is not comparable, with the reason, never a difference
    report = verify(conf)
    checks = {c.table: c for c in report.targets[0].tables}
    for t, why in (
        (TABLE, "renamed to public.sc_renamed at the source"),
        ("public.third", "dropped at the source"),
        ("public.fourth", "renamed to public.fourth_renamed at the source"),
    ):
        assert not checks[t].same and checks[t].equal and why in checks[t].not_comparable, report.text()
        assert f"{t}: not comparable: " in report.text()
    assert checks[OTHER].same and report.ok, report.text()
    # reconciled by the configuration: the new name configured in place of the old one is loaded, then followed
    conf = _config(pg, tmp_path, {"t": url}, "update", {"public.sc_renamed": {}, OTHER: {}})
    Capture(conf, once=True).run()
    snapshot_target(conf, "t", tables=["public.sc_renamed"])
    pg.execute("UPDATE public.sc_renamed SET a = 4 WHERE id = 1")
    Capture(conf, once=True).run()
    a = Applier(conf, spark=spark)
    try:
        assert a.catch_up()
    finally:
        a.close()
    oracle.assert_same(pg.dsn, "duckdb", url, "public.sc_renamed")
    assert not any("stopped" in w for w in status_mod.status(conf).warnings)


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_schema_changed_after_an_export_is_followed_after_its_load(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str
) -> None:
    import subprocess
    import sys

    from mirrorline.pipeline import catch_up_target
    from mirrorline.snapshot import export_snapshot, load_snapshot

    pg.execute(DDL + "; INSERT INTO public.sc SELECT i, i, 'b' || i, i, 'd' || i FROM generate_series(1, 50) i")
    url = target_url(kind, tmp_path, pg_cluster, f"ex_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, {"t": url}, "update")
    Capture(conf, once=True).run()
    (tmp_path / "out").mkdir()
    folder = export_snapshot(conf, tmp_path / "out").folder
    assert folder is not None
    # after the export's consistent point: changes before and after a rename, an added column, a widened type
    pg.execute(
        "UPDATE public.sc SET a = 100 WHERE id = 1; ALTER TABLE public.sc RENAME COLUMN a TO a2;"
        "UPDATE public.sc SET a2 = 101 WHERE id = 2; ALTER TABLE public.sc ADD COLUMN e text DEFAULT 'e';"
        "ALTER TABLE public.sc ALTER COLUMN b TYPE text; INSERT INTO public.sc (id, a2, e) VALUES (51, 51, 'x')"
    )
    Capture(conf, once=True).run()
    # the daystream export names each change's columns as its own schema version had them
    out = subprocess.run(
        [sys.executable, "-m", "mirrorline.cli.main", "log", "export", "-c", str(tmp_path / "m.toml")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    sc = [line for line in out if "_table\tsc\t" in line]
    assert any("\ta\t100" in line for line in sc) and any("\ta2\t101" in line for line in sc), sc[:5]
    assert not any("\ta\t101" in line for line in sc)
    load_snapshot(conf, "t", folder)
    catch_up_target(conf, "t")
    for t in (TABLE, OTHER):
        oracle.assert_same(pg.dsn, kind, url, t)
    report = verify(conf)
    assert report.ok, report.text()


def test_plan_for_logs_without_attnums_and_tables_without_a_key() -> None:
    # a log written before attnums were recorded: its columns are matched by name
    legacy = TableSchema("public.t", (Column("id", "integer"), Column("a", "integer")), ("id",))
    now = _schema(Column("a", "bigint", attnum=2), version=2)
    assert [s.describe() for s in plan(legacy, now, ["id", "a"], target="t")] == [
        "column a changed from integer to bigint"
    ]
    # a table without a key: a column dropped builds it again (its index covers the columns)
    bag = TableSchema("public.t", (Column("x", "integer", attnum=1), Column("y", "text", attnum=2)), ("x",), bag=True)
    fewer = TableSchema("public.t", (Column("x", "integer", attnum=1),), ("x",), version=2, bag=True)
    assert [s.kind for s in plan(bag, fewer, ["x", "y"], target="t")] == ["rebuild"]
    wider = TableSchema("public.t", (*bag.columns, Column("z", "text", attnum=3)), ("x", "y", "z"), version=3, bag=True)
    assert [s.kind for s in plan(bag, wider, ["x", "y"], target="t")] == ["add"]


def test_infer_attnums() -> None:
    # a column renamed since capture read its Relation message sits in the one attnum its neighbours leave
    assert infer_attnums([1, 0, 3, 4]) == [1, 2, 3, 4]
    assert infer_attnums([0, 2]) == [1, 2]
    assert infer_attnums([1, 0, 0, 4]) == [1, 2, 3, 4]
    # a gap wider than the unknown columns (a dropped or generated column between) or no right neighbour: unknown
    assert infer_attnums([1, 0, 4]) == [1, 0, 4]
    assert infer_attnums([1, 2, 0]) == [1, 2, 0]


def test_plan_stop_mode_counts_kept_drops_and_missing_columns_are_added() -> None:
    old = _schema(Column("a", "integer", attnum=2), Column("b", "text", attnum=3))
    fewer = _schema(Column("a", "integer", attnum=2), version=2)
    with pytest.raises(SchemaChangeStop, match=r'column b dropped \(on_schema_change = "stop"\)'):
        plan(old, fewer, ["id", "a", "b"], target="t", keep_dropped=True, follow=False)
    # the target lacks a column no step of this change makes: it is added too, before a rebuild for a new key
    rekeyed = _schema(Column("a", "integer", attnum=2), Column("b", "text", attnum=3), key=("id", "a"), version=2)
    assert [s.describe() for s in plan(old, rekeyed, ["id", "a"], target="t")] == [
        "column b (text) added",
        "key changed from (id) to (id, a)",
    ]
