"""The small-unit compiler (mirrorline.compile.small): one plan reused for every unit, no shuffle, rows back through
Arrow. It must give exactly what the general path and the reference give, unit after unit on the same plan."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from compile_cases import CASES, pos, render, unit
from compile_histories import Picker, inject, pack, random_histories, unpack
from compile_support import changes_frame, collect_result
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorline.compile.reference import Actions, NetResult, apply_net, fold, replay
from mirrorline.compile.small import SmallUnits, qualifies
from mirrorline.compile.spark import compile_changes
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.rows import changes_to_table
from mirrorline.log.stats import table_stats
from mirrorline.model import Change, Op
from mirrorline.position import ZERO

pytestmark = pytest.mark.spark


def _small(spark: Any, su: SmallUnits, changes: list[Change]) -> NetResult:
    rows = changes_to_table(sorted(changes, key=lambda c: c.pos))
    stats = table_stats(rows)
    assert qualifies(stats)
    batch = su.compile(rows, stats, ZERO, max((c.pos for c in changes), default=ZERO))
    assert batch.rows is not None and batch.net is None  # nothing left in Spark
    assert batch.changes == len(changes)
    return collect_result(batch)


def _general(spark: Any, changes: list[Change], actions: Actions | None) -> NetResult:
    batch = compile_changes(changes_frame(spark, changes), actions=actions)
    try:
        return collect_result(batch)
    finally:
        batch.release()


def _simple(changes: list[Change]) -> bool:
    """No TRUNCATE and no key change leaving columns unsent: what the small path takes."""
    return not any(
        c.op is Op.TRUNCATE or (c.old_key is not None and c.old_key != c.key and c.unchanged) for c in changes
    )


SIMPLE = [n for n, c in CASES.items() if c.error is None and _simple(c.changes())]
INVALID = [n for n, c in CASES.items() if c.error is not None and _simple(c.changes())]


@pytest.mark.parametrize("name", SIMPLE)
def test_named_case(spark: Any, name: str) -> None:
    case = CASES[name]
    su = SmallUnits(spark, case.actions or None)
    got = _small(spark, su, case.changes())
    assert render(got) == case.expected
    want = fold(case.changes(), case.actions or None)
    assert (got.tables, got.rows()) == (want.tables, want.rows())


@pytest.mark.parametrize("name", INVALID)
def test_invalid_case_raises_the_earliest_error(spark: Any, name: str) -> None:
    case = CASES[name]
    assert case.error is not None
    first_op, first_line, second_op, second_line, key, table = case.error
    with pytest.raises(InvalidSequenceError) as e:
        _small(spark, SmallUnits(spark, case.actions or None), case.changes())
    assert (e.value.table.partition(".")[2], e.value.key) == (table.partition(".")[2], key)
    assert (e.value.context["first_op"], e.value.first_pos) == (first_op, pos(first_line))
    assert (e.value.context["second_op"], e.value.second_pos) == (second_op, pos(second_line))


def test_the_plan_is_built_once_and_each_unit_gets_its_own_rows(spark: Any) -> None:
    """Three units through one SmallUnits: one plan per shape, and no unit sees another's rows."""
    su = SmallUnits(spark)
    first = _small(spark, su, unit("a: I 1 c=1", "a: U 1 c=2", "b: I 7 c=x"))
    second = _small(spark, su, unit("a: U 1 c=3", "a: D 2", base=100))
    third = _small(spark, su, unit("b: U 7 c=y", base=200))
    assert render(first) == ["a: I 1 c=2", "b: I 7 c=x"]
    assert render(second) == ["a: D 2", "a: U 1 c=3"]
    assert render(third) == ["b: U 7 c=y"]
    assert len(su._plans) == 1
    moved = unit("a: U 1>5 c=4", base=300)  # a key change (all columns sent): the other shape
    assert render(_small(spark, su, moved)) == ["a: D 1", "a: I 5 c=4"]
    assert len(su._plans) == 2


def test_units_that_do_not_qualify() -> None:
    truncating = table_stats(changes_to_table(unit("a: I 1 c=1", "a: T")))
    assert not qualifies(truncating)
    assert qualifies(table_stats(changes_to_table(unit("a: I 1 c=1", "a: I 2 c=1"))))
    assert not qualifies(table_stats(changes_to_table(unit("a: I 1 c=1", "a: I 2 c=1"))), max_changes=1)
    with pytest.raises(ValueError, match="TRUNCATE"):
        SmallUnits(None).compile(changes_to_table(unit("a: T")), truncating, ZERO, pos(1))


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_generated_histories_equal_the_general_path_and_the_reference(spark: Any, seed: int) -> None:
    hs = [h for h in random_histories(seed, 100) if _simple(h.changes)]
    changes, actions = pack(hs)
    su = SmallUnits(spark, actions or None)
    got = _small(spark, su, changes)
    general = _general(spark, changes, actions or None)
    assert (got.tables, got.rows()) == (general.tables, general.rows())
    for i, h in enumerate(hs):
        mine = unpack(got, i, hs)
        assert mine.rows() == fold(h.changes, h.actions or None).rows()
        assert apply_net(h.before, mine) == {**h.before, **replay(h.before, h.changes, h.actions or None)}


@settings(max_examples=2, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_generated_invalid_histories_raise_the_general_paths_error(spark: Any, seed: int) -> None:
    rnd = random.Random(seed)
    injected = [
        inj
        for h in random_histories(seed, 50)
        if _simple(h.changes) and (inj := inject(Picker(rnd=rnd), h)) is not None
    ]
    hs = [replace(inj.history) for inj in injected if _simple(inj.history.changes)]  # (an injection may add either)
    assert hs, "no injected history the small path takes"
    changes, actions = pack(hs)
    assert _simple(changes)
    with pytest.raises(InvalidSequenceError) as want:
        compile_changes(changes_frame(spark, changes), actions=actions or None)
    with pytest.raises(InvalidSequenceError) as got:
        _small(spark, SmallUnits(spark, actions or None), changes)
    assert (got.value.table, got.value.key, got.value.first_pos, got.value.second_pos) == (
        want.value.table,
        want.value.key,
        want.value.first_pos,
        want.value.second_pos,
    )


def test_unit_rows_keeps_the_configured_tables_only() -> None:
    """The driver's read of a unit: rows of tables not configured are dropped; when there are none, the rows are
    returned as read (in their batches: nothing copied)."""
    from mirrorline.compile.small import unit_rows

    mine = [Change(pos(i), 0, 1, "public.a", Op.INSERT, key=(str(i),), new={"id": str(i)}) for i in range(1, 5)]
    other = [Change(pos(i), 0, 1, "public.b", Op.INSERT, key=(str(i),), new={"id": str(i)}) for i in range(5, 7)]
    first, second = changes_to_table(mine[:2]), changes_to_table(mine[2:])
    got = unit_rows({"public.a": None}, iter([first, second]))
    assert got.equals(changes_to_table(mine))
    read, kept = first.column("new").chunk(0).buffers(), got.column("new").chunk(0).buffers()
    assert [b.address for b in kept if b is not None] == [b.address for b in read if b is not None]
    mixed = unit_rows({"public.a": None}, iter([changes_to_table(mine[:2] + other), second]))
    assert mixed.equals(changes_to_table(mine))
    assert unit_rows({"public.b": None}, iter([first, second])).num_rows == 0
    assert unit_rows(None, iter([changes_to_table(mine + other)])).num_rows == 6
    assert unit_rows({"public.a": None}, iter([])).num_rows == 0


def test_the_python_task_freezes_its_workers_garbage_collector_once(tmp_path: Any) -> None:
    """The small plan's Python task (in a Spark worker: a process of its own here) reads the unit's rows, and has its
    process's objects frozen out of the cyclic collector's walk (the full collection PySpark's daemon runs after each
    task then walks only what came after), once."""
    import subprocess
    import sys
    import textwrap

    rows = changes_to_table(unit("a: I 1 c=1", "a: U 1 c=2", "b: I 7 c=x"))
    path = tmp_path / "rows.arrow"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, rows.schema) as w:
        w.write_table(rows)
    script = textwrap.dedent(
        f"""
        import gc, pyspark
        from mirrorline.compile import small

        class Ctx:
            def getLocalProperty(self, name):
                return {str(path)!r} if name == small.UNIT_PROPERTY else None

        pyspark.TaskContext.get = staticmethod(lambda: Ctx())
        assert gc.get_freeze_count() == 0
        first = sum(b.num_rows for b in small._read_unit(iter([])))
        frozen = gc.get_freeze_count()
        second = sum(b.num_rows for b in small._read_unit(iter([])))
        print(first, second, frozen > 1000, gc.get_freeze_count() == frozen)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "3", "True", "True"]
