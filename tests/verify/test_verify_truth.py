"""``verify`` never reports a difference the tests' own reader does not see, and never misses one: a row
of all NULLs across many types (``inet`` last), empty strings and arrays beside NULLs, on every kind; a table whose
``actions`` keep rows the source deleted is "not comparable", never a difference; a row changed at the target behind
mirrorline's back is a difference."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import configs
import oracle
import psycopg2
import pytest
from pipeline_support import capture_and_apply, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.snapshot.run import snapshot_target
from mirrorline.verify import verify

KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")

TYPES = [
    "smallint",
    "integer",
    "bigint",
    "numeric",
    "numeric(10,2)",
    "real",
    "double_precision",
    "boolean",
    "text",
    "varchar(5)",
    "char(3)",
    "bytea",
    "date",
    "time",
    "timestamp",
    "timestamptz",
    "interval",
    "uuid",
    "json",
    "jsonb",
    "integer[]",
    "text[]",
    "inet",
]
COLS = [f"c{i} {t.replace('_', ' ')}" for i, t in enumerate(TYPES)]
EMPTY = {"text": "''", "varchar(5)": "''", "char(3)": "''", "bytea": "''", "integer[]": "'{}'", "text[]": "'{}'"}


def _config(pg: Any, tmp_path: Path, urls: dict[str, str]) -> cfg.Config:
    return configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables={"public.nulls": {}, "public.kept": {"actions": "I"}},
        targets=urls,
    )


def _oracle_same(pg: Any, kind: str, url: str, table: str) -> bool:
    try:
        oracle.assert_same(pg.dsn, kind, url, table)
    except AssertionError:
        return False
    return True


@pytest.mark.pg
@pytest.mark.spark
def test_verify_agrees_with_an_independent_reader(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    empties = ", ".join(EMPTY.get(t, "NULL") for t in TYPES[1:])
    pg.execute(
        f"CREATE TABLE public.nulls (id integer PRIMARY KEY, {', '.join(COLS)});"
        "CREATE TABLE public.kept (id integer PRIMARY KEY, v text);"
        f"INSERT INTO public.nulls (id) VALUES (1); INSERT INTO public.nulls VALUES (2, 0, {empties});"
        "INSERT INTO public.kept SELECT i, 'v' || i FROM generate_series(1, 5) i"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"vt_{k[:2]}_{pg.name[-6:]}") for k in KINDS}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    for name in urls:
        snapshot_target(conf, name)
    # live: a row of all NULLs and one of empty values arrive through the log too; the kept table loses rows
    pg.execute(
        f"INSERT INTO public.nulls (id) VALUES (3); INSERT INTO public.nulls VALUES (4, 0, {empties});"
        "UPDATE public.nulls SET c0 = 1 WHERE id = 1; DELETE FROM public.kept WHERE id <= 2;"
        "INSERT INTO public.kept VALUES (6, 'v6')"
    )
    capture_and_apply(conf, spark)
    for kind, url in urls.items():
        assert _oracle_same(pg, kind, url, "public.nulls"), kind
        assert not _oracle_same(pg, kind, url, "public.kept"), kind  # the target keeps the deleted rows
    report = verify(conf, diff=10)
    assert report.ok, report.text()
    for t in report.targets:
        (kept,) = [c for c in t.tables if c.table == "public.kept"]
        assert not kept.same and kept.equal and "actions = I" in kept.not_comparable
    assert "not comparable: actions = I" in report.text()

    # a row changed at the targets behind mirrorline's back: the reader and verify both see it
    pg_target = psycopg2.connect(urls["postgresql"])
    pg_target.autocommit = True
    with pg_target.cursor() as cur:
        cur.execute("UPDATE public.nulls SET c22 = '10.0.0.1' WHERE id = 3")
    pg_target.close()
    with sqlite3.connect(urls["sqlite"].split(":///", 1)[1]) as lite:
        lite.execute("UPDATE nulls SET c8 = NULL WHERE id = 2")
    report = verify(conf, diff=10)
    bad = {t.target: t.differing for t in report.targets}
    assert bad == {
        "postgresql": ["public.nulls"],
        "sqlite": ["public.nulls"],
        "duckdb": [],
        "delta": [],
        "iceberg": [],
    }, bad
    assert not _oracle_same(pg, "postgresql", urls["postgresql"], "public.nulls")
    assert not _oracle_same(pg, "sqlite", urls["sqlite"], "public.nulls")


@pytest.mark.pg
@pytest.mark.spark
def test_a_table_that_lost_its_identity_does_not_stop_verify(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    """A configured table whose primary key is dropped at the source (no replica identity left): ``verify`` still
    compares every table, that one as a bag of rows, and sees a row changed behind mirrorline's back in it."""
    pg.execute(
        "CREATE TABLE public.nulls (id integer PRIMARY KEY, v text); CREATE TABLE public.kept (id integer PRIMARY "
        "KEY, v text); INSERT INTO public.nulls VALUES (1, 'a'), (2, 'b'); INSERT INTO public.kept VALUES (1, 'k')"
    )
    urls = {"sqlite": target_url("sqlite", tmp_path, pg_cluster, "lost")}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    snapshot_target(conf, "sqlite")
    pg.execute("ALTER TABLE public.nulls DROP CONSTRAINT nulls_pkey")
    report = verify(conf)
    assert report.ok, report.text()
    assert sorted(c.table for c in report.targets[0].tables) == ["public.kept", "public.nulls"]
    with sqlite3.connect(urls["sqlite"].split(":///", 1)[1]) as lite:
        lite.execute("UPDATE nulls SET v = 'changed' WHERE id = 2")
    assert verify(conf).targets[0].differing == ["public.nulls"]
    assert not _oracle_same(pg, "sqlite", urls["sqlite"], "public.nulls")


@pytest.mark.pg
@pytest.mark.spark
def test_a_target_that_cannot_be_read_does_not_stop_verify(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    """One target cannot be opened (its folder is gone): verify says so for that target and compares the other."""
    import shutil

    pg.execute(
        "CREATE TABLE public.nulls (id integer PRIMARY KEY); CREATE TABLE public.kept (id integer PRIMARY KEY);"
        "INSERT INTO public.nulls VALUES (1); INSERT INTO public.kept VALUES (1)"
    )
    (tmp_path / "gone").mkdir()
    urls = {"ok": target_url("sqlite", tmp_path, pg_cluster, "ok"), "gone": f"sqlite:///{tmp_path / 'gone' / 'g.db'}"}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    for name in urls:
        snapshot_target(conf, name)
    shutil.rmtree(tmp_path / "gone")
    report = verify(conf)
    by = {t.target: t for t in report.targets}
    assert by["ok"].ok and len(by["ok"].tables) == 2
    assert not by["gone"].ok and "could not be compared" in by["gone"].error, by["gone"].error
    assert not report.ok
