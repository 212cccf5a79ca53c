"""How the pipeline cuts units (no server): sized by how far behind the targets are, and when the next one is
compiled ahead."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from mirrorline.config import parse
from mirrorline.log import LogWriter
from mirrorline.model import Change, Op
from mirrorline.pipeline import Applier
from mirrorline.pipeline.plan import Sizes, next_unit
from mirrorline.position import ZERO, Position


def _applier(tmp_path: Path, txns: int, max_changes: int = 1_000_000, spark: Any = None) -> Applier:
    """A log of ``txns`` transactions of 10 changes each (LSN 10, 20, ...)."""
    with LogWriter(tmp_path / "log", segment_changes=5_000) as w:
        for k in range(1, txns + 1):
            w.add_transaction(
                k * 10, k, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (f"{k}.{i}",), {"id": "x"}) for i in range(10)]
            )
    conf = parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "apply": {"max_changes": max_changes},
            "targets": {"t": {"url": f"sqlite:///{tmp_path / 't.db'}"}},
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, open_targets=False, spark=spark)
    a.small_unit, a.catch_up_changes = 1_000, 4_000
    return a


def _next(a: Applier, start: Position, upto: Position | None = None) -> tuple[Position | None, int, int]:
    u = next_unit(a.log, start, upto or a.log.durable() or ZERO, Sizes(a.config.apply.max_changes, 1_000, 4_000))
    return u.end, u.changes, u.size


def test_the_logs_own_shape_plans_units_as_the_plans_tests_say(tmp_path: Path) -> None:
    """tests/pipeline/test_pipeline_plan.py checks the planner on a log in memory; here on the change log's files."""
    a = _applier(tmp_path, 350)  # 3,500 changes behind: fewer than catch_up
    assert _next(a, ZERO) == (Position(1000, 9), 1_000, 1_000)
    assert _next(a, ZERO, Position(300, 9)) == (Position(300, 9), 300, 1_000)
    a = _applier(tmp_path / "b", 600)  # 6,000 changes behind
    assert _next(a, ZERO) == (Position(6000, 9), 6_000, 1_000_000)
    assert _next(a, Position(2500, 9)) == (Position(3500, 9), 1_000, 1_000)
    a = _applier(tmp_path / "c", 600, max_changes=500)
    assert _next(a, ZERO) == (Position(500, 9), 500, 500)


def _append(tmp_path: Path, first: int, txns: int) -> None:
    with LogWriter(tmp_path / "log", segment_changes=5_000) as w:
        for k in range(first, first + txns):
            w.add_transaction(
                k * 10, k, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (f"{k}.{i}",), {"id": "x"}) for i in range(10)]
            )


def test_the_next_unit_is_compiled_once_it_fills_while_this_one_applies(tmp_path: Path, spark: Any) -> None:
    a = _applier(tmp_path, 150, spark=spark)  # 500 changes after (1000, 9): not full yet
    applying: Future[None] = Future()

    def load() -> None:
        time.sleep(0.3)
        _append(tmp_path, 151, 60)  # now 1,100 after it: full
        time.sleep(0.2)
        applying.set_result(None)

    t = threading.Thread(target=load)
    t.start()
    batch = a.compile_next(Position(1000, 9), [applying])
    t.join()
    assert batch is not None
    assert (batch.start, batch.end, batch.changes) == (Position(1000, 9), Position(2000, 9), 1_000)
    a.close()


def test_a_next_unit_still_open_when_the_targets_finish_is_left_for_the_next_step(tmp_path: Path) -> None:
    a = _applier(tmp_path, 150)
    applying: Future[None] = Future()
    threading.Timer(0.3, applying.set_result, (None,)).start()
    t0 = time.monotonic()
    assert a.compile_next(Position(1000, 9), [applying]) is None  # no Spark: nothing is compiled
    assert time.monotonic() - t0 < 5


def test_a_target_moves_past_the_logs_last_change_only_to_a_covered_position(tmp_path: Path, spark: Any) -> None:
    from mirrorline.model import Column, TableSchema
    from mirrorline.pipeline import catch_up_target

    with LogWriter(tmp_path / "log") as w:
        w.record_schema(TableSchema("public.t", (Column("id", "text", nullable=False),), ("id",)))
        w.add_transaction(10, 1, [Change(ZERO, 0, 0, "public.t", Op.INSERT, ("a",), {"id": "a"})])
    conf = parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "targets": {"t": {"url": f"sqlite:///{tmp_path / 't.db'}"}},
        },
        tmp_path / "m.toml",
    )
    beyond = Position(500, 2**63 - 1)  # a consistent point past the last change (verify's)
    a = Applier(conf, spark=spark)
    a.catch_up(beyond)  # not known to be covered: the log's end
    assert a.positions() == {"t": Position(10, 0)}
    a.close()
    assert catch_up_target(conf, "t", upto=beyond) == beyond  # the caller knows capture passed it


def test_a_unit_closes_when_its_first_change_is_latency_old_by_its_commit_time(tmp_path: Path) -> None:
    """The latency counts from the first change's commit: a change that already waited (for capture, or while the
    previous unit applied) does not wait the whole latency again; a source clock ahead of this machine's never
    holds a unit open longer than the latency."""
    now_us = int(time.time() * 1e6)
    with LogWriter(tmp_path / "log") as w:
        for lsn, ts in ((10, now_us - 60_000_000), (20, now_us), (30, now_us + 3_600_000_000)):
            w.add_transaction(lsn, ts, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (str(lsn),), {"id": "x"})])
    conf = parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "apply": {"latency": "2s"},
            "targets": {"t": {"url": f"sqlite:///{tmp_path / 't.db'}"}},
        },
        tmp_path / "m.toml",
    )
    a = Applier(conf, open_targets=False)
    t0 = time.monotonic()
    assert a.closes_at(ZERO) <= time.monotonic()  # committed a minute ago: closes now
    fresh = a.closes_at(Position(10, 0)) - t0  # committed just now: about the whole latency
    assert 1.0 < fresh <= 2.0 + (time.monotonic() - t0)
    ahead = a.closes_at(Position(20, 0)) - time.monotonic()  # "committed" an hour from now: the latency, no more
    assert 1.9 < ahead <= 2.0
    nothing = a.closes_at(Position(30, 0)) - time.monotonic()  # no change after it (yet)
    assert 1.9 < nothing <= 2.0


def test_a_log_that_cannot_be_read_leaves_the_unit_the_whole_latency(tmp_path: Path) -> None:
    """When the first change's commit time cannot be read (a damaged segment: the log raises LogError), the unit waits
    the latency from now; the error is for the unit's own read to report."""
    a = _applier(tmp_path, 1)
    for seg in (tmp_path / "log").rglob("*.parquet"):
        seg.write_bytes(b"not parquet")
    left = a.closes_at(ZERO) - time.monotonic()
    assert a.config.apply.latency - 0.1 < left <= a.config.apply.latency


def test_a_unit_whose_segments_another_process_retained_meanwhile_is_formed_again(tmp_path: Path, spark: Any) -> None:
    """Two processes apply the same targets (``run`` and ``verify``, or ``apply --once``): between one reading its
    targets' positions and reading the unit's segments, the other applies past them and its retention removes the
    segments. The first forms its unit again from the new positions instead of stopping on a "damaged" log; a
    segment removed while a target still needs it is still an error."""
    import sqlite3

    import pytest

    from mirrorline.errors import LogError
    from mirrorline.log.retention import retain
    from mirrorline.model import Column, TableSchema

    with LogWriter(tmp_path / "log", segment_changes=1) as w:
        w.record_schema(TableSchema("public.t", (Column("id", "text", nullable=False),), ("id",)))
        for k in range(1, 6):  # five transactions, a segment each
            w.add_transaction(k * 10, k, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (str(k),), {"id": str(k)})])
    conf = parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "targets": {"t": {"url": f"sqlite:///{tmp_path / 't.db'}"}},
        },
        tmp_path / "m.toml",
    )
    first, other = Applier(conf, spark=spark), Applier(conf, spark=spark)
    first.catch_up(Position(20, 0))
    first.prune()
    assert len(list((tmp_path / "log").rglob("*.parquet"))) == 3
    compile_ = first.units.compile

    def raced(*args: Any, **kwargs: Any) -> Any:
        other.catch_up()  # the other process applies everything meanwhile, and retains
        other.prune()
        return compile_(*args, **kwargs)

    first.units.compile = raced  # type: ignore[method-assign]
    assert first.step() is None  # formed again at the next step, nothing lost
    first.units.compile = compile_  # type: ignore[method-assign]
    assert first.step() is None and first.positions() == {"t": Position(50, 0)}
    with sqlite3.connect(tmp_path / "t.db") as db:
        assert sorted(r[0] for r in db.execute('SELECT "id" FROM "t"')) == ["1", "2", "3", "4", "5"]
    first.close()
    other.close()

    # a target behind what retention removed (nothing registered: keep nothing) still stops with the log's error
    with LogWriter(tmp_path / "log", segment_changes=1) as w:
        w.add_transaction(60, 6, [Change(ZERO, 0, 0, "public.t", Op.INSERT, ("6",), {"id": "6"})])
        w.add_transaction(70, 7, [Change(ZERO, 0, 0, "public.t", Op.INSERT, ("7",), {"id": "7"})])
    behind = Applier(conf, spark=spark)
    (tmp_path / "log" / "readers" / "t.json").unlink()
    retain(behind.log, keep_nothing=True)
    with pytest.raises(LogError, match="no longer retained"):
        behind.step()
    behind.close()


def test_a_unit_another_process_still_needs_is_kept_when_one_target_passes_it(tmp_path: Path, spark: Any) -> None:
    """``apply --target a`` beside ``run`` applying b: a unit stored for both stays until both have passed it (b by
    the position it registered), so that the other process never finds its Parquet files gone between reading
    ``unit.json`` and Spark listing them. A unit removed meanwhile anyway (the tables changed) is compiled again."""
    import sqlite3

    from mirrorline.compile.store import UnitStore
    from mirrorline.log.retention import set_applied
    from mirrorline.model import Column, TableSchema

    with LogWriter(tmp_path / "log", segment_changes=2) as w:
        w.record_schema(TableSchema("public.t", (Column("id", "text", nullable=False),), ("id",)))
        for k in range(1, 6):
            w.add_transaction(k * 10, k, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (str(k),), {"id": str(k)})])
    conf = parse(
        {
            "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
            "log": {"path": str(tmp_path / "log")},
            "targets": {n: {"url": f"sqlite:///{tmp_path / n}.db"} for n in ("a", "b")},
        },
        tmp_path / "m.toml",
    )
    ahead, behind = Applier(conf, ["a"], spark=spark), Applier(conf, ["b"], spark=spark)
    for n in ("a", "b"):
        set_applied(ahead.log, n, ZERO)  # as a snapshot registers them
    store = UnitStore(tmp_path / "log")
    ahead.catch_up()
    assert ahead.positions() == {"a": Position(50, 0)}
    [unit] = store.units()
    ahead.prune()
    assert store.units() == [unit]  # b, registered at ZERO, still needs it
    report = behind.step()
    assert report is not None and not report.compiled  # read from the store, not compiled again
    ahead.prune()
    assert store.units() == []  # both passed it
    for n in ("a", "b"):
        with sqlite3.connect(tmp_path / f"{n}.db") as db:
            assert sorted(r[0] for r in db.execute('SELECT "id" FROM "t"')) == ["1", "2", "3", "4", "5"]

    # removed after its unit.json was read, before Spark listed its files: compiled again, nothing lost
    with LogWriter(tmp_path / "log", segment_changes=2) as w:
        w.add_transaction(60, 6, [Change(ZERO, 0, 0, "public.t", Op.INSERT, ("6",), {"id": "6"})])
    ahead.catch_up()
    [unit] = store.units()
    real = spark.read.__class__.schema

    def removed_meanwhile(self: Any, *args: Any) -> Any:
        import shutil

        shutil.rmtree(store.path(*unit), ignore_errors=True)  # (the first read; the unit stored again stays)
        mp.setattr(spark.read.__class__, "schema", real)
        return real(self, *args)

    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spark.read.__class__, "schema", removed_meanwhile)
        report = behind.step()
    assert report is not None and report.compiled and behind.positions() == {"b": Position(60, 0)}
    with sqlite3.connect(tmp_path / "b.db") as db:
        assert db.execute('SELECT count(*) FROM "t"').fetchone() == (6,)
    ahead.close()
    behind.close()


_NO_SPARK = """
import json, sys
from pathlib import Path
from mirrorline import sparkenv
from mirrorline.config import parse
from mirrorline.log import LogWriter
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.pipeline import Applier
from mirrorline.position import ZERO

root = Path(sys.argv[1])
with LogWriter(root / "log") as w:
    w.record_schema(TableSchema("public.t", (Column("id", "text", nullable=False), Column("v", "text")), ("id",)))
    for k in range(1, 201):
        ops = [Change(ZERO, 0, 0, "public.t", Op.INSERT, (str(k),), {"id": str(k), "v": "a"})]
        if k % 3 == 0:
            ops.append(Change(ZERO, 0, 0, "public.t", Op.UPDATE, (str(k),), {"id": str(k), "v": "b"}))
        if k % 5 == 0:
            ops.append(Change(ZERO, 0, 0, "public.t", Op.DELETE, (str(k),), None))
        w.add_transaction(k * 10, k, ops)
conf = parse(
    {
        "source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"},
        "log": {"path": str(root / "log")},
        "targets": {"t": {"url": f"sqlite:///{root / 't.db'}"}},
    },
    root / "m.toml",
)
a = Applier(conf)
a.catch_up()
print(json.dumps({"started": sparkenv.started(), "route": a.compiler.last_route, "at": str(a.positions()["t"])}))
a.close()
"""


def test_a_process_without_spark_applies_small_units_without_starting_it(tmp_path: Path) -> None:
    """``apply --once`` and ``verify``'s catch-up start no warm-up: a unit the driver route takes is folded on the
    driver, and Spark is never started for it (a Spark start is 10 to 20 seconds of a short command)."""
    import json
    import sqlite3
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_SPARK, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"started": False, "route": "driver", "at": str(Position(2000, 1))}, got
    with sqlite3.connect(tmp_path / "t.db") as db:
        rows = dict(db.execute('SELECT "id", "v" FROM "t"').fetchall())
    assert rows == {str(k): "b" if k % 3 == 0 else "a" for k in range(1, 201) if k % 5}
