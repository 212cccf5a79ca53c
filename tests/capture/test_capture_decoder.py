"""The pgoutput decoder: every message kind, values as sent (null and unchanged TOAST apart), stream-block state, and
malformed input: always a DecodeError saying what and where, never another exception or a silently different message
(fuzzed with hypothesis: random bytes, mutations and truncations of real messages)."""

from __future__ import annotations

import struct

import pytest
from decoder_vectors import REAL, col, encode
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorline.capture.decoder import (
    HAS_BINARY,
    HAS_UNCHANGED,
    PG_EPOCH_UNIX_US,
    UNCHANGED,
    Begin,
    Commit,
    Decoder,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    decode,
)
from mirrorline.errors import DecodeError

# ------------------------------------------------------------------------------------------------ message kinds


def test_begin_and_commit_keep_lsns_and_timestamps_as_sent() -> None:
    b = decode(encode(Begin(0x16B374D848, 1, 42)))
    assert b == Begin(0x16B374D848, 1, 42)
    c = decode(encode(Commit(0, 0x16B374D848, 0x16B374D878, -5)))
    assert c == Commit(0, 0x16B374D848, 0x16B374D878, -5)
    assert PG_EPOCH_UNIX_US == 946_684_800 * 1_000_000  # 2000-01-01T00:00:00Z


def test_relation_columns_key_flags_types_and_identity() -> None:
    rel = Relation(None, 99, "", "pg_thing", "f", (col("a", 23, True), col("b", 1043, typmod=24)))
    out = decode(encode(rel))
    assert out == rel
    assert isinstance(out, Relation)
    assert [c.is_key for c in out.columns] == [True, False]
    assert out.columns[1].typmod == 24


def test_values_text_null_unchanged_and_binary_are_kept_apart() -> None:
    m = decode(encode(Update(None, 7, "O", ["1", None], ["1", UNCHANGED, None, "", b"\x00\x01"], 0)))
    assert isinstance(m, Update)
    assert m.new == ["1", UNCHANGED, None, "", b"\x00\x01"]
    assert m.new[1] is UNCHANGED and m.new[2] is None and m.new[3] == ""
    assert m.flags == HAS_UNCHANGED | HAS_BINARY
    assert m.old_kind == "O" and m.old == ["1", None]


def test_text_values_are_utf8_exactly_as_sent() -> None:
    values = ["héllo wörld ✓", "tab\there", "line\nbreak", "back\\slash", "quote'\"", "  spaces  ", "1e-7", "NaN"]
    m = decode(encode(Insert(None, 1, list(values), 0)))
    assert isinstance(m, Insert) and m.new == values and m.flags == 0


def test_update_without_old_tuple_with_old_key_and_with_old_row() -> None:
    for old_kind, old in ((None, None), ("K", ["1", None]), ("O", ["1", "x"])):
        m = Update(None, 5, old_kind, old, ["2", "y"], 0)
        assert decode(encode(m)) == m


def test_delete_with_key_and_with_full_old_row() -> None:
    for kind in ("K", "O"):
        m = Delete(None, 5, kind, ["1", None], 0)
        assert decode(encode(m)) == m


def test_truncate_many_relations_and_options() -> None:
    m = Truncate(None, 3, (1, 2, 4294967295))
    assert decode(encode(m)) == m
    assert decode(encode(Truncate(None, 0, ()))) == Truncate(None, 0, ())


def test_logical_message_transactional_and_not() -> None:
    for flags in (0, 1):
        m = LogicalMessage(None, flags, 77, "prefix", b"\x00binary\xff")
        assert decode(encode(m)) == m


def test_origin_and_type() -> None:
    assert decode(encode(Origin(171, "up1"))) == Origin(171, "up1")
    assert decode(encode(Type(None, 16385, "public", "mood"))) == Type(None, 16385, "public", "mood")


def test_stream_messages_and_xid_inside_blocks() -> None:
    assert decode(encode(StreamStart(9, True))) == StreamStart(9, True)
    assert decode(encode(StreamStart(9, False))) == StreamStart(9, False)
    assert decode(b"E") == StreamStop()
    assert decode(encode(StreamCommit(9, 0, 100, 120, 5))) == StreamCommit(9, 0, 100, 120, 5)
    assert decode(encode(StreamAbort(9, 10))) == StreamAbort(9, 10)
    # inside a block, data messages carry the (sub)transaction's xid
    ins = Insert(10, 3, ["a"], 0)
    assert decode(encode(ins), in_stream=True) == ins


def test_stream_abort_protocol_4_carries_lsn_and_timestamp() -> None:
    m = StreamAbort(9, 10, 0x1234, 99)
    assert decode(encode(m), proto_version=4) == m
    with pytest.raises(DecodeError, match="unexpected bytes"):
        decode(encode(m), proto_version=2)


def test_real_messages_from_postgresql_15() -> None:
    kinds = set()
    for hexdata, in_stream, expected in REAL:
        assert decode(bytes.fromhex(hexdata), in_stream) == expected
        kinds.add(type(expected))
    assert kinds == {
        Begin,
        Commit,
        Origin,
        Relation,
        Type,
        Insert,
        Update,
        Delete,
        Truncate,
        LogicalMessage,
        StreamStart,
        StreamStop,
        StreamCommit,
        StreamAbort,
    }


# ------------------------------------------------------------------------------------------------ stream state


def test_decoder_tracks_stream_blocks() -> None:
    d = Decoder()
    ins = Insert(10, 3, ["a"], 0)
    assert d.decode(encode(StreamStart(9, True))) == StreamStart(9, True)
    assert d.in_stream and d.stream_xid == 9
    assert d.decode(encode(ins)) == ins
    d.decode(b"E")
    assert not d.in_stream
    assert d.decode(encode(Insert(None, 3, ["a"], 0))) == Insert(None, 3, ["a"], 0)


@pytest.mark.parametrize(
    "inside",
    [Begin(1, 2, 3), Commit(0, 1, 2, 3), StreamStart(4, False), StreamCommit(9, 0, 1, 2, 3), StreamAbort(9, 9)],
)
def test_decoder_refuses_transaction_boundaries_inside_a_block(inside: Message) -> None:
    d = Decoder()
    d.decode(encode(StreamStart(9, True)))
    with pytest.raises(DecodeError, match="inside the stream block of xid 9"):
        d.decode(encode(inside))


def test_decoder_refuses_stream_stop_outside_a_block_and_reset_forgets_the_block() -> None:
    d = Decoder()
    with pytest.raises(DecodeError, match="Stream Stop outside"):
        d.decode(b"E")
    d.decode(encode(StreamStart(9, True)))
    d.reset()
    assert not d.in_stream
    assert d.decode(encode(Begin(1, 2, 3))) == Begin(1, 2, 3)


# ------------------------------------------------------------------------------------------------ malformed input


def test_empty_and_unknown_messages() -> None:
    with pytest.raises(DecodeError, match="empty"):
        decode(b"")
    with pytest.raises(DecodeError, match="unknown pgoutput message type 'P'"):
        decode(b"P" + bytes(20))
    with pytest.raises(DecodeError, match="0x00"):
        decode(b"\x00")


def test_truncated_insert_says_what_and_where() -> None:
    data = encode(Insert(None, 16384, ["1", "abc"], 0))
    with pytest.raises(DecodeError) as e:
        decode(data[:-2])
    msg = str(e.value)
    assert "Insert" in msg and "new tuple column 2" in msg and "byte" in msg
    assert e.value.context["message_type"] == "Insert"
    assert e.value.context["offset"] == 15


def test_trailing_bytes_are_an_error() -> None:
    with pytest.raises(DecodeError, match="2 unexpected bytes after the last field"):
        decode(encode(Begin(1, 2, 3)) + b"xx")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"I" + struct.pack(">I", 1) + b"X" + struct.pack(">H", 0), "expected 'N'"),
        (b"D" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 0), "expected 'K' or 'O'"),
        (b"U" + struct.pack(">I", 1) + b"K" + struct.pack(">H", 0) + b"K", "expected 'N'"),
        (b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"x", "unknown kind"),
        (b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">i", -1), "length -1"),
        (b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">i", 9) + b"abc", "exceeds"),
        (
            b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">i", 2) + b"\xff\xfe",
            "not valid UTF-8",
        ),
        (b"R" + struct.pack(">I", 1) + b"public\0t\0" + b"z" + struct.pack(">H", 0), "unknown replica identity"),
        (b"R" + struct.pack(">I", 1) + b"public\0t", "unterminated string"),
        (b"T" + struct.pack(">iB", -1, 0), "negative relation count"),
        (b"T" + struct.pack(">iB", 1000000, 0), "truncated"),
        (b"M" + struct.pack(">BQ", 0, 1) + b"p\0" + struct.pack(">i", -3), "negative content length"),
        (b"S" + struct.pack(">IB", 1, 2), "first segment flag"),
        (b"C" + bytes(10), "truncated in Commit fields"),
    ],
)
def test_malformed_messages(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode(data)


def test_every_truncation_of_every_real_message_is_a_decode_error() -> None:
    for hexdata, in_stream, _ in REAL:
        data = bytes.fromhex(hexdata)
        for n in range(len(data)):
            with pytest.raises(DecodeError):
                decode(data[:n], in_stream)


def _decodes_faithfully(data: bytes, in_stream: bool) -> None:
    """The property: either a DecodeError, or a message that encodes back to exactly these bytes (nothing read
    wrongly, nothing ignored)."""
    try:
        m = decode(data, in_stream)
    except DecodeError as e:
        assert str(e) and "offset" in e.context
        return
    assert encode(m) == data


@settings(max_examples=400)
@given(st.binary(max_size=64), st.booleans())
def test_fuzz_random_bytes(data: bytes, in_stream: bool) -> None:
    _decodes_faithfully(data, in_stream)


@settings(max_examples=300)
@given(st.sampled_from(sorted(b"BCORYIUDTMSEcA")), st.binary(max_size=80), st.booleans())
def test_fuzz_random_bodies_of_every_message_type(kind: int, body: bytes, in_stream: bool) -> None:
    _decodes_faithfully(bytes([kind]) + body, in_stream)


_mutation = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.just(0)),
)


@settings(max_examples=600)
@given(st.sampled_from(REAL), st.lists(_mutation, min_size=1, max_size=4))
def test_fuzz_mutations_of_real_messages(
    vector: tuple[str, bool, Message], mutations: list[tuple[str, int, int]]
) -> None:
    data = bytearray(bytes.fromhex(vector[0]))
    for op, at, value in mutations:
        i = at % (len(data) + (op == "insert")) if data or op == "insert" else 0
        if op == "set" and data:
            data[i] = value
        elif op == "insert":
            data.insert(i, value)
        elif op == "delete" and data:
            del data[i]
    _decodes_faithfully(bytes(data), vector[1])


@settings(max_examples=200)
@given(st.sampled_from(REAL), st.integers(0, 200))
def test_fuzz_truncations_of_real_messages(vector: tuple[str, bool, Message], cut: int) -> None:
    data = bytes.fromhex(vector[0])
    n = cut % len(data)
    with pytest.raises(DecodeError):
        decode(data[:n], vector[1])


_values = st.lists(st.one_of(st.none(), st.just(UNCHANGED), st.text(max_size=20), st.binary(max_size=8)), max_size=6)


@settings(max_examples=300)
@given(st.integers(0, 2**32 - 1), _values, _values, st.sampled_from([None, "K", "O"]), st.booleans())
def test_fuzz_generated_updates_round_trip(relid: int, old: list, new: list, kind: str | None, stream: bool) -> None:
    xid = 77 if stream else None
    m = Update(xid, relid, kind, old if kind else None, new, 0)
    out = decode(encode(m), in_stream=stream)
    assert isinstance(out, Update)
    assert (out.xid, out.relid, out.old_kind, out.old, out.new) == (xid, relid, kind, old if kind else None, new)
    assert bool(out.flags & HAS_UNCHANGED) == any(v is UNCHANGED for v in new)


def test_every_real_vector_decodes_to_its_message_and_encodes_back() -> None:
    from mirrorline.capture.decoder import decode

    for hexdata, in_stream, expected in REAL:
        data = bytes.fromhex(hexdata)
        assert decode(data, in_stream) == expected, hexdata
        assert encode(expected) == data, hexdata
