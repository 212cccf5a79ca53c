"""Test vectors for the pgoutput decoder: an encoder of pgoutput messages (the inverse of mirrorline.capture.decoder)
and messages captured from a real PostgreSQL 15 (proto_version 2, streaming on, messages on); imported by the decoder
and assembler tests (test_capture_decoder.py checks that every vector decodes to its message and encodes back to its
bytes)."""

from __future__ import annotations

import struct

from mirrorline.capture.decoder import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleValue,
    Type,
    Update,
)


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _xid(xid: int | None) -> bytes:
    return struct.pack(">I", xid) if xid is not None else b""


def encode_tuple(values: list[TupleValue]) -> bytes:
    out = [struct.pack(">H", len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        elif v is UNCHANGED:
            out.append(b"u")
        elif isinstance(v, bytes):
            out.append(b"b" + struct.pack(">i", len(v)) + v)
        else:
            assert isinstance(v, str)
            e = v.encode()
            out.append(b"t" + struct.pack(">i", len(e)) + e)
    return b"".join(out)


def encode(m: Message) -> bytes:
    """One message as pgoutput sends it (xid fields present when the message has one set)."""
    if isinstance(m, Begin):
        return b"B" + struct.pack(">QqI", m.final_lsn, m.commit_ts, m.xid)
    if isinstance(m, Commit):
        return b"C" + struct.pack(">BQQq", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)
    if isinstance(m, Origin):
        return b"O" + struct.pack(">Q", m.commit_lsn) + _s(m.name)
    if isinstance(m, Relation):
        cols = b"".join(bytes([c.flags]) + _s(c.name) + struct.pack(">Ii", c.type_oid, c.typmod) for c in m.columns)
        return (
            b"R"
            + _xid(m.xid)
            + struct.pack(">I", m.relid)
            + _s(m.namespace)
            + _s(m.name)
            + m.replica_identity.encode()
            + struct.pack(">H", len(m.columns))
            + cols
        )
    if isinstance(m, Type):
        return b"Y" + _xid(m.xid) + struct.pack(">I", m.type_oid) + _s(m.namespace) + _s(m.name)
    if isinstance(m, Insert):
        return b"I" + _xid(m.xid) + struct.pack(">I", m.relid) + b"N" + encode_tuple(m.new)
    if isinstance(m, Update):
        old = (m.old_kind or "").encode() + encode_tuple(m.old) if m.old is not None else b""
        return b"U" + _xid(m.xid) + struct.pack(">I", m.relid) + old + b"N" + encode_tuple(m.new)
    if isinstance(m, Delete):
        return b"D" + _xid(m.xid) + struct.pack(">I", m.relid) + m.old_kind.encode() + encode_tuple(m.old)
    if isinstance(m, Truncate):
        return (
            b"T"
            + _xid(m.xid)
            + struct.pack(">iB", len(m.relids), m.options)
            + struct.pack(f">{len(m.relids)}I", *m.relids)
        )
    if isinstance(m, LogicalMessage):
        return (
            b"M"
            + _xid(m.xid)
            + struct.pack(">BQ", m.flags, m.lsn)
            + _s(m.prefix)
            + struct.pack(">i", len(m.content))
            + m.content
        )
    if isinstance(m, StreamStart):
        return b"S" + struct.pack(">IB", m.xid, int(m.first_segment))
    if isinstance(m, StreamStop):
        return b"E"
    if isinstance(m, StreamCommit):
        return b"c" + struct.pack(">IBQQq", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)
    if isinstance(m, StreamAbort):
        tail = struct.pack(">Qq", m.abort_lsn, m.abort_ts) if m.abort_lsn is not None else b""
        return b"A" + struct.pack(">II", m.xid, m.subxid) + tail
    raise TypeError(m)


def col(name: str, oid: int = 25, key: bool = False, typmod: int = -1) -> RelationColumn:
    return RelationColumn(1 if key else 0, name, oid, typmod)


# (hex, in_stream, decoded): captured from PostgreSQL 15.
REAL: list[tuple[str, bool, Message]] = [
    ("4200000000015095c0000303bca04ee1b9000002d5", False, Begin(22058432, 848533608391097, 725)),
    (
        "52000040007075626c69630074006400030169640000000017ffffffff00760000000019ffffffff006e00000006a4000a0006",
        False,
        Relation(None, 16384, "public", "t", "d", (col("id", 23, True), col("v", 25), col("n", 1700, typmod=655366))),
    ),
    ("49000040004e00037400000001317400000001617400000004312e3530", False, Insert(None, 16384, ["1", "a", "1.50"], 0)),
    ("430000000000015095c000000000015095f0000303bca04ee1b9", False, Commit(0, 22058432, 22058480, 848533608391097)),
    (
        "55000040004e00037400000001317400000001627400000004312e3530",
        False,
        Update(None, 16384, None, None, ["1", "b", "1.50"], 0),
    ),
    (
        "55000040004b00037400000001326e6e4e00037400000001336e7400000004322e3030",
        False,
        Update(None, 16384, "K", ["2", None, None], ["3", None, "2.00"], 0),
    ),
    ("44000040004b00037400000001316e6e", False, Delete(None, 16384, "K", ["1", None, None], 0)),
    (
        "55000040074f00027400000001317400000001784e0002740000000131740000000179",
        False,
        Update(None, 16391, "O", ["1", "x"], ["1", "y"], 0),
    ),
    ("44000040074f0002740000000131740000000179", False, Delete(None, 16391, "O", ["1", "y"], 0)),
    (
        "55000040004e0003740000000137757400000004392e3030",
        False,
        Update(None, 16384, None, None, ["7", UNCHANGED, "9.00"], 1),
    ),
    ("5400000002000000400000004007", False, Truncate(None, 0, (16384, 16391))),
    ("4d01000000000150aef8706678000000000568656c6c6f", False, LogicalMessage(None, 1, 22064888, "pfx", b"hello")),
    ("4d00000000000150af3070667800000000026e74", False, LogicalMessage(None, 0, 22064944, "pfx", b"nt")),
    ("4f00000000000000ab75703100", False, Origin(171, "up1")),
    ("59000040017075626c6963006d6f6f6400", False, Type(None, 16385, "public", "mood")),
    ("53000002dd01", False, StreamStart(733, True)),
    (
        "52000002dd000040007075626c69630074006400030169640000000017ffffffff00760000000019ffffffff006e00000006a4000a0006",
        True,
        Relation(733, 16384, "public", "t", "d", (col("id", 23, True), col("v", 25), col("n", 1700, typmod=655366))),
    ),
    ("59000002d7000040017075626c6963006d6f6f6400", True, Type(727, 16385, "public", "mood")),
    ("49000002d7000040054e00027400000001327400000003736164", True, Insert(727, 16389, ["2", "sad"], 0)),
    (
        "4d000002d7010000000001563cb8700000000009696e2073747265616d",
        True,
        LogicalMessage(727, 1, 22428856, "p", b"in stream"),
    ),
    ("55000002d7000040054e000274000000013274000000026f6b", True, Update(727, 16389, None, None, ["2", "ok"], 0)),
    ("44000002d7000040054b00027400000001336e", True, Delete(727, 16389, "K", ["3", None], 0)),
    ("54000002d7000000010000004005", True, Truncate(727, 0, (16389,))),
    ("45", True, StreamStop()),
    ("41000002dd000002de", False, StreamAbort(733, 734)),
    (
        "63000002d70000000000015643a80000000001564478000303bca67f015b",
        False,
        StreamCommit(727, 0, 22430632, 22430840, 848533712208219),
    ),
]
