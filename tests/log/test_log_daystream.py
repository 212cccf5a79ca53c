"""The deltaflood/daystream line format (seed 002_3903d6a2179b2f70.txt): every worked example line of the seed is a
test vector; escaping; lines <-> changes; malformed lines."""

from __future__ import annotations

import pytest
from daystream_vectors import DAYSTREAM, DELTAFLOOD
from hypothesis import given
from hypothesis import strategies as st

from mirrorline.log.daystream import Address, Decoder, Encoder, LineError, escape, format_line, parse_line, unescape
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.position import ZERO

ZZZ = TableSchema("public.zzz", (Column("a", "text", nullable=False), Column("b", "text")), ("a",))
T = TableSchema(
    "s.t", (Column("id", "bigint", nullable=False), Column("v", "text"), Column("doc", "jsonb")), ("id",), version=2
)
FULL = TableSchema("public.full", (Column("x", "integer"), Column("y", "integer")), ("x", "y"))  # no primary key
SCHEMAS = {"public.zzz": ZZZ, "s.t": T, "public.full": FULL}


def decode(lines: list[str], default_ts: int = 0) -> list:
    d = Decoder(SCHEMAS.__getitem__, default_ts)
    txns = [t for ln in lines if (p := parse_line(ln)) is not None and (t := d.feed(p)) is not None]
    last = d.finish()
    return [*txns, last] if last else txns


def encode(txns) -> list[str]:
    enc = Encoder(lambda table, version: SCHEMAS[table])
    return [ln for t in txns for c in t.changes for ln in enc.lines(_with_ts(c, t.ts))]


def _with_ts(c: Change, ts: int) -> Change:
    return Change(c.pos, ts, c.xid, c.table, c.op, c.key, c.new, c.unchanged, c.old_key, c.schema_version)


def test_the_seed_examples_are_all_here():
    """Every example line of the seed, copied verbatim into tests/support/daystream_vectors.py (the tests read only
    the repository's files)."""
    assert len(DELTAFLOOD) == 12 and len(DAYSTREAM) == 20
    assert all(ln.startswith("_table\t") for ln in DELTAFLOOD) and all(ln.startswith("_c\t") for ln in DAYSTREAM)


@pytest.mark.parametrize("text", DELTAFLOOD + DAYSTREAM)
def test_every_seed_line_parses(text):
    line = parse_line(text)
    assert line is not None and line.table == "public.zzz" and line.action in ("insert", "update", "delete", "replace")
    assert line.xid is not None and 88628908 <= line.xid <= 88628923
    assert line.columns["a"].startswith("fox")
    assert ("b" in line.columns) == (line.action in ("insert", "update"))
    if text.startswith("_c"):
        assert line.c in (1507507200 * 1_000_000, 1507507201 * 1_000_000) and line.s is not None


def test_seed_daystream_lines_in_detail():
    first = parse_line(DAYSTREAM[0])
    assert (first.c, first.s, first.xid, first.action, first.columns) == (
        1507507200_000000,
        0,
        88628908,
        "update",
        {"a": "fox47", "b": "hen30"},
    )
    delete = parse_line(DAYSTREAM[6])  # "... _action delete a fox70 <tab><tab>": the empty pair is ignored
    assert DAYSTREAM[6].endswith("\t\t") and (delete.action, delete.columns) == ("delete", {"a": "fox70"})
    last = parse_line(DAYSTREAM[-1])
    assert (last.c, last.s) == (1507507201_000000, 1)


def test_seed_daystream_decodes_to_transactions():
    txns = decode(DAYSTREAM)
    assert len(txns) == 16 and sum(len(t.changes) for t in txns) == 18
    assert [t.xid for t in txns] == list(range(88628908, 88628924))
    t916 = next(t for t in txns if t.xid == 88628916)
    d, u = t916.changes
    assert (d.op, d.key, d.new) == (Op.DELETE, ("fox61",), None)
    # "replace a fox49" then "update a fox61 b hen62": one update that changed the key fox49 -> fox61
    assert (u.op, u.key, u.old_key, u.new) == (Op.UPDATE, ("fox61",), ("fox49",), {"a": "fox61", "b": "hen62"})
    ins = next(t for t in txns if t.xid == 88628918).changes[0]
    assert (ins.op, ins.key, ins.new) == (Op.INSERT, ("fox62",), {"a": "fox62", "b": "hen17"})
    assert txns[0].ts == 1507507200_000000 and txns[-1].ts == 1507507201_000000


def test_seed_daystream_round_trips_byte_for_byte():
    assert encode(decode(DAYSTREAM)) == DAYSTREAM


def test_seed_deltaflood_lines_are_the_tail_of_the_daystream_block():
    """The deltaflood block is the daystream block from _s 8 on, without the _c/_s tags (DESIGN §4)."""
    plain = decode(DELTAFLOOD, default_ts=1507507200_000000)
    tagged = decode(DAYSTREAM)[-len(plain) :]
    assert [(t.xid, t.changes) for t in plain] == [(t.xid, t.changes) for t in tagged]
    assert [ln.split("\t", 4)[4] for ln in DAYSTREAM[8:]] == DELTAFLOOD


def test_seed_deltaflood_without_timestamps_takes_the_default_time():
    assert {t.ts for t in decode(DELTAFLOOD, default_ts=42)} == {42}


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("plain", "plain"),
        ("a\tb", "a\\tb"),
        ("two\nlines", "two\\nlines"),
        ("back\\slash", "back\\\\slash"),
        ("bell\x07", "bell\\007"),
        ("\r\n", "\\015\\n"),
        ("", ""),
        ("café ☃", "café ☃"),
    ],
)
def test_escaping_as_deltaflood_does(raw, escaped):
    assert escape(raw) == escaped
    assert unescape(escaped) == raw


def test_octal_escapes_of_utf8_bytes_are_read():
    assert unescape("caf\\303\\251") == "café"


@given(st.text())
def test_escape_round_trips_any_text(text):
    e = escape(text)
    assert "\t" not in e and "\n" not in e
    assert unescape(e) == text


def test_changes_of_every_kind_round_trip():
    changes = [
        Change(ZERO, 0, 5, "s.t", Op.INSERT, ("1",), {"id": "1", "v": "tab\there", "doc": None}, schema_version=2),
        Change(ZERO, 0, 5, "s.t", Op.UPDATE, ("1",), {"id": "1", "v": None}, frozenset({"doc"}), schema_version=2),
        Change(
            ZERO, 0, 5, "s.t", Op.UPDATE, ("2",), {"id": "2", "v": "x", "doc": "{}"}, old_key=("1",), schema_version=2
        ),
        Change(ZERO, 0, 5, "s.t", Op.DELETE, ("2",), schema_version=2),
        Change(ZERO, 0, 5, "s.t", Op.TRUNCATE, schema_version=2),
    ]
    enc = Encoder(lambda table, version: SCHEMAS[table])
    lines = [ln for c in changes for ln in enc.lines(_with_ts(c, 7_000_000))]
    assert lines == [
        "_c\t7\t_s\t0\t_table\ts.t\t_xid\t5\t_action\tinsert\tid\t1\tv\ttab\\there",
        '_c\t7\t_s\t1\t_table\ts.t\t_xid\t5\t_action\tupdate\t_unchanged\t["doc"]\tid\t1',
        "_c\t7\t_s\t2\t_table\ts.t\t_xid\t5\t_action\treplace\tid\t1\t\t",
        "_c\t7\t_s\t3\t_table\ts.t\t_xid\t5\t_action\tupdate\tid\t2\tv\tx\tdoc\t{}",
        "_c\t7\t_s\t4\t_table\ts.t\t_xid\t5\t_action\tdelete\tid\t2\t\t",
        "_c\t7\t_s\t5\t_table\ts.t\t_xid\t5\t_action\ttruncate",
    ]
    (txn,) = decode(lines)
    assert txn.ts == 7_000_000 and txn.xid == 5
    assert txn.changes == changes


def test_update_keeping_its_key_after_replace_has_no_old_key():
    (txn,) = decode(
        ["_table\tzzz\t_xid\t1\t_action\treplace\ta\tx", "_table\tzzz\t_xid\t1\t_action\tupdate\ta\tx\tb\ty"]
    )
    assert txn.changes[0].old_key is None


def test_qualified_table_and_fractional_time():
    line = parse_line('_c\t12.5\t_s\t0\t_table\tt\t_qualified_table\t"s"."t"\t_action\ttruncate')
    assert line.table == "s.t" and line.c == 12_500_000
    assert parse_line("   ") is None and parse_line("\n") is None


def test_lines_without_xid_are_each_a_transaction():
    txns = decode(["_table\tzzz\t_action\tinsert\ta\t1", "_table\tzzz\t_action\tinsert\ta\t2"])
    assert len(txns) == 2


def test_format_line_leaves_the_public_schema_out():
    line = format_line(1, 2, "public.x", 3, "insert", [("k", "v")])
    assert line == "_c\t1\t_s\t2\t_table\tx\t_xid\t3\t_action\tinsert\tk\tv"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("_table\tzzz\t_action", "must pair up"),
        ("_table\tzzz\t_action\tupsert\ta\tx", "unknown _action"),
        ("_xid\t1\t_action\tinsert\ta\tx", "no _table"),
        ("_table\tzzz\ta\tx", "no _action"),
        ("_c\tyesterday\t_table\tzzz\t_action\tinsert\ta\tx", "_c"),
        ("_c\t1\t_s\t-1\t_table\tzzz\t_action\tinsert\ta\tx", "_s"),
        ("_table\tzzz\t_xid\tabc\t_action\tinsert\ta\tx", "_xid"),
        ("_table\tzzz\t_action\tinsert\ta\tx\\q", "bad escape"),
        ("_table\tzzz\t_action\tinsert\ta\tx\ta\ty", "twice"),
        ("_table\tzzz\t_action\tinsert\t\tx", "without a name"),
        ("_table\tzzz\t_action\tupdate\t_unchanged\tdoc\ta\tx", "_unchanged"),
        ("_table\tzzz\t_action\tinsert\ta\t\\377", "UTF-8"),
    ],
)
def test_malformed_lines(text, reason):
    with pytest.raises(LineError, match=reason):
        parse_line(text)


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        (["_table\tzzz\t_xid\t1\t_action\tinsert\ta\tx\tc\ty"], "no column"),
        (["_table\tzzz\t_xid\t1\t_action\tdelete\tb\ty"], "lacks key column"),
        (
            ["_table\tzzz\t_xid\t1\t_action\treplace\ta\tx", "_table\tzzz\t_xid\t1\t_action\tdelete\ta\tx"],
            "replace line must be followed",
        ),
        (["_table\tzzz\t_xid\t1\t_action\treplace\ta\tx"], "replace line must be followed"),
        (
            ["_table\tzzz\t_xid\t1\t_action\treplace\ta\tx", "_table\tzzz\t_xid\t2\t_action\tupdate\ta\tx"],
            "replace line must be followed",
        ),
        (["_table\tzzz\t_xid\t1\t_action\ttruncate\ta\tx"], "truncate line has no columns"),
        (['_table\tzzz\t_xid\t1\t_action\tinsert\t_unchanged\t["b"]\ta\tx'], "insert cannot have _unchanged"),
    ],
)
def test_lines_that_do_not_fit_the_table(lines, reason):
    with pytest.raises(LineError, match=reason):
        decode(lines)


def test_null_key_columns_of_a_table_without_a_primary_key_round_trip():
    changes = [
        Change(ZERO, 0, 3, "public.full", Op.INSERT, ("1", None), {"x": "1", "y": None}),
        Change(ZERO, 0, 3, "public.full", Op.UPDATE, ("2", None), {"x": "2", "y": None}, old_key=("1", None)),
        Change(ZERO, 0, 3, "public.full", Op.DELETE, (None, "5")),
    ]
    enc = Encoder(lambda table, version: SCHEMAS[table])
    lines = [ln for c in changes for ln in enc.lines(_with_ts(c, 9_000_000))]
    assert lines[1] == "_c\t9\t_s\t1\t_table\tfull\t_xid\t3\t_action\treplace\tx\t1\t\t"  # y left out: NULL
    (txn,) = decode(lines)
    assert txn.changes == changes


def test_a_replace_and_its_update_are_one_change_without_xids():
    # lines without _xid are transactions of their own, but a replace belongs with the update after it (in the next
    # file of an import, too: one decoder reads every file of the call)
    txns = decode(["_table\tzzz\t_action\treplace\ta\tx\t\t", "_table\tzzz\t_action\tupdate\ta\ty\tb\tz"])
    assert len(txns) == 1
    (c,) = txns[0].changes
    assert (c.op, c.key, c.old_key, c.new) == (Op.UPDATE, ("y",), ("x",), {"a": "y", "b": "z"})


@given(
    st.tuples(st.integers(-1, 5), st.integers(0, 3)),
    st.lists(st.tuples(st.integers(0, 7_000_000), st.integers(1, 2)), max_size=30),
)
def test_skipping_lines_at_once_is_tagging_them_one_by_one(start, lines):
    """Retention moves the addressing state over a unit's changes at once (vectorized): the same state as tagging
    each line, including times that go back (a later commit in an earlier second) and two-line key changes."""
    one, many = Address(*start), Address(*start)
    for ts, n in lines:
        for _ in range(n):
            one.tag(ts)
    many.skip([ts for ts, _ in lines], [n for _, n in lines])
    assert (many.c, many.lines) == (one.c, one.lines)
