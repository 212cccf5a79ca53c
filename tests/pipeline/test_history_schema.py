"""Schema changes of a table kept with its history, from a real source: in versions, an added column is NULL in the
versions before it, a dropped column stays (the versions before keep their values, the later ones hold NULL), a
renamed column keeps its values under the new name, a widened type holds the old values; soft deletes follow the
rules of the plain table (a dropped column goes). Read by the kinds' own clients."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from pipeline_support import capture_and_apply, target_url

from mirrorline.capture.session import Capture
from mirrorline.snapshot.run import snapshot_target

T = "public.hs"
DDL = """
CREATE TABLE public.hs (id integer PRIMARY KEY, a text, gone text, ren text, w integer);
INSERT INTO public.hs VALUES (1, 'a1', 'g1', 'r1', 1), (2, 'a2', 'g2', 'r2', 2);
"""
ALTER = """
ALTER TABLE public.hs ADD COLUMN c integer;
ALTER TABLE public.hs DROP COLUMN gone;
ALTER TABLE public.hs RENAME COLUMN ren TO ren2;
ALTER TABLE public.hs ALTER COLUMN w TYPE bigint;
"""


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize(
    ("kind", "mode"),
    [(k, "versions") for k in ("postgresql", "sqlite", "duckdb", "delta", "iceberg")]
    + [("sqlite", "soft_delete"), ("iceberg", "soft_delete")],
)
def test_schema_changes_of_a_table_kept_with_its_history(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str, mode: str
) -> None:
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"hs_{kind[:2]}_{mode[:2]}_{pg.name[-6:]}")
    conf = configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables={T: {"history": mode}},
        targets={"t": url},
    )
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    pg.execute("UPDATE public.hs SET a = 'a1b' WHERE id = 1")
    capture_and_apply(conf, spark)
    pg.execute(ALTER)
    pg.execute(
        "UPDATE public.hs SET a = 'a1c', c = 10, w = 9000000000 WHERE id = 1; DELETE FROM public.hs WHERE id = 2"
    )
    pg.execute("INSERT INTO public.hs VALUES (3, 'a3', 'r3', 3, 30)")
    capture_and_apply(conf, spark)
    loc = oracle.location(url)
    if mode == "versions":
        got = oracle.read(kind, loc, T, ["id", "a", "gone", "ren2", "w", "c", "_ml_end_lsn", "_ml_deleted"])
        assert got is not None
        rows = sorted((r[0], r[1], r[2], r[3], int(r[4]), r[5], r[6] is None, bool(r[7])) for r in got)
        assert rows == [
            (1, "a1", "g1", "r1", 1, None, False, False),
            (1, "a1b", "g1", "r1", 1, None, False, False),
            (1, "a1c", None, "r1", 9000000000, 10, True, False),
            (2, "a2", "g2", "r2", 2, None, False, True),
            (3, "a3", None, "r3", 3, 30, True, False),
        ]
    else:
        cols = [n for n, _ in oracle.columns(pg.dsn, T)]
        got = oracle.read(kind, loc, T, [*cols, "_ml_deleted"])
        assert got is not None
        assert sorted((r[0], r[1], r[2], int(r[3]), r[4], bool(r[5])) for r in got) == [
            (1, "a1c", "r1", 9000000000, 10, False),
            (2, "a2", "r2", 2, None, True),
            (3, "a3", "r3", 3, 30, False),
        ]
        assert "gone" not in _columns(kind, loc)  # (dropped, as in a plain table)


def _columns(kind: str, loc: str) -> list[str]:
    if kind == "sqlite":
        with sqlite3.connect(loc) as db:
            return [r[1] for r in db.execute("PRAGMA table_info(hs)")]
    assert kind == "iceberg"
    return [f.name for f in oracle.iceberg_table(loc, T).schema().fields]
