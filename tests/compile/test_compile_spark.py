"""The Spark compiler (mirrorline.compile.spark) on the named cases of tests/support/compile_cases.py: every rule and
edge case its own test, each checked against the expected lines and the reference. To keep Spark's cost per job
down, all valid cases are compiled together in ONE unit (case i's tables renamed ``c<i>.<name>``, tables being
independent), and all invalid ones are diagnosed together with ``find_invalid``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from compile_cases import CASES, pos, render, unit
from compile_support import changes_frame, collect_result, find_invalid, mirror

from mirrorline import scratch
from mirrorline.compile.batch import NET_ARROW, NET_DDL
from mirrorline.compile.reference import NetResult, fold
from mirrorline.compile.spark import compile_changes
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.rows import changes_to_table
from mirrorline.log.stats import table_stats
from mirrorline.model import Change
from mirrorline.position import Position

pytestmark = pytest.mark.spark

VALID = [n for n, c in CASES.items() if c.error is None]
INVALID = [n for n, c in CASES.items() if c.error is not None]


def _packed(names: list[str]) -> tuple[list[Change], dict[str, str]]:
    changes: list[Change] = []
    actions: dict[str, str] = {}
    for i, name in enumerate(names):
        case = CASES[name]
        for c in case.changes():
            changes.append(replace(c, table=f"c{i}.{c.table.partition('.')[2]}"))
        for t, a in case.actions.items():
            actions[f"c{i}.{t.partition('.')[2]}"] = a
    return changes, actions


def _case_part(result: NetResult, i: int) -> NetResult:
    prefix = f"c{i}."
    ren = {t: "public." + t.removeprefix(prefix) for t in result.tables if t.startswith(prefix)}
    return NetResult(
        [ren[t] for t in result.tables if t in ren],
        {ren[t]: p for t, p in result.truncated.items() if t in ren},
        {ren[t]: net for t, net in result.nets.items() if t in ren},
    )


def _compiled(
    spark: Any, changes: list[Change], actions: dict[str, str], with_stats: bool, to_driver: bool = False
) -> NetResult:
    stats = table_stats(changes_to_table(sorted(changes, key=lambda c: c.pos))) if with_stats else None
    batch = compile_changes(changes_frame(spark, changes), actions=actions, stats=stats, to_driver=to_driver)
    try:
        return collect_result(batch)
    finally:
        batch.release()


@pytest.fixture(scope="module")
def valid_results(spark: Any) -> dict[str, NetResult]:
    changes, actions = _packed(VALID)
    result = _compiled(spark, changes, actions, with_stats=False)
    return {name: _case_part(result, i) for i, name in enumerate(VALID)}


def test_log_statistics_give_the_same_result_as_the_metadata_job(
    spark: Any, valid_results: dict[str, NetResult]
) -> None:
    """Every valid case again, the tables' metadata (order, TRUNCATEs, key changes) from the log's statistics of
    the changes instead of a Spark job: the same result, table order included."""
    changes, actions = _packed(VALID)
    result = _compiled(spark, changes, actions, with_stats=True)
    for i, name in enumerate(VALID):
        got, want = _case_part(result, i), valid_results[name]
        assert (got.tables, got.truncated, got.rows()) == (want.tables, want.truncated, want.rows()), name


def test_net_rows_on_the_driver_are_those_written_to_parquet(spark: Any, valid_results: dict[str, NetResult]) -> None:
    """Every valid case again, the net rows brought to the driver through Arrow in the fold's job: the same result
    (the cases with key changes leaving columns unsent among them took the Parquet path)."""
    changes, actions = _packed(VALID)
    result = _compiled(spark, changes, actions, with_stats=True, to_driver=True)
    for i, name in enumerate(VALID):
        got, want = _case_part(result, i), valid_results[name]
        assert (got.tables, got.truncated, got.rows()) == (want.tables, want.truncated, want.rows()), name


@pytest.fixture(scope="module")
def invalid_results(spark: Any) -> dict[str, InvalidSequenceError]:
    changes, actions = _packed(INVALID)
    errors = find_invalid(changes_frame(spark, changes), actions=actions)
    out: dict[str, InvalidSequenceError] = {}
    for e in errors:  # earliest first: keep each case's earliest
        i = int(e.table.partition(".")[0][1:])
        out.setdefault(INVALID[i], e)
    return out


@pytest.mark.parametrize("name", VALID)
def test_rule(name: str, valid_results: dict[str, NetResult]) -> None:
    case = CASES[name]
    got = valid_results[name]
    assert render(got) == case.expected
    assert got.rows() == fold(case.changes(), case.actions or None).rows()  # positions and unchanged marks too
    assert got.truncated == fold(case.changes(), case.actions or None).truncated


@pytest.mark.parametrize("name", INVALID)
def test_invalid(name: str, invalid_results: dict[str, InvalidSequenceError]) -> None:
    case = CASES[name]
    assert case.error is not None
    first_op, first_line, second_op, second_line, key, table = case.error
    e = invalid_results[name]
    assert e.table.partition(".")[2] == table.partition(".")[2] and e.key == key
    assert (e.context["first_op"], e.first_pos) == (first_op, pos(first_line))
    assert (e.context["second_op"], e.second_pos) == (second_op, pos(second_line))


def test_compile_raises_the_earliest_invalid_sequence(spark: Any) -> None:
    changes = unit("a: U 1 c=1", "b: D 2", "a: D 1", "b: D 2", "a: U 1 c=2")
    with pytest.raises(InvalidSequenceError) as e:
        compile_changes(changes_frame(spark, changes))
    assert (e.value.table, e.value.key, e.value.first_pos, e.value.second_pos) == ("public.b", ("2",), pos(2), pos(4))
    assert "public.b" in str(e.value) and str(pos(4)) in str(e.value) and str(pos(2)) in str(e.value)


def test_seeds_and_mirror_form_in_apply_order(spark: Any) -> None:
    """000's two examples and 003's example, compiled together; 003 in the mirror form gives the document's
    statements: per table deletes then inserts, tables in first-seen order."""
    changes = (
        [replace(c, table="e1.T") for c in CASES["seed000_example1"].changes(base=0)]
        + [replace(c, table="e2.T") for c in CASES["seed000_example2"].changes(base=100)]
        + CASES["seed003_net_effect"].changes(base=200)
    )
    batch = compile_changes(changes_frame(spark, changes))
    try:
        assert batch.tables == ["e1.T", "e2.T", "public.TABLE1", "public.TABLE2", "public.TABLE3"]
        rows = {(r["table"], r["kind"], r["key"][0]): r for r in batch.net.collect()}
        assert rows.keys() >= {("e1.T", "I", "1"), ("e2.T", "U", "1")}
        assert dict(rows[("e1.T", "I", "1")]["new"]) == {"k": "1", "c": "13"}
        assert dict(rows[("e2.T", "U", "1")]["new"]) == {"k": "1", "c": "16"}
        kind_order = {"D": 0, "U": 1, "I": 2}
        mirrored = [
            (r["table"].removeprefix("public."), r["kind"], r["key"][0])
            for r in mirror(batch.net).where("table LIKE 'public.%'").collect()
        ]
        mirrored.sort(key=lambda x: (batch.tables.index("public." + x[0]), kind_order[x[1]], x[2]))
        assert mirrored == [
            ("TABLE1", "D", "2"), ("TABLE1", "D", "3"),
            ("TABLE1", "I", "1"), ("TABLE1", "I", "3"), ("TABLE1", "I", "4"),
            ("TABLE2", "D", "1"), ("TABLE2", "I", "1"), ("TABLE2", "I", "2"),
            ("TABLE3", "I", "1"), ("TABLE3", "I", "2"),
        ]  # fmt: skip
        # within a kind the rows' positions give 003's statement order
        t1 = sorted(
            (r for r in mirror(batch.net).where("table = 'public.TABLE1'").collect()),
            key=lambda r: (kind_order[r["kind"]], r["lsn"], r["seq"]),
        )
        assert [(r["kind"], r["key"][0]) for r in t1] == [("D", "2"), ("D", "3"), ("I", "1"), ("I", "3"), ("I", "4")]
    finally:
        batch.release()


def test_net_layout_is_the_contract(spark: Any) -> None:
    from pyspark.sql.types import _parse_datatype_string

    batch = compile_changes(changes_frame(spark, unit("I 1 c=1", "U 2 c=2 ~d", "D 3")))
    try:
        want = _parse_datatype_string(NET_DDL)
        assert [(f.name, f.dataType) for f in batch.net.schema] == [(f.name, f.dataType) for f in want]
        assert batch.changes == 3 and batch.tables == ["public.t"] and batch.truncated == {}
        assert batch.counts() == {"public.t": {"D": 1, "U": 1, "I": 1}}
        assert batch.end == pos(3)
        scratch = batch.scratch
        assert scratch is not None and Path(scratch).is_dir()
    finally:
        batch.release()
    assert batch.scratch is None and not Path(scratch).exists()


def test_out_keeps_the_net_rows_as_parquet(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "net"
    batch = compile_changes(changes_frame(spark, unit("I 1 c=1", "U 1 c=2", "D 2")), out=str(out))
    batch.release()  # not a scratch folder: stays
    net = spark.read.schema(NET_DDL).parquet(str(out))
    assert sorted((r["kind"], r["key"][0], dict(r["new"] or {}).get("c")) for r in net.collect()) == [
        ("D", "2", None),
        ("I", "1", "2"),
    ]


def test_to_driver_brings_the_net_rows_back_without_files(spark: Any) -> None:
    before = set(scratch.folder().iterdir())
    batch = compile_changes(
        changes_frame(spark, unit("I 1 c=1", "U 1 c=2", "U 2 c=2 ~d", "D 3", "I 4 c=4", "D 4")), to_driver=True
    )
    try:
        assert batch.on_driver and batch.scratch is None and batch.net is None
        assert set(scratch.folder().iterdir()) == before
        assert batch.net_rows == 3 and batch.counts() == {"public.t": {"D": 1, "U": 1, "I": 1}}
        assert render(collect_result(batch)) == ["t: D 3", "t: U 2 c=2 ~d", "t: I 1 c=2"]
        assert batch.rows is not None and batch.rows.schema == NET_ARROW
    finally:
        batch.release()


def test_to_driver_keeps_key_changes_leaving_columns_unsent_in_parquet(spark: Any) -> None:
    """Their second pass reads the first's Parquet: such a unit is written as Parquet, to_driver or not."""
    changes = unit("U 1>2 c=1 ~d", "U 2>3 c=2 ~d", "I 7 d=x")
    batch = compile_changes(changes_frame(spark, changes), to_driver=True)
    try:
        assert not batch.on_driver and batch.scratch is not None
        assert render(collect_result(batch)) == ["t: D 1", "t: I 3 c=2 ~d <1", "t: I 7 d=x"]
    finally:
        batch.release()


def test_to_driver_raises_the_earliest_invalid_sequence_and_leaves_nothing(spark: Any) -> None:
    before = set(scratch.folder().iterdir())
    changes = unit("a: U 1 c=1", "b: D 2", "a: D 1", "b: D 2", "a: U 1 c=2", "c: I 3", "c: I 3")
    with pytest.raises(InvalidSequenceError) as e:
        compile_changes(changes_frame(spark, changes), to_driver=True)
    assert (e.value.table, e.value.key, e.value.first_pos, e.value.second_pos) == ("public.b", ("2",), pos(2), pos(4))
    assert set(scratch.folder().iterdir()) == before


_RESULT_LIMIT_SCRIPT = """
import json, sys
from mirrorline.sparkenv import get_spark
from mirrorline.compile.spark import compile_changes
from mirrorline.log.rows import SPARK_DDL, changes_to_table
from mirrorline.model import Change, Op
from mirrorline.position import Position

def changes_frame(spark, changes):
    return spark.createDataFrame(changes_to_table(changes), schema=SPARK_DDL)

spark = get_spark(conf={"spark.driver.maxResultSize": "100k"})
changes = [
    Change(pos=Position(i + 1, 0), commit_ts=0, xid=i + 1, table="public.t", op=Op.INSERT, key=(str(i).zfill(80),),
           new={"id": str(i).zfill(80), "pad": "x" * 200})
    for i in range(20_000)
]
batch = compile_changes(changes_frame(spark, changes), to_driver=True)
# the inserts-and-updates route: its aggregate's rows (a position and two flags each) are more than 100 KiB too
from mirrorline.compile.updates import compile_updates
from mirrorline.log.stats import table_stats
from mirrorline.position import ZERO
stats = table_stats(changes_to_table(changes))
upd = compile_updates(changes_frame(spark, changes), stats, ZERO, Position(20_000, 0), lambda at: [at])
print(json.dumps({"on_driver": batch.on_driver, "net": batch.frame().count(), "updates": upd is not None}))
"""


def test_to_driver_falls_back_to_parquet_past_the_driver_result_limit(tmp_path: Path) -> None:
    """Net rows larger than ``spark.driver.maxResultSize`` (here 100 KiB, in a Spark of its own) are not an error:
    the unit is compiled through Parquet, with a warning naming the setting; the inserts-and-updates route leaves
    such a unit to the general path."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _RESULT_LIMIT_SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == '{"on_driver": false, "net": 20000, "updates": false}'
    assert "spark.driver.maxResultSize" in done.stderr and "compiled through Parquet instead" in done.stderr
    assert "compiled the general way instead" in done.stderr


def test_invalid_unit_leaves_no_scratch_files(spark: Any) -> None:
    before = set(scratch.folder().iterdir())
    with pytest.raises(InvalidSequenceError):
        compile_changes(changes_frame(spark, unit("D 1", "D 1")))
    assert set(scratch.folder().iterdir()) == before


def test_start_and_end_bound_the_unit(spark: Any) -> None:
    changes = unit("I 1 c=1", "U 1 c=2", "U 1 c=3", "D 1", "I 2 c=1")
    batch = compile_changes(changes_frame(spark, changes), start=pos(1), end=pos(3))
    try:
        assert render(collect_result(batch)) == ["t: U 1 c=3"]
        assert (batch.start, batch.end, batch.changes) == (pos(1), pos(3), 2)
    finally:
        batch.release()


def test_empty_unit(spark: Any) -> None:
    batch = compile_changes(changes_frame(spark, []), start=Position(5, 0))
    try:
        assert batch.tables == [] and batch.net.count() == 0 and (batch.start, batch.end) == (Position(5, 0),) * 2
    finally:
        batch.release()


def test_ops_arriving_out_of_order_are_sorted(spark: Any) -> None:
    """The fold's safety net: a key's ops that do not arrive sorted by position are sorted by the lambda sort."""
    from pyspark.sql import functions as F

    from mirrorline.compile.fold_sql import SORTED_OPS

    op = "named_struct('lsn', CAST({} AS BIGINT), 'seq', CAST({} AS BIGINT), 'sub', {}, 'kind', '{}', " \
         "'new', map('c', '{}'), 'unchanged', CAST(array() AS ARRAY<STRING>))"  # fmt: skip
    ops = f"array({op.format(5, 1, 0, 'U', 'c')}, {op.format(5, 0, 1, 'I', 'b')}, {op.format(5, 0, 0, 'D', 'a')})"
    got = spark.range(1).select(F.expr(ops).alias("ops")).select(F.expr(SORTED_OPS).alias("ops")).first()["ops"]
    assert [(o["lsn"], o["seq"], o["sub"], o["kind"]) for o in got] == [(5, 0, 0, "D"), (5, 0, 1, "I"), (5, 1, 0, "U")]


def test_reads_the_log_layout_from_parquet(spark: Any, tmp_path: Any) -> None:
    """Segments written by pyarrow in ARROW_SCHEMA, read back by Spark with SPARK_DDL, compile like the reference."""
    import pyarrow.parquet as pq

    from mirrorline.compile import generated
    from mirrorline.log.rows import SPARK_DDL, table_to_changes

    table = generated.generate(6000, seed=7)
    for i in range(3):
        pq.write_table(table.slice(i * 2000, 2000), tmp_path / f"seg-{i}.parquet")
    batch = compile_changes(spark.read.schema(SPARK_DDL).parquet(str(tmp_path)))
    try:
        expected = fold(table_to_changes(table))
        got = collect_result(batch)
        assert got.tables == expected.tables and got.rows() == expected.rows()
        assert batch.changes == 6000
    finally:
        batch.release()


def test_key_change_with_unchanged_columns_out_and_mirror_form(spark: Any, tmp_path: Path) -> None:
    """A unit with key changes not sending a column: the net rows (written to ``out``, nothing left in the scratch
    folder, their number known) carry moved_from; the mirror form of an update marking columns takes them from its
    own key."""
    before = set(scratch.folder().iterdir())
    out = tmp_path / "net"
    changes = unit("U 1>2 c=1 ~d", "U 2>3 c=2 ~d", "U 5 c=5 ~d", "I 7 d=x", "U 7>8 ~d")
    batch = compile_changes(changes_frame(spark, changes), out=str(out))
    try:
        assert render(collect_result(batch)) == ["t: D 1", "t: U 5 c=5 ~d", "t: I 3 c=2 ~d <1", "t: I 8 d=x"]
        assert set(scratch.folder().iterdir()) == before
        net = spark.read.schema(NET_DDL).parquet(str(out))
        # the rows final after the first pass were moved in beside the second pass's: out is one flat folder
        assert net.count() == 4 and batch.net_rows == 4
        assert not [p for p in out.iterdir() if p.is_dir()] and len(list(out.glob("*.parquet"))) >= 2
        got = {(r["kind"], r["key"][0]): r["moved_from"] for r in mirror(net).collect()}
        assert got == {("D", "1"): None, ("D", "5"): None, ("I", "5"): ["5"], ("I", "3"): ["1"], ("I", "8"): None}
    finally:
        batch.release()


def test_units_stored_without_moved_from_still_load(spark: Any, tmp_path: Path) -> None:
    old_ddl = NET_DDL.replace(", moved_from ARRAY<STRING>", "")
    assert old_ddl != NET_DDL
    spark.createDataFrame([("public.t", "I", ["1"], {"k": "1"}, [], 1, 0)], old_ddl).write.parquet(str(tmp_path / "n"))
    rows = spark.read.schema(NET_DDL).parquet(str(tmp_path / "n")).collect()
    assert [(r["key"], r["moved_from"]) for r in rows] == [(["1"], None)]


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_stored_unit_whose_files_lost_rows_is_compiled_again(spark: Any, tmp_path: Path, damage: str) -> None:
    """A stored unit records how many net rows its synced files hold; one whose files do not (a part cut short by
    a crash of the machine, or gone) is removed and reported as damaged, never read as a smaller unit."""
    from mirrorline.compile.batch import NetBatch
    from mirrorline.compile.store import Damaged, UnitStore

    store = UnitStore(tmp_path)
    start, end = Position(1, 0), Position(9, 0)
    rows = spark.createDataFrame(
        [("public.t", "I", [str(i)], {"k": str(i)}, [], i, 0, None) for i in range(1, 40)], NET_DDL
    ).repartition(3)
    saved = store.save(spark, NetBatch(start=start, end=end, tables=["public.t"], net=rows, changes=39))
    assert saved.frame(spark).count() == 39
    assert store.load(spark, start, end).frame(spark).count() == 39
    parts = sorted((store.path(start, end) / "net").glob("*.parquet"))
    assert len(parts) > 1
    if damage == "truncated":
        data = parts[0].read_bytes()
        parts[0].write_bytes(data[: len(data) // 2])
    else:
        parts[0].unlink()
    with pytest.raises(Damaged, match="compiled again"):
        store.load(spark, start, end)
    assert store.starting_at(start) is None and not store.path(start, end).exists()
