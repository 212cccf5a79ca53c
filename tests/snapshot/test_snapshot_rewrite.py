"""A table rewritten just after a snapshot's consistent point, before its chunks are read (TRUNCATE is not
MVCC-safe: a snapshot reading a table truncated after it finds it empty). The source empties the REPLICA IDENTITY FULL
table and fills it again with the same keys in one transaction, right after each snapshot's consistent point: the
snapshot must start again at a new point and load the refilled table whole (before the fix both the DuckDB and the
PostgreSQL target got 0 rows), and after catching up from the log each target must equal the source. verify, whose
source read has the same race, is then checked the same way."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import oracle
import psycopg2
import pytest
from snapshot_support import capture_once, target_urls, write_config

from mirrorline.apply import open_target
from mirrorline.pipeline import catch_up_target
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

ROWS = 1500
SMALL = Options(chunk_mb=0.02, progress=False)  # 2 heap blocks a chunk: several Spark tasks per load


class Refill:
    """Armed before a snapshot: as soon as a new replication slot has its consistent point, ``TRUNCATE events`` and
    insert the same keys with a new label, in one transaction: a rewrite just after the snapshot, before it is
    read."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.generation = 0
        self.error: BaseException | None = None
        self._armed = threading.Event()
        self.looked = threading.Event()  # it has seen the slots there are: only a new one sets it off
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="refill", daemon=True)

    def _loop(self) -> None:
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            seen: set[str] = set()
            try:
                with conn.cursor() as cur:
                    while not self._stop.wait(0.002):
                        cur.execute(
                            "SELECT slot_name FROM pg_replication_slots WHERE database = current_database() "
                            "AND confirmed_flush_lsn IS NOT NULL"
                        )
                        new = {r[0] for r in cur.fetchall()} - seen
                        seen |= new
                        self.looked.set()
                        if new and self._armed.is_set():
                            self._armed.clear()
                            self.generation += 1
                            cur.execute(
                                "BEGIN; TRUNCATE public.events; INSERT INTO public.events "
                                "SELECT i / 10, i %% 10, 'g' || %s FROM generate_series(0, %s) i; COMMIT",
                                (self.generation, ROWS - 1),
                            )
            finally:
                conn.close()
        except BaseException as e:
            self.error = e

    def arm(self) -> None:
        self._armed.set()

    def start(self) -> Refill:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None:
            raise self.error


def _target_rows(cfg: Any, name: str) -> list[tuple[Any, ...]]:
    t = open_target(cfg.targets[name])
    try:
        s = t.session()
        try:
            return list(s.query(f"SELECT a, b, label FROM {t.dialect.table('public.events')}"))
        finally:
            s.close()
    finally:
        t.close()


def test_snapshot_of_a_table_truncated_meanwhile_is_whole(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    pg.execute("CREATE TABLE public.events (a integer NOT NULL, b integer NOT NULL, label text)")
    pg.execute("ALTER TABLE public.events REPLICA IDENTITY FULL")
    pg.execute(f"INSERT INTO public.events SELECT i / 10, i % 10, 'g0' FROM generate_series(0, {ROWS - 1}) i")
    urls = target_urls(tmp_path, pg.cluster, ["duckdb", "postgresql"], target_dbs)
    cfg = write_config(tmp_path, pg.dsn, urls, {"public.events": {}}, slot="ml_" + uuid.uuid4().hex[:8])
    refill = Refill(pg.dsn).start()
    results = []
    try:
        for name in ("duckdb", "postgresql"):  # the first creates the main slot, the second a temporary one
            refill.arm()
            results.append(snapshot_target(cfg, name, options=SMALL))
            assert refill.generation == len(results)  # the table was rewritten just after the snapshot
    finally:
        refill.stop()
    got = {}
    for res in results:
        rows = _target_rows(cfg, str(res.target))
        got[res.target] = (res.rows["public.events"], len(rows), sorted({r[2] for r in rows}))
    # whole, and of one generation: the one the source held at the (new) consistent point
    assert got == {"duckdb": (ROWS, ROWS, ["g1"]), "postgresql": (ROWS, ROWS, ["g2"])}
    capture_once(cfg)
    for res in results:
        catch_up_target(cfg, str(res.target))
        oracle.assert_same(pg.dsn, str(res.target), urls[str(res.target)], "public.events")  # before verify
    report = verify(cfg)
    assert report.ok, report.text()
    # verify meets the same race: its own source read under a snapshot the table was truncated after must not see
    # it empty (a false difference); it takes a new point, where the refill is in the log and the targets catch up
    refill = Refill(pg.dsn).start()
    try:
        assert refill.looked.wait(60)  # it has seen the slots there already: only verify's new one sets it off
        refill.arm()
        report = verify(cfg)
        assert refill.generation == 1
    finally:
        refill.stop()
    assert report.ok, report.text()
    assert {c.source_rows for t in report.targets for c in t.tables} == {ROWS}
    for res in results:
        assert sorted({r[2] for r in _target_rows(cfg, str(res.target))}) == ["g1"]
