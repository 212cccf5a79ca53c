"""Streamed large transactions: spill as blocks arrive, commit by renaming (no copy), abort of the whole transaction
or of one subtransaction, leftovers of a crash discarded, order with buffered transactions kept."""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pytest
from changes import ch

from mirrorline.errors import LogError
from mirrorline.log import ChangeLog, LogWriter, segments, stream
from mirrorline.log.columns import changes_to_arrow
from mirrorline.position import Position


def keys(log: ChangeLog, after=None, upto=None) -> list[int]:
    return [int(c.key[0]) for c in log.read(after, upto)]


def test_commit_makes_the_spill_log_content_at_its_position(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1_000, [ch(1)])
        s = w.open_stream(500)
        s.add(500, [ch(2), ch(3)])
        s.end_block()
        w.add_transaction(20, 2_000, [ch(4)])  # commits while the stream is open: before it in the log
        assert w.open_stream(500) is s  # the next block continues the same spill
        s.add(501, [ch(5)])
        s.add(500, changes_to_arrow([ch(6)], 0, 0))
        s.end_block()
        assert list(ChangeLog(tmp_path).read()) == []  # nothing visible yet: not even the buffered transactions
        pos = s.commit(30, 3_000)
        assert pos == Position(30, 3) == w.durable
        assert (tmp_path / "spill" / "500").exists() is False
    log = ChangeLog(tmp_path)
    got = list(log.read())
    assert [int(c.key[0]) for c in got] == [1, 4, 2, 3, 5, 6]
    assert [c.pos for c in got[2:]] == [Position(30, i) for i in range(4)]
    assert {c.commit_ts for c in got[2:]} == {3_000} and {c.xid for c in got[2:]} == {500}
    seg = log.segments()[-1]
    assert seg.stream and seg.name.endswith(".stream") and seg.count == 4 and seg.prev == Position(20, 0)
    assert keys(log, Position(30, 1), Position(30, 2)) == [5]


def test_commit_does_not_copy_rows(tmp_path):
    with LogWriter(tmp_path) as w:
        s = w.open_stream(7)
        s.add(7, [ch(i) for i in range(10)])
        s.end_block()
        s._close(s._open[7])
        part = tmp_path / "spill" / "7" / s._parts[7][0].name
        inode = os.stat(part).st_ino
        s.commit(10, 1)
    moved = tmp_path / "segments" / "000000000000000A-000000000000000A.stream" / part.name
    assert os.stat(moved).st_ino == inode


def test_abort_of_a_subtransaction_discards_exactly_its_changes(tmp_path):
    with LogWriter(tmp_path) as w:
        s = w.open_stream(100)
        s.add(100, [ch(1)])
        s.add(101, [ch(2)])
        s.end_block()
        s.add(102, [ch(3)])
        s.add(101, [ch(4)])  # a later block of the same subtransaction
        s.add(100, [ch(5)])
        s.end_block()
        s.abort_subxact(101)
        s.add(100, [ch(6)])
        s.commit(50, 1)
    assert keys(ChangeLog(tmp_path)) == [1, 3, 5, 6]
    assert [c.pos.seq for c in ChangeLog(tmp_path).read()] == [0, 2, 4, 5]  # arrival order, gaps where aborted


def test_abort_of_the_whole_stream(tmp_path):
    with LogWriter(tmp_path) as w:
        s = w.open_stream(100)
        s.add(100, [ch(1)])
        s.end_block()
        s.abort()
        assert not (tmp_path / "spill" / "100").exists()
        with pytest.raises(LogError, match="already committed or aborted"):
            s.add(100, [ch(2)])
        s2 = w.open_stream(101)
        s2.add(101, [ch(3)])
        s2.abort_subxact(101)  # the top xid: the whole transaction
        w.add_transaction(10, 1, [ch(4)])
    assert keys(ChangeLog(tmp_path)) == [4]
    assert os.listdir(tmp_path / "spill") == []


def test_empty_stream_commit_writes_nothing(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, [ch(1)])
        s = w.open_stream(5)
        s.add(6, [ch(2)])
        s.abort_subxact(6)
        assert s.commit(20, 2) == Position(10, 0)
        assert w.flushed_lsn == 20 and w.last_lsn == 20
    assert [seg.name for seg in ChangeLog(tmp_path).segments()] == ["000000000000000A-000000000000000A.parquet"]


def test_leftover_spill_of_a_crash_is_discarded_at_open(tmp_path):
    w = LogWriter(tmp_path)
    s = w.open_stream(9)
    s.add(9, [ch(1)])
    s.end_block()
    w.close()  # like a crash: the stream never committed
    assert (tmp_path / "spill" / "9").exists()
    w = LogWriter(tmp_path)
    assert os.listdir(tmp_path / "spill") == []
    s = w.open_stream(9)  # PostgreSQL sends it again
    s.add(9, [ch(1), ch(2)])
    s.commit(10, 1)
    w.close()
    assert keys(ChangeLog(tmp_path)) == [1, 2]


def test_stream_commit_lsn_must_follow_the_log(tmp_path):
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 1, [ch(1)])
        s = w.open_stream(9)
        s.add(9, [ch(2)])
        with pytest.raises(LogError):
            s.commit(10, 1)


def test_memory_and_files_stay_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "SPILL_ROWS", 10)
    monkeypatch.setattr(stream, "MAX_BUFFERED_ROWS", 25)
    monkeypatch.setattr(stream, "MAX_OPEN_PARTS", 3)
    with LogWriter(tmp_path) as w:
        s = w.open_stream(1)
        n = 0
        for _block in range(20):
            for sub in (1, 2, 3, 4, 5):  # five subtransactions, at most three parts open
                s.add(sub, [ch(n), ch(n + 1)])
                n += 2
                assert s._buffered_rows < 25 + 2
                assert len(s._open) <= 3
            s.end_block()
        s.abort_subxact(3)
        assert s.changes == n - 40
        s.commit(10, 1)
    log = ChangeLog(tmp_path)
    seg = log.segments()[0]
    assert len(seg.parts) > 5  # closed and reopened as new parts
    expect = [i for i in range(n) if (i // 2) % 5 != 2]
    assert keys(log) == expect
    # a boundary inside the stream: positions are (commit lsn, arrival seq)
    assert keys(log, Position(10, 10), Position(10, 17)) == [11, 12, 13, 16, 17]  # 14, 15: the aborted sub 3
    assert log.count(Position(10, 10), Position(10, 17)) == 5
    assert log.advance(Position(10, 10), 3) == (seg.last, len(expect) - 9)  # one transaction: the rest, whole
    assert log.after_time(1) is None and log.after_time(2) == seg.last


def test_parts_are_read_once_the_merge_reaches_them(tmp_path, monkeypatch):
    """A stream's parts that follow one another (a transaction's blocks without subtransactions) are read one at a
    time, not each one's first rows at once; where a subtransaction's rows interleave with them, both are read side
    by side: in log order, every row once."""
    with LogWriter(tmp_path) as w:
        w.stream_watcher = Watcher(cut_rows=1)  # (each block's parts closed at its end)
        s = w.open_stream(1)
        for k in range(0, 100, 10):
            s.add(1, [ch(i) for i in range(k, k + 10)])
            s.end_block()
        for k in range(100, 140, 2):
            s.add(1, [ch(k)])
            s.add(2, [ch(k + 1)])
        s.end_block()
        for k in range(140, 200, 10):
            s.add(1, [ch(i) for i in range(k, k + 10)])
            s.end_block()
        s.commit(10, 1)
    reading, most = [0], [0]
    real = segments._part_batches

    def counting(*args):
        reading[0] += 1
        most[0] = max(most[0], reading[0])
        try:
            yield from real(*args)
        finally:
            reading[0] -= 1

    monkeypatch.setattr(segments, "_part_batches", counting)
    log = ChangeLog(tmp_path)
    assert len(log.segments()[0].parts) == 18
    assert keys(log) == list(range(200))
    assert most[0] == 2 and reading[0] == 0


class Watcher:
    def __init__(self, cut_rows: int, cut_bytes: int = 1 << 40) -> None:
        self.cut_rows, self.cut_bytes = cut_rows, cut_bytes
        self.events: list[tuple] = []

    def cut(self, cut: stream.StreamCut) -> None:
        self.events.append(("cut", cut))

    def committed(self, xid: int, info) -> None:
        self.events.append(("committed", xid, info.path))

    def aborted(self, xid: int, subxid: int) -> None:
        self.events.append(("aborted", xid, subxid))


def from_parts(cut: stream.StreamCut) -> stream.StreamCut:
    """The cut without the rows it carries: read from its part files."""
    return dataclasses.replace(cut, rows=None)


def test_a_watcher_reads_each_cut_whole_while_the_transaction_is_open(tmp_path):
    """``run`` applying ahead of the commit: at a block's end past ``cut_rows`` rows, every open part is closed and
    the rows since the last cut are readable in order, of every subtransaction, from the rows the cut carries and
    alike from its part files; a subtransaction's abort is told; at the commit a last cut of the rows since the one
    before, then the commit; what a commit publishes is every row, at its position."""
    watcher = Watcher(cut_rows=3)
    with LogWriter(tmp_path) as w:
        w.stream_watcher = watcher
        s = w.open_stream(500)
        s.add(500, [ch(1), ch(2)])
        s.end_block()  # 2 rows: no cut yet
        assert watcher.events == []
        s.add(501, [ch(3)])
        s.add(500, [ch(4)])
        s.end_block()
        ((_, first),) = watcher.events
        assert (first.first_seq, first.last_seq) == (0, 3)
        assert first.rows is not None
        for cut in (first, from_parts(first)):
            assert [int(k[0]) for k in stream.read_cut(cut)["key"].to_pylist()] == [1, 2, 3, 4]
            assert stream.read_cut(cut)["seq"].to_pylist() == [0, 1, 2, 3]
        assert stream.read_cut(first).equals(stream.read_cut(from_parts(first)))
        s.add(502, [ch(5), ch(6), ch(7)])
        s.add(500, [ch(8)])
        s.abort_subxact(502)  # before the cut: its rows are in none
        s.end_block()
        second = watcher.events[-1][1]
        assert watcher.events[1] == ("aborted", 500, 502)
        assert (second.first_seq, second.last_seq) == (4, 7)
        for cut in (second, from_parts(second)):
            assert [int(k[0]) for k in stream.read_cut(cut)["key"].to_pylist()] == [8]
        s.add(500, [ch(9), ch(10)])
        s.end_block()  # 2 rows since the cut: none
        s.add(500, [ch(11)])
        s.commit(40, 4_000)
        (what, last), committed = watcher.events[-2], watcher.events[-1]
        assert what == "cut" and (last.first_seq, last.last_seq) == (8, 10)
        assert [int(k[0]) for k in stream.read_cut(last)["key"].to_pylist()] == [9, 10, 11]
        assert committed[:2] == ("committed", 500)
        published = committed[2]
        with pytest.raises(FileNotFoundError):
            stream.read_cut(from_parts(second))
        assert [int(k[0]) for k in stream.read_cut(from_parts(second), published)["key"].to_pylist()] == [8]
        assert stream.read_cut(from_parts(last), published).equals(stream.read_cut(last))
    assert keys(ChangeLog(tmp_path)) == [1, 2, 3, 4, 8, 9, 10, 11]
    assert keys(ChangeLog(tmp_path), Position(40, second.last_seq)) == [9, 10, 11]  # the rest, after the last cut


def test_a_whole_abort_is_told_to_the_watcher(tmp_path):
    watcher = Watcher(cut_rows=1)
    with LogWriter(tmp_path) as w:
        w.stream_watcher = watcher
        s = w.open_stream(9)
        s.add(9, [ch(1)])
        s.end_block()
        s.abort()
    assert [e[0] for e in watcher.events] == ["cut", "aborted"] and watcher.events[-1] == ("aborted", 9, 9)


def test_wide_rows_are_cut_by_bytes(tmp_path):
    watcher = Watcher(cut_rows=1_000, cut_bytes=30_000)
    with LogWriter(tmp_path) as w:
        w.stream_watcher = watcher
        s = w.open_stream(9)
        for k in range(10):
            s.add(9, [ch(k, new={"id": str(k), "v": "x" * 10_000})])
            s.end_block()
        s.commit(10, 1)
    cuts = [e[1] for e in watcher.events if e[0] == "cut"]
    assert [(c.first_seq, c.last_seq) for c in cuts] == [(0, 2), (3, 5), (6, 8), (9, 9)]  # (the last: at the commit)


def test_a_big_cut_is_read_a_slice_at_a_time_in_arrival_order(tmp_path):
    """One stream block of wide rows across two subtransactions (a cut PostgreSQL sent whole): read in batches of
    about the bytes asked for, in arrival order across the parts, together every row once."""
    watcher = Watcher(cut_rows=1)
    with LogWriter(tmp_path) as w:
        w.stream_watcher = watcher
        s = w.open_stream(9)
        for k in range(0, 60, 3):
            s.add(9, [ch(k, new={"id": str(k), "v": "x" * 10_000}), ch(k + 1, new={"id": str(k + 1), "v": "y"})])
            s.add(10, [ch(k + 2, new={"id": str(k + 2), "v": "z" * 5_000})])
        s.end_block()
        ((_, cut),) = watcher.events
        assert len(cut.parts) == 2 and cut.rows is not None
        for c in (cut, from_parts(cut)):  # the rows it carries, and from its parts
            batches = list(stream.iter_cut(c, batch_bytes=50_000))
            assert len(batches) >= 5 and max(b.nbytes for b in batches) < 100_000  # (300 kB in all)
            whole = pa.concat_tables(batches)
            assert whole["seq"].to_pylist() == list(range(60))
            assert [int(k[0]) for k in whole["key"].to_pylist()] == list(range(60))
            assert whole.equals(stream.read_cut(cut))
        s.commit(10, 1)


def test_a_cut_past_the_bytes_kept_is_read_from_its_parts(tmp_path, monkeypatch):
    """Rows since the last cut past ``KEEP_BYTES`` (one stream block of TOASTed values): the cut carries none of
    them, its parts have them all; the next cut carries its own again."""
    monkeypatch.setattr(stream, "KEEP_BYTES", 25_000)
    monkeypatch.setattr(stream, "SPILL_ROWS", 1)  # (each row spilled as it comes)
    watcher = Watcher(cut_rows=1)
    with LogWriter(tmp_path) as w:
        w.stream_watcher = watcher
        s = w.open_stream(9)
        for k in range(6):
            s.add(9, [ch(k, new={"id": str(k), "v": "x" * 10_000})])
        s.end_block()
        s.add(9, [ch(6)])
        s.end_block()
        (_, big), (_, small) = watcher.events
        assert big.rows is None and small.rows is not None
        assert [int(k[0]) for k in stream.read_cut(big)["key"].to_pylist()] == list(range(6))
        assert [int(k[0]) for k in stream.read_cut(small)["key"].to_pylist()] == [6]
        s.commit(10, 1)
