"""The driver route (compile/driver.py): while Spark warms up, a small unit is read from the log and folded on the
driver. Every named case of the rules gives its expected net changes (or its error) through the log and the NetBatch
layout; a bag table's copies survive the layout; and a pipeline whose Spark is still warming applies its first unit
this way, then takes the Spark routes once Spark is warm."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from changes import write_log
from compile_cases import CASES, pos, render
from compile_support import collect_result
from large_units import one_unit_pipeline

from mirrorline.compile.driver import fold_unit
from mirrorline.compile.reference import fold
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.writer import LogWriter
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.position import ZERO, Position


def _logged(tmp_path: Path, changes: list[Change]) -> Any:
    """The changes written to a log one transaction each (a change's position is then its transaction's)."""
    return write_log(tmp_path / "log", [], changes, per_txn=1, segment_changes=7)


def _positions(log: Any) -> dict[int, Position]:
    return {i: c.pos for i, c in enumerate(log.read(), start=1)}


VALID = [n for n, c in CASES.items() if c.error is None]
INVALID = [n for n, c in CASES.items() if c.error is not None]


@pytest.mark.parametrize("name", VALID)
def test_named_case(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    log = _logged(tmp_path, case.changes())
    end = max((c.pos for c in log.read()), default=ZERO)
    batch = fold_unit(log, ZERO, end, (), case.actions, {}, len(case.changes()))
    got = collect_result(batch)
    assert render(got) == case.expected
    want = fold(log.read(), case.actions or None)  # the rules on the same logged changes
    assert (got.tables, got.rows(), got.truncated) == (want.tables, want.rows(), want.truncated)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_case_raises_its_error(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    assert case.error is not None
    first_op, first_line, second_op, second_line, key, table = case.error
    log = _logged(tmp_path, case.changes())
    at = _positions(log)
    with pytest.raises(InvalidSequenceError) as e:
        fold_unit(log, ZERO, max(at.values()), (), case.actions, {}, len(at))
    assert (e.value.table.partition(".")[2], e.value.key) == (table.partition(".")[2], key)
    assert (e.value.context["first_op"], e.value.first_pos) == (first_op, at[first_line])
    assert (e.value.context["second_op"], e.value.second_pos) == (second_op, at[second_line])
    assert pos(first_line) is not None


def test_a_bag_tables_copies_survive_the_layout(tmp_path: Path) -> None:
    t = "public.bag"
    row = {"a": "1", "b": "x"}
    changes = [Change(ZERO, 0, 1, t, Op.INSERT, ("1", "x"), row) for _ in range(3)]
    changes.append(Change(ZERO, 0, 1, t, Op.DELETE, ("1", "x")))
    log = _logged(tmp_path, changes)
    end = max(c.pos for c in log.read())
    bags = {t: ("a", "b")}
    batch = fold_unit(log, ZERO, end, (), {}, bags, 4)
    assert batch.rows is not None and batch.rows.num_rows == 2  # two copies to insert
    got = collect_result(batch, bags)
    assert got.rows() == fold(log.read(), None, bags).rows()


@pytest.mark.spark
def test_a_pipeline_applies_its_first_unit_on_the_driver_while_spark_warms(tmp_path: Path, spark: Any) -> None:
    from mirrorline.compile.warmup import WarmUp

    schema = TableSchema("public.t", (Column("id", "integer", nullable=False), Column("v", "text")), ("id",))
    first = [Change(ZERO, 0, 1, "public.t", Op.INSERT, (str(i),), {"id": str(i), "v": f"v{i}"}) for i in range(50)]
    first += [Change(ZERO, 0, 1, "public.t", Op.UPDATE, ("3",), {"id": "3", "v": "new"})]
    write_log(tmp_path / "log", [schema], first, per_txn=10, segment_changes=100)
    release = threading.Event()
    warm = WarmUp(lambda: spark, warm=lambda s: float(release.wait(60)))  # Spark "still warming"
    a = one_unit_pipeline(tmp_path, spark=spark, warm_up=warm)
    try:
        report = a.step()
        assert report is not None and a.compiler.last_route == "driver"
        with sqlite3.connect(tmp_path / "t.db") as con:
            rows = con.execute("SELECT id, v FROM t ORDER BY id").fetchall()
        assert len(rows) == 50 and rows[3] == (3, "new")
        release.set()
        warm.wait(60)
        with LogWriter(tmp_path / "log", segment_changes=100) as w:
            w.add_transaction(5000, 2, [Change(ZERO, 0, 2, "public.t", Op.DELETE, ("4",))])
        assert a.step() is not None and a.compiler.last_route != "driver"  # Spark is warm: its routes
        with sqlite3.connect(tmp_path / "t.db") as con:
            assert con.execute("SELECT count(*) FROM t").fetchone() == (49,)
    finally:
        release.set()
        a.close()
