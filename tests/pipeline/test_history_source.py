"""History mode from a real source: a table with a TOASTed column updates leave unsent, and one named with a space,
quotes and a dot whose composite key is neither first nor in column order; loaded by a snapshot (a version per row at
its position), then transactions of updates, deletes, a key change, re-inserts and a TRUNCATE, some made while
nothing ran. Each key's versions at the target, read by the kind's own client, are the images the test itself read
from the source after each transaction that changed the key, chained by their positions; the current ones are the
source's rows; ``verify`` says it compared the current versions, and ``status`` names the mode."""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import configs
import oracle
import psycopg2
import pytest
from pipeline_support import capture_and_apply, target_url

from mirrorline.capture.session import Capture
from mirrorline.snapshot.run import snapshot_target
from mirrorline.status import status
from mirrorline.verify import verify

KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")
HIST = "public.hist"
ODD = 'My Schema.Order "Items" v2.0'  # as mirrorline names it ("schema.name")
ODD_SQL = '"My Schema"."Order ""Items"" v2.0"'  # as SQL and the configuration file name it

DDL = f"""
CREATE TABLE public.hist (id integer PRIMARY KEY, v text, big text);
ALTER TABLE public.hist ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE SCHEMA "My Schema";
CREATE TABLE {ODD_SQL} (note text, k2 integer, k1 text, PRIMARY KEY (k1, k2));
INSERT INTO public.hist SELECT i, 'v' || i, repeat(md5(i::text), 200) FROM generate_series(1, 5) i;
INSERT INTO {ODD_SQL} VALUES ('n1', 1, 'a'), ('n2', 2, 'a'), ('n3', 1, 'b');
"""


class Recorder:
    """The transactions the test runs, and what it reads back from the source after each: per key, the images of
    its row after each transaction that changed it (None: gone)."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.images: dict[str, dict[tuple[Any, ...], list[tuple[Any, ...] | None]]] = defaultdict(dict)

    def rows(self, table: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
        cols = oracle.columns(self.pg.dsn, table)
        key = KEYS[table]
        out = {}
        for r in oracle.source(self.pg.dsn, table):
            out[tuple(r[[n for n, _ in cols].index(k)] for k in key)] = r
        return out

    def start(self) -> None:
        for t in KEYS:
            for k, r in self.rows(t).items():
                self.images[t][k] = [r]

    def txn(self, sql: str, touched: dict[str, list[tuple[Any, ...]]]) -> None:
        self.pg.execute(f"BEGIN; {sql}; COMMIT")
        for t, keys in touched.items():
            now = self.rows(t)
            for k in keys if keys else set(self.images[t]) | set(now):
                self.images[t].setdefault(k, []).append(now.get(k))


KEYS = {HIST: ("id",), ODD: ("k1", "k2")}


def _check(pg: Any, kind: str, url: str, rec: Recorder) -> None:
    for table, want in rec.images.items():
        got = oracle.versions(pg.dsn, kind, url, table)
        names = [n for n, _ in oracle.columns(pg.dsn, table)]
        idx = [names.index(k) for k in KEYS[table]]
        by_key: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
        for v in got:
            by_key[tuple(v[0][i] for i in idx)].append(v)
        for key, images in want.items():
            vs = by_key.pop(key, [])
            assert [v[0] for v in vs] == [i for i in images if i is not None], (table, key)
            assert all(v[4] for v in vs), (table, key, "start and end times set as the lsns are")
            for a, b in pairwise(vs):
                assert a[2] is not None and a[2] <= b[1], (table, key, a, b)
                assert a[3] or a[2] == b[1], (table, key, "a version not deleted ends where the next starts")
            if vs:
                assert (vs[-1][2] is None) == (images[-1] is not None), (table, key)
                assert vs[-1][3] == (images[-1] is None), (table, key)
        assert not by_key, f"{table}: versions of keys the source never had: {sorted(by_key)}"
        current = [v[0] for v in got if v[2] is None]
        assert sorted(map(str, current)) == sorted(map(str, oracle.source(pg.dsn, table).elements()))


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_versions_from_a_real_source(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str) -> None:
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"h_{kind[:2]}_{pg.name[-6:]}")
    conf = configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables=[HIST, ODD_SQL],
        targets={"t": {"url": url, "history": "versions"}},
    )
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    rec = Recorder(pg)
    rec.start()
    _check(pg, kind, url, rec)
    snap = {v[1] for v in oracle.versions(pg.dsn, kind, url, HIST)}
    assert len(snap) == 1 and snap.pop() > 0  # every loaded row opened at the snapshot's position

    rec.txn("UPDATE public.hist SET v = 'u1' WHERE id = 1", {HIST: [(1,)]})  # big not sent
    rec.txn(
        "UPDATE public.hist SET v = 'u2' WHERE id = 1; UPDATE public.hist SET v = 'w2' WHERE id = 2",
        {HIST: [(1,), (2,)]},
    )
    rec.txn("DELETE FROM public.hist WHERE id = 3", {HIST: [(3,)]})
    rec.txn(f"UPDATE {ODD_SQL} SET note = 'x' WHERE k1 = 'a'", {ODD: [("a", 1), ("a", 2)]})
    capture_and_apply(conf, spark)
    _check(pg, kind, url, rec)

    # made while nothing ran: a key change (big not sent), a re-insert, an insert and update in one transaction
    rec.txn("UPDATE public.hist SET id = 30, v = 'moved' WHERE id = 4", {HIST: [(4,), (30,)]})
    rec.txn("INSERT INTO public.hist VALUES (3, 'back', 'small')", {HIST: [(3,)]})
    rec.txn(
        "INSERT INTO public.hist VALUES (6, 'new', 'b6'); UPDATE public.hist SET v = 'newer' WHERE id = 6",
        {HIST: [(6,)]},
    )
    rec.txn(f"UPDATE {ODD_SQL} SET k2 = 5 WHERE k1 = 'b'", {ODD: [("b", 1), ("b", 5)]})
    rec.txn(f"DELETE FROM {ODD_SQL} WHERE k1 = 'a' AND k2 = 2", {ODD: [("a", 2)]})
    capture_and_apply(conf, spark)
    _check(pg, kind, url, rec)

    rec.txn("UPDATE public.hist SET v = 'last' WHERE id = 5", {HIST: [(5,)]})
    rec.txn("TRUNCATE public.hist", {HIST: []})
    rec.txn("INSERT INTO public.hist VALUES (1, 'again', 'b1')", {HIST: [(1,)]})
    rec.txn(f"UPDATE {ODD_SQL} SET note = 'y' WHERE k1 = 'a'", {ODD: [("a", 1)]})
    capture_and_apply(conf, spark)
    _check(pg, kind, url, rec)

    report = verify(conf)
    assert report.ok, report.text()
    (tc,) = report.targets
    assert {c.table: c.compared for c in tc.tables} == {HIST: "its current versions", ODD: "its current versions"}
    assert "its current versions" in report.text()
    (st,) = status(conf).targets
    assert st.history == {HIST: "versions", ODD: "versions"}
    if kind in ("sqlite", "postgresql"):  # a current version changed by hand: verify --diff names that row alone
        sql = "UPDATE hist SET v = 'tampered' WHERE id = 1 AND _ml_end_lsn IS NULL"
        if kind == "sqlite":
            with sqlite3.connect(oracle.location(url)) as db:
                db.execute(sql)
        else:
            with psycopg2.connect(url) as conn, conn.cursor() as cur:
                cur.execute(sql.replace("hist", "public.hist"))
        report = verify(conf, diff=10)
        assert not report.ok
        (tc,) = report.targets
        (bad,) = [c for c in tc.tables if not c.equal]
        assert bad.table == HIST and bad.differing_rows == 1 and bad.compared == "its current versions"
