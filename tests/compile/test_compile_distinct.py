"""Units in which no key repeats (mirrorline.compile.distinct): their changes are their net rows, the same as the
rules' fold gives; a unit where a key repeats is declined and folded by the next route; which units qualify."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from compile_support import collect_result
from large_units import A, B, ab_rows, one_unit_pipeline, spy_route

from mirrorline.compile import distinct
from mirrorline.compile.distinct import compile_distinct, qualifies
from mirrorline.compile.reference import fold
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.rows import changes_to_table
from mirrorline.log.stats import table_stats
from mirrorline.model import Change, Op
from mirrorline.position import ZERO, Position


def _row(table: str, i: int, rnd: random.Random) -> dict[str, str | None]:
    if table == "public.a":
        return {"id": str(i), "v": rnd.choice([None, "", 'a,b"c', f"v{i}"]), "w": rnd.choice([None, str(i)])}
    return {"k1": f"x{i % 3}", "k2": str(i), "note": rnd.choice([None, f"n{i}"])}


def _key(table: str, i: int) -> tuple[str, ...]:
    return (str(i),) if table == "public.a" else (f"x{i % 3}", str(i))


def _distinct(seed: int, n: int) -> list[Change]:
    """``n`` changes of tables a and b, each to a key of its own: inserts, updates (some leaving ``v`` and ``w`` or
    ``note`` unsent) and deletes."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        table = rnd.choice(["public.a", "public.b"])
        op = rnd.choice([Op.INSERT, Op.UPDATE, Op.DELETE])
        new = None if op is Op.DELETE else _row(table, i, rnd)
        unchanged: frozenset[str] = frozenset()
        if op is Op.UPDATE and new is not None and rnd.random() < 0.3:
            unchanged = frozenset({"v", "w"} if table == "public.a" else {"note"})
            new = {c: v for c, v in new.items() if c not in unchanged}
        out.append(Change(ZERO, 0, 1, table, op, _key(table, i), new, unchanged))
    return out


def _log(path: Path, before: list[Change], streamed: list[Change], xid: int = 77, lsn: int = 1000) -> ChangeLog:
    """A log of ``before`` (transactions of 10, from LSN ``lsn``) and then ``streamed`` as one streamed
    transaction."""
    with LogWriter(path, segment_changes=40) as w:
        for s in (A, B):
            w.record_schema(s)
        for i in range(0, len(before), 10):
            w.add_transaction(lsn, 1, before[i : i + 10])
            lsn += 10
        if streamed:
            spill = w.open_stream(xid)
            spill.add(xid, streamed[: len(streamed) // 2])
            spill.end_block()
            spill.add(xid, streamed[len(streamed) // 2 :])
            spill.end_block()
            spill.commit(lsn + 1000, 2)
    return ChangeLog(path)


def test_which_units_qualify() -> None:
    rnd = random.Random(0)
    ups = [Change(Position(10, i), 0, 1, "public.a", Op.UPDATE, (str(i),), _row("public.a", i, rnd)) for i in range(9)]
    stats = table_stats(changes_to_table(ups))
    assert qualifies(stats, (), streamed=lambda: 9, small_unit=5, driver_unit=9)
    assert qualifies(stats, (), streamed=lambda: 0, small_unit=5, driver_unit=9)  # small transactions, 9 keys
    unknown = {t: replace(s, keys=None) for t, s in stats.items()}  # segments from before the sketch was kept
    assert qualifies(unknown, (), streamed=lambda: 5, small_unit=5, driver_unit=9)  # most changes streamed
    assert not qualifies(unknown, (), streamed=lambda: 4, small_unit=5, driver_unit=9)  # most in small transactions
    again = table_stats(changes_to_table([replace(c, key=("1",)) if c.pos.seq % 2 else c for c in ups]))
    assert not qualifies(again, (), streamed=lambda: 4, small_unit=5, driver_unit=9)  # 5 keys of 9 changes
    assert qualifies(again, (), streamed=lambda: 5, small_unit=5, driver_unit=9)  # (read, then declined)
    assert not qualifies(stats, (), streamed=lambda: 9, small_unit=9, driver_unit=20)  # the small route's
    assert not qualifies(stats, (), streamed=lambda: 9, small_unit=5, driver_unit=8)  # too many for the driver
    assert not qualifies(stats, (), streamed=lambda: 9, small_unit=5, driver_unit=9, on_driver=False)  # stored units
    assert not qualifies(stats, ("public.a",), streamed=lambda: 9, small_unit=5, driver_unit=9)  # a bag of rows
    assert not qualifies(stats, (), lambda: 9, 5, 9, actions={"public.a": "IU"})  # an insert would replace
    assert qualifies(stats, (), lambda: 9, 5, 9, actions={"public.b": "IU"})
    trunc = Change(Position(11, 0), 0, 1, "public.a", Op.TRUNCATE)
    moved = Change(Position(11, 0), 0, 1, "public.a", Op.UPDATE, ("99",), _row("public.a", 99, rnd), old_key=("1",))
    for other in (trunc, moved):
        assert not qualifies(table_stats(changes_to_table([*ups, other])), (), lambda: 10, 5, 10)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_net_rows_are_the_rules_fold(seed: int, tmp_path: Path) -> None:
    log = _log(tmp_path / "log", _distinct(seed, 60), _distinct(seed + 100, 300)[60:])
    everything = list(log.read())
    assert any(s.stream for s in log.segments())
    for start, end in ((ZERO, log.durable()), (everything[17].pos, everything[250].pos)):
        stats = log.stats(start, end)
        got = compile_distinct(log.read_arrow(start, end), stats, start, end)
        want = fold(log.read(start, end))
        assert got is not None and got.rows is not None
        assert (got.start, got.end, got.changes) == (start, end, sum(s.count for s in stats.values()))
        g = collect_result(got)
        assert g.rows() == want.rows() and got.net_rows == got.rows.num_rows
        assert {(t, k) for t in g.tables for k in "DUI" if g.nets[t].of(k)} == {
            (t, k) for t in want.tables for k in "DUI" if want.nets[t].of(k)
        }
        assert g.tables == want.tables


def test_a_repeated_key_is_declined(tmp_path: Path) -> None:
    changes = _distinct(5, 50)
    again = replace(changes[10], op=Op.UPDATE, new=_row(changes[10].table, 10, random.Random(1)))
    log = _log(tmp_path / "log", [], [*changes, again])
    end = log.durable()
    assert compile_distinct(log.read_arrow(ZERO, end), log.stats(ZERO, end), ZERO, end) is None
    # one table with a one-column key (its keys compared as they are)
    only_a = [c for c in changes if c.table == "public.a"]
    twice = replace(only_a[3], op=Op.DELETE, new=None)
    log1 = _log(tmp_path / "log1", [], [*only_a, twice])
    end = log1.durable()
    assert compile_distinct(log1.read_arrow(ZERO, end), log1.stats(ZERO, end), ZERO, end) is None
    # the same key in another table is another key
    other = Change(ZERO, 0, 1, "public.b", Op.INSERT, ("10",), None)
    log2 = _log(tmp_path / "log2", [], [*[c for c in changes if c.table == "public.a"], other])
    end = log2.durable()
    assert compile_distinct(log2.read_arrow(ZERO, end), log2.stats(ZERO, end), ZERO, end) is not None


def _final(changes: list[Change]) -> tuple[list[Any], list[Any]]:
    """Tables a and b as ``changes`` leave them, replayed one by one (rows of :func:`ab_rows`)."""
    rows: dict[tuple[str, tuple[str, ...]], dict[str, str | None]] = {}
    for c in changes:
        if c.op is Op.DELETE:
            del rows[(c.table, c.key)]
        else:
            assert c.new is not None
            rows[(c.table, c.key)] = {**rows.get((c.table, c.key), {}), **c.new}
    a = sorted(
        (int(n["id"] or 0), n["v"], None if n["w"] is None else int(n["w"]))
        for (t, _), n in rows.items()
        if t == "public.a"
    )
    b = sorted((n["k1"], int(n["k2"] or 0), n["note"]) for (t, _), n in rows.items() if t == "public.b")
    return a, b


def _batch_job(n: int) -> tuple[list[Change], list[Change]]:
    """Rows inserted in small transactions, then one streamed transaction that updates some (some leaving columns
    unsent), deletes others and inserts new ones: every change of it to a key of its own."""
    rnd = random.Random(n)
    tables = ["public.a", "public.b"]
    before = [Change(ZERO, 0, 1, t, Op.INSERT, _key(t, i), _row(t, i, rnd)) for i in range(n) for t in tables]
    big = []
    for i in range(n):
        for t in tables:
            if i % 3 == 0:
                big.append(Change(ZERO, 0, 1, t, Op.DELETE, _key(t, i), None))
            elif i % 3 == 1:
                new = _row(t, i, rnd)
                big.append(
                    Change(
                        ZERO,
                        0,
                        1,
                        t,
                        Op.UPDATE,
                        _key(t, i),
                        {c: new[c] for c in list(new)[:2]},
                        frozenset(list(new)[2:]),
                    )
                )
            else:
                big.append(Change(ZERO, 0, 1, t, Op.UPDATE, _key(t, i), _row(t, i, rnd)))
            big.append(Change(ZERO, 0, 1, t, Op.INSERT, _key(t, n + i), _row(t, n + i, rnd)))
    return before, big


@pytest.mark.spark
def test_a_pipeline_applies_a_batch_jobs_transaction_exactly(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, big = _batch_job(150)
    urls = {"s": f"sqlite:///{tmp_path / 't.db'}", "d": f"duckdb:///{tmp_path / 't.duckdb'}", "p": pg.url}
    _log(tmp_path / "log", before, [])
    a = one_unit_pipeline(tmp_path, 300, spark=spark, **urls)
    assert [r.changes for r in a.catch_up()] == [300]
    a.close()
    _log(tmp_path / "log", [], big, lsn=5000)
    calls = spy_route(monkeypatch, distinct, "compile_distinct")
    a = one_unit_pipeline(tmp_path, 300, spark=spark, **urls)
    reports = a.catch_up()
    a.close()
    assert [r.changes for r in reports] == [600] and calls == [True]
    assert ab_rows(tmp_path, pg) == dict.fromkeys(("sqlite", "duckdb", "pg"), _final(before + big))


@pytest.mark.spark
@pytest.mark.parametrize("repeat", [False, True])
def test_a_catch_up_of_small_transactions_takes_the_route_when_the_sketches_say_no_key_repeats(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch, repeat: bool
) -> None:
    """A batch job committing every 10 rows, every change to a key of its own: the log's key sketches say nothing
    folds, and the unit goes to the driver without Spark's fold. The same job updating its keys again is folded by
    the other routes, without a read by this one."""
    before, big = _batch_job(150)
    urls = {"s": f"sqlite:///{tmp_path / 't.db'}", "d": f"duckdb:///{tmp_path / 't.duckdb'}", "p": pg.url}
    if not repeat:  # the rows the job changes are there already
        _log(tmp_path / "log", before, [])
        a = one_unit_pipeline(tmp_path, 300, spark=spark, **urls)
        assert [r.changes for r in a.catch_up()] == [300]
        a.close()
    unit = big if not repeat else before + big
    _log(tmp_path / "log", unit, [], lsn=5000)
    calls = spy_route(monkeypatch, distinct, "compile_distinct")
    a = one_unit_pipeline(tmp_path, 300, spark=spark, **urls)
    reports = a.catch_up()
    a.close()
    assert [r.changes for r in reports] == [len(unit)] and calls == ([] if repeat else [True])
    assert ab_rows(tmp_path, pg) == dict.fromkeys(("sqlite", "duckdb", "pg"), _final(before + big))


@pytest.mark.spark
def test_a_pipeline_folds_a_streamed_unit_whose_keys_repeat(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, big = _batch_job(150)
    _log(tmp_path / "log", before, big)
    calls = spy_route(monkeypatch, distinct, "compile_distinct")
    urls = {"s": f"sqlite:///{tmp_path / 't.db'}", "d": f"duckdb:///{tmp_path / 't.duckdb'}", "p": pg.url}
    a = one_unit_pipeline(tmp_path, 300, spark=spark, **urls)
    reports = a.catch_up()  # one unit: the inserts before and the streamed changes of the same keys
    a.close()
    assert [r.changes for r in reports] == [900] and calls == [False]
    assert ab_rows(tmp_path, pg) == dict.fromkeys(("sqlite", "duckdb", "pg"), _final(before + big))
