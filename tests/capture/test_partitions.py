"""Partitioned tables: a configured partitioned table is replicated as one table at every kind, its
partitions' changes published under its name (``publish_via_partition_root``): several levels, a default partition,
a partition attached with its columns in another order, rows moving between partitions, a TRUNCATE of the parent,
``DROP v, ADD c ... DEFAULT, ADD v`` in one statement. Partitions attached with rows, detached, dropped or truncated
alone (nothing sent) stop the table at the target until it is loaded again; those that change no row go on.
A partition configured alone is replicated under its own name. Each target is read by the tests' own reader."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from pipeline_support import target_url
from waiting import wait_until

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.pipeline import Applier
from mirrorline.snapshot.run import snapshot_target
from mirrorline.status import status
from mirrorline.verify import verify

KINDS = ("postgresql", "sqlite", "duckdb", "delta", "iceberg")
TABLES = ("public.part", "public.solo_a")

DDL = """
CREATE TABLE public.part (id integer, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE public.part_eu PARTITION OF public.part FOR VALUES IN ('eu');
CREATE TABLE public.part_us PARTITION OF public.part FOR VALUES IN ('us') PARTITION BY RANGE (id);
CREATE TABLE public.part_us_lo PARTITION OF public.part_us FOR VALUES FROM (MINVALUE) TO (1000);
CREATE TABLE public.part_us_hi PARTITION OF public.part_us FOR VALUES FROM (1000) TO (MAXVALUE);
CREATE TABLE public.part_asia (v text, region text NOT NULL, id integer NOT NULL);
ALTER TABLE public.part ATTACH PARTITION public.part_asia FOR VALUES IN ('asia');
CREATE TABLE public.part_rest PARTITION OF public.part DEFAULT;
CREATE TABLE public.solo (id integer PRIMARY KEY, v text) PARTITION BY RANGE (id);
CREATE TABLE public.solo_a PARTITION OF public.solo FOR VALUES FROM (0) TO (100);
CREATE TABLE public.solo_b PARTITION OF public.solo FOR VALUES FROM (100) TO (200);
INSERT INTO public.part VALUES (1, 'eu', 'a'), (2, 'us', 'b'), (2000, 'us', 'c'), (3, 'asia', 'd'), (4, 'mars', 'e');
INSERT INTO public.solo VALUES (1, 'in a'), (150, 'in b');
"""

CHANGES = [
    "INSERT INTO public.part VALUES (10, 'eu', 'x'), (11, 'us', 'y'), (1011, 'us', 'z'), (12, 'asia', 'w'),"
    " (13, 'venus', 'q'); INSERT INTO public.solo VALUES (2, 'a2'), (151, 'b2')",
    # rows moving between partitions (and levels), updates in place, a delete from a partition named directly
    "UPDATE public.part SET region = 'us' WHERE id = 1; UPDATE public.part SET id = 5000 WHERE id = 2;"
    "UPDATE public.part SET region = 'eu' WHERE id = 3; UPDATE public.part_us_hi SET v = 'direct' WHERE id = 2000;"
    "UPDATE public.part SET v = v || '!' WHERE region = 'asia'; DELETE FROM public.part_rest WHERE id = 4;"
    "UPDATE public.solo SET v = 'moved' WHERE id = 2; UPDATE public.solo SET id = 160 WHERE id = 1",
    "BEGIN; TRUNCATE public.part; INSERT INTO public.part VALUES (7, 'asia', 'after'), (8, 'eu', NULL); COMMIT",
    # case 4 on a partitioned table, capture started again before it: a column dropped, one added with a default,
    # and one of the dropped one's name added, in one statement
    "ALTER TABLE public.part DROP v, ADD COLUMN c integer NOT NULL DEFAULT 7, ADD v text;"
    "INSERT INTO public.part (id, region, c, v) VALUES (20, 'eu', 1, 'new v'), (21, 'asia', 2, NULL);"
    "UPDATE public.part SET v = 'set' WHERE id = 7",
]


def _config(pg: Any, tmp_path: Path, tables: Iterable[str] | dict[str, dict[str, Any]], url: str) -> cfg.Config:
    """``tables`` replicated to the one target ``t`` at ``url``."""
    return configs.load(
        tmp_path / "m.toml",
        source=pg.dsn,
        log=tmp_path / "log",
        apply={"latency": "100ms"},
        tables=tables,
        targets={"t": url},
    )


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_a_partitioned_table_is_one_table(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str) -> None:
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"pt_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, TABLES, url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    for t in TABLES:
        oracle.assert_same(pg.dsn, kind, url, t)
    applier = Applier(conf, spark=spark)
    try:
        for sql in CHANGES:
            pg.execute(sql)
            Capture(conf, once=True).run()
            applier.catch_up()
            for t in TABLES:
                oracle.assert_same(pg.dsn, kind, url, t)
    finally:
        applier.close()


EVENTS_DDL = """
CREATE TABLE public.ev (id integer, d date, v text, PRIMARY KEY (id, d)) PARTITION BY RANGE (d);
CREATE TABLE public.ev_2024 PARTITION OF public.ev FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
CREATE TABLE public.ev_2025 PARTITION OF public.ev FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE public.ev_2026 PARTITION OF public.ev FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
INSERT INTO public.ev SELECT g, date '2024-01-01' + g, 'v' || g FROM generate_series(1, 600) g;
CREATE TABLE public.ev_old (v text, d date NOT NULL, id integer NOT NULL);
INSERT INTO public.ev_old VALUES ('old', '2020-05-05', 1), ('old', '2020-06-06', 2);
"""

# what the source does to a partition that logical decoding does not send, and whether the targets must stop the
# table (the rows they hold are no longer the source's) or go on
PARTITION_EVENTS = [
    (
        "a partition created empty, rows through the parent",
        "CREATE TABLE public.ev_2027 PARTITION OF public.ev FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');"
        "INSERT INTO public.ev VALUES (1000, '2027-02-02', 'new year')",
        False,
    ),
    ("a partition rewritten by VACUUM FULL", "VACUUM FULL public.ev_2024", False),
    (
        "the parent truncated (sent)",
        "TRUNCATE public.ev; INSERT INTO public.ev SELECT g, date '2025-01-01' + g, "
        "'again' || g FROM generate_series(1, 300) g",
        False,
    ),
    (
        "a table attached with rows",
        "ALTER TABLE public.ev ATTACH PARTITION public.ev_old FOR VALUES FROM ('2020-01-01') TO ('2021-01-01')",
        True,
    ),
    ("a partition truncated alone", "TRUNCATE public.ev_2025", True),
    (
        "a partition detached with its rows",
        "INSERT INTO public.ev VALUES (5, '2026-03-03', 'x');ALTER TABLE public.ev DETACH PARTITION public.ev_2026",
        True,
    ),
    ("a partition dropped with its rows", "DROP TABLE public.ev_old", True),
]


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_partitions_attached_detached_truncated_or_dropped(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str
) -> None:
    """Every event that changes which rows a partitioned table holds without a change logged stops the table at
    the target until it is loaded again; those that do not change its rows (or are sent) go on. Each event comes
    while capture is stopped (each capture is a run of its own), then a change of the table."""
    pg.execute(EVENTS_DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"pe_{kind[:2]}_{pg.name[-6:]}")
    conf = _config(pg, tmp_path, ["public.ev"], url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    oracle.assert_same(pg.dsn, kind, url, "public.ev")
    applier = Applier(conf, spark=spark)
    verified = False
    try:
        for i, (what, sql, stops) in enumerate(PARTITION_EVENTS):
            pg.execute(sql)
            Capture(conf, once=True).run()
            # before the table's next change: status says so already
            said = {t.name: t.stopped_tables for t in status(conf).targets}
            assert ("public.ev" in said["t"]) == stops, f"{what}: {said}"
            if stops and not verified:  # and verify agrees: not comparable, with the reason, never a difference
                report = verify(conf)
                (ev,) = report.targets[0].tables
                assert "changed at the source with nothing logged" in ev.not_comparable, report.text()
                assert ev.equal and not ev.same and report.ok, report.text()
                verified = True
            pg.execute(f"INSERT INTO public.ev VALUES ({2000 + i}, '2027-05-05', 'after: {what}')")
            Capture(conf, once=True).run()
            applier.catch_up(held_ok=True)
            held = applier.held()
            if not stops:
                assert held == {}, f"{what}: stopped needlessly: {held}"
                oracle.assert_same(pg.dsn, kind, url, "public.ev")
                continue
            assert list(held) == [("t", "public.ev")], f"{what}: not stopped ({held})"
            assert "not the source's" in str(held["t", "public.ev"]), held
            applier.close()
            snapshot_target(conf, "t", tables=["public.ev"])
            applier = Applier(conf, spark=spark)
            pg.execute(f"UPDATE public.ev SET v = v || ' again' WHERE id = {2000 + i}")
            Capture(conf, once=True).run()
            applier.catch_up()
            assert applier.held() == {}, f"{what}: still stopped after the reload"
            oracle.assert_same(pg.dsn, kind, url, "public.ev")
    finally:
        applier.close()


def test_partition_looks_compared() -> None:
    """The pure comparison of two looks: what appeared, went, or had its storage replaced with its columns kept."""
    from mirrorline.capture import partitions as p

    a = p.Leaf(1, "public.a", 100, 8192, "id integer")
    b = p.Leaf(2, "public.b", 200, 0, "id integer")
    before = {10: {1: a, 2: b}}
    assert p.changes(before, before) == []
    assert p.changes({}, before) == []  # a root the last look lacks: nothing known of it
    c = p.Leaf(3, "public.c", 300, 8192, "id integer")
    now = {10: {1: p.Leaf(1, "public.a", 101, 8192, "id integer"), 3: c}}
    assert [(x.kind, x.leaf.relid) for x in p.changes(before, now)] == [("added", 3), ("removed", 2), ("refilled", 1)]
    rewritten = {10: {1: p.Leaf(1, "public.a", 101, 8192, "id bigint"), 2: p.Leaf(2, "public.b", 201, 0, "id integer")}}
    assert p.changes(before, rewritten) == []  # an ALTER rewrote one; the other held no pages
    look = p.Look(5, 9, now, (p.Suspect(10, a, 5, 9),))
    assert p.from_json(p.to_json(look)) == look
    with pytest.raises(ValueError):
        p.from_json({"roots": {"x": []}})


@pytest.mark.pg
@pytest.mark.spark
def test_detached_partitions_kept_at_the_targets(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path) -> None:
    """``detached_partitions = "keep"``: a partition detached with its rows, and one dropped with its rows, leave
    their rows at the target (an archive), nothing stops, and ``verify`` says the table is not comparable rather
    than different."""
    from mirrorline.cli.main import main

    pg.execute(EVENTS_DDL)
    url = target_url("sqlite", tmp_path, pg_cluster, "keep")
    conf = _config(pg, tmp_path, {"public.ev": {"detached_partitions": "keep"}}, url)
    Capture(conf, once=True).run()
    snapshot_target(conf, "t")
    dropped = oracle.source(pg.dsn, "public.ev_2025")
    pg.execute("ALTER TABLE public.ev DETACH PARTITION public.ev_2024")
    pg.execute("DROP TABLE public.ev_2025")
    pg.execute("INSERT INTO public.ev VALUES (3000, '2026-06-06', 'later')")
    Capture(conf, once=True).run()
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
        assert applier.held() == {}
    finally:
        applier.close()
    assert all(not t.stopped_tables for t in status(conf).targets)
    got = oracle.target("sqlite", url, "public.ev", oracle.columns(pg.dsn, "public.ev"))
    assert got == oracle.source(pg.dsn, "public.ev") + oracle.source(pg.dsn, "public.ev_2024") + dropped
    assert main(["verify", "-c", str(conf.file)]) == 0


def _equal(pg: Any, kind: str, url: str, table: str) -> bool:
    try:
        oracle.assert_same(pg.dsn, kind, url, table)
    except Exception:
        return False
    return True


@pytest.mark.pg
@pytest.mark.spark
def test_run_loads_a_marked_table_again_by_itself(pg: Any, pg_cluster: Any, tmp_path: Path) -> None:
    """A live ``run`` with a SQLite and a PostgreSQL target: a partition detached with its rows, then one truncated
    alone. Each time every target stops the table, ``run`` loads it again there by itself, and the other table stays
    current meanwhile."""
    import time

    from crash_support import mirrorline_process

    pg.execute(
        EVENTS_DDL
        + "CREATE TABLE public.other (id integer PRIMARY KEY, v text); INSERT INTO public.other VALUES (1, 'a');"
    )
    urls = {
        "lite": target_url("sqlite", tmp_path, pg_cluster, "lite"),
        "pg": target_url("postgresql", tmp_path, pg_cluster, f"rl_{pg.name[-6:]}"),
    }
    kinds = {"lite": "sqlite", "pg": "postgresql"}
    cfg = configs.write(
        tmp_path / "m.toml",
        source=pg.dsn,
        log="log",
        apply={"latency": "100ms"},
        tables=["public.ev", "public.other"],
        targets=urls,
    )

    def current() -> bool:
        return all(_equal(pg, kinds[n], u, t) for n, u in urls.items() for t in ("public.ev", "public.other"))

    log = tmp_path / "run.log"
    wait = partial(wait_until, timeout=180.0, interval=0.5, context=lambda: log.read_text()[-3000:])
    proc = mirrorline_process("run", "-c", str(cfg), log_file=log)
    try:
        wait(current, what="every target is current")
        for i, sql in enumerate(
            [
                "INSERT INTO public.ev VALUES (5, '2026-03-03', 'x');"
                "ALTER TABLE public.ev DETACH PARTITION public.ev_2026",
                "TRUNCATE public.ev_2025",
            ]
        ):
            pg.execute(sql)
            time.sleep(6)  # (capture's look at the partitions comes every 5 s)
            pg.execute(
                f"INSERT INTO public.ev VALUES ({100 + i}, '2024-02-02', 'after'); UPDATE public.other SET v = 'v{i}'"
            )
            wait(
                lambda i=i: log.read_text().count("loaded again") >= 2 * (i + 1),
                what=f"the table is loaded again after event {i}",
            )
            wait(current, what=f"every target is current after event {i}")
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(60)
