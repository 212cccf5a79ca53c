"""Per-table statistics of log rows (mirrorline.log.stats): computed from Arrow rows, checked against a plain count
over the changes; kept in every kind of segment's metadata; summed by the reader over any range."""

from __future__ import annotations

import functools
import json
import random
from dataclasses import replace
from pathlib import Path

import changes
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from compile_histories import pack, random_histories

from mirrorline.errors import LogError
from mirrorline.log import ChangeLog, LogWriter
from mirrorline.log import stream as spill
from mirrorline.log.layout import META_KEY
from mirrorline.log.rows import changes_to_table
from mirrorline.log.segments import write_segment
from mirrorline.log.stats import SKETCH_FIELD, KeySketch, TableStats, from_meta, key_hashes, merge, table_stats, to_meta
from mirrorline.model import Change, Op
from mirrorline.position import ZERO, Position


def counted(changes: list[Change]) -> dict[str, TableStats]:
    """The statistics by a plain walk over changes in log order."""
    acc: dict[str, dict] = {}
    for c in changes:
        kind = "K" if c.op is Op.UPDATE and c.old_key is not None and c.old_key != c.key else c.op.value
        a = acc.setdefault(
            c.table, {"count": 0, "first": {}, "last": c.pos, "truncates": [], "kc": 0, "mv": 0, "mk": 0}
        )
        a["count"] += 1
        a["first"].setdefault(kind, c.pos)
        a["last"] = c.pos
        a["mk"] += bool(c.unchanged)
        if kind == "T":
            a["truncates"].append(c.pos)
        if kind == "K":
            a["kc"] += 1
            a["mv"] += bool(c.unchanged)
    return {
        t: TableStats(a["count"], a["first"], a["last"], tuple(a["truncates"]), a["kc"], a["mv"], a["mk"])
        for t, a in acc.items()
    }


def history_changes(seed: int) -> list[Change]:
    changes, _ = pack(random_histories(seed, 30))
    return sorted(changes, key=lambda c: c.pos)


@pytest.mark.parametrize("seed", range(5))
def test_statistics_equal_a_plain_count(seed: int) -> None:
    changes = history_changes(seed)
    assert any(c.op is Op.TRUNCATE for c in changes) and any(c.old_key for c in changes)
    assert table_stats(changes_to_table(changes)) == counted(changes)
    bare = table_stats(changes_to_table(changes), sketch=False)  # (equality leaves the estimate out)
    assert bare == counted(changes) and all(s.keys is None and s.distinct_keys() is None for s in bare.values())


@pytest.mark.parametrize("seed", range(3))
def test_statistics_of_consecutive_ranges_merge_into_the_whole(seed: int) -> None:
    changes = history_changes(seed)
    rnd = random.Random(seed)
    cuts = sorted(rnd.sample(range(1, len(changes)), 4))
    pieces = [changes[a:b] for a, b in zip([0, *cuts], [*cuts, len(changes)], strict=True)]
    assert merge(table_stats(changes_to_table(p)) for p in pieces) == table_stats(changes_to_table(changes))


def test_metadata_round_trip_through_json() -> None:
    stats = table_stats(changes_to_table(history_changes(7)))
    assert from_meta(json.loads(json.dumps(to_meta(stats)))) == stats
    with pytest.raises(ValueError, match="unknown change kinds"):
        from_meta({"public.t": {"count": 1, "first": {"X": [1, 0]}, "last": [1, 0]}})


def test_an_update_naming_its_own_key_as_old_key_is_no_key_change() -> None:
    def upd(seq: int, old: tuple[str, ...] | None, unchanged: frozenset[str] = frozenset()) -> Change:
        return Change(Position(5, seq), 0, 1, "public.t", Op.UPDATE, ("1",), {"id": "1"}, unchanged, old_key=old)

    s = table_stats(changes_to_table([upd(0, ("1",)), upd(1, ("2",), frozenset({"doc"})), upd(2, None)]))["public.t"]
    assert s.first == {"U": Position(5, 0), "K": Position(5, 1)}
    assert (s.count, s.key_changes, s.moves) == (3, 1, 1)


def test_first_kept_follows_the_actions() -> None:
    s = TableStats(
        5,
        {"K": Position(1, 0), "U": Position(2, 0), "T": Position(3, 0), "I": Position(4, 0), "D": Position(5, 0)},
        Position(5, 0),
        (Position(3, 0),),
    )
    assert s.first_kept(frozenset("IUD")) == Position(1, 0)
    assert s.first_kept(frozenset("U")) == Position(2, 0)  # a key change is kept with its D or its I
    assert s.first_kept(frozenset("I")) == Position(1, 0)
    only_t = TableStats(1, {"T": Position(3, 0)}, Position(3, 0), (Position(3, 0),))
    assert only_t.first_kept(frozenset("IU")) is None  # a TRUNCATE goes with D
    assert only_t.first_kept(frozenset("D")) == Position(3, 0)


ch = functools.partial(changes.ch, xid=7, cols=("id", "v"))


def test_every_segment_kind_carries_its_statistics_and_the_reader_sums_any_range(tmp_path: Path) -> None:
    with LogWriter(tmp_path, segment_changes=4) as w:
        for lsn in range(10, 60, 10):
            w.add_transaction(
                lsn,
                lsn,
                [ch(lsn), ch(lsn + 1, Op.UPDATE, old_key=(str(lsn),)), ch(lsn + 2, table="s.o"), ch(lsn, Op.DELETE)],
            )
        s = w.open_stream(900)
        s.add(900, [ch(100), ch(0, Op.TRUNCATE, table="s.o")])
        s.add(901, [ch(101, Op.UPDATE, unchanged=frozenset({"doc"})), ch(300, Op.UPDATE, old_key=("30",))])
        s.add(900, [ch(102, table="s.o"), ch(1, Op.TRUNCATE, table="s.o")])
        s.add(902, [ch(103)])
        s.end_block()
        s.abort_subxact(902)
        s.commit(70, 70)
        w.add_transaction(80, 80, [ch(200, Op.DELETE)])
        w.flush()
    log = ChangeLog(tmp_path)
    segs = log.segments()
    assert len(segs) >= 3 and any(x.stream for x in segs) and all(x.tables is not None for x in segs)
    for seg in segs:
        own = [b for b in log.read_arrow(seg.prev, seg.last)]
        assert seg.tables == merge(table_stats(b) for b in own)
    everything = list(log.read())
    positions = [ZERO, *[c.pos for c in everything]]
    for a in positions[::3]:
        for b in positions[1::4]:
            if a < b:
                want = counted([c for c in everything if a < c.pos <= b])
                assert log.stats(a, b) == want, (a, b)
    assert log.stats() == counted(everything)
    stream = next(x for x in segs if x.stream)
    assert (
        len(stream.parts) == 2
        and stream.tables is not None
        and stream.tables["s.o"].truncates == (Position(70, 1), Position(70, 5))
    )


def test_a_streams_statistics_counted_as_it_spills_are_those_of_its_rows(tmp_path: Path, monkeypatch) -> None:
    """Counted a few rows at a time as the parts spill (parts closed and opened again, a subtransaction aborted after
    some of its rows were counted, a TRUNCATE, key changes), then moved to the commit's LSN: the same statistics as
    its rows read back from the log, and as a plain count of them."""
    monkeypatch.setattr(spill, "SPILL_ROWS", 3)
    monkeypatch.setattr(spill, "STATS_ROWS", 5)
    monkeypatch.setattr(spill, "MAX_OPEN_PARTS", 2)
    with LogWriter(tmp_path) as w:
        s = w.open_stream(900)
        for i in range(40):
            sub = 900 + i % 4
            c = ch(i, Op.UPDATE, old_key=(str(i - 1),)) if i % 7 == 0 else ch(i, table="s.o" if i % 3 else "public.t")
            s.add(sub, [c, ch(i, Op.DELETE)] if i % 5 == 0 else [c])
            if i == 17:
                s.add(900, [ch(0, Op.TRUNCATE, table="s.o")])
            if i % 6 == 5:
                s.end_block()
        s.abort_subxact(903)
        s.commit(70, 70)
    log = ChangeLog(tmp_path)
    (seg,) = log.segments()
    assert seg.stream and len(seg.parts) > 4
    assert seg.tables == merge(table_stats(b) for b in log.read_arrow(seg.prev, seg.last))
    assert seg.tables == counted(list(log.read()))
    assert seg.tables["s.o"].truncates[0].lsn == 70


def test_segments_without_statistics_are_read_for_them(tmp_path: Path) -> None:
    """A segment written before footers carried statistics: the reader computes them from its small columns."""
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 10, [ch(1), ch(2, Op.UPDATE, old_key=("9",)), ch(0, Op.TRUNCATE)])
        w.flush()
    log = ChangeLog(tmp_path)
    (seg,) = log.segments()
    table = pq.read_table(str(seg.path))
    old = replace(seg, tables=None)
    seg.path.unlink()
    write_segment(seg.path.parent, seg.name, [table], old)
    assert json.loads(pq.read_metadata(str(seg.path)).metadata[META_KEY]).get("tables") is None
    fresh = ChangeLog(tmp_path)
    assert fresh.segments()[0].tables is None
    assert fresh.stats() == counted(list(fresh.read()))
    assert fresh.stats(Position(10, 0), Position(10, 1)) == counted(list(fresh.read(Position(10, 0), Position(10, 1))))


def test_a_damaged_statistics_record_is_a_damaged_segment(tmp_path: Path) -> None:
    with LogWriter(tmp_path) as w:
        w.add_transaction(10, 10, [ch(1)])
        w.flush()
    (seg,) = ChangeLog(tmp_path).segments()
    raw = {**seg.meta(), "tables": {"public.t": {"count": "many"}}}
    table = pq.read_table(str(seg.path))
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(raw).encode()}), str(seg.path))
    with pytest.raises(LogError, match="damaged"):
        ChangeLog(tmp_path).segments()


def test_segments_from_before_marks_were_kept_leave_them_unknown(tmp_path: Path) -> None:
    """``marks`` (changes marking columns unchanged) is None over any range that touches a segment whose statistics
    lack it: compile then cannot tell that no image needs completing."""
    with LogWriter(tmp_path, segment_changes=2) as w:
        w.add_transaction(10, 10, [ch(1), ch(2)])
        w.add_transaction(20, 20, [ch(1, Op.UPDATE, unchanged=frozenset({"v"})), ch(3)])
        w.flush()
    log = ChangeLog(tmp_path)
    first, second = log.segments()
    assert (first.tables or {})["public.t"].marks == 0 and (second.tables or {})["public.t"].marks == 1
    assert log.stats()["public.t"].marks == 1
    raw = first.meta()
    del raw["tables"]["public.t"]["marks"]
    table = pq.read_table(str(first.path))
    pq.write_table(table.replace_schema_metadata({META_KEY: json.dumps(raw).encode()}), str(first.path))
    old = ChangeLog(tmp_path)
    assert old.stats()["public.t"].marks is None
    assert old.stats(None, Position(10, 1))["public.t"].marks is None
    assert old.stats(Position(10, 1), Position(20, 1))["public.t"].marks == 1
    assert old.stats(Position(10, 0), Position(20, 1))["public.t"].marks == 1  # a part of a segment: read from rows


@pytest.mark.parametrize("seed", range(3))
def test_the_key_sketch_counts_the_keys_and_sums_over_pieces_as_over_the_whole(seed: int) -> None:
    """The sketch is an estimate (not compared with ``==``): its registers are what must add up exactly."""
    changes = history_changes(seed)
    whole = table_stats(changes_to_table(changes))
    rnd = random.Random(seed)
    cuts = sorted(rnd.sample(range(1, len(changes)), 4))
    pieces = [changes[a:b] for a, b in zip([0, *cuts], [*cuts, len(changes)], strict=True)]
    merged = merge(table_stats(changes_to_table(p)) for p in pieces)
    for t, s in whole.items():
        assert s.keys is not None and merged[t].keys == s.keys
        keys = len({c.key for c in changes if c.table == t})
        assert abs((s.distinct_keys() or 0) - keys) <= max(2, 0.1 * keys), (t, s.distinct_keys(), keys)
    again = from_meta(json.loads(json.dumps(to_meta(whole))))
    assert all(again[t].keys == s.keys for t, s in whole.items())


def test_a_sketch_tells_many_keys_from_few() -> None:
    many = [Change(Position(1, i), 0, 1, "public.t", Op.UPDATE, (str(i),), {"id": str(i)}) for i in range(20_000)]
    few = [Change(Position(1, i), 0, 1, "public.t", Op.UPDATE, (str(i % 4000),), {"id": "x"}) for i in range(20_000)]
    two = [replace(c, key=("a", str(i))) for i, c in enumerate(many)]  # a key of two columns
    estimates = [table_stats(changes_to_table(cs))["public.t"].distinct_keys() or 0 for cs in (many, few, two)]
    assert 17_000 < estimates[0] < 23_000 and 3_400 < estimates[1] < 4_600 and 17_000 < estimates[2] < 23_000
    old = {"count": 1, "first": {"U": [1, 0]}, "last": [1, 0]}  # written before the sketch was kept
    assert from_meta({"public.t": old})["public.t"].keys is None
    with pytest.raises(ValueError, match="registers"):
        from_meta({"public.t": {**old, SKETCH_FIELD: "AAAA"}})
    # a sketch kept of the hash before (field "keys") cannot be joined with these: left unread, unknown
    earlier = KeySketch(bytes(range(4)) * 256).text()
    assert from_meta({"public.t": {**old, "keys": earlier}})["public.t"].keys is None


M64 = (1 << 64) - 1


def reference_hash(text: str | None) -> int:
    """The key hash by its definition, a word at a time in Python: the length times the golden ratio's constant,
    each eight bytes (little-endian, the last word's missing bytes zero) mixed in, mixed once more."""

    def fmix(h: int) -> int:
        h ^= h >> 33
        h = (h * 0xFF51AFD7ED558CCD) & M64
        h ^= h >> 33
        h = (h * 0xC4CEB9FE1A85EC53) & M64
        return h ^ (h >> 33)

    if text is None:
        return 0x9E3779B97F4A7C15
    raw = text.encode()
    h = (len(raw) * 0x9E3779B97F4A7C15) & M64
    for i in range(0, len(raw), 8):
        h = fmix(h ^ int.from_bytes(raw[i : i + 8], "little"))
    return fmix(h)


def test_key_hashes_follow_their_definition_however_arrow_holds_the_texts() -> None:
    """Texts around the eight-byte words' edges, multibyte, empty, NULL; in an array that starts at an offset, in
    large strings, in chunks, in slices past one hash step: the same hashes as the definition's."""
    texts = ["", "1", "1234567", "12345678", "123456789", "x" * 16, "y" * 17, "é€😀", "a\x00b", None, "z" * 300]
    texts += [str(i) for i in range(-50, 50)] + ["k" * i for i in range(40)]
    expect = [reference_hash(t) for t in texts]

    def keys(values: list[str | None], text: pa.DataType | None = None) -> pa.Array:
        return pa.array([[v] for v in values], pa.list_(text or pa.string()))

    assert key_hashes(keys(texts)).tolist() == expect
    assert key_hashes(keys(texts).slice(3)).tolist() == expect[3:]
    assert key_hashes(keys(texts, pa.large_string())).tolist() == expect
    chunked = pa.chunked_array([keys(texts[:7]), keys(texts[7:]).slice(1)])
    assert key_hashes(chunked).tolist() == expect[:7] + expect[8:]
    many = [f"key-{i}" for i in range(300_000)]  # past HASH_ROWS: hashed a slice at a time
    assert key_hashes(keys(many)).tolist()[-5:] == [reference_hash(t) for t in many[-5:]]
    # a key of two columns: its texts joined by NUL (key_ids), hashed as one
    pair = pa.array([["a", "b"], ["ab", ""]], pa.list_(pa.string()))
    assert key_hashes(pair).tolist() == [reference_hash("a\x00b"), reference_hash("ab\x00")]


def test_the_sketch_counts_keys_that_differ_only_past_their_first_word() -> None:
    """Keys alike in their first eight bytes (a common prefix), of every length up to three words."""
    for fmt in ("customer-{:012d}", "{:030d}", "{}"):
        keys = [fmt.format(i) for i in range(50_000)]
        (sketch,) = KeySketch.of(key_hashes(pa.array([[k] for k in keys])))
        assert 45_000 < sketch.estimate() < 55_000, (fmt, sketch.estimate())
