"""History mode exactly once under crashes: ``run`` with ``public.accounts`` kept in versions and ``public.ledger``
with soft deletes (SQLite, PostgreSQL and Iceberg targets) killed with SIGKILL at random moments while the source
keeps changing (key changes, TOASTed values left unsent, deletes and re-inserts, large streamed transactions),
restarted each time. Afterwards, read by the kinds' own clients: each table's current rows are the source's, and
each key's versions form one chain (every version but the last ended, a version not deleted ending where the next
starts, none twice): a unit applied again would have added a version or broken the chain."""

from __future__ import annotations

import random
from collections import defaultdict
from itertools import pairwise
from typing import Any

import oracle
import pytest
from crash_support import KILLS, SourceLoad, finish, kill_loop
from pipeline_support import config_text, target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.workload import Workload

pytestmark = [pytest.mark.pg, pytest.mark.slow, pytest.mark.timeout(600)]

TABLES = {
    "public.accounts": {"history": "versions"},
    "public.ledger": {"history": "soft_delete"},
    "public.events": {},
}


def _chains(pg: Any, kind: str, url: str) -> None:
    table, key = "public.accounts", 0  # (id, its first column)
    got = oracle.versions(pg.dsn, kind, url, table)
    by_key: dict[Any, list[Any]] = defaultdict(list)
    for v in got:
        by_key[v[0][key]].append(v)
    for k, vs in by_key.items():
        assert len({v[1] for v in vs}) == len(vs), (kind, k, "a version twice")
        assert all(v[2] is not None for v in vs[:-1]), (kind, k, "an earlier version left open")
        for a, b in pairwise(vs):
            assert a[2] <= b[1] and (a[3] or a[2] == b[1]), (kind, k, a, b)
    current = sorted(str(v[0]) for v in got if v[2] is None)
    assert current == sorted(str(r) for r in oracle.source(pg.dsn, table).elements())
    loc = oracle.location(url)
    cols = oracle.columns(pg.dsn, "public.ledger")
    rows = oracle.read(kind, loc, "public.ledger", [*(n for n, _ in cols), "_ml_deleted"])
    assert rows is not None
    kept = sorted(
        str(tuple(oracle.value(t, v) for (_, t), v in zip(cols, r[:-1], strict=True))) for r in rows if not r[-1]
    )
    assert kept == sorted(str(r) for r in oracle.source(pg.dsn, "public.ledger").elements())
    oracle.assert_same(pg.dsn, kind, url, "public.events")


def test_run_killed_at_random_with_tables_kept_with_their_history(pg, pg_cluster, tmp_path):
    work = Workload(pg.dsn, seed=21)
    work.create()
    urls = {
        "lite": target_url("sqlite", tmp_path, pg_cluster, "lite"),
        "pgt": target_url("postgresql", tmp_path, pg_cluster, f"crash_hist_{pg.name[-6:]}"),
        "ice": target_url("iceberg", tmp_path, pg_cluster, "ice"),
    }
    targets = {n: (u, "update") for n, u in urls.items()}
    conf_file = tmp_path / "m.toml"
    conf_file.write_text(config_text(pg.dsn, tmp_path / "log", targets, max_changes=200, tables=TABLES))
    Capture(cfg.load(conf_file), once=True).run()
    load = SourceLoad(work).start()
    try:
        landed, mid_apply = kill_loop(["run", "-c", str(conf_file)], tmp_path, random.Random(5))
    finally:
        load.stop()
    assert landed >= KILLS and mid_apply >= KILLS // 2
    conf_file.write_text(config_text(pg.dsn, tmp_path / "log", targets, max_changes=5000, tables=TABLES))
    finish(["run", "--once", "-c", str(conf_file)], tmp_path)
    for name, kind in (("lite", "sqlite"), ("pgt", "postgresql"), ("ice", "iceberg")):
        _chains(pg, kind, urls[name])
