"""The start-up warm-up: its synthetic unit is a valid unit whose Spark compile equals the reference fold, and a
warm-up that fails only logs (the first real unit reports the cause)."""

from __future__ import annotations

import logging

import pytest

from mirrorline.compile import reference
from mirrorline.compile.spark import collect_result, compile_changes
from mirrorline.compile.warmup import WarmUp, synthetic_rows, synthetic_unit, warm_small, warm_up
from mirrorline.log.rows import table_to_changes

pytestmark = pytest.mark.spark


def test_synthetic_unit_compiles_to_what_the_reference_folds(spark):
    frame = synthetic_unit(spark, 800)
    changes = sorted(table_to_changes(frame.toArrow()), key=lambda c: c.pos)
    assert len(changes) == 800 and {c.op.value for c in changes} == {"I", "U", "D"}
    want = reference.fold(changes)
    batch = compile_changes(frame)
    try:
        got = collect_result(batch)
    finally:
        batch.release()
    assert got == want
    assert sum(len(t.inserts) for t in want.nets.values()) == 100  # keys inserted then updated; the others deleted


def test_warm_up_runs_and_times_itself(spark):
    assert warm_up(spark, 2000) > 0


def test_small_warm_up_builds_both_plans_of_the_pipeline(spark):
    from mirrorline.compile.small import shared

    actions = {"public.only_inserts": frozenset("I")}
    assert warm_small(spark, actions) > 0
    assert set(shared(spark, actions)._plans) == {False, True}


def test_synthetic_rows_are_the_synthetic_unit(spark):
    assert (
        synthetic_rows(800).to_pylist()
        == synthetic_unit(spark, 800).toArrow().cast(synthetic_rows(1).schema).to_pylist()
    )
    moved = synthetic_rows(800, key_changes=True)
    assert moved.num_rows == 801 and moved.column("old_key")[800].as_py() == ["199"]


def test_a_failing_warm_up_only_logs(caplog):
    def no_spark():
        raise RuntimeError("no Java here")

    with caplog.at_level(logging.WARNING, logger="mirrorline.compile.warmup"):
        w = WarmUp(no_spark)
        w.wait(30)
    assert w.seconds is None
    assert "no Java here" in caplog.text


def test_a_warm_up_says_how_long_spark_took_to_start_and_to_warm_up(spark):
    """``run`` prints it (bench/live reads Spark's start from it); a failed warm-up says nothing of the kind."""
    import time

    def slow_start():
        time.sleep(0.3)  # a Spark that takes its time to start
        return spark

    told: list[str] = []
    w = WarmUp(slow_start, on_ready=told.append)
    w.wait(120)
    assert w.started_seconds is not None and w.started_seconds >= 0.3 and w.seconds is not None
    assert told == [f"Spark ready: started in {w.started_seconds:.2f}s, warmed up in {w.seconds:.2f}s"]

    def no_spark():
        raise RuntimeError("no Java here")

    told.clear()
    WarmUp(no_spark, on_ready=told.append).wait(30)
    assert told == []
