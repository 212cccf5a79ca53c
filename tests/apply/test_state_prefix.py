"""Two mirrorline instances share one target database (seed 001's replication prefix): each names its own
tables (applied positions, snapshot state, rejects) with its target's ``state_prefix``, so neither touches the
other's state; both replicate, both verify equal."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import oracle
import pytest
from snapshot_support import create_items, write_config

from mirrorline import config as C
from mirrorline.cli.main import main
from mirrorline.status import status

pytestmark = [pytest.mark.pg, pytest.mark.spark]


def _prefixed(targets: dict[str, str], prefix: str) -> dict[str, dict[str, str]]:
    return {name: {"url": url, "state_prefix": prefix} for name, url in targets.items()}


def test_two_instances_share_a_target_database(pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]) -> None:
    cluster = pg.cluster
    other = f"{pg.name}_b"
    cluster.create_database(other)
    target_dbs.append(other)  # dropped after the test (with its slot)
    dw = f"{pg.name}_dw"
    cluster.create_database(dw)
    target_dbs.append(dw)
    create_items(pg.dsn, rows=300)
    create_items(cluster.dsn(other), "public.parts", rows=200, start=5000)
    shared = {"dw": cluster.url(dw), "cache": f"sqlite:///{tmp_path / 'shared.db'}"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_config(tmp_path / "a", pg.dsn, _prefixed(shared, "a_"), {"public.items": {}})
    b = write_config(tmp_path / "b", cluster.dsn(other), _prefixed(shared, "b_"), {"public.parts": {}}, slot="ml_b")
    assert a.targets["dw"].state_prefix == "a_"
    for cfg in (a, b, a):
        assert main(["run", "--once", "-c", str(cfg.file)]) == 0
    pg.execute("UPDATE public.items SET qty = qty + 1 WHERE id < 50")
    cluster.execute("DELETE FROM public.parts WHERE id < 5050", other)
    for cfg, dsn, table in ((a, pg.dsn, "public.items"), (b, cluster.dsn(other), "public.parts")):
        assert main(["run", "--once", "-c", str(cfg.file)]) == 0
        oracle.assert_same(dsn, "postgresql", shared["dw"], table)  # read independently before verify is asked
        oracle.assert_same(dsn, "sqlite", shared["cache"], table)
        assert main(["verify", "-c", str(cfg.file)]) == 0
    own = {r[0] for r in cluster.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", dw)}
    assert {"a_applied", "a_snapshot", "b_applied", "b_snapshot", "items", "parts"} <= own
    assert not any(t.startswith("mirrorline_") for t in own)
    with sqlite3.connect(tmp_path / "shared.db") as c:
        names = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"a_applied", "b_applied", "items", "parts"} <= names and "mirrorline_applied" not in names
    for cfg, table in ((a, "public.items"), (b, "public.parts")):
        st = status(cfg)  # each instance sees its own state only
        assert all(t.state in ("live", "catching up") and t.position is not None for t in st.targets), st.targets
        assert all(set(t.tables) == {table} for t in st.targets), [(t.name, t.tables) for t in st.targets]
    for prefix, table in (("a_", "public.items"), ("b_", "public.parts")):  # each state table names its own only
        scopes = {r[0] for r in cluster.execute(f"SELECT scope FROM {prefix}applied", dw)}
        with sqlite3.connect(tmp_path / "shared.db") as c:
            scopes |= {r[0] for r in c.execute(f"SELECT scope FROM {prefix}applied")}
        named = {x.split(":", 1)[-1] for x in scopes if x}
        assert named == {table}, scopes


def test_state_prefix_is_validated(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text('[log]\npath = "l"\n[targets.t]\nurl = "sqlite:///t.db"\nstate_prefix = "A-b"\n')
    with pytest.raises(C.ConfigError, match=r"targets\.t\.state_prefix"):
        C.load(tmp_path / "m.toml")
