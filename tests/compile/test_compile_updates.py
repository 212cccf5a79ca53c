"""Units that only insert and update (mirrorline.compile.updates): the general path's net rows from one hash
aggregate and the images read at their positions; any other unit, or a key whose changes are not an insert and
updates, goes the general way."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from changes import write_log
from compile_support import changes_frame, collect_result
from large_units import A, B, ab_rows, kill_while_copying, one_unit_pipeline, spy_route

from mirrorline.compile import updates
from mirrorline.compile.spark import compile_changes
from mirrorline.compile.updates import SEQ_BITS, compile_updates, qualifies
from mirrorline.errors import ApplyError, InvalidSequenceError, LogError
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.rows import changes_to_table
from mirrorline.log.spark import read_spark
from mirrorline.log.stats import table_stats
from mirrorline.model import Change, Op
from mirrorline.position import ZERO, Position


def _a(i: int, rnd: random.Random) -> dict[str, str | None]:
    return {"id": str(i), "v": rnd.choice([None, f"v{rnd.random()}", "", 'a,b"c']), "w": rnd.choice([None, "7"])}


def _b(i: int, rnd: random.Random) -> dict[str, str | None]:
    return {"k1": f"x{i % 3}", "k2": str(i), "note": rnd.choice([None, "n", f"n{rnd.random()}"])}


def _changes(seed: int, n: int, present: bool = True) -> list[Change]:
    """Inserts and updates on 40 keys of A and B: a key is inserted once and then updated, or (``present``: the
    keys of odd number) only updated (it was there before the unit). Positions come from the log."""
    rnd = random.Random(seed)
    inserted: set[tuple[str, int]] = set()
    out = []
    for _ in range(n):
        table, i = rnd.choice(["public.a", "public.b"]), rnd.randrange(40)
        before = present and i % 2 == 1
        op = Op.UPDATE if before or (table, i) in inserted else Op.INSERT
        inserted.add((table, i))
        new = _a(i, rnd) if table == "public.a" else _b(i, rnd)
        key = (str(i),) if table == "public.a" else (f"x{i % 3}", str(i))
        out.append(Change(ZERO, 0, 1, table, op, key, new))
    return out


def _log(path: Path, changes: list[Change], per_txn: int = 7) -> ChangeLog:
    return write_log(path, [A, B], changes, per_txn=per_txn, segment_changes=50)


def test_which_units_qualify() -> None:
    rnd = random.Random(0)
    ups = [
        Change(Position(10, 0), 0, 1, "public.a", Op.INSERT, ("1",), _a(1, rnd)),
        Change(Position(11, 0), 0, 1, "public.a", Op.UPDATE, ("1",), _a(1, rnd)),
    ]
    stats = table_stats(changes_to_table(ups))
    assert qualifies(stats) and qualifies(stats, {"public.a": "iud"}) and qualifies(stats, {"public.b": "I"})
    assert not qualifies(stats, {"public.a": "IU"})  # the general path keeps what D's absence means
    assert not qualifies(stats, bags={"public.a": ("id", "v", "w")})
    assert not qualifies({})
    marked = Change(Position(12, 0), 0, 1, "public.a", Op.UPDATE, ("1",), {"id": "1"}, frozenset({"v", "w"}))
    dele = Change(Position(12, 0), 0, 1, "public.a", Op.DELETE, ("1",))
    trunc = Change(Position(12, 0), 0, 1, "public.b", Op.TRUNCATE)
    moved = Change(Position(12, 0), 0, 1, "public.a", Op.UPDATE, ("2",), _a(2, rnd), old_key=("1",))
    for other in (marked, dele, trunc, moved):
        assert not qualifies(table_stats(changes_to_table([*ups, other])))
    assert not qualifies({"public.a": replace(stats["public.a"], marks=None)})  # a segment from before marks


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_net_rows_are_the_general_paths(spark: Any, seed: int, tmp_path: Path) -> None:
    log = _log(tmp_path / "log", _changes(seed, 400))
    everything = list(log.read())
    assert len(log.segments()) > 3
    for start, end in ((ZERO, log.durable()), (everything[37].pos, everything[311].pos)):
        stats = log.stats(start, end)
        assert qualifies(stats) and {"I", "U"} <= set(stats["public.a"].first)
        got = compile_updates(
            read_spark(log, start, end, spark=spark),
            stats,
            start,
            end,
            lambda at: log.iter_at(at, ["table", "key", "new"]),
        )
        want = compile_changes(read_spark(log, start, end, spark=spark), start=start, end=end, stats=stats)
        assert got is not None and got.rows is not None
        assert (got.start, got.end, got.changes) == (start, end, sum(s.count for s in stats.values()))
        assert got.counts() == want.counts() and got.net_rows == got.rows.num_rows
        w, g = collect_result(want), collect_result(got)
        assert (g.tables, g.rows()) == (w.tables, w.rows())
        assert all(g.nets[t].of("I") and g.nets[t].of("U") for t in g.tables)
        want.release()


@pytest.mark.spark
@pytest.mark.parametrize(
    ("ops", "first", "second"),
    [(["I", "U", "I"], "U", "I"), (["I", "I"], "I", "I"), (["U", "I", "U"], "U", "I")],
)
def test_a_key_whose_changes_are_not_an_insert_and_updates_goes_the_general_way(
    spark: Any, ops: list[str], first: str, second: str
) -> None:
    rnd = random.Random(4)
    changes = [Change(Position(100 + i, 0), 0, 1, "public.a", Op(o), ("5",), _a(5, rnd)) for i, o in enumerate(ops)] + [
        Change(Position(200, 0), 0, 1, "public.a", Op.INSERT, ("6",), _a(6, rnd))
    ]
    stats = table_stats(changes_to_table(changes))
    assert qualifies(stats)

    def no_read(_at: pa.Table) -> list[pa.Table]:
        raise AssertionError("nothing is read for a unit that goes the general way")

    end = Position(200, 0)
    assert compile_updates(changes_frame(spark, changes), stats, ZERO, end, no_read) is None
    with pytest.raises(InvalidSequenceError) as e:
        compile_changes(changes_frame(spark, changes), end=end)
    assert e.value.key == ("5",) and f"{second} at 0/" in str(e.value) and f"cannot follow {first} at" in str(e.value)


@pytest.mark.spark
def test_positions_that_do_not_pack_go_the_general_way(spark: Any) -> None:
    """A transaction of more than 2^24 changes (its seq) or a unit spanning more than 2^39 bytes of WAL."""
    rnd = random.Random(5)
    for far in (Position(101, 1 << SEQ_BITS), Position(100 + (1 << (63 - SEQ_BITS)), 0)):
        changes = [
            Change(Position(100, 0), 0, 1, "public.a", Op.INSERT, ("1",), _a(1, rnd)),
            Change(far, 0, 1, "public.a", Op.UPDATE, ("1",), _a(1, rnd)),
        ]
        stats = table_stats(changes_to_table(changes))
        assert qualifies(stats)
        got = compile_updates(changes_frame(spark, changes), stats, ZERO, far, lambda at: [])
        assert got is None
        net = compile_changes(changes_frame(spark, changes), end=far, to_driver=True).rows
        assert net is not None
        assert [(r["kind"], r["lsn"], r["seq"]) for r in net.to_pylist()] == [("I", far.lsn, far.seq)]


@pytest.mark.spark
def test_images_read_on_the_driver_must_be_those_spark_found(spark: Any, tmp_path: Path) -> None:
    """Should the rows read at the net rows' positions not be there (a log changed under a reader), the unit is
    not applied."""
    log = _log(tmp_path / "log", _changes(6, 100))
    stats = log.stats()
    with pytest.raises(LogError) as e:
        compile_updates(
            read_spark(log, spark=spark),
            stats,
            ZERO,
            log.durable(),
            lambda at: log.iter_at(at.slice(1), ["table", "key", "new"]),
        )
    assert "the driver read" in str(e.value) and "only one capture" in (e.value.hint or "")


@pytest.mark.spark
def test_a_pipeline_applies_an_insert_and_update_unit_exactly(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:

    changes = _changes(7, 1000, present=False)
    _log(tmp_path / "log", changes)
    calls = spy_route(monkeypatch, updates, "compile_updates")
    a = one_unit_pipeline(
        tmp_path, 490, s=f"sqlite:///{tmp_path / 't.db'}", d=f"duckdb:///{tmp_path / 't.duckdb'}", p=pg.url, spark=spark
    )
    reports = a.catch_up()
    a.close()
    assert [r.changes for r in reports] == [1000] and calls == [True]
    assert ab_rows(tmp_path, pg) == dict.fromkeys(("sqlite", "duckdb", "pg"), _final(changes))


@pytest.mark.spark
def test_a_pipeline_stops_on_an_insert_after_an_update_and_keeps_its_position(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    changes = _changes(8, 1000, present=False)
    late = next(c for c in changes if c.op is Op.INSERT)
    changes.append(Change(ZERO, 0, 1, late.table, Op.INSERT, late.key, late.new))
    _log(tmp_path / "log", changes, per_txn=1001)
    calls = spy_route(monkeypatch, updates, "compile_updates")
    a = one_unit_pipeline(tmp_path, 490, t=f"sqlite:///{tmp_path / 't.db'}", spark=spark)
    with pytest.raises(InvalidSequenceError) as e:
        a.catch_up()
    assert calls == [False]
    assert (e.value.table, e.value.key) == (late.table, late.key) and ": I at " in str(e.value)
    assert a.positions()["t"] == ZERO
    a.close()


def _schemas() -> dict[str, Any]:
    return {"public.a": A, "public.b": B}


@pytest.mark.spark
def test_a_unit_of_new_keys_is_given_to_apply_while_its_images_are_read(spark: Any, tmp_path: Path) -> None:
    """Every net row an insert (each key's first change in the unit is its insert): the batch holds each table's
    rows as a feed of the images read at the keys' last positions, the general path's net rows; a unit with some
    keys only updated has its rows attached, as before."""
    for present, streamed in ((False, True), (True, False)):
        log = _log(tmp_path / f"log{present}", _changes(9, 400, present=present))
        end = log.durable()
        stats = log.stats(ZERO, end)
        chunks: list[int] = []

        def read(at: pa.Table, log: ChangeLog = log, chunks: list[int] = chunks) -> Any:
            for c in log.iter_at(at, ["table", "key", "new"]):
                chunks.append(c.num_rows)
                yield c

        got = compile_updates(read_spark(log, spark=spark), stats, ZERO, end, read, _schemas())
        assert got is not None and (got.inserts is not None) == streamed and (got.rows is None) == streamed
        got.verify()
        want = compile_changes(read_spark(log, spark=spark), end=end, stats=stats)
        w, g = collect_result(want), collect_result(got)
        assert (g.tables, g.rows()) == (w.tables, w.rows()) and got.net_rows == len(g.rows())
        assert len(chunks) > 1  # read a row group at a time
        want.release()
        got.release()


@pytest.mark.spark
def test_images_streamed_into_apply_must_be_those_spark_found(spark: Any, tmp_path: Path, pg: Any) -> None:
    """A streamed unit's rows are checked before apply commits: one image missing (a log changed under a reader)
    and nothing commits, the position stays; read again as it is, the unit applies exactly."""
    changes = _changes(10, 600, present=False)
    _log(tmp_path / "log", changes)
    real = ChangeLog.iter_at

    def short(self: ChangeLog, at: pa.Table, columns: list[str]) -> Any:
        return real(self, at.slice(1), columns)

    a = one_unit_pipeline(tmp_path, 490, p=pg.url, spark=spark)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ChangeLog, "iter_at", short)
        with pytest.raises(LogError) as e:
            a.catch_up()
    assert "the driver read" in str(e.value) and "only one capture" in (e.value.hint or "")
    assert a.positions()["p"] == ZERO
    assert pg.execute("SELECT count(*) FROM a") == [(0,)]
    assert [r.changes for r in a.catch_up()] == [600]
    a.close()
    assert ab_rows_pg(pg) == _final(changes)


@pytest.mark.spark
def test_a_failed_read_of_a_streamed_unit_is_the_error_reported(spark: Any, tmp_path: Path, pg: Any) -> None:
    changes = _changes(11, 600, present=False)
    _log(tmp_path / "log", changes)
    real = ChangeLog.iter_at

    def damaged(self: ChangeLog, *args: Any) -> Any:
        chunks = real(self, *args)
        yield next(chunks)
        raise LogError("change log segment x is damaged: junk", hint="restore it from a backup")

    a = one_unit_pipeline(tmp_path, 490, p=pg.url, spark=spark)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ChangeLog, "iter_at", damaged)
        with pytest.raises(LogError, match="segment x is damaged"):
            a.catch_up()
    assert a.positions()["p"] == ZERO
    assert pg.execute("SELECT count(*) FROM a") == [(0,)]
    a.close()


@pytest.mark.spark
@pytest.mark.parametrize("on_error", ["stop", "reject"])
def test_streamed_inserts_into_a_table_that_holds_one_of_them(
    spark: Any, tmp_path: Path, pg: Any, on_error: str
) -> None:
    """The COPY straight into the table fails on a key the target holds already: the failure path names the change
    (stop: nothing commits, the position stays) or rejects it and applies the rest."""
    changes = _changes(12, 600, present=False)
    _log(tmp_path / "log", changes)
    final = _final(changes)
    clash = final[0][0]
    pg.execute("CREATE TABLE a (id bigint PRIMARY KEY, v text, w integer)")
    pg.execute(f"INSERT INTO a VALUES ({clash[0]}, 'already here', NULL)")
    a = one_unit_pipeline(tmp_path, 490, p=pg.url, spark=spark)
    a.targets["p"].on_error = on_error
    if on_error == "stop":
        with pytest.raises(ApplyError) as e:
            a.catch_up()
        assert "public.a" in str(e.value) and f"'{clash[0]}'" in str(e.value)
        assert a.positions()["p"] == ZERO
        assert pg.execute("SELECT count(*) FROM a") == [(1,)]
    else:
        reports = a.catch_up()
        assert [r.results["p"].rejects for r in reports] == [1]  # the insert; the key's updates then apply
        assert a.positions()["p"] == ChangeLog(tmp_path / "log").durable()
        assert ab_rows_pg(pg) == final
    a.close()


def _final(changes: list[Change]) -> tuple[list[Any], list[Any]]:
    """Tables a and b as the changes leave them (rows of :func:`ab_rows_pg`)."""
    last: dict[tuple[str, tuple[str, ...]], dict[str, str | None]] = {}
    for c in changes:
        assert c.new is not None
        last[(c.table, c.key)] = c.new
    want_a = sorted(
        (int(n["id"] or 0), n["v"], None if n["w"] is None else int(n["w"]))
        for (t, _), n in last.items()
        if t == "public.a"
    )
    want_b = sorted((n["k1"], int(n["k2"] or 0), n["note"]) for (t, _), n in last.items() if t == "public.b")
    return want_a, want_b


def ab_rows_pg(pg: Any) -> tuple[list[Any], list[Any]]:
    return (
        pg.execute("SELECT id, v, w FROM a ORDER BY id"),
        pg.execute("SELECT k1, k2, note FROM b ORDER BY k1, k2"),
    )


@pytest.mark.spark
def test_killed_while_postgresql_copies_a_streamed_unit_then_run_again(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL while a unit of inserts and updates streams its images into COPY: nothing of it is committed (or, had
    the kill come after the commit, all of it); a new process then applies it exactly."""
    rnd = random.Random(13)
    keys = 40_000
    changes = [Change(ZERO, 0, 1, "public.a", Op.INSERT, (str(i),), _a(i, rnd)) for i in range(keys)]
    for i in rnd.sample(range(keys), keys) + rnd.sample(range(keys), keys // 2):
        changes.append(Change(ZERO, 0, 1, "public.a", Op.UPDATE, (str(i),), _a(i, rnd)))
    with LogWriter(tmp_path / "log", segment_changes=50_000) as w:
        w.record_schema(A)
        for i in range(0, len(changes), 1000):
            w.add_transaction(1000 + i, 1, changes[i : i + 1000])
    pg.execute("CREATE TABLE a (id bigint PRIMARY KEY, v text, w integer)")
    kill_while_copying(tmp_path, pg, "a")
    want = _final(changes)[0]
    rows = pg.execute("SELECT count(*) FROM a")[0][0]
    a = one_unit_pipeline(tmp_path, p=pg.url, spark=spark)
    end = ChangeLog(tmp_path / "log").durable()
    assert (a.positions()["p"], rows) in ((ZERO, 0), (end, len(want)))
    calls = spy_route(monkeypatch, updates, "compile_updates")
    a.catch_up()
    assert a.positions()["p"] == end and calls == ([True] if rows == 0 else [])  # (the streamed route, again)
    a.close()
    assert pg.execute("SELECT id, v, w FROM a ORDER BY id") == want
