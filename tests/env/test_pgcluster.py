"""The harness's throwaway PostgreSQL: logical decoding works on it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.pg


def test_cluster_runs_with_logical_wal_level(pg):
    assert pg.execute("SHOW wal_level") == [("logical",)]


def test_logical_replication_slot_decodes_a_change(pg):
    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("SELECT pg_create_logical_replication_slot('harness_slot', 'test_decoding')")
    pg.execute("INSERT INTO t VALUES (1, 'one')")
    rows = pg.execute("SELECT data FROM pg_logical_slot_get_changes('harness_slot', NULL, NULL)")
    data = [r[0] for r in rows]
    assert any("table public.t: INSERT: id[integer]:1 v[text]:'one'" in d for d in data), data


def test_dedicated_cluster_takes_its_own_settings(pg_cluster_factory):
    cluster = pg_cluster_factory(logical_decoding_work_mem="64kB")
    assert cluster.execute("SHOW logical_decoding_work_mem") == [("64kB",)]
