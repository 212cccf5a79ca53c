"""The start-up warm-up: its synthetic unit is a valid unit whose Spark compile equals the reference fold, and a
warm-up that fails only logs (the first real unit reports the cause)."""

from __future__ import annotations

import logging
import time

import pytest
from compile_support import collect_result
from patching import patch_where_used
from waiting import wait_until

from mirrorline.compile import reference
from mirrorline.compile.spark import compile_changes
from mirrorline.compile.warmup import WarmUp, large_unit, synthetic_rows, synthetic_unit, warm_small, warm_up
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


def test_large_warm_up_unit_is_a_catch_up_of_updated_rows():
    """Each key inserted, then updated once in another order: the fold's net rows are one insert per key with the
    key's last image."""
    unit = large_unit(300)
    changes = list(table_to_changes(unit))
    assert len(changes) == 600 and [c.op.value for c in changes] == ["I"] * 300 + ["U"] * 300
    assert [c.pos for c in changes] == sorted(c.pos for c in changes)
    want = reference.fold(changes)
    (net,) = want.nets.values()
    last = {c.key: c.new for c in changes}
    assert not net.updates and not net.deletes and {k: r.new for k, r in net.inserts.items()} == last


_LARGE_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from large_units import A
from mirrorline.compile.updates import compile_updates
from mirrorline.compile.warmup import warm_large
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.spark import read_spark
from mirrorline.model import Change, Op
from mirrorline.position import ZERO
from mirrorline.sparkenv import get_spark

spark = get_spark()
def classes():
    return spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()
before = classes()
warm_large(spark, 20_000)
warmed = classes() - before
def change(op, k, v):
    return Change(ZERO, 0, 1, "public.a", op, (str(k),), {"id": str(k), "v": v, "w": None})
changes = [change(Op.INSERT, k, "x") for k in range(3000)] + [change(Op.UPDATE, k, "y") for k in range(3000)]
with LogWriter(Path(sys.argv[1]), segment_changes=2000) as w:
    w.record_schema(A)
    for i in range(0, len(changes), 100):
        w.add_transaction(1000 + i, 1, changes[i : i + 100])
log = ChangeLog(sys.argv[1])
before = classes()
batch = compile_updates(read_spark(log, spark=spark), log.stats(), ZERO, log.durable(),
                        lambda at: log.iter_at(at, ["table", "key", "new"]))
print(json.dumps({"warm_up": warmed, "unit": classes() - before, "net": batch.net_rows}))
"""


def test_warm_large_compiles_the_code_a_large_unit_of_inserts_and_updates_runs(tmp_path):
    """In a fresh Spark: the large warm-up generates and compiles the route's classes, and a real unit of the log
    then compiles none of its own (what the JIT compiled for the warm-up serves it)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    args = [
        sys.executable,
        "-c",
        _LARGE_SCRIPT,
        str(tmp_path / "log"),
        str(Path(__file__).resolve().parents[1] / "support"),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["warm_up"] > 0 and got["unit"] == 0 and got["net"] == 3000


def _idle_pipeline(tmp_path, spark):
    from large_units import A, one_unit_pipeline

    from mirrorline.log import LogWriter
    from mirrorline.model import Change, Op
    from mirrorline.position import ZERO

    with LogWriter(tmp_path / "log") as w:
        w.record_schema(A)
        w.add_transaction(
            1000, 1, [Change(ZERO, 0, 1, "public.a", Op.INSERT, ("1",), {"id": "1", "v": "x", "w": None})]
        )
    a = one_unit_pipeline(tmp_path, spark=spark)
    a.idle_warm_up = 0.5
    return a


def _follow_until(a, done, what, timeout=120.0):
    import threading
    import time

    stop = threading.Event()
    thread = threading.Thread(target=a.follow, args=(stop,), kwargs={"poll": 0.02})
    thread.start()
    try:
        wait_until(done, timeout=timeout, interval=0.05, what=what)
        time.sleep(1.0)  # (idle on: no second warm-up)
    finally:
        stop.set()
        thread.join()
        a.close()


def test_an_idle_pipeline_warms_up_for_large_units_once(tmp_path, spark, caplog):
    """``follow``, once it has had no unit for ``idle_warm_up`` seconds (after applying the log's unit), runs the
    large warm-up in the background, once; ``close`` waits for it."""
    from mirrorline.log import ChangeLog

    a = _idle_pipeline(tmp_path, spark)
    with caplog.at_level(logging.INFO, logger="mirrorline.pipeline"):
        _follow_until(a, lambda: "warmed up for large units" in caplog.text, "it warms up for large units")
    assert caplog.text.count("warmed up for large units in") == 1
    assert a.positions()["t"] == ChangeLog(tmp_path / "log").durable()


def test_no_large_warm_up_while_a_large_transaction_is_arriving(tmp_path, spark, caplog):
    """A streamed transaction being received (spilled, neither committed nor aborted) is not idle time, however long
    no unit comes: its unit is next, and a warm-up beside it would slow its capture and compile."""
    from mirrorline.log import ChangeLog, LogWriter
    from mirrorline.model import Change, Op
    from mirrorline.position import ZERO

    a = _idle_pipeline(tmp_path, spark)
    with LogWriter(tmp_path / "log") as w:
        s = w.open_stream(2000)
        s.add(2000, [Change(ZERO, 0, 0, "public.a", Op.INSERT, ("2",), {"id": "2", "v": "y", "w": None})])
        s.end_block()
        assert ChangeLog(tmp_path / "log").receiving()
        durable = ChangeLog(tmp_path / "log").durable()
        applied: list[float] = []

        def idle_long() -> bool:  # the log's unit applied, then six times idle_warm_up without a unit
            if not applied and a.positions()["t"] == durable:
                applied.append(time.monotonic())
            return bool(applied) and time.monotonic() - applied[0] > 3.0

        with caplog.at_level(logging.INFO, logger="mirrorline.pipeline"):
            _follow_until(a, idle_long, "the log's unit is applied and 3 s idle followed")
        assert applied
        s.abort()
    assert "warmed up for large units" not in caplog.text
    assert not ChangeLog(tmp_path / "log").receiving()
    assert a.positions()["t"] == ChangeLog(tmp_path / "log").durable()


def test_a_failing_idle_warm_up_only_logs(tmp_path, spark, caplog, monkeypatch):
    from mirrorline.compile import warmup
    from mirrorline.log import ChangeLog

    pools = []

    def failing(spark_, *args):
        pools.append(spark_.sparkContext.getLocalProperty("spark.scheduler.pool"))
        raise RuntimeError("no room left in the scratch folder")

    patch_where_used(monkeypatch, warmup, "warm_large", failing)
    a = _idle_pipeline(tmp_path, spark)
    with caplog.at_level(logging.WARNING, logger="mirrorline.pipeline"):
        _follow_until(a, lambda: bool(pools), "the idle warm-up is tried")
    assert pools == ["warm-up"]  # its own scheduler pool; once
    assert "warming up for large units failed" in caplog.text and "no room left" in caplog.text
    assert a.positions()["t"] == ChangeLog(tmp_path / "log").durable()
