"""Units that only insert (mirrorline.compile.inserts): one narrow Spark job, no fold. The result must be the general
path's, a key inserted twice must still end in the general path's error, and a pipeline must apply such a unit to
its targets exactly."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from changes import write_log
from compile_support import changes_frame, collect_result
from large_units import A, B, ab_rows, kill_while_copying, one_unit_pipeline, spy_route
from waiting import wait_until

from mirrorline import stopped
from mirrorline.compile import inserts
from mirrorline.compile.batch import Feed
from mirrorline.compile.inserts import compile_inserts, qualifies
from mirrorline.compile.spark import compile_changes
from mirrorline.compile.store import UnitStore
from mirrorline.errors import ApplyError, InvalidSequenceError, LogError, Unverified
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.rows import changes_to_table
from mirrorline.log.spark import range_filter
from mirrorline.log.stats import table_stats
from mirrorline.model import Change, Op
from mirrorline.position import ZERO, Position


def _inserts(seed: int, n: int) -> list[Change]:
    """Inserts into A and B in random order, some values NULL, positions 1..n."""
    rnd = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        if rnd.random() < 0.6:
            new = {"id": str(i), "v": rnd.choice([None, f"v{i}", "", 'a,b"c']), "w": rnd.choice([None, str(i % 7)])}
            out.append(Change(Position(10 + i, 0), 0, 1, "public.a", Op.INSERT, (str(i),), new))
        else:
            new = {"k1": f"x{i % 13}", "k2": str(i), "note": rnd.choice([None, "n"])}
            out.append(Change(Position(10 + i, 0), 0, 1, "public.b", Op.INSERT, (f"x{i % 13}", str(i)), new))
    return out


def _batches(changes: list[Change], size: int = 64) -> list[Any]:
    """The changes in the log layout as the driver reads them: batches of rows in log order."""
    t = changes_to_table(changes)
    return [t.slice(i, size) for i in range(0, t.num_rows, size)]


def test_which_units_qualify() -> None:
    ins = table_stats(changes_to_table(_inserts(1, 20)))
    assert qualifies(ins)
    assert not qualifies(ins, max_rows=19)
    assert not qualifies(ins, {"public.a": "UD", "public.b": "D"})  # nothing left to insert
    assert qualifies(ins, {"public.a": "UD"})
    upd = Change(Position(99, 0), 0, 1, "public.a", Op.UPDATE, ("1",), {"id": "1", "v": "x", "w": None})
    dele = Change(Position(99, 0), 0, 1, "public.a", Op.DELETE, ("1",))
    trunc = Change(Position(99, 0), 0, 1, "public.b", Op.TRUNCATE)
    moved = Change(
        Position(99, 0), 0, 1, "public.a", Op.UPDATE, ("100",), {"id": "100", "v": None, "w": None}, old_key=("1",)
    )
    for other in (upd, dele, trunc, moved):
        assert not qualifies(table_stats(changes_to_table([*_inserts(1, 20), other])))
    assert not qualifies({})


@pytest.mark.spark
@pytest.mark.parametrize("seed", [1, 2])
def test_the_net_rows_are_the_general_paths(spark: Any, seed: int, tmp_path: Path) -> None:
    changes = _inserts(seed, 300)
    stats = table_stats(changes_to_table(changes))
    start, end = Position(40, 0), Position(250, 0)  # bounds inside the rows: only (start, end] counts
    inside = [c for c in changes if start < c.pos <= end]
    for actions in (None, {"public.b": "UD"}):
        want = compile_changes(changes_frame(spark, changes), actions=actions, start=start, end=end)
        got = compile_inserts(
            changes_frame(spark, changes).where(range_filter(start, end)),  # the unit's rows, as read_spark gives
            table_stats(changes_to_table(inside)),
            {"public.a": A, "public.b": B},
            start,
            end,
            _batches(inside),
            actions,
        )
        assert got is not None and got.net is None and got.inserts is not None
        assert (got.start, got.end, got.changes) == (start, end, len(inside))
        assert got.counts() == want.counts()
        w, g = collect_result(want), collect_result(got)
        got.verify()
        assert (g.tables, g.rows()) == (w.tables, w.rows())
        assert len(g.tables) == (1 if actions else 2) and sum(len(g.nets[t].of("I")) for t in g.tables) > 0
        stored = collect_result(UnitStore(tmp_path / f"s{actions is None}").save(spark, got))  # as `compile` keeps it
        assert (stored.tables, stored.rows()) == (w.tables, w.rows())
        want.release()
    assert qualifies(stats)


@pytest.mark.spark
def test_a_key_inserted_twice_goes_to_the_general_path_and_its_error(spark: Any) -> None:
    changes = _inserts(3, 50)
    twice = Change(Position(200, 0), 0, 1, "public.a", Op.INSERT, ("7",), {"id": "7", "v": "again", "w": None})
    changes = [c for c in changes if c.key != ("7",)] + [
        Change(Position(17, 0), 0, 1, "public.a", Op.INSERT, ("7",), {"id": "7", "v": "first", "w": None}),
        twice,
    ]
    stats = table_stats(changes_to_table(sorted(changes, key=lambda c: c.pos)))
    assert qualifies(stats)
    end = Position(200, 0)
    rows = _batches(sorted(changes, key=lambda c: c.pos))
    got = compile_inserts(changes_frame(spark, changes), stats, {"public.a": A, "public.b": B}, ZERO, end, rows)
    with pytest.raises(Unverified):
        got.verify()
    with pytest.raises(Unverified):  # every caller (each target's apply) hears the same
        got.verify()
    got.release()
    with pytest.raises(InvalidSequenceError) as e:
        compile_changes(changes_frame(spark, changes), end=end)
    assert (e.value.table, e.value.key, e.value.second_pos) == ("public.a", ("7",), Position(200, 0))


def _want_ab(changes: list[Change]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows of ``a`` and ``b`` the inserts ``changes`` leave, sorted, as :func:`ab_rows` reads them."""
    want_a = sorted(
        (int(c.new["id"]), c.new["v"], None if c.new["w"] is None else int(c.new["w"]))
        for c in changes
        if c.table == "public.a" and c.new
    )
    want_b = sorted((c.new["k1"], int(c.new["k2"]), c.new["note"]) for c in changes if c.table == "public.b" and c.new)
    return want_a, want_b


def _log(tmp_path: Path, changes: list[Change], per_txn: int = 100) -> None:
    write_log(tmp_path / "log", [A, B], changes, per_txn=per_txn, segment_changes=250, lsn_step=1)


@pytest.mark.spark
def test_a_pipeline_applies_an_inserts_only_unit_exactly(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    changes = _inserts(4, 1000)
    _log(tmp_path, changes)
    calls = spy_route(monkeypatch, inserts, "compile_inserts")
    a = one_unit_pipeline(
        tmp_path, s=f"sqlite:///{tmp_path / 't.db'}", d=f"duckdb:///{tmp_path / 't.duckdb'}", p=pg.url, spark=spark
    )
    reports = a.catch_up()
    a.close()
    assert [r.changes for r in reports] == [1000] and calls == [True]
    assert ab_rows(tmp_path, pg) == dict.fromkeys(("sqlite", "duckdb", "pg"), _want_ab(changes))


@pytest.mark.spark
def test_inserts_copied_straight_into_a_table_that_holds_one_of_them_stop_naming_it(
    tmp_path: Path, spark: Any, pg: Any
) -> None:
    changes = _inserts(6, 1000)
    _log(tmp_path, changes)
    clash = next(c for c in reversed(changes) if c.table == "public.a")
    pg.execute("CREATE TABLE a (id bigint PRIMARY KEY, v text, w integer)")
    pg.execute(f"INSERT INTO a VALUES ({clash.new['id']}, 'already here', NULL)")
    a = one_unit_pipeline(tmp_path, p=pg.url, spark=spark)
    with pytest.raises(ApplyError) as e:
        a.catch_up()
    assert "public.a" in str(e.value) and str(clash.key[0]) in str(e.value)
    assert a.positions()["p"] == ZERO
    assert pg.execute("SELECT count(*) FROM a") == [(1,)]
    a.close()


@pytest.mark.spark
def test_a_pipeline_stops_on_a_key_inserted_twice_and_keeps_its_position(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = _twice_log(tmp_path)
    calls = spy_route(monkeypatch, inserts, "compile_inserts")
    a = one_unit_pipeline(tmp_path, spark=spark)
    with pytest.raises(InvalidSequenceError) as e:
        a.catch_up()
    assert calls == [True]  # the route's batch, whose check failed before anything committed
    assert (e.value.table, e.value.key) == ("public.a", first.key)
    assert a.positions()["t"] == ZERO
    assert stopped.read(tmp_path / "log") == {}  # the unit's error, not the target's
    a.close()


def _twice_log(tmp_path: Path) -> tuple[Change, list[Change]]:
    """A log of 1,000 inserts in one transaction, the first key of ``public.a`` inserted again at the end."""
    changes = _inserts(5, 1000)
    first = next(c for c in changes if c.table == "public.a")
    changes.append(Change(ZERO, 0, 1, "public.a", Op.INSERT, first.key, first.new))
    _log(tmp_path, changes, per_txn=1001)
    return first, changes


@pytest.mark.spark
@pytest.mark.parametrize(("keyed", "on_error"), [(True, "stop"), (True, "reject"), (False, "stop")])
def test_inserts_copied_straight_in_commit_nothing_when_a_key_is_inserted_twice(
    tmp_path: Path, spark: Any, pg: Any, keyed: bool, on_error: str
) -> None:
    """PostgreSQL loads the rows while Spark checks the keys: with a primary key the COPY itself fails on the
    second insert; without one it loads both. Either way the check decides, before the failure path (which, to
    reject, would commit): nothing commits, the general path names the invalid sequence, the position stays and
    the target is not marked stopped."""
    first, _ = _twice_log(tmp_path)
    pg.execute(f"CREATE TABLE a (id bigint {'PRIMARY KEY' if keyed else ''}, v text, w integer)")
    a = one_unit_pipeline(tmp_path, p=pg.url, spark=spark)
    a.targets["p"].on_error = on_error
    with pytest.raises(InvalidSequenceError) as e:
        a.catch_up()
    assert (e.value.table, e.value.key) == ("public.a", first.key)
    assert a.positions()["p"] == ZERO
    assert pg.execute("SELECT count(*) FROM a") == [(0,)]
    assert stopped.read(tmp_path / "log") == {}
    a.close()


@pytest.mark.spark
def test_a_unit_kept_for_other_processes_is_checked_before_it_is_stored(tmp_path: Path, spark: Any) -> None:
    """``compile`` (the stage alone) keeps units in the log for ``apply`` processes: a unit whose inserts route's
    check fails is compiled the general way, whose error names the sequence; nothing is stored."""
    first, _ = _twice_log(tmp_path)
    a = one_unit_pipeline(tmp_path, spark=spark)
    with pytest.raises(InvalidSequenceError) as e:
        a.compile_ahead()
    assert (e.value.table, e.value.key) == ("public.a", first.key)
    assert UnitStore(tmp_path / "log").starting_at(ZERO) is None
    a.close()


@pytest.mark.spark
def test_a_read_that_fails_while_postgresql_loads_the_rows_stops_the_unit_with_that_error(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows go into COPY as the driver reads them: a segment found damaged after some were loaded fails the
    COPY, and the read's own error is what the user reads. Nothing commits, the position stays, and the next run
    (the segment readable again) applies the unit exactly."""
    changes = _inserts(7, 1000)
    _log(tmp_path, changes)
    real = ChangeLog.read_arrow

    def damaged(self: ChangeLog, *args: Any, **kwargs: Any) -> Any:
        batches = real(self, *args, **kwargs)
        yield next(batches)
        raise LogError("change log segment x is damaged: junk", hint="restore it from a backup")

    monkeypatch.setattr(ChangeLog, "read_arrow", damaged)
    pg.execute("CREATE TABLE a (id bigint PRIMARY KEY, v text, w integer)")
    a = one_unit_pipeline(tmp_path, p=pg.url, spark=spark)
    with pytest.raises(LogError, match="segment x is damaged"):
        a.catch_up()
    assert a.positions()["p"] == ZERO
    assert stopped.read(tmp_path / "log") == {}
    assert pg.execute("SELECT count(*) FROM a") == [(0,)]
    a.close()
    monkeypatch.setattr(ChangeLog, "read_arrow", real)
    a = one_unit_pipeline(tmp_path, p=pg.url, spark=spark)
    assert [r.changes for r in a.catch_up()] == [1000]
    a.close()
    want_a = sorted(
        (int(c.new["id"]), c.new["v"], None if c.new["w"] is None else int(c.new["w"]))
        for c in changes
        if c.table == "public.a" and c.new
    )
    assert pg.execute("SELECT id, v, w FROM a ORDER BY id") == want_a


def test_inserts_reach_apply_in_key_order_as_the_tables_columns() -> None:
    import pyarrow as pa

    from mirrorline.apply import rows as work_rows
    from mirrorline.compile.batch import Inserts

    rows = pa.table({"id": ["10", "9", "100"], "v": ["a", None, "c"], "_ml_lsn": [3, 2, 1], "_ml_seq": [0, 0, 0]})
    ins = Inserts(rows, ("id",))  # no "w": a column the schema gained after these rows were captured
    direct = work_rows.direct_from_inserts(ins.rows, A)
    assert direct.to_pylist() == [
        {"id": "9", "v": None, "w": None},
        {"id": "10", "v": "a", "w": None},
        {"id": "100", "v": "c", "w": None},
    ]
    work = work_rows.from_inserts(ins, A)
    assert work.column_names == work_rows.work_columns(A, "I")
    assert work.column("id").to_pylist() == ["9", "10", "100"]
    assert work.column("_ml_unchanged").to_pylist() == ["", "", ""]
    assert work.column("_ml_lsn").to_pylist() == ["2", "3", "1"]


@pytest.mark.spark
def test_rows_read_on_the_driver_must_be_those_spark_read(spark: Any) -> None:
    """The images come from the driver's read of the log, the check from Spark's: should they ever differ (a log
    changed under a reader), the unit is not applied."""

    changes = _inserts(8, 100)
    stats = table_stats(changes_to_table(changes))
    end = changes[-1].pos
    got = compile_inserts(
        changes_frame(spark, changes), stats, {"public.a": A, "public.b": B}, ZERO, end, _batches(changes[1:])
    )
    with pytest.raises(LogError) as e:
        got.verify()
    assert "99 inserts on the driver and 100 on Spark" in str(e.value)
    got.release()


@pytest.mark.spark
def test_a_failed_read_on_the_driver_is_the_error_reported(spark: Any) -> None:
    """A segment the driver cannot read (here: the batches raise) stops the unit with that error, once Spark's job
    has ended."""
    changes = _inserts(9, 100)

    def damaged() -> Any:
        yield from _batches(changes[:50])
        raise LogError("change log segment x is damaged: junk", hint="restore it")

    got = compile_inserts(
        changes_frame(spark, changes),
        table_stats(changes_to_table(changes)),
        {"public.a": A, "public.b": B},
        ZERO,
        changes[-1].pos,
        damaged(),
    )
    assert got.inserts is not None
    chunks = got.inserts["public.a"].chunks()
    assert next(chunks).num_rows > 0  # the rows read before the damage come as they are read ...
    with pytest.raises(LogError, match="segment x is damaged"):
        list(chunks)  # ... and then the error
    with pytest.raises(LogError, match="segment x is damaged"):
        got.verify()
    got.release()


def test_a_feed_gives_each_reader_its_chunks_as_they_come_then_the_readers_error() -> None:
    import threading

    import pyarrow as pa

    schema = pa.schema([("id", pa.string())])
    feed = Feed(schema)
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(c.num_rows for c in feed.chunks()))
    reader.start()
    feed.put(pa.table({"id": ["1", "2"]}, schema=schema))
    wait_until(lambda: got == [2], timeout=10, interval=0.01, what="the reader has the chunk before the feed ends")
    assert got == [2] and reader.is_alive()
    feed.put(pa.table({"id": ["3"]}, schema=schema))
    feed.close()
    reader.join(10)
    assert got == [2, 1] and feed.rows() == 3 and feed.table().column("id").to_pylist() == ["1", "2", "3"]
    empty = Feed(schema)
    empty.close()
    assert empty.table().schema == schema and empty.rows() == 0

    failed = Feed(schema)
    failed.put(pa.table({"id": ["1"]}, schema=schema))
    failed.close(LogError("change log segment x is damaged: junk"))
    chunks = failed.chunks()
    assert next(chunks).num_rows == 1
    with pytest.raises(LogError, match="damaged"):
        next(chunks)
    with pytest.raises(LogError, match="damaged"):
        failed.rows()


def test_a_feed_holds_its_budget_in_memory_and_the_rest_in_a_file_every_reader_reads_whole() -> None:
    """Past its budget a feed writes its oldest chunks to a scratch file: a reader that kept up and one that starts
    at the end both read every row in order; the file is the user's alone and goes with the feed."""
    import os
    import stat
    import threading

    import pyarrow as pa

    schema = pa.schema([("id", pa.string()), ("body", pa.string())])
    chunk_bytes = pa.table({"id": ["0"] * 100, "body": ["x" * 1000] * 100}, schema=schema).nbytes
    feed = Feed(schema, budget=3 * chunk_bytes)
    early: list[str] = []
    step = threading.Semaphore(0)

    def keep_up() -> None:
        for c in feed.chunks():
            early.extend(c.column("id").to_pylist())
            step.release()

    reader = threading.Thread(target=keep_up)
    reader.start()
    held = []
    for i in range(20):
        feed.put(pa.table({"id": [f"{i}.{j}" for j in range(100)], "body": ["x" * 1000] * 100}, schema=schema))
        held.append(feed.held)
        assert step.acquire(timeout=10)  # the reader has read it (from memory, or the file if already written)
    feed.close()
    reader.join(10)
    want = [f"{i}.{j}" for i in range(20) for j in range(100)]
    assert early == want
    assert max(held) <= 4 * chunk_bytes, held  # the budget, and the newest chunk beside it
    spill = feed._spill
    assert spill is not None and os.path.getsize(spill.path) > 15 * chunk_bytes
    assert stat.S_IMODE(os.stat(spill.path).st_mode) == 0o600
    late = feed.table()  # a reader that starts at the end reads the file, then the memory
    assert late.column("id").to_pylist() == want and late.column("body").to_pylist() == ["x" * 1000] * 2000
    assert feed.rows() == 2000
    feed.discard()
    assert not os.path.exists(spill.folder)
    with pytest.raises(RuntimeError, match="released"):
        list(feed.chunks())


@pytest.mark.spark
def test_a_pipeline_applies_an_inserts_only_unit_whose_rows_went_to_a_file(
    tmp_path: Path, spark: Any, pg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A feed's budget of one byte: every chunk but the newest is read back from the scratch file, by every target."""
    from mirrorline import limits

    monkeypatch.setattr(limits, "FEED_BYTES", 1)
    changes = _inserts(4, 1000)
    _log(tmp_path, changes)
    spilled: list[int] = []
    real = Feed._bound

    def spy(self: Feed) -> None:
        real(self)
        spilled.append(self._spilled)

    monkeypatch.setattr(Feed, "_bound", spy)
    calls = spy_route(monkeypatch, inserts, "compile_inserts")
    a = one_unit_pipeline(
        tmp_path, s=f"sqlite:///{tmp_path / 't.db'}", d=f"duckdb:///{tmp_path / 't.duckdb'}", p=pg.url, spark=spark
    )
    reports = a.catch_up()
    a.close()
    assert [r.changes for r in reports] == [1000] and calls == [True] and max(spilled) > 1
    assert ab_rows(tmp_path, pg) == dict.fromkeys(("sqlite", "duckdb", "pg"), _want_ab(changes))


@pytest.mark.spark
def test_killed_while_postgresql_copies_an_inserts_only_unit_then_run_again(
    tmp_path: Path, spark: Any, pg: Any
) -> None:
    """SIGKILL while the unit's rows stream into COPY (seen in ``pg_stat_activity``), its check perhaps still
    running: nothing of the unit is committed (or, had the kill come after the commit, all of it); a new process
    then applies it exactly."""
    changes = _inserts(12, 100_000)
    with LogWriter(tmp_path / "log", segment_changes=50_000) as w:
        w.record_schema(A)
        w.record_schema(B)
        for i in range(0, len(changes), 1000):
            w.add_transaction(1000 + i, 1, changes[i : i + 1000])
    pg.execute("CREATE TABLE a (id bigint PRIMARY KEY, v text, w integer)")
    kill_while_copying(tmp_path, pg, "a")
    a = one_unit_pipeline(tmp_path, p=pg.url, spark=spark)
    want_a = sorted(
        (int(c.new["id"]), c.new["v"], None if c.new["w"] is None else int(c.new["w"]))
        for c in changes
        if c.table == "public.a" and c.new
    )
    rows = pg.execute("SELECT count(*) FROM a")[0][0]
    end = ChangeLog(tmp_path / "log").durable()
    assert (a.positions()["p"], rows) in ((ZERO, 0), (end, len(want_a)))
    a.catch_up()
    assert a.positions()["p"] == end
    a.close()
    assert pg.execute("SELECT id, v, w FROM a ORDER BY id") == want_a
