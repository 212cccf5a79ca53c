"""Worktable rows of one unit, derived once and shared by every target applying it (NetBatch.derive, ArrowStager)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from mirrorline.apply import rows as work_rows
from mirrorline.apply.stage import ArrowStager
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.model import Column, TableSchema
from mirrorline.position import Position

TS = TableSchema("public.t", (Column("id", "integer"), Column("v", "text")), ("id",))


def _batch() -> NetBatch:
    rows = [
        {"table": "public.t", "kind": "D", "key": ["1"], "new": None, "unchanged": [], "lsn": 5, "seq": 0},
        {"table": "public.t", "kind": "U", "key": ["3"], "new": [("id", "3"), ("v", "c")], "unchanged": [],
         "lsn": 6, "seq": 0},
        {"table": "public.t", "kind": "U", "key": ["2"], "new": [("id", "2"), ("v", "b")], "unchanged": [],
         "lsn": 7, "seq": 0},
        {"table": "public.t", "kind": "I", "key": ["4"], "new": [("id", "4"), ("v", "d")], "unchanged": [],
         "lsn": 8, "seq": 0},
    ]  # fmt: skip
    return NetBatch(Position(1, 0), Position(9, 0), ["public.t"], rows=pa.Table.from_pylist(rows, schema=NET_ARROW))


def test_derive_computes_once_per_key_while_others_wait() -> None:
    batch = _batch()
    calls: list[str] = []

    def make() -> str:
        calls.append("x")
        time.sleep(0.05)  # the other threads arrive while it runs
        return "value"

    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(batch.derive("k", make))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["value"] * 4 and calls == ["x"]
    assert batch.derive("other", lambda: "second") == "second"


def test_derive_does_not_remember_a_failure_and_release_drops_what_it_derived() -> None:
    batch = _batch()

    def fail() -> str:
        raise OSError("disk full")

    with pytest.raises(OSError):
        batch.derive("k", fail)
    assert batch.derive("k", lambda: "then") == "then"
    batch.release()
    assert batch.derive("k", lambda: "after release") == "after release"


def test_targets_of_one_unit_share_its_worktable_rows() -> None:
    """Two targets' stagers of the same batch get the same flattened rows (one flatten), in key order."""
    batch = _batch()
    a, b = ArrowStager(batch, whole=True), ArrowStager(batch, whole=True)
    for kind in work_rows.KINDS:
        assert a.rows(TS, kind) is b.rows(TS, kind)
    updates = a.rows(TS, "U")
    assert updates is not None and updates.column("v").to_pylist() == ["b", "c"]
    other = ArrowStager(_batch(), whole=True)  # another unit: its own rows
    assert other.rows(TS, "U") is not updates
    assert other.rows(TS, "U") == updates
