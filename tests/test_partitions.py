"""Partitioned tables (issue 35): a configured partitioned table is replicated as one table at every kind, its
partitions' changes published under its name (``publish_via_partition_root``): several levels, a default partition,
a partition attached with its columns in another order, rows moving between partitions, a TRUNCATE of the parent,
``DROP v, ADD c ... DEFAULT, ADD v`` in one statement.
A partition configured alone is replicated under its own name. Each target is read by the tests' own reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.pipeline import Applier
from mirrorline.snapshot.run import snapshot_target
from tests import oracle
from tests.pipeline_support import target_url

KINDS = ("postgresql", "sqlite", "duckdb", "delta")
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


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.parametrize("kind", KINDS)
def test_a_partitioned_table_is_one_table(pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, kind: str) -> None:
    pg.execute(DDL)
    url = target_url(kind, tmp_path, pg_cluster, f"pt_{kind[:2]}_{pg.name[-6:]}")
    lines = ["[source]", f'dsn = "{pg.dsn}"', "[log]", f'path = "{tmp_path / "log"}"', "[apply]", 'latency = "100ms"']
    lines += [f'[tables."{t}"]' for t in TABLES] + ["[targets.t]", f'url = "{url}"']
    (tmp_path / "m.toml").write_text("\n".join(lines) + "\n")
    conf = cfg.load(tmp_path / "m.toml")
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
