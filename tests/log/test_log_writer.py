"""The log writer: segment naming and order, atomic visibility, the lock, commit order, watermarks, schema
versions, Arrow input, damaged and missing segments."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import changes
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mirrorline.errors import LogError
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log.columns import changes_to_arrow, transactions_to_arrow
from mirrorline.log.layout import parse_segment_name, segment_name
from mirrorline.log.rows import ARROW_SCHEMA, changes_to_table
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.position import Position

ch = functools.partial(changes.ch, xid=7, cols=("id", "v", "n"))


def strip(c: Change) -> tuple:
    """A change without its position/ts (what the writer is given)."""
    return (
        c.xid,
        c.table,
        c.op,
        c.key,
        dict(c.new) if c.new is not None else None,
        c.unchanged,
        c.old_key,
        c.schema_version,
    )


def names(root) -> list[str]:
    return sorted(os.listdir(root / "segments"))


def test_segment_names_sort_in_log_order():
    lsns = [(0x1, 0x9), (0xA, 0xFF), (0x100, 0x100), (0x16_B374_D848, 0x16_B374_D900), (1 << 40, (1 << 40) + 5)]
    made = [segment_name(a, b, stream=(i % 2 == 0)) for i, (a, b) in enumerate(lsns)]
    assert sorted(made) == made
    assert [parse_segment_name(n)[:2] for n in made] == lsns
    assert parse_segment_name(".tmp-abc.parquet") is None
    assert parse_segment_name("0000000000000001-0000000000000002.parquet.part") is None


def test_round_trip_of_every_field(tmp_path):
    changes = [
        ch(1),
        ch(2, Op.UPDATE, new={"id": "2", "v": "x\ty\n"}, unchanged=frozenset({"big", "doc"})),
        ch(3, Op.UPDATE, old_key=("30",)),
        ch(4, Op.DELETE),
        ch(0, Op.TRUNCATE, table="s.other", schema_version=3),
    ]
    with LogWriter(tmp_path) as w:
        w.add_transaction(0x100, 1_500_000_000_000_001, changes)
        assert w.pending == 5 and w.durable is None
        assert w.flush() == Position(0x100, 4)
    got = list(ChangeLog(tmp_path).read())
    assert [strip(c) for c in got] == [strip(c) for c in changes]
    assert [c.pos for c in got] == [Position(0x100, i) for i in range(5)]
    assert {c.commit_ts for c in got} == {1_500_000_000_000_001}
    assert got[1].new == {"id": "2", "v": "x\ty\n"} and got[1].unchanged == {"big", "doc"}


def test_columnwise_conversion_equals_the_row_layout():
    changes = [ch(1), ch(2, Op.UPDATE, unchanged=frozenset({"z", "a"}), old_key=("9",)), ch(3, Op.DELETE)]
    fast = changes_to_arrow(changes, 5, 6)
    slow = changes_to_table(
        [
            Change(Position(5, i), 6, c.xid, c.table, c.op, c.key, c.new, c.unchanged, c.old_key, c.schema_version)
            for i, c in enumerate(changes)
        ]
    )
    assert fast.equals(slow)
    bulk = transactions_to_arrow([(5, 6, changes[:2]), (8, 9, changes[2:])])
    assert bulk.column("lsn").to_pylist() == [5, 5, 8] and bulk.column("seq").to_pylist() == [0, 1, 0]
    assert bulk.column("ts").to_pylist() == [6, 6, 9]


def test_flushes_by_itself_at_segment_changes_and_keeps_transactions_whole(tmp_path):
    with LogWriter(tmp_path, segment_changes=5, background=False) as w:
        for t in range(6):
            w.add_transaction(100 + t, t, [ch(t * 10 + i) for i in range(3)])
        # 3 + 3 >= 5 -> a segment of two whole transactions, three times
        assert w.pending == 0
    segs = ChangeLog(tmp_path).segments()
    assert [(s.first, s.last, s.count) for s in segs] == [
        (Position(100, 0), Position(101, 2), 6),
        (Position(102, 0), Position(103, 2), 6),
        (Position(104, 0), Position(105, 2), 6),
    ]
    assert [s.prev for s in segs] == [None, Position(101, 2), Position(103, 2)]
    assert names(tmp_path) == sorted(s.name for s in segs)


def test_flush_with_nothing_pending_writes_nothing(tmp_path):
    with LogWriter(tmp_path) as w:
        assert w.flush() is None
        w.add_transaction(10, 1, [ch(1)])
        w.flush()
        assert w.flush() == Position(10, 0)
    assert len(names(tmp_path)) == 1


def test_tick_flushes_only_when_the_oldest_transaction_waited(tmp_path):
    with LogWriter(tmp_path, segment_seconds=3600) as w:
        w.add_transaction(10, 1, [ch(1)])
        assert w.tick() is None and w.pending == 1
        w.segment_seconds = 0
        assert w.tick() == Position(10, 0) and w.pending == 0


def test_commit_lsn_must_increase(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, [ch(1)])
        with pytest.raises(LogError, match="not after the log's last commit"):
            w.add_transaction(10, 1, [ch(2)])
        w.flush()
    with LogWriter(tmp_path) as w:  # after a restart too: the log's end is read back
        assert w.last_lsn == 10 and w.durable == Position(10, 0)
        with pytest.raises(LogError):
            w.add_transaction(9, 1, [ch(2)])
        w.add_transaction(11, 1, [ch(2)])


def test_flushed_lsn_covers_empty_transactions_only_once_earlier_ones_are_durable(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, [])
        assert w.flushed_lsn == 10 and w.durable is None
        w.add_transaction(20, 1, [ch(1)])
        w.add_transaction(30, 1, [])
        assert w.flushed_lsn == 10  # 20 is only buffered
        w.flush()
        assert w.flushed_lsn == 30 and w.durable == Position(20, 0)


def test_one_writer_per_log(tmp_path):
    w = LogWriter(tmp_path)
    try:
        with pytest.raises(LogError, match=f"another writer \\(pid {os.getpid()}\\)"):
            LogWriter(tmp_path)
        code = f"from mirrorline.log import LogWriter; LogWriter({str(tmp_path)!r})"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert r.returncode != 0 and "another writer" in r.stderr
    finally:
        w.close()
    LogWriter(tmp_path).close()  # released


def test_a_crashed_writers_temp_files_are_never_read_and_are_removed(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, [ch(1)])
    # what a writer killed mid-flush leaves: a temp segment, even one with a valid body
    pq.write_table(changes_to_arrow([ch(2)], 20, 1), tmp_path / "segments" / ".tmp-dead.parquet")
    (tmp_path / "segments" / ".tmp-torn.parquet").write_bytes(b"PAR1 torn")
    log = ChangeLog(tmp_path)
    assert [c.pos for c in log.read()] == [Position(10, 0)]
    assert log.durable() == Position(10, 0)
    LogWriter(tmp_path).close()
    assert names(tmp_path) == ["000000000000000A-000000000000000A.parquet"]


def test_damaged_segment_is_a_clear_log_error(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, [ch(1)])
    seg = tmp_path / "segments" / names(tmp_path)[0]
    data = seg.read_bytes()
    seg.write_bytes(data[: len(data) // 2])
    with pytest.raises(LogError, match="damaged") as e:
        list(ChangeLog(tmp_path).read())
    assert e.value.context["path"] == str(seg) and e.value.hint


def test_missing_segment_is_a_clear_log_error(tmp_path):
    with LogWriter(tmp_path, segment_changes=1) as w:
        for i in range(3):
            w.add_transaction(10 + i, 1, [ch(i)])
    os.unlink(tmp_path / "segments" / names(tmp_path)[1])
    with pytest.raises(LogError, match="missing a segment"):
        ChangeLog(tmp_path).segments()
    os.unlink(tmp_path / "segments" / names(tmp_path)[0])
    with pytest.raises(LogError, match="missing a segment"):
        ChangeLog(tmp_path).segments()


def test_no_log_is_a_clear_log_error(tmp_path):
    with pytest.raises(LogError, match="no change log"):
        ChangeLog(tmp_path / "nothing").durable()


def test_arrow_input_single_and_many_transactions(tmp_path):
    t1 = changes_to_arrow([ch(1), ch(2)], 0, 0)  # lsn/ts left 0: the writer sets them
    many = transactions_to_arrow([(30, 3, [ch(3)]), (40, 4, [ch(4), ch(5)])])
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, t1.to_batches()[0])
        w.add_transaction(20, 2, [ch(9)])  # mixed with Change input, order kept
        w.add_transactions(many)
        with pytest.raises(LogError):
            w.add_transactions(transactions_to_arrow([(35, 3, [ch(6)])]))
    got = [(c.pos, c.commit_ts, c.key) for c in ChangeLog(tmp_path).read()]
    assert got == [
        (Position(10, 0), 1, ("1",)),
        (Position(10, 1), 1, ("2",)),
        (Position(20, 0), 2, ("9",)),
        (Position(30, 0), 3, ("3",)),
        (Position(40, 0), 4, ("4",)),
        (Position(40, 1), 4, ("5",)),
    ]


def test_arrow_input_not_in_the_layout_is_refused(tmp_path):
    with LogWriter(tmp_path) as w, pytest.raises(LogError, match="log layout"):
        w.add_transaction(10, 1, pa.table({"x": [1]}))
    bad = ARROW_SCHEMA.empty_table()
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, bad)  # empty: nothing, no error
        assert w.pending == 0


def test_schema_versions(tmp_path):
    cols = (Column("id", "bigint", 20), Column("v", "text", 25))
    with LogWriter(tmp_path) as w:
        v1 = w.record_schema(TableSchema("public.t", cols, ("id",), since=Position(5, 0)))
        again = w.record_schema(TableSchema("public.t", cols, ("id",), version=99, since=Position(9, 0)))
        v2 = w.record_schema(TableSchema("public.t", (*cols, Column("w", "integer")), ("id",)))
        other = w.record_schema(TableSchema("s.x", cols, ("id", "v")))
        back = w.record_schema(TableSchema("public.t", cols, ("id",)))
    assert (v1.version, again.version, v2.version, other.version, back.version) == (1, 1, 2, 1, 1)
    assert again.since == Position(5, 0)
    log = ChangeLog(tmp_path)  # durable, readable by any later reader
    assert log.schema("public.t", 2).column_names == ("id", "v", "w")
    assert log.schema("public.t", 1) == v1
    assert log.schema("s.x", 1).key == ("id", "v")
    with pytest.raises(LogError, match="no schema version 3"):
        log.schema("public.t", 3)
    with LogWriter(tmp_path) as w:  # a restarted writer continues the numbering
        assert w.record_schema(TableSchema("public.t", cols[:1], ("id",))).version == 3


WRITER_LOOP = """
import sys
from mirrorline.log import LogWriter
from mirrorline.model import Change, Op
from mirrorline.position import ZERO
w = LogWriter(sys.argv[1], segment_changes=50)
lsn = w.last_lsn
print("ready", flush=True)
while True:
    lsn += 10
    w.add_transaction(lsn, lsn, [Change(ZERO, 0, lsn, "public.t", Op.INSERT, (str(i),), {"id": str(i)})
                                 for i in range(5)])
    if lsn % 70 == 0:
        s = w.open_stream(lsn)
        s.add(lsn, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (str(i),), {"id": str(i)}) for i in range(5)])
        s.end_block()
        lsn += 10
        s.commit(lsn, lsn)
"""


def test_writer_killed_at_any_instant_leaves_only_whole_transactions(tmp_path):
    import signal
    import time

    for round_ in range(3):
        p = subprocess.Popen([sys.executable, "-c", WRITER_LOOP, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        start = len(names(tmp_path))
        while len(names(tmp_path)) < start + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05 * round_)
        p.send_signal(signal.SIGKILL)
        p.wait()
        log = ChangeLog(tmp_path)
        by_txn: dict[int, list[int]] = {}
        for c in log.read():
            by_txn.setdefault(c.pos.lsn, []).append(c.pos.seq)
        assert by_txn and all(seqs == [0, 1, 2, 3, 4] for seqs in by_txn.values())
        assert log.durable() == Position(max(by_txn), 4)
        with LogWriter(tmp_path) as w:  # reopens: the lock died with the process, leftovers are cleared
            assert w.durable == log.durable()
            assert os.listdir(tmp_path / "spill") == []
        assert not [n for n in names(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize("background", [True, False])
def test_background_and_inline_writing_give_the_same_log(tmp_path, background):
    with LogWriter(tmp_path, segment_changes=4, background=background) as w:
        for t in range(10):
            w.add_transaction(100 + t, t, [ch(t * 10 + i) for i in range(3)])
            assert w.pending <= 6 + (6 if background else 0)  # buffered, plus one segment in flight
        w.add_transaction(200, 1, [])
        s = w.open_stream(5)
        s.add(5, [ch(99)])
        assert s.commit(300, 3) == Position(300, 0)
        assert w.durable == Position(300, 0) and w.pending == 0 and w.flushed_lsn == 300
    segs = ChangeLog(tmp_path).segments()
    assert [(s.first.lsn, s.last.lsn, s.count) for s in segs] == [
        (100, 101, 6),
        (102, 103, 6),
        (104, 105, 6),
        (106, 107, 6),
        (108, 109, 6),
        (300, 300, 1),
    ]


def test_an_error_of_the_background_writer_is_raised_and_stops_the_writer(tmp_path, monkeypatch):
    from mirrorline.log import writer as writer_mod

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    w = LogWriter(tmp_path, segment_changes=2, background=True)
    monkeypatch.setattr(writer_mod, "write_segment", disk_full)
    w.add_transaction(10, 1, [ch(1), ch(2)])  # fills a segment: handed to the worker
    with pytest.raises(OSError, match="No space"):
        w.flush()
    with pytest.raises(LogError, match="failed earlier"):
        w.add_transaction(20, 1, [ch(3)])
    w.close()  # releases the lock without writing
    monkeypatch.undo()
    with LogWriter(tmp_path) as w2:
        assert w2.durable is None
