"""End to end into a Delta target: a real PostgreSQL (``logical_decoding_work_mem = 64kB``, so the large transaction
is streamed) through capture, the log and Spark into Delta tables, in both modes, with every kind of change made
certain to happen (a key change leaving a TOASTed column unsent, a TRUNCATE followed by inserts in one transaction,
a streamed transaction), read back by two independent readers: deltalake to Arrow, and DuckDB reading the Parquet
files of the tables' current versions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_support import assert_same, config_text, delta_parquet_rows

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.pipeline import Applier
from mirrorline.workload import TABLES, Workload, big_text, source_rows

pytestmark = [pytest.mark.pg, pytest.mark.spark]


@pytest.mark.parametrize("mode", ["update", "mirror"])
def test_every_kind_of_change_reaches_delta_tables(pg_cluster_factory: Any, spark: Any, tmp_path: Path, mode: str):
    import random

    cluster = pg_cluster_factory(logical_decoding_work_mem="64kB")
    dsn = cluster.dsn()
    work = Workload(dsn, seed={"update": 31, "mirror": 32}[mode])
    work.create()
    url = f"delta:///{tmp_path / 'lake'}"
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(config_text(dsn, tmp_path / "log", {"lake": (url, mode)}, max_changes=500))
    conf = cfg.load(conf_file)
    Capture(conf, once=True).run()
    applier = Applier(conf, spark=spark)
    try:
        work.run(transactions=150)
        first = work.next_id + 10_000_000
        cluster.execute(
            f"INSERT INTO public.accounts VALUES ({first}, 'toast', 1.00, true, '2024-01-01', "
            f"'{big_text(random.Random(5))}')"
        )
        Capture(conf, once=True).run()
        applier.catch_up()  # the TOASTed row is at the target before its key changes
        cluster.execute(
            f"UPDATE public.accounts SET id = {first + 1}, balance = 2.00 WHERE id = {first};"  # note: not sent
            "BEGIN; TRUNCATE public.events; INSERT INTO public.events VALUES (1, 1, 'after'), (2, 2, 'after'); COMMIT;"
        )
        work.large_transaction(3000)
        stats = Capture(conf, once=True).run()
        assert stats.streamed >= 1, "the large transaction was streamed"
        reports = applier.catch_up()
        assert reports and applier.positions()["lake"] == applier.log.durable()
    finally:
        applier.close()
    got = {r[0]: r for r in source_rows(dsn, "public.accounts")}
    assert got[str(first + 1)][5] is not None and len(got[str(first + 1)][5]) == 4000 and str(first) not in got
    assert_same(dsn, "delta", url)  # deltalake to Arrow
    for table in TABLES:  # DuckDB over the Parquet files of the current version
        assert delta_parquet_rows(url, table) == source_rows(dsn, table), table
