"""Part of a table (per table ``columns`` / ``exclude`` / ``where``): the publication carries the column list and row
filter, so the source sends only those; the snapshot and ``verify`` read the same part; a row an update moves out of
the filter is deleted at the target, one it moves in is inserted (PostgreSQL's own rule). Every target kind, read by
the tests' own reader. What PostgreSQL would refuse at the source (a filter on a column outside the replica identity,
a column list without the identity) and an invalid filter are configuration errors naming the table, before the
source is changed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import configs
import duckdb
import oracle
import psycopg2
import pytest
from pipeline_support import target_url

from mirrorline import config as cfg
from mirrorline.capture.selection import filter_columns
from mirrorline.errors import ConfigError

KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")


def test_the_columns_a_row_filter_names() -> None:
    names = ["id", "Region", "amount", "note"]
    assert filter_columns("amount > 0 AND \"Region\" = 'amount'", names) == ["Region", "amount"]
    assert filter_columns("NOTE IS NULL", names) == ["note"]  # a bare word folds to lower case
    assert filter_columns("region = 'x'", names) == []  # "Region" is another column


def _config(tmp_path: Path, dsn: str, urls: dict[str, str], tables: dict[str, dict[str, Any]]) -> Path:
    return configs.write(tmp_path / "m.toml", source=dsn, log=tmp_path / "log", tables=tables, targets=urls)


ORDERS: dict[str, dict[str, Any]] = {
    'public."Orders"': {"exclude": ["secret"], "where": "region IN ('eu', 'uk') AND id > 0"},
    "public.drafts": {"columns": ["id", "status", "body"], "where": "status <> 'draft'"},
}


@pytest.mark.pg
@pytest.mark.spark
def test_part_of_a_table_at_every_target(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    from pipeline_support import capture_and_apply

    from mirrorline.snapshot import reconcile_targets
    from mirrorline.verify import verify

    pg.execute(
        'CREATE TABLE public."Orders" (region text, id integer, amount numeric(10,2), secret text, '
        "PRIMARY KEY (region, id));"
        "INSERT INTO public.\"Orders\" SELECT (ARRAY['eu','us','uk'])[1 + i % 3], i, i * 1.5, 'pin' || i "
        "FROM generate_series(1, 300) i;"
        "CREATE TABLE public.drafts (id integer, status text, body text); "
        "ALTER TABLE public.drafts REPLICA IDENTITY FULL;"
        "INSERT INTO public.drafts SELECT i, CASE WHEN i % 2 = 0 THEN 'draft' ELSE 'final' END, 'b' || i "
        "FROM generate_series(1, 50) i"
    )
    urls = {k: target_url(k, tmp_path, pg_cluster, f"part_{k[:2]}_{pg.name[-6:]}") for k in KINDS}
    conf = cfg.load(_config(tmp_path, pg.dsn, urls, ORDERS))
    from mirrorline.capture.session import Capture

    Capture(conf, once=True).run()  # the slot and publication, with the column list and row filter
    for r in reconcile_targets(conf):
        assert r.result is not None
    pg.execute(
        "INSERT INTO public.\"Orders\" VALUES ('eu', 1000, 1, 's'), ('us', 1001, 2, 's');"
        "UPDATE public.\"Orders\" SET region = 'us' WHERE region = 'eu' AND id < 40;"  # leave the filter: deleted
        "UPDATE public.\"Orders\" SET region = 'uk' WHERE region = 'us' AND id BETWEEN 100 AND 130;"  # enter: inserted
        "UPDATE public.\"Orders\" SET amount = -amount, secret = 'changed' WHERE id % 5 = 0;"
        'DELETE FROM public."Orders" WHERE id % 11 = 0;'
        "UPDATE public.drafts SET status = 'final' WHERE id <= 10;"  # drafts published: inserted
        "UPDATE public.drafts SET status = 'draft' WHERE id BETWEEN 41 AND 45;"  # finals back to draft: deleted
        "UPDATE public.drafts SET body = 'edited' WHERE id % 3 = 0; DELETE FROM public.drafts WHERE id = 49"
    )
    capture_and_apply(conf, spark)
    for kind, url in urls.items():
        oracle.assert_same_part(
            pg.dsn, kind, url, "public.Orders", ["region", "id", "amount"], "region IN ('eu', 'uk') AND id > 0"
        )
        oracle.assert_same_part(pg.dsn, kind, url, "public.drafts", ["id", "status", "body"], "status <> 'draft'")
        if kind == "sqlite":  # (SQLite reads an unknown "name" as a string)
            with sqlite3.connect(oracle.location(url)) as con:
                assert "secret" not in [r[1] for r in con.execute("PRAGMA table_info('Orders')")]
        else:
            with pytest.raises((psycopg2.Error, duckdb.Error, ValueError)):  # the column left out is not there
                oracle.read(kind, oracle.location(url), "public.Orders", ["secret"])
    report = verify(conf)
    assert report.ok, report.text()
    conn = psycopg2.connect(pg.dsn)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.relname, r.prattrs IS NOT NULL, pg_get_expr(r.prqual, r.prrelid) IS NOT NULL FROM "
            "pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid ORDER BY 1"
        )
        assert cur.fetchall() == [("Orders", True, True), ("drafts", False, True)]  # every column of drafts: no list
    conn.close()
    # the part changed in the file (us rows too, secret too): the table is marked to be loaded again, not left
    # holding another part than the one configured; once loaded again, the targets hold the new part
    wider = {**ORDERS, 'public."Orders"': {"where": "region IN ('eu', 'uk', 'us') AND id > 0"}}
    conf = cfg.load(_config(tmp_path, pg.dsn, urls, wider))
    pg.execute('UPDATE public."Orders" SET amount = 7 WHERE id = 1000')
    Capture(conf, once=True).run()
    from mirrorline.log.reader import ChangeLog

    store = ChangeLog(conf.log.path).schemas
    store.refresh()
    latest = store.latest("public.Orders")
    assert latest is not None and latest.resync and "its replicated columns changed" in latest.resync
    from mirrorline.snapshot import snapshot_target

    for kind in KINDS:
        snapshot_target(conf, kind, tables=["public.Orders"])
    pg.execute("UPDATE public.\"Orders\" SET amount = 8 WHERE region = 'us' AND id < 30")
    capture_and_apply(conf, spark)
    for kind, url in urls.items():
        oracle.assert_same_part(
            pg.dsn, kind, url, "public.Orders", ["region", "id", "amount", "secret"], "region IN ('eu', 'uk', 'us')"
        )


@pytest.mark.pg
@pytest.mark.parametrize(
    ("tables", "field", "words"),
    [
        ({"public.p": {"where": "v >"}}, "where", "is not a row filter of public.p"),
        ({"public.p": {"where": "v = 'x'"}}, "where", "not in public.p's replica identity (id)"),
        ({"public.p": {"exclude": ["id"]}}, "exclude", "leaves out id, of public.p's replica identity"),
        ({"public.p": {"columns": ["v", "nope"]}}, "columns", "public.p has no column(s) nope"),
        ({"public.f": {"exclude": ["v"]}}, "exclude", "REPLICA IDENTITY FULL: every column"),
    ],
)
def test_what_the_source_would_refuse_is_a_configuration_error(
    pg: Any, tmp_path: Path, tables: dict[str, dict[str, Any]], field: str, words: str
) -> None:
    from mirrorline.capture.session import Capture

    pg.execute(
        "CREATE TABLE public.p (id integer PRIMARY KEY, v text); CREATE TABLE public.f (id integer, v text);"
        "ALTER TABLE public.f REPLICA IDENTITY FULL"
    )
    conf = cfg.load(_config(tmp_path, pg.dsn, {"s": f"sqlite:///{tmp_path / 't.db'}"}, tables))
    with pytest.raises(ConfigError) as e:
        Capture(conf, once=True).prepare()
    assert field in str(e.value) and words in str(e.value), str(e.value)
    conn = psycopg2.connect(pg.dsn)
    with conn.cursor() as cur:  # nothing made at the source
        cur.execute("SELECT count(*) FROM pg_publication")
        assert cur.fetchone() == (0,)
    conn.close()


def test_columns_and_exclude_are_checked_in_the_file(tmp_path: Path) -> None:
    for body, words in [
        ('columns = ["a"]\nexclude = ["b"]\n', "either columns"),
        ("columns = []\n", "list of the column names"),
        ('where = "  "\n', "boolean expression"),
        ('exclude = ["a", "a"]\n', "each once"),
    ]:
        (tmp_path / "m.toml").write_text(
            f'[log]\npath = "l"\n[tables."public.t"]\n{body}[targets.t]\nurl = "sqlite:///t.db"\n'
        )
        with pytest.raises(ConfigError, match=words):
            cfg.load(tmp_path / "m.toml")
