"""Generated histories through the real pipeline: the property test's generator
(:mod:`tests.compile_histories`: every op kind, key changes, columns left unsent, TRUNCATEs) replayed as SQL
transactions on a real PostgreSQL, each history on tables of its own, then captured, compiled on Spark in small units
(unit boundaries fall inside histories) and applied to one target of each kind. Column ``b`` holds large
incompressible text, so an update that does not set it leaves it TOASTed and unsent, as the generator's "unchanged"
marks say. Every table of every target is read back independently (:mod:`tests.oracle`) and ``verify`` is asked.
The seeds are fixed and printed."""

from __future__ import annotations

import hashlib
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import configs
import oracle
import psycopg2
import pytest
from compile_histories import History, random_histories
from pipeline_support import target_url

from mirrorline.capture.session import Capture
from mirrorline.log.reader import ChangeLog
from mirrorline.model import Op
from mirrorline.pipeline import Applier
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

SEED, HISTORIES = 1701, 16
KINDS = {"postgresql": "update", "sqlite": "mirror", "duckdb": "update", "delta": "mirror", "iceberg": "update"}


def big(v: str | None) -> str | None:
    """A value of ``b``: large and incompressible (stored out of line), the same for the same generated value."""
    if not v:
        return v
    seed = hashlib.sha256(v.encode()).hexdigest()
    return "".join(hashlib.sha256(f"{seed}{i}".encode()).hexdigest() for i in range(250))  # 16,000 characters


def _name(i: int, table: str) -> str:
    return f"public.h{i}_{table.partition('.')[2]}"


def _lit(v: str | None) -> str:
    return "NULL" if v is None else "'" + v.replace("'", "''") + "'"


def _statements(i: int, h: History) -> list[list[str]]:
    """The history's changes as SQL, one list of statements per transaction (the changes of one LSN)."""
    out: list[list[str]] = []
    for _, group in itertools.groupby(h.changes, key=lambda c: c.pos.lsn):
        txn = []
        for c in group:
            t = _name(i, c.table)
            new = c.new or {}
            sets = [f"a = {_lit(new.get('a'))}"] + ([] if "b" in c.unchanged else [f"b = {_lit(big(new.get('b')))}"])
            if c.op is Op.INSERT:
                txn.append(
                    f"INSERT INTO {t} VALUES ({_lit(c.key[0])}, {_lit(new.get('a'))}, {_lit(big(new.get('b')))})"
                )
            elif c.op is Op.UPDATE and c.old_key:
                txn.append(f"UPDATE {t} SET k = {_lit(c.key[0])}, {', '.join(sets)} WHERE k = {_lit(c.old_key[0])}")
            elif c.op is Op.UPDATE:
                txn.append(f"UPDATE {t} SET {', '.join(sets)} WHERE k = {_lit(c.key[0])}")
            elif c.op is Op.DELETE:
                txn.append(f"DELETE FROM {t} WHERE k = {_lit(c.key[0])}")
            else:
                txn.append(f"TRUNCATE {t}")
        out.append(txn)
    return out


def test_generated_histories_replicate_exactly_to_every_kind(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path):
    print(f"histories: seed {SEED}, {HISTORIES} of them")
    hs = random_histories(SEED, HISTORIES)
    tables = [_name(i, t) for i, h in enumerate(hs) for t in h.tables]
    for t in tables:
        pg.execute(f"CREATE TABLE {t} (k text PRIMARY KEY, a text, b text)")
    urls = {k: target_url(k, tmp_path, pg_cluster, f"hist_{k}_{pg.name[-6:]}") for k in KINDS}
    conf = configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms", "max_changes": 40},
        tables=tables,
        targets={k: {"url": url, "mode": KINDS[k]} for k, url in urls.items()},
    )
    Capture(conf, once=True).run()
    for k in KINDS:  # the tables are empty: loaded at once, everything else replicated
        snapshot_target(conf, k, options=Options(progress=False))

    conn = psycopg2.connect(pg.dsn)
    try:
        with conn.cursor() as cur:
            for i, h in enumerate(hs):  # each history's state before its unit, then its changes
                for t, rows in h.state.items():
                    for key, img in rows.items():
                        cur.execute(f"INSERT INTO {_name(i, t)} VALUES (%s, %s, %s)", (key[0], img["a"], big(img["b"])))
                conn.commit()
            for txns in itertools.zip_longest(*(_statements(i, h) for i, h in enumerate(hs))):
                for txn in txns:  # the histories interleaved, a transaction of each in turn
                    for stmt in txn or []:
                        cur.execute(stmt)
                    conn.commit()
    finally:
        conn.close()
    assert sum(len(h.changes) for h in hs) > 100, "enough changes for several units"
    assert any(c.op is Op.TRUNCATE for h in hs for c in h.changes)
    assert any(c.op is Op.UPDATE and c.old_key and "b" in c.unchanged for h in hs for c in h.changes)

    Capture(conf, once=True).run()
    logged = list(ChangeLog(conf.log.path).read())
    assert any(c.unchanged for c in logged), "updates left TOASTed values unsent"
    assert any(c.old_key and c.unchanged for c in logged), "... key changes too"
    applier = Applier(conf, spark=spark)
    try:
        assert len(applier.catch_up()) >= 3, "several units"
    finally:
        applier.close()
    for k, url in urls.items():
        for t in tables:
            oracle.assert_same(pg.dsn, k, url, t)
    report = verify(conf)
    assert report.ok, report.text()
    # the reader is no rubber stamp: one value changed behind replication is found
    t = next(t for t in tables if oracle.source(pg.dsn, t))
    name = t.partition(".")[2]
    with sqlite3.connect(urls["sqlite"].split(":///", 1)[1]) as lite:
        lite.execute(f'UPDATE "{name}" SET a = \'tampered\' WHERE rowid = (SELECT min(rowid) FROM "{name}")')
    with pytest.raises(AssertionError, match="tampered"):
        oracle.assert_same(pg.dsn, "sqlite", urls["sqlite"], t)
