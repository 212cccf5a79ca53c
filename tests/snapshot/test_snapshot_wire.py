"""Snapshots over the wire while a workload keeps changing the source: after catching up from the log, verify finds
every target equal to the source (PostgreSQL, SQLite, DuckDB targets)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import oracle
import pytest
from snapshot_support import Workload, capture_once, create_items, target_urls, write_config

from mirrorline.apply import open_target
from mirrorline.config import TargetConfig
from mirrorline.pipeline import catch_up_target
from mirrorline.snapshot import Options, consistent_position, snapshot_target
from mirrorline.snapshot.plan import SEQ_MAX
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

SMALL = Options(chunk_mb=0.04, progress=False)  # 5 blocks a chunk: many chunks even for small tables


def test_consistent_position_is_just_before_the_point() -> None:
    p = consistent_position(0x1505760)
    assert p.lsn == 0x150575F and p.seq == SEQ_MAX
    from mirrorline.position import Position

    assert Position(0x150575F, 10**6) <= p < Position(0x1505760, 0)


def test_snapshot_under_a_workload_then_catch_up_equals_source(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    create_items(pg.dsn, rows=3000)
    urls = target_urls(tmp_path, pg.cluster, ["postgresql", "sqlite", "duckdb", "delta", "iceberg"], target_dbs)
    cfg = write_config(tmp_path, pg.dsn, urls, {"public.items": {"actions": "IDU"}})
    work = Workload(pg.dsn, max_id=3000).start()
    try:
        first = snapshot_target(cfg, "postgresql", options=SMALL)  # creates the main slot: the log starts here
        before = work.ops
        second = snapshot_target(cfg, "sqlite", options=SMALL)  # a temporary slot: a later point
        third = snapshot_target(cfg, "duckdb", options=SMALL)
        fourth = snapshot_target(cfg, "delta", options=SMALL)
        fifth = snapshot_target(cfg, "iceberg", options=SMALL)
        assert work.ops > before  # the source changed while the snapshots ran
    finally:
        work.stop()
    assert first.created_slot and not second.created_slot
    assert first.position < second.position < third.position < fourth.position < fifth.position
    for res in (first, second, third, fourth, fifth):
        t = open_target(cfg.targets[res.target])  # type: ignore[index]
        assert t.applied_position() == res.position
        t.close()
    capture_once(cfg)
    for name in ("postgresql", "sqlite", "duckdb", "delta", "iceberg"):
        catch_up_target(cfg, name)
        oracle.assert_same(pg.dsn, name, urls[name], "public.items")  # read independently before verify is asked
    report = verify(cfg)
    assert report.ok, report.text()
    assert {t.target for t in report.targets} == {"postgresql", "sqlite", "duckdb", "delta", "iceberg"}
    assert all(c.source_rows > 2000 for t in report.targets for c in t.tables)


def test_a_chunk_task_run_twice_loads_its_rows_once(pg: Any, pg_cluster: Any, target_dbs: list[str]) -> None:
    """PostgreSQL's load from the tasks: Spark may run a task again (a lost executor, speculation); the chunk's record
    committed with its rows makes the second run load nothing, and report the rows the first committed."""
    import psycopg2

    from mirrorline.model import Column, TableSchema
    from mirrorline.snapshot.plan import copy_out_sql
    from mirrorline.snapshot.tasks import pipe_chunk

    table = 'public.odd "t.x'
    ddl = 'CREATE TABLE "odd ""t.x" (id integer PRIMARY KEY, v text)'
    src = psycopg2.connect(pg.dsn)
    src.autocommit = True
    src.cursor().execute(ddl + '; INSERT INTO "odd ""t.x" SELECT i, \'v\' || i FROM generate_series(1, 300) i')
    db = "tgt_" + uuid.uuid4().hex[:10]
    pg_cluster.create_database(db)
    target_dbs.append(db)
    ts = TableSchema(table, (Column("id", "integer", 23, nullable=False), Column("v", "text", 25)), ("id",))
    url = pg_cluster.url(db)
    target = open_target(TargetConfig("pg", url, "postgresql", url))
    try:
        target.ensure_schema([ts])
        loader = target.chunk_loader()
        assert loader is not None
        with target.transaction() as s:
            loader.prepare(s)
        fmt = loader.formats({table: ts})[table]
        assert fmt == "binary"  # the same built-in types on both sides
        exporter = psycopg2.connect(pg.dsn)
        exporter.set_session(isolation_level="REPEATABLE READ")
        cur = exporter.cursor()
        cur.execute("SELECT pg_export_snapshot()")
        snap = cur.fetchone()[0]
        spec = {
            "source_dsn": pg.dsn,
            "snapshot": snap,
            "copy_out": copy_out_sql(ts, None, fmt),
            "table": table,
            "chunk_id": 0,
            "sink": loader.sink,
            "sink_spec": loader.spec(ts, fmt, "load-1", 0),
        }
        first, second = pipe_chunk(spec), pipe_chunk(spec)
        exporter.close()
        assert (first["rows"], first["again"], first["rewritten"]) == (300, False, False)
        assert (second["rows"], second["again"]) == (300, True)
        tgt = psycopg2.connect(pg_cluster.url(db))
        with tgt.cursor() as c:
            c.execute('SELECT count(*), count(DISTINCT id) FROM "public"."odd ""t.x"')
            assert c.fetchone() == (300, 300)
            with target.transaction() as s:
                loader.forget(s, "load-1")
            c.execute("SELECT count(*) FROM public.mirrorline_snapshot_chunks")
            assert c.fetchone() == (0,)
        tgt.close()
    finally:
        target.close()
        src.close()
