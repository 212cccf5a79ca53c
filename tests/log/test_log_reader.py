"""Readers: from a position (exclusive) up to a position (inclusive), from a timestamp, counts and unit ends, many
readers at once, registered readers and retention."""

from __future__ import annotations

from itertools import pairwise

import pytest
from changes import ch

from mirrorline.errors import LogError
from mirrorline.limits import SLICE_BYTES, slice_rows
from mirrorline.log import ChangeLog, LogWriter, readers, retain, set_applied, unregister
from mirrorline.log.retention import check_reader
from mirrorline.position import ZERO, Position

S = 1_000_000  # one second in microseconds


@pytest.fixture
def log(tmp_path) -> ChangeLog:
    """Transactions at LSN 100, 200, ... 1000, three changes each, commit ts = k seconds; one segment per two
    transactions; transaction 500 is a streamed one."""
    with LogWriter(tmp_path, segment_changes=6) as w:
        for k in range(1, 11):
            lsn = k * 100
            rows = [ch(k * 10 + i) for i in range(3)]
            if k == 5:
                w.flush()
                s = w.open_stream(k)
                s.add(k, rows)
                s.commit(lsn, k * S)
            else:
                w.add_transaction(lsn, k * S, rows)
    return ChangeLog(tmp_path)


def positions(changes) -> list[Position]:
    return [c.pos for c in changes]


def all_positions() -> list[Position]:
    return [Position(k * 100, i) for k in range(1, 11) for i in range(3)]


def test_whole_log_in_order(log):
    assert positions(log.read()) == all_positions()
    assert log.durable() == Position(1000, 2)
    assert log.start() is None


@pytest.mark.parametrize(
    ("after", "upto"),
    [
        (None, None),
        (Position(100, 2), Position(1000, 2)),
        (Position(100, 1), Position(200, 0)),  # boundaries inside transactions and segments
        (Position(400, 2), Position(600, 1)),  # across the stream segment
        (Position(500, 0), Position(500, 1)),  # inside the stream
        (Position(150, 0), Position(650, 9)),  # positions between transactions
        (Position(1000, 2), None),  # nothing after the end
        (ZERO, Position(100, 0)),
    ],
)
def test_ranges_are_exclusive_inclusive(log, after, upto):
    expect = [p for p in all_positions() if (after is None or p > after) and (upto is None or p <= upto)]
    assert positions(log.read(after, upto)) == expect
    assert log.count(after, upto) == len(expect)
    got = [
        Position(lsn, seq)
        for b in log.read_arrow(after, upto, batch_rows=2)
        for lsn, seq in zip(b.column("lsn").to_pylist(), b.column("seq").to_pylist(), strict=True)
    ]
    assert got == expect


def test_a_range_ending_inside_a_segment_reads_no_batch_after_its_end(log, monkeypatch):
    """The batch that reaches past ``upto`` is the last one read of its segment (rows are in log order)."""
    from mirrorline.log import reader, segments

    pulled: list[int] = []

    def counting(info, batch_rows=8192):
        for b in segments.iter_batches(info, batch_rows):
            pulled.append(b.num_rows)
            yield b

    monkeypatch.setattr(reader, "iter_batches", counting)
    whole = sum(s.count for s in log.select(ZERO, Position(1000, 2)))
    rows = sum(b.num_rows for b in log.read_arrow(ZERO, Position(100, 1), batch_rows=1))
    assert rows == 2 and sum(pulled) == 3 < whole


def test_batches_of_wide_rows_are_bounded_in_bytes_as_well_as_rows(tmp_path):
    """Rows of 20 kB: a batch of the 65,536 rows asked for would hold all 60 MB. Each batch holds about SLICE_BYTES
    (less than twice: a stream's merge adds a part's slice to a batch until it passes the bound), from an ordinary
    segment and from a stream's parts alike, and together they are every row in order."""
    body = "x" * 20_000
    rows = [ch(i, new={"id": str(i), "body": body}) for i in range(3_000)]
    with LogWriter(tmp_path, segment_changes=10_000) as w:
        w.add_transaction(100, S, rows)
        w.flush()
        s = w.open_stream(7)
        for i in range(0, len(rows), 500):
            s.add(7 if i % 1000 else 8, rows[i : i + 500])  # two (sub)transactions: two parts, merged by seq
            s.end_block()
        s.commit(200, 2 * S)
    log = ChangeLog(tmp_path)
    for upto in (Position(100, 2_999), Position(200, 2_999)):
        after = None if upto.lsn == 100 else Position(100, 2_999)
        batches = list(log.read_arrow(after, upto, batch_rows=65_536))
        assert [p for b in batches for p in b.column("seq").to_pylist()] == list(range(3_000))
        assert len(batches) >= 3
        assert max(b.nbytes for b in batches) <= 2 * SLICE_BYTES


def test_slice_rows_bounds_rows_and_bytes():
    assert slice_rows(6 << 20, 65_536) == 65_536  # narrow rows: the row bound
    assert slice_rows(128 << 20, 65_536) == 65_536 * SLICE_BYTES // (128 << 20)
    assert slice_rows(1 << 40, 3) == 1  # one row wider than a slice: a slice of one row
    assert slice_rows(0, 0) == 1


def test_readers_each_at_their_own_position(log):
    a = log.read(Position(200, 2))
    b = ChangeLog(log.layout.root).read(Position(700, 0))
    assert next(a).pos == Position(300, 0)
    assert next(b).pos == Position(700, 1)
    assert next(a).pos == Position(300, 1)


@pytest.mark.parametrize(
    ("ts", "first"),
    [
        (0, Position(100, 0)),
        (1 * S, Position(100, 0)),
        (1 * S + 1, Position(200, 0)),
        (5 * S, Position(500, 0)),
        (7 * S - 1, Position(700, 0)),
        (10 * S, Position(1000, 0)),
        (11 * S, None),
    ],
)
def test_from_a_timestamp(log, ts, first):
    got = list(log.read_from_time(ts))
    assert (got[0].pos if got else None) == first
    assert all(c.commit_ts >= ts for c in got)


def test_advance_closes_units_at_transaction_ends(log):
    assert log.advance(None, 7) == (Position(200, 2), 6)
    assert log.advance(Position(200, 2), 4) == (Position(300, 2), 3)
    assert log.advance(Position(100, 0), 5) == (Position(200, 2), 5)  # the rest of 100, then 200 whole: 2 + 3
    assert log.advance(Position(100, 0), 4) == (Position(100, 2), 2)
    assert log.advance(Position(100, 0), 1) == (Position(100, 2), 2)  # a transaction is never split
    assert log.advance(Position(400, 2), 2) == (Position(500, 2), 3)  # the stream, whole
    assert log.advance(None, 1000) == (Position(1000, 2), 30)
    assert log.advance(None, 1000, upto=Position(600, 1)) == (Position(600, 1), 17)
    assert log.advance(Position(1000, 2), 5) == (Position(1000, 2), 0)


def test_first_ts_after_is_the_commit_time_of_the_first_change_after_a_position(log):
    assert log.first_ts_after(None) == 1 * S
    assert log.first_ts_after(Position(100, 1)) == 1 * S  # inside a transaction
    assert log.first_ts_after(Position(100, 2)) == 2 * S  # inside a segment
    assert log.first_ts_after(Position(200, 2)) == 3 * S  # at a segment's end
    assert log.first_ts_after(Position(400, 2)) == 5 * S  # the streamed transaction
    assert log.first_ts_after(Position(500, 1)) == 5 * S  # inside it
    assert log.first_ts_after(Position(1000, 1)) == 10 * S
    assert log.first_ts_after(Position(1000, 2)) is None  # nothing after the log's end


def test_advance_from_inside_a_segment_goes_on_into_the_next_ones(log):
    # a unit that starts inside a segment (the previous unit ended there) is not cut at that segment's end
    assert log.advance(Position(100, 2), 9) == (Position(400, 2), 9)  # the rest of [100, 200], then [300, 400]
    assert log.advance(Position(200, 1), 7) == (Position(400, 2), 7)
    assert log.advance(Position(100, 2), 8) == (Position(300, 2), 6)  # 300 fits, 400 does not
    assert log.advance(Position(300, 2), 100) == (Position(1000, 2), 21)


def test_segment_metadata_is_cheap_and_complete(log):
    segs = log.segments()
    assert sum(s.count for s in segs) == 30
    assert [s.stream for s in segs].count(True) == 1
    assert all(s.first <= s.last and s.min_ts <= s.max_ts for s in segs)
    assert all(b.first > a.last and b.prev == a.last for a, b in pairwise(segs))


def test_registered_readers(log):
    assert readers(log) == {}
    set_applied(log, "cache", None)
    set_applied(log, "warehouse", Position(300, 2))
    got = readers(log)
    assert got["cache"].applied is None and got["warehouse"].applied == Position(300, 2)
    set_applied(log, "cache", Position(700, 1))
    assert readers(log)["cache"].applied == Position(700, 1)
    unregister(log, "cache")
    assert set(readers(log)) == {"warehouse"}
    with pytest.raises(LogError, match="invalid reader name"):
        set_applied(log, "../x", None)


def test_retention_needs_a_registered_reader_unless_told_to_keep_nothing(log):
    assert retain(log) == []
    assert len(log.segments()) == 6
    set_applied(log, "cache", None)  # registered, nothing applied: keeps everything
    assert retain(log) == []


def test_retention_removes_only_whole_segments_every_reader_applied(log):
    set_applied(log, "a", Position(700, 1))
    set_applied(log, "b", Position(400, 2))
    gone = retain(log)
    # segments end at 200:2, 400:2 (both <= 400:2); the one holding 600..700 stays although "a" is past part of it
    assert len(gone) == 2
    assert log.start() == Position(400, 2)
    assert positions(log.read(Position(400, 2))) == all_positions()[12:]
    assert positions(log.read()) == all_positions()[12:]
    with pytest.raises(LogError, match="no longer retained") as e:
        list(log.read(Position(300, 0)))
    assert "reload" in (e.value.hint or "")
    with pytest.raises(LogError, match="no longer retained"):
        log.after_time(2 * S)
    assert log.after_time(5 * S) == Position(400, 2)
    assert check_reader(log, "b") == Position(400, 2)
    set_applied(log, "b", Position(1000, 2))
    retain(log)
    assert log.segments()[0].first == Position(600, 0)  # the stream went; "a" (at 700:1) still needs 700:2
    assert log.durable() == Position(1000, 2)


def test_retention_of_everything_and_a_writer_going_on(log):
    root = log.layout.root
    assert len(retain(log, keep_nothing=True)) == 6
    assert log.segments() == [] and log.durable() == Position(1000, 2)
    with LogWriter(root) as w:
        assert w.durable == Position(1000, 2) and w.last_lsn == 1000
        with pytest.raises(LogError):
            w.add_transaction(900, 1, [ch(1)])
        w.add_transaction(1100, 11 * S, [ch(1)])
    assert positions(ChangeLog(root).read(Position(1000, 2))) == [Position(1100, 0)]


def test_retention_stopped_half_way_is_consistent_and_finished_later(log, monkeypatch):
    from mirrorline.log import retention

    set_applied(log, "a", Position(400, 2))
    removed: list = []

    def crash_after_one(path):
        if removed:
            raise KeyboardInterrupt("killed")
        removed.append(path)
        path.unlink()

    monkeypatch.setattr(retention, "remove_segment", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        retain(log)
    assert len(log.segment_files()) == 5  # one of the two doomed segments is still on disk ...
    assert positions(log.read()) == all_positions()[12:]  # ... but readers already start after it
    monkeypatch.undo()
    assert retain(log) == []  # nothing new to remove, the leftover goes
    assert len(log.segment_files()) == 4


def test_rows_at_positions_in_log_order_only_those_found(log, monkeypatch):
    """read_at: the rows at the positions asked (in any order, some not in the log), in log order, the columns
    asked beside lsn and seq; a plain segment reads only the row groups holding some of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    asked = [Position(900, 1), Position(200, 0), Position(500, 2), Position(150, 0), Position(500, 0), Position(1, 1)]
    at = pa.table({"lsn": [p.lsn for p in asked], "seq": [p.seq for p in asked]})
    got = log.read_at(at, ["key", "new"])
    assert got.column_names == ["lsn", "seq", "key", "new"]
    want = [c for c in log.read() if c.pos in asked]
    assert [Position(r["lsn"], r["seq"]) for r in got.to_pylist()] == [c.pos for c in want]
    assert [r["key"] for r in got.to_pylist()] == [list(c.key) for c in want]
    assert [dict(r["new"]) for r in got.to_pylist()] == [c.new for c in want]
    assert log.read_at(at.slice(0, 0), ["new"]).num_rows == 0
    assert log.read_at(pa.table({"lsn": [5000], "seq": [0]}), ["new"]).num_rows == 0

    read_groups: list[int] = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, *args, **kwargs):
        read_groups.append(i)
        return real(self, i, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    log.read_at(pa.table({"lsn": [900], "seq": [1]}), ["new"])
    assert read_groups == [0]  # one segment of the ten transactions' five, one row group


def test_rows_at_positions_of_a_damaged_segment_are_a_log_error(log):
    import pyarrow as pa

    seg = next(s for s in log.segments() if not s.stream and s.first <= Position(900, 1) <= s.last)
    seg.path.write_bytes(seg.path.read_bytes()[:-100])  # its footer (the log read it already: metadata is cached)
    with pytest.raises(LogError, match="is damaged"):
        log.read_at(pa.table({"lsn": [900], "seq": [1]}), ["new"])
