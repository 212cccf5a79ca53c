"""A unit's Spark plan holds nothing of the unit's own (its bounds, its first lsn), so that Spark generates each
route's code once and every later unit runs the same classes, which the JIT has compiled by then: two large units of
the same shape, the second at other positions, make Spark compile no new code (its codegen metrics count every
class it compiles). Units that end inside a segment are filtered by the reader only; their net rows are the
general path's over the unfiltered rows."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from changes import write_log
from compile_support import changes_frame, collect_result
from large_units import A, one_unit_pipeline, spy_route

from mirrorline.compile import inserts, updates
from mirrorline.compile import spark as general
from mirrorline.compile.spark import compile_changes
from mirrorline.log import ChangeLog
from mirrorline.log.spark import read_spark
from mirrorline.model import Change, Op
from mirrorline.position import ZERO

KEYS = 150


def _row(k: int, r: int) -> dict[str, str | None]:
    return {"id": str(k), "v": f"round {r}", "w": str(r)}


def _rounds(ops: list[str]) -> list[Change]:
    """One round of changes per entry of ``ops``, each over keys 0..KEYS-1 of A: ``X/Y`` is X on the first half of
    the keys and Y on the second."""
    out = []
    for r, ops_ in enumerate(ops):
        for k in range(KEYS):
            o = ops_.split("/")[0 if k < KEYS // 2 else -1]
            out.append(Change(ZERO, 0, 1, "public.a", Op(o), (str(k),), None if o == "D" else _row(k, r)))
    return out


def _log(path: Path, changes: list[Change]) -> ChangeLog:
    return write_log(path, [A], changes, per_txn=10, segment_changes=KEYS)


def _compiled_classes(spark_session: Any) -> int:
    return int(spark_session._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


@pytest.mark.spark
@pytest.mark.parametrize(
    ("route", "ops"),
    [
        ("updates", ["I", "U", "U", "U"]),  # two units: I then U, and U then U
        ("inserts", ["I", "I", "I", "I"]),  # (distinct keys: see below)
        ("general", ["I", "D/U", "I/D", "U/I"]),  # (half the keys one way, half the other)
    ],
)
def test_a_later_unit_at_other_positions_runs_the_classes_of_the_first(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str, ops: list[str]
) -> None:
    changes = _rounds(ops)
    if route == "inserts":  # every round inserts new keys
        changes = [Change(ZERO, 0, 1, "public.a", Op.INSERT, (str(i),), _row(i, 0)) for i in range(len(changes))]
    log = _log(tmp_path / "log", changes)
    everything = list(log.read())  # (with their positions)
    segs = log.segments()
    assert len(segs) == 4 and all(s.count == KEYS for s in segs)
    calls = {
        "updates": spy_route(monkeypatch, updates, "compile_updates"),
        "inserts": spy_route(monkeypatch, inserts, "compile_inserts"),
        "general": spy_route(monkeypatch, general, "compile_changes"),
    }
    a = one_unit_pipeline(tmp_path)
    try:
        new_classes = []
        for start, end in ((ZERO, segs[1].last), (segs[1].last, segs[3].last)):
            before = _compiled_classes(a.spark)
            batch = a.compiler.compile(start, end)
            assert a.compiler.last_route == route
            got = collect_result(batch)
            batch.verify()
            new_classes.append(_compiled_classes(a.spark) - before)
            assert (batch.start, batch.end, batch.changes) == (start, end, 2 * KEYS)
            batch.release()
            want = compile_changes(changes_frame(a.spark, everything), start=start, end=end)
            assert got.rows() == collect_result(want).rows() and got.rows()
            want.release()
        assert calls[route] == [True, True] and all(not c for r, c in calls.items() if r != route)
        assert new_classes[1] == 0, f"classes compiled per unit: {new_classes}"
        # (the first unit's may be cached from an earlier test of this JVM; a plan of its own is counted)
        before = _compiled_classes(a.spark)
        a.spark.range(10).selectExpr(f"id * {uuid.uuid4().int % 1000003} AS x").where("x > 5").collect()
        assert _compiled_classes(a.spark) > before
    finally:
        a.close()


@pytest.mark.spark
def test_a_unit_ending_inside_segments_is_filtered_by_the_reader(spark: Any, tmp_path: Path) -> None:
    changes = _rounds(["I", "D/U", "I/D", "U/I"])
    everything = list(_log(tmp_path / "log", changes).read())
    log = ChangeLog(tmp_path / "log")
    start, end = everything[97].pos, everything[433].pos  # inside the first and the third segment
    got = compile_changes(read_spark(log, start, end, spark=spark), start=start, end=end, in_range=True)
    want = compile_changes(changes_frame(spark, everything), start=start, end=end)
    assert got.changes == want.changes and collect_result(got).rows() == collect_result(want).rows()
    assert collect_result(got).rows()  # not empty
    got.release()
    want.release()
