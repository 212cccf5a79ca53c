"""Tables without a primary key (REPLICA IDENTITY FULL) are bags of rows, end to end: a real PostgreSQL
through capture, the log and Spark into one target of each kind, with identical rows, one DELETE removing two of
them, an update of one copy, rows differing only in a text or json column, a TOASTed value left unsent by an update
of one copy, and a TRUNCATE; every target compared with the source row for row, duplicates counted, through each
target's own client."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import configs
import pytest
from pipeline_support import target_rows, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.errors import ApplyError
from mirrorline.pipeline import Applier
from mirrorline.workload import COLUMNS, big_text, source_rows

pytestmark = [pytest.mark.pg, pytest.mark.spark]

TABLE = "public.hist"
KINDS = ["postgresql", "sqlite", "duckdb", "delta", "iceberg"]
DDL = (
    "CREATE TABLE public.hist (a integer NOT NULL, note text, doc json, big text);"
    "ALTER TABLE public.hist REPLICA IDENTITY FULL"
)
ONE = "ctid = (SELECT ctid FROM public.hist WHERE {} LIMIT 1)"


def _config(pg: Any, tmp_path: Path, urls: dict[str, str], latency: str = "100ms") -> cfg.Config:
    return configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": latency},
        tables=[TABLE],
        targets=urls,
    )


def _same(pg: Any, urls: dict[str, str]) -> None:
    src = source_rows(pg.dsn, TABLE)
    for name, url in urls.items():
        got = target_rows(name, url, TABLE)
        assert got == src, f"{name}: source {src}, target {got}"


@pytest.fixture
def hist_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(COLUMNS, TABLE, ["a", "note", "doc", "big"])


def test_bags_of_rows_replicate_exactly(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, hist_columns: None):
    pg.execute(DDL)
    urls = {k: target_url(k, tmp_path, pg_cluster, f"bag_{k}_{pg.name[-6:]}") for k in KINDS}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    big = big_text(random.Random(3))
    applier = Applier(conf, spark=spark)
    try:

        def step(sql: str) -> None:
            pg.execute(sql)
            Capture(conf, once=True).run()
            assert applier.catch_up()
            _same(pg, urls)

        step(
            "INSERT INTO public.hist VALUES (1, 'x', '{\"k\": 1}', NULL), (1, 'x', '{\"k\": 1}', NULL), "
            "(1, 'y', '{\"k\":  1}', NULL), (3, 'p', NULL, NULL), (3, 'q', NULL, NULL), (6, NULL, NULL, NULL), "
            f"(6, NULL, NULL, NULL), (6, '', NULL, NULL), (2, 'toast', NULL, '{big}'), (2, 'toast', NULL, '{big}')"
        )
        assert len(source_rows(pg.dsn, TABLE)) == 10
        # one DELETE removes two identical rows
        step("DELETE FROM public.hist WHERE a = 1 AND note = 'x'")
        # rows differing only in text (or json) are different rows; an update of one copy of two
        step(
            "UPDATE public.hist SET note = 'p2' WHERE note = 'p';"
            f"UPDATE public.hist SET a = 7 WHERE {ONE.format('a = 6 AND note IS NULL')};"
            f"UPDATE public.hist SET a = 4 WHERE {ONE.format('a = 2')};"  # big is TOASTed and not sent
            "UPDATE public.hist SET note = 'z' WHERE doc::text = '{\"k\":  1}'"
        )
        # copies come and go inside one unit; one copy of several deleted; a copy added to a row already there
        step(
            "INSERT INTO public.hist VALUES (5, 'd', NULL, NULL), (5, 'd', NULL, NULL);"
            f"DELETE FROM public.hist WHERE {ONE.format('a = 5')};"
            "INSERT INTO public.hist SELECT * FROM public.hist WHERE a = 4;"
            f"DELETE FROM public.hist WHERE {ONE.format('a = 2')};"
            "INSERT INTO public.hist VALUES (3, 'q', NULL, NULL)"
        )
        step(
            "BEGIN; TRUNCATE public.hist; INSERT INTO public.hist VALUES (8, 'a', NULL, NULL), (8, 'a', NULL, NULL);"
            "DELETE FROM public.hist WHERE a = 8; INSERT INTO public.hist VALUES (9, 'b', NULL, NULL); COMMIT"
        )
        assert applier.catch_up() == [], "nothing is applied twice"
    finally:
        applier.close()
    assert source_rows(pg.dsn, TABLE) == [("9", "b", None, None)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_missing_at_the_target_stops_naming_the_delete(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, hist_columns: None, kind: str
):
    """Two copies deleted at the source, one of them already gone at the target: the bulk delete finds fewer copies
    than the unit deletes, the failure path names the delete that finds none, and the position stays."""
    pg.execute(DDL)
    urls = {kind: target_url(kind, tmp_path, pg_cluster, f"bagm_{kind}_{pg.name[-6:]}")}
    conf = _config(pg, tmp_path, urls)
    Capture(conf, once=True).run()
    pg.execute("INSERT INTO public.hist VALUES (1, 'x', NULL, NULL), (1, 'x', NULL, NULL), (2, 'y', NULL, NULL)")
    Capture(conf, once=True).run()
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
        _same(pg, urls)
        target = applier.targets[kind]
        if kind == "delta":  # one copy taken away by another writer of the Delta table
            from deltalake import DeltaTable, write_deltalake

            dt = DeltaTable(str(target.path(TABLE)))  # type: ignore[attr-defined]
            rows = dt.to_pyarrow_table()
            first = rows["a"].to_pylist().index(1)
            write_deltalake(dt, rows.take([i for i in range(rows.num_rows) if i != first]), mode="overwrite")
        elif kind == "iceberg":  # the same by another writer of the Iceberg table
            import oracle

            it = oracle.iceberg_table(urls[kind].split(":///", 1)[1], TABLE)
            rows = it.scan().to_arrow()
            first = rows["a"].to_pylist().index(1)
            it.overwrite(rows.take([i for i in range(rows.num_rows) if i != first]))
        else:
            s = target.connect()
            s.begin()
            s.execute(
                f"DELETE FROM {target.dialect.table(TABLE)} WHERE {target.dialect.row_id} IN "
                f"(SELECT {target.dialect.row_id} FROM {target.dialect.table(TABLE)} WHERE a = 1 LIMIT 1)"
            )
            s.commit()
            s.close()
        before = applier.positions()[kind]
        pg.execute("DELETE FROM public.hist WHERE a = 1; DELETE FROM public.hist WHERE a = 2")
        Capture(conf, once=True).run()
        with pytest.raises(ApplyError, match=r"delete on public.hist key \['1', 'x', None, None\]") as e:
            applier.catch_up()
        assert "at 0/" in str(e.value)
        assert applier.positions()[kind] == before
        assert target_rows(kind, urls[kind], TABLE) == [("1", "x", None, None), ("2", "y", None, None)]
    finally:
        applier.close()
