"""Decoder of the ``pgoutput`` logical replication protocol (PostgreSQL's "Logical Replication Message Formats"),
protocol version 2 with ``streaming`` on, as PostgreSQL 15 sends it.

Pure code over bytes: :func:`decode` turns one message (the payload of one XLogData) into one message object;
:class:`Decoder` adds the one piece of state the format needs (inside a stream block, data messages carry the xid of
their (sub)transaction) and checks the order of stream blocks. Values are kept exactly as sent: text values as ``str``,
SQL NULL as ``None``, an unchanged TOASTed value as :data:`UNCHANGED` (never a null), binary-format values as
``bytes``. LSNs, xids and timestamps are kept as sent (timestamps count microseconds from 2000-01-01).

Anything malformed or truncated raises :class:`mirrorline.errors.DecodeError` naming the message, the field and the
byte offset: never another exception, never a hang, never a silently different message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mirrorline.errors import DecodeError

PG_EPOCH_UNIX_US: Final = 946_684_800_000_000
"""Microseconds from the Unix epoch to PostgreSQL's epoch (2000-01-01 UTC): add it to a pgoutput timestamp."""


class _Unchanged:
    """The marker of an unchanged TOASTed column ('u'): the value was not sent."""

    __slots__ = ()
    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()

TupleValue = str | bytes | None | _Unchanged
"""One column of a TupleData: text (``str``), binary (``bytes``), NULL (``None``) or :data:`UNCHANGED`."""

HAS_UNCHANGED: Final = 1
"""Tuple flag: some column is :data:`UNCHANGED`."""
HAS_BINARY: Final = 2
"""Tuple flag: some column came in binary format (``bytes``)."""


# ----------------------------------------------------------------------------------------------------- messages


@dataclass(slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_ts: int  # microseconds since 2000-01-01
    xid: int


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int  # 1: part of the key (replica identity)
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(slots=True)
class Relation:
    xid: int | None  # set inside a stream block
    relid: int
    namespace: str  # "" for pg_catalog
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]


@dataclass(slots=True)
class Type:
    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(slots=True)
class Insert:
    xid: int | None
    relid: int
    new: list[TupleValue]
    flags: int = 0  # HAS_UNCHANGED / HAS_BINARY of the tuple


@dataclass(slots=True)
class Update:
    xid: int | None
    relid: int
    old_kind: str | None  # 'K' (old key columns only), 'O' (whole old row, REPLICA IDENTITY FULL) or None
    old: list[TupleValue] | None
    new: list[TupleValue]
    flags: int = 0  # HAS_UNCHANGED / HAS_BINARY of the new tuple (HAS_BINARY also for the old one)


@dataclass(slots=True)
class Delete:
    xid: int | None
    relid: int
    old_kind: str  # 'K' or 'O'
    old: list[TupleValue]
    flags: int = 0  # HAS_UNCHANGED / HAS_BINARY of the old tuple


@dataclass(slots=True)
class Truncate:
    xid: int | None
    options: int  # 1: CASCADE, 2: RESTART IDENTITY
    relids: tuple[int, ...]


@dataclass(slots=True)
class LogicalMessage:
    xid: int | None
    flags: int  # 1: transactional
    lsn: int
    prefix: str
    content: bytes


@dataclass(slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(slots=True)
class StreamStop:
    pass


@dataclass(slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(slots=True)
class StreamAbort:
    xid: int
    subxid: int
    abort_lsn: int | None = None  # protocol version 4 only
    abort_ts: int | None = None


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)

# ----------------------------------------------------------------------------------------------------- reading

_NAMES: Final = {
    66: "Begin",
    67: "Commit",
    79: "Origin",
    82: "Relation",
    89: "Type",
    73: "Insert",
    85: "Update",
    68: "Delete",
    84: "Truncate",
    77: "Message",
    83: "Stream Start",
    69: "Stream Stop",
    99: "Stream Commit",
    65: "Stream Abort",
}
_U8 = struct.Struct(">B").unpack_from
_U16 = struct.Struct(">H").unpack_from
_I32 = struct.Struct(">i").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I64 = struct.Struct(">q").unpack_from
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_STREAM_COMMIT = struct.Struct(">IBQQq")


class _Reader:
    """A cursor over one message that checks every read against the message's end."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.pos = 1
        self.end = len(buf)
        self.what = what

    def fail(self, reason: str, at: int | None = None) -> DecodeError:
        at = self.pos if at is None else at
        return DecodeError(
            f"malformed pgoutput {self.what} message: {reason} at byte {at} (message is {self.end} bytes)",
            hint="the replication stream is damaged or not pgoutput protocol version 2",
            message_type=self.what,
            offset=at,
        )

    def need(self, n: int, field: str) -> int:
        p = self.pos
        if p + n > self.end:
            raise self.fail(f"truncated in {field} (needs {n} bytes, {self.end - p} left)")
        self.pos = p + n
        return p

    def u8(self, field: str) -> int:
        return int(self.buf[self.need(1, field)])

    def u16(self, field: str) -> int:
        return int(_U16(self.buf, self.need(2, field))[0])

    def i32(self, field: str) -> int:
        return int(_I32(self.buf, self.need(4, field))[0])

    def u32(self, field: str) -> int:
        return int(_U32(self.buf, self.need(4, field))[0])

    def u64(self, field: str) -> int:
        return int(_U64(self.buf, self.need(8, field))[0])

    def i64(self, field: str) -> int:
        return int(_I64(self.buf, self.need(8, field))[0])

    def string(self, field: str) -> str:
        p = self.pos
        z = self.buf.find(b"\0", p, self.end)
        if z < 0:
            raise self.fail(f"unterminated string in {field}")
        self.pos = z + 1
        try:
            return self.buf[p:z].decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{field} is not valid UTF-8", p + e.start) from None

    def done(self) -> None:
        if self.pos != self.end:
            raise self.fail(f"{self.end - self.pos} unexpected bytes after the last field")

    def xid(self, in_stream: bool) -> int | None:
        return self.u32("xid") if in_stream else None

    def tuple(self, field: str) -> tuple[list[TupleValue], int]:
        """TupleData: Int16 column count, then per column 'n' | 'u' | 't' Int32 len, bytes | 'b' Int32 len, bytes."""
        buf, end = self.buf, self.end
        pos = self.need(2, f"{field} column count")
        n = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
        values: list[TupleValue] = []
        append = values.append
        flags = 0
        for i in range(n):
            if pos >= end:
                self.pos = pos
                raise self.fail(f"truncated in {field} column {i + 1} of {n}")
            kind = buf[pos]
            if kind == 116 or kind == 98:  # 't' text, 'b' binary
                if pos + 5 > end:
                    self.pos = pos + 1
                    raise self.fail(f"truncated in {field} column {i + 1} length")
                length = _I32(buf, pos + 1)[0]
                start = pos + 5
                stop = start + length
                if length < 0 or stop > end:
                    raise self.fail(f"{field} column {i + 1} length {length} exceeds the message", pos + 1)
                if kind == 116:
                    try:
                        append(buf[start:stop].decode("utf-8"))
                    except UnicodeDecodeError as e:
                        raise self.fail(f"{field} column {i + 1} is not valid UTF-8", start + e.start) from None
                else:
                    append(buf[start:stop])
                    flags |= HAS_BINARY
                pos = stop
            elif kind == 110:  # 'n' null
                append(None)
                pos += 1
            elif kind == 117:  # 'u' unchanged TOAST
                append(UNCHANGED)
                flags |= HAS_UNCHANGED
                pos += 1
            else:
                raise self.fail(f"unknown kind {kind!r} of {field} column {i + 1}", pos)
        self.pos = pos
        return values, flags


def _begin(r: _Reader, in_stream: bool, proto: int) -> Begin:
    r.need(_BEGIN.size, "Begin fields")
    lsn, ts, xid = _BEGIN.unpack_from(r.buf, 1)
    return Begin(lsn, ts, xid)


def _commit(r: _Reader, in_stream: bool, proto: int) -> Commit:
    r.need(_COMMIT.size, "Commit fields")
    flags, lsn, end, ts = _COMMIT.unpack_from(r.buf, 1)
    return Commit(flags, lsn, end, ts)


def _origin(r: _Reader, in_stream: bool, proto: int) -> Origin:
    return Origin(r.u64("origin commit LSN"), r.string("origin name"))


def _relation(r: _Reader, in_stream: bool, proto: int) -> Relation:
    xid = r.xid(in_stream)
    relid = r.u32("relation id")
    namespace = r.string("namespace")
    name = r.string("relation name")
    ident = r.u8("replica identity")
    if ident not in (100, 110, 102, 105):  # d n f i
        raise r.fail(f"unknown replica identity {ident!r}", r.pos - 1)
    ncols = r.u16("column count")
    cols = []
    for i in range(ncols):
        flags = r.u8(f"column {i + 1} flags")
        cname = r.string(f"column {i + 1} name")
        cols.append(RelationColumn(flags, cname, r.u32(f"column {i + 1} type"), r.i32(f"column {i + 1} typmod")))
    return Relation(xid, relid, namespace, name, chr(ident), tuple(cols))


def _type(r: _Reader, in_stream: bool, proto: int) -> Type:
    xid = r.xid(in_stream)
    return Type(xid, r.u32("type id"), r.string("type namespace"), r.string("type name"))


def _insert(r: _Reader, in_stream: bool, proto: int) -> Insert:
    xid = r.xid(in_stream)
    relid = r.u32("relation id")
    marker = r.u8("tuple marker")
    if marker != 78:  # 'N'
        raise r.fail(f"expected 'N' before the new tuple, got {marker!r}", r.pos - 1)
    new, flags = r.tuple("new tuple")
    return Insert(xid, relid, new, flags)


def _update(r: _Reader, in_stream: bool, proto: int) -> Update:
    xid = r.xid(in_stream)
    relid = r.u32("relation id")
    marker = r.u8("tuple marker")
    old_kind: str | None = None
    old: list[TupleValue] | None = None
    old_flags = 0
    if marker == 75 or marker == 79:  # 'K' / 'O'
        old_kind = chr(marker)
        old, old_flags = r.tuple("old tuple")
        marker = r.u8("tuple marker")
    if marker != 78:
        raise r.fail(f"expected 'N' before the new tuple, got {marker!r}", r.pos - 1)
    new, flags = r.tuple("new tuple")
    return Update(xid, relid, old_kind, old, new, flags | (old_flags & HAS_BINARY))


def _delete(r: _Reader, in_stream: bool, proto: int) -> Delete:
    xid = r.xid(in_stream)
    relid = r.u32("relation id")
    marker = r.u8("tuple marker")
    if marker != 75 and marker != 79:
        raise r.fail(f"expected 'K' or 'O' before the old tuple, got {marker!r}", r.pos - 1)
    old, flags = r.tuple("old tuple")
    return Delete(xid, relid, chr(marker), old, flags)


def _truncate(r: _Reader, in_stream: bool, proto: int) -> Truncate:
    xid = r.xid(in_stream)
    n = r.i32("relation count")
    if n < 0:
        raise r.fail(f"negative relation count {n}", r.pos - 4)
    options = r.u8("options")
    p = r.need(4 * n, f"{n} relation ids")
    relids = struct.unpack_from(f">{n}I", r.buf, p)
    return Truncate(xid, options, relids)


def _message(r: _Reader, in_stream: bool, proto: int) -> LogicalMessage:
    xid = r.xid(in_stream)
    flags = r.u8("flags")
    lsn = r.u64("message LSN")
    prefix = r.string("prefix")
    n = r.i32("content length")
    if n < 0:
        raise r.fail(f"negative content length {n}", r.pos - 4)
    p = r.need(n, "content")
    return LogicalMessage(xid, flags, lsn, prefix, bytes(r.buf[p : p + n]))


def _stream_start(r: _Reader, in_stream: bool, proto: int) -> StreamStart:
    xid = r.u32("xid")
    first = r.u8("first segment flag")
    if first > 1:
        raise r.fail(f"first segment flag {first} is neither 0 nor 1", r.pos - 1)
    return StreamStart(xid, bool(first))


def _stream_stop(r: _Reader, in_stream: bool, proto: int) -> StreamStop:
    return StreamStop()


def _stream_commit(r: _Reader, in_stream: bool, proto: int) -> StreamCommit:
    r.need(_STREAM_COMMIT.size, "Stream Commit fields")
    xid, flags, lsn, end, ts = _STREAM_COMMIT.unpack_from(r.buf, 1)
    return StreamCommit(xid, flags, lsn, end, ts)


def _stream_abort(r: _Reader, in_stream: bool, proto: int) -> StreamAbort:
    xid = r.u32("xid")
    subxid = r.u32("subtransaction xid")
    if proto >= 4:
        return StreamAbort(xid, subxid, r.u64("abort LSN"), r.i64("abort timestamp"))
    return StreamAbort(xid, subxid)


_DECODERS: Final[dict[int, Callable[[_Reader, bool, int], Message]]] = {
    66: _begin,
    67: _commit,
    79: _origin,
    82: _relation,
    89: _type,
    73: _insert,
    85: _update,
    68: _delete,
    84: _truncate,
    77: _message,
    83: _stream_start,
    69: _stream_stop,
    99: _stream_commit,
    65: _stream_abort,
}


def decode(buf: bytes, in_stream: bool = False, proto_version: int = 2) -> Message:
    """Decode one pgoutput message. ``in_stream``: the message is inside a stream block (between Stream Start and
    Stream Stop), where data messages carry their transaction's xid."""
    if not buf:
        raise DecodeError("empty pgoutput message", hint="the replication stream is damaged", offset=0)
    kind = buf[0]
    fn = _DECODERS.get(kind)
    if fn is None:
        shown = chr(kind) if 32 < kind < 127 else f"0x{kind:02x}"
        raise DecodeError(
            f"unknown pgoutput message type {shown!r} at byte 0",
            hint="mirrorline asks for protocol version 2 without two-phase; is this pgoutput?",
            offset=0,
        )
    r = _Reader(buf, _NAMES[kind])
    msg = fn(r, in_stream, proto_version)
    r.done()
    return msg


class Decoder:
    """:func:`decode` plus the stream-block state: knows whether data messages carry an xid, and refuses a stream
    sequence that PostgreSQL never sends (a block inside a block, a stop outside one, a commit inside one)."""

    __slots__ = ("in_stream", "proto_version", "stream_xid")

    def __init__(self, proto_version: int = 2) -> None:
        self.proto_version = proto_version
        self.in_stream = False
        self.stream_xid: int | None = None

    def reset(self) -> None:
        """Forget the stream state (a new replication connection starts outside any block)."""
        self.in_stream = False
        self.stream_xid = None

    def decode(self, buf: bytes) -> Message:
        msg = decode(buf, self.in_stream, self.proto_version)
        if self.in_stream:
            if isinstance(msg, StreamStop):
                self.in_stream = False
                self.stream_xid = None
            elif isinstance(msg, Begin | Commit | StreamStart | StreamCommit | StreamAbort):
                raise DecodeError(
                    f"{_NAMES[buf[0]]} inside the stream block of xid {self.stream_xid}",
                    hint="the replication stream is out of order",
                )
        elif isinstance(msg, StreamStart):
            self.in_stream = True
            self.stream_xid = msg.xid
        elif isinstance(msg, StreamStop):
            raise DecodeError("Stream Stop outside a stream block", hint="the replication stream is out of order")
        return msg
