"""Decoded pgoutput messages -> :class:`mirrorline.model.Change` objects, transactions and stream-spill events.

Pure: no server, no files. The two things it needs from outside come in as functions: ``type_name(oid, typmod)``
(PostgreSQL's ``format_type`` text, looked up by the caller) and ``record_schema(schema)`` (the log writer assigns the
schema version). :meth:`Assembler.feed` takes one message and returns the events it completes:

- :class:`Committed`: a whole (not streamed, not too large) transaction committed; its changes wait for
  :meth:`Assembler.take`, which returns every committed change gathered so far as one Arrow table in the log layout
  (:data:`mirrorline.log.rows.ARROW_SCHEMA`; :func:`mirrorline.capture.rowbuf.to_changes` gives Change objects).
- :class:`SpillChanges` / :class:`SpillBlockEnd` / :class:`SpillCommit` / :class:`SpillAbort`: the life of a spilled
  transaction: a streamed one (its commit LSN is unknown until Stream Commit, so its changes carry LSN 0 and their
  index in arrival order), or a non-streamed one too large to keep in memory.
- :class:`SkippedTxn`: a transaction whose commit is at or before ``skip_through`` (already durable in the log: on a
  restart PostgreSQL sends again what it was not told was flushed).

Changes: positions ``(commit_lsn, seq)``, ``seq`` the index inside the transaction; ``commit_ts`` in microseconds since
the Unix epoch; ``table`` "schema.name"; ``key`` the key columns' values (configured key, else the Relation's key
flags, else for REPLICA IDENTITY FULL the primary key known from the catalog, else every column: a bag of rows); an
update whose key changed carries ``old_key``; unchanged TOAST columns are absent from ``new`` and named in
``unchanged``; TRUNCATE is one change per table with op T.

This is the reference path, one message at a time. :class:`mirrorline.capture.batching.BatchAssembler` takes message
bytes and decodes row messages column-wise a batch at a time, with the same results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

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
    TupleValue,
    Type,
    Update,
)
from mirrorline.capture.events import (
    Committed,
    Event,
    RelInfo,
    SkippedTxn,
    SpillAbort,
    SpillBlockEnd,
    SpillChanges,
    SpillCommit,
    TableInfo,
)
from mirrorline.capture.rowbuf import RowBuffer, Rows
from mirrorline.errors import DecodeError, SourceError
from mirrorline.model import Column, Key, TableSchema, default_key
from mirrorline.position import Position, format_lsn


@dataclass(slots=True)
class _Stream:
    """A streamed transaction in progress."""

    xid: int
    seq: int = 0
    subxid: int = 0
    pending: RowBuffer = field(default_factory=RowBuffer)
    relations: dict[int, RelInfo] = field(default_factory=dict)


_EMPTY: tuple[Event, ...] = ()


class Assembler:
    """Turns one replication connection's messages into changes and transaction events (see the module doc)."""

    def __init__(
        self,
        type_name: Callable[[int, int], str | None],
        record_schema: Callable[[TableSchema], TableSchema],
        tables: Mapping[str, TableInfo] | None = None,
        *,
        skip_through: int = 0,
        chunk_changes: int = 20_000,
        attributes: Callable[[int], Mapping[str, tuple[int, str | None, bool]]] | None = None,
    ) -> None:
        self.type_name = type_name
        self.attributes = attributes  # relid -> the catalog's column facts (TypeNames.attributes)
        self.oids: Mapping[int, str] = {}  # the configured tables' relids, by the name they were configured under
        self.on_renamed: Callable[[str, str, int], None] | None = None  # (configured name, new name, commit LSN)
        self.record_schema = record_schema
        self.tables = tables  # None: capture every table the publication sends
        self.skip_through = skip_through
        self.chunk_changes = chunk_changes
        self.types: dict[int, str] = {}  # Type messages: oid -> "schema.name"
        self.relations: dict[int, RelInfo] = {}
        self.dropped = 0  # changes of tables that are not configured
        self.decoder = Decoder()  # for callers that hand in bytes (see batching.BatchAssembler)
        self._out = Rows()  # committed transactions not taken yet, then the open transaction's rows
        self._replaying = False  # no chunking (see _chunk)
        self._txn: Begin | None = None
        self._txn_mark = 0  # where the open transaction's rows start in _out
        self._txn_ts = 0
        self._seq = 0  # index of the next change in the open transaction
        self._spilled = False  # the open non-streamed transaction went (partly) to a spill
        self._skipping = False
        self._streams: dict[int, _Stream] = {}
        self._stream: _Stream | None = None  # the stream block we are in
        self._handlers: dict[type, Callable[[Any], Sequence[Event]]] = {
            Insert: self._insert,
            Update: self._update,
            Delete: self._delete,
            Begin: self._begin,
            Commit: self._commit,
            Relation: self._relation,
            Truncate: self._truncate,
            StreamStart: self._stream_start,
            StreamStop: self._stream_stop,
            StreamCommit: self._stream_commit,
            StreamAbort: self._stream_abort,
            Type: self._type,
            Origin: self._ignore,
            LogicalMessage: self._ignore,
        }

    # -------------------------------------------------------------------------------------------- state

    @property
    def in_transaction(self) -> bool:
        """Between Begin and Commit of a non-streamed transaction."""
        return self._txn is not None

    @property
    def open_streams(self) -> frozenset[int]:
        """Streamed transactions started and neither committed nor aborted."""
        return frozenset(self._streams)

    @property
    def buffered(self) -> int:
        """Rows of committed transactions waiting for :meth:`take` (rows of tables not captured may be counted)."""
        return self._txn_mark if self._txn is not None else len(self._out)

    def take(self) -> pa.Table | None:
        """The committed transactions' rows gathered since the last call (log layout, commit order), or None."""
        if self._txn is None:
            return self._out.take()
        if self._txn_mark == 0:
            return None
        rest = self._out.split(self._txn_mark)
        done = self._out.take()
        if rest is not None:
            self._out.append_table(rest)
        self._txn_mark = 0
        return done

    def reset(self) -> list[Event]:
        """A new replication connection: PostgreSQL sends Relation messages and in-progress transactions again.
        Drops the open transaction (committed rows stay for :meth:`take`); returns the aborts of every open spill."""
        events: list[Event] = [SpillAbort(xid, xid) for xid in self._streams]
        if self._txn is not None:
            if self._spilled:
                events.append(SpillAbort(self._txn.xid, self._txn.xid))
            self._out.split(self._txn_mark)
        self.decoder.reset()
        self.relations.clear()
        self._streams.clear()
        self._stream = None
        self._txn = None
        self._spilled = False
        self._skipping = False
        return events

    def _commit_rows(self) -> tuple[list[Event], int]:
        """At a Commit: events to emit first, and how many rows the transaction has (at most)."""
        return [], len(self._out) - self._txn_mark

    def _chunk(self) -> Sequence[Event]:
        """A non-streamed transaction too large to keep in memory goes to a spill, a chunk at a time."""
        if not self._replaying and len(self._out) - self._txn_mark >= self.chunk_changes:
            txn = self._txn
            assert txn is not None
            rows = self._out.split(self._txn_mark)
            assert rows is not None
            self._spilled = True
            return (SpillChanges(txn.xid, txn.xid, rows),)
        return _EMPTY

    def feed(self, msg: Message) -> Sequence[Event]:
        """Take one decoded message; return the events it completes (mostly none)."""
        return self._handlers[type(msg)](msg)

    # -------------------------------------------------------------------------------------------- transactions

    def _ignore(self, msg: Message) -> Sequence[Event]:
        return _EMPTY

    def _type(self, msg: Type) -> Sequence[Event]:
        self.types[msg.type_oid] = f"{msg.namespace or 'pg_catalog'}.{msg.name}"
        return _EMPTY

    def _begin(self, msg: Begin) -> Sequence[Event]:
        if self._txn is not None:
            raise DecodeError(
                f"Begin of xid {msg.xid} while xid {self._txn.xid} is still open",
                hint="the replication stream is out of order",
            )
        self._txn = msg
        self._txn_mark = len(self._out)
        self._txn_ts = msg.commit_ts + PG_EPOCH_UNIX_US
        self._seq = 0
        self._spilled = False
        self._skipping = msg.final_lsn <= self.skip_through
        return _EMPTY

    def _commit(self, msg: Commit) -> Sequence[Event]:
        txn = self._txn
        if txn is None:
            raise DecodeError(
                f"Commit at {format_lsn(msg.commit_lsn)} without a Begin", hint="the replication stream is out of order"
            )
        if msg.commit_lsn != txn.final_lsn:
            raise DecodeError(
                f"Commit LSN {format_lsn(msg.commit_lsn)} differs from the Begin's final LSN "
                f"{format_lsn(txn.final_lsn)} (xid {txn.xid})",
                hint="the replication stream is damaged",
            )
        ts = msg.commit_ts + PG_EPOCH_UNIX_US
        if self._skipping:
            self._txn = None
            self._skipping = False
            return (SkippedTxn(txn.xid, msg.commit_lsn, msg.end_lsn),)
        events, rows = self._commit_rows()
        self._txn = None
        if self._spilled:
            self._spilled = False
            rest = self._out.split(self._txn_mark)
            if rest is not None:
                events.append(SpillChanges(txn.xid, txn.xid, rest))
            events.append(SpillCommit(txn.xid, msg.commit_lsn, msg.end_lsn, ts))
            return events
        events.append(Committed(txn.xid, msg.commit_lsn, msg.end_lsn, ts, rows))
        return events

    def _stream_start(self, msg: StreamStart) -> Sequence[Event]:
        events: Sequence[Event] = _EMPTY
        st = self._streams.get(msg.xid)
        if st is not None and msg.first_segment:  # sent again from its start: what we had is stale
            events = (SpillAbort(msg.xid, msg.xid),)
            st = None
        if st is None:
            st = self._streams[msg.xid] = _Stream(msg.xid, subxid=msg.xid)
        self._stream = st
        return events

    def _stream_stop(self, msg: StreamStop) -> Sequence[Event]:
        st = self._stream
        if st is None:
            raise DecodeError("Stream Stop outside a stream block", hint="the replication stream is out of order")
        self._stream = None
        if len(st.pending):
            rows, st.pending = st.pending, RowBuffer()
            return (SpillChanges(st.xid, st.subxid, rows.to_arrow()), SpillBlockEnd(st.xid))
        return (SpillBlockEnd(st.xid),)

    def _stream_commit(self, msg: StreamCommit) -> Sequence[Event]:
        st = self._streams.pop(msg.xid, None)
        if st is not None:
            self.relations.update(st.relations)
        if msg.commit_lsn <= self.skip_through:
            return (SpillAbort(msg.xid, msg.xid), SkippedTxn(msg.xid, msg.commit_lsn, msg.end_lsn))
        return (SpillCommit(msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_ts + PG_EPOCH_UNIX_US),)

    def _stream_abort(self, msg: StreamAbort) -> Sequence[Event]:
        if msg.subxid == msg.xid:
            self._streams.pop(msg.xid, None)
        return (SpillAbort(msg.xid, msg.subxid),)

    # -------------------------------------------------------------------------------------------- relations

    def _relation(self, msg: Relation) -> Sequence[Event]:
        table = f"{msg.namespace or 'pg_catalog'}.{msg.name}"
        info = self.tables.get(table) if self.tables is not None else TableInfo(table)
        captured = info is not None
        if info is None:
            info = TableInfo(table)
        was = self.oids.get(msg.relid)
        if not captured and was is not None and was != table and self.on_renamed is not None:
            self.on_renamed(was, table, self._txn.final_lsn if self._txn is not None else 0)
        names = tuple(c.name for c in msg.columns)
        facts = self.attributes(msg.relid) if self.attributes is not None and captured else {}
        found = [facts.get(c.name, (0, None, False)) for c in msg.columns]
        nums = infer_attnums([f[0] for f in found])
        columns = tuple(
            Column(
                c.name,
                self._type_text(c.type_oid, c.typmod),
                c.type_oid,
                c.typmod,
                c.name not in info.not_null,
                n,
                *f[1:],
            )
            for c, f, n in zip(msg.columns, found, nums, strict=True)
        )
        flagged = tuple(c.name for c in msg.columns if c.is_key)
        bag = False
        if info.key:
            key = info.key
        elif msg.replica_identity == "f" or not flagged:
            pk = info.primary_key if info.primary_key and all(k in names for k in info.primary_key) else ()
            key = default_key(columns, pk)
            bag = not pk
        else:
            key = flagged
        missing = [k for k in key if k not in names]
        if captured and missing:
            raise SourceError(
                f"key column(s) {', '.join(missing)} of {table} are not in the table as sent by the "
                f"source (columns: {', '.join(names)})",
                hint="fix tables.key in the configuration",
                table=table,
            )
        if captured and not key:
            raise SourceError(
                f"{table} has no usable key: no primary key and no columns",
                hint="add a primary key, or configure tables.key",
                table=table,
            )
        key_idx = tuple(names.index(k) for k in key if k in names)
        version = 0
        if captured:
            since = Position(self._txn.final_lsn if self._txn is not None else 0)
            version = self.record_schema(
                TableSchema(table, columns, key, since=since, bag=bag, relid=msg.relid)
            ).version
        rel = RelInfo(msg.relid, table, version, names, key_idx, captured)
        if self._stream is not None:
            self._stream.relations[msg.relid] = rel
        else:
            self.relations[msg.relid] = rel
        return _EMPTY

    def _type_text(self, oid: int, typmod: int) -> str:
        name = self.type_name(oid, typmod)
        if name:
            return name
        return self.types.get(oid) or f"oid {oid}"

    def set_version(self, relid: int, version: int) -> None:
        """Relation ``relid``'s changes carry schema ``version`` from now on (a version capture recorded without a
        Relation message: capture/partitions.py)."""
        for rels in (self.relations, *(st.relations for st in self._streams.values())):
            rel = rels.get(relid)
            if rel is not None:
                rels[relid] = dataclasses.replace(rel, version=version)

    def forget(self, relid: int) -> None:
        """No change of relation ``relid`` is captured from now on (its table was found renamed or dropped at the
        source), whatever name the last Relation message gave it; rows of it not taken yet are dropped too."""
        for rels in [self.relations, *(st.relations for st in self._streams.values())]:
            rel = rels.get(relid)
            if rel is not None:
                rels[relid] = dataclasses.replace(rel, captured=False)

    def _rel(self, relid: int, what: str) -> RelInfo:
        st = self._stream
        rel = st.relations.get(relid) if st is not None else None
        if rel is None:
            rel = self.relations.get(relid)
            if rel is None:
                raise DecodeError(
                    f"{what} for relation id {relid} that no Relation message described",
                    hint="the replication stream is damaged or out of order",
                    relid=relid,
                )
        return rel

    # -------------------------------------------------------------------------------------------- changes

    def _target(self, what: str) -> tuple[RowBuffer, int, int, int, int] | None:
        """(buffer, commit_lsn, seq, commit_ts, xid) for the next change; None when it is to be skipped."""
        st = self._stream
        if st is not None:
            return st.pending, 0, st.seq, 0, st.xid
        txn = self._txn
        if txn is None:
            raise DecodeError(f"{what} outside a transaction", hint="the replication stream is out of order")
        if self._skipping:
            return None
        return self._out.buffer, txn.final_lsn, self._seq, self._txn_ts, txn.xid

    def _added(self, subxid: int | None) -> Sequence[Event]:
        """After one change was added: keep spills and chunks in step."""
        st = self._stream
        if st is None:
            self._seq += 1
            return self._chunk()
        st.seq += 1
        sub = subxid if subxid is not None else st.xid
        if sub != st.subxid:
            # the change just added belongs to `sub`; what came before it to the previous subtransaction
            prev = st.pending
            last = prev.cut((len(prev) - 1, prev.flat - _new_width(prev)))
            st.pending = last
            before = st.subxid
            st.subxid = sub
            if len(prev):
                return (SpillChanges(st.xid, before, prev.to_arrow()),)
            return _EMPTY
        if len(st.pending) >= self.chunk_changes:
            rows, st.pending = st.pending, RowBuffer()
            return (SpillChanges(st.xid, st.subxid, rows.to_arrow()),)
        return _EMPTY

    def _insert(self, msg: Insert) -> Sequence[Event]:
        rel = self._rel(msg.relid, "Insert")
        t = self._target("Insert")
        if t is None or not rel.captured:
            self.dropped += not rel.captured
            return _EMPTY
        buf, lsn, seq, ts, xid = t
        vals = msg.new
        if len(vals) != len(rel.names) or msg.flags:
            self._check(rel, vals, msg.flags, "Insert", lsn, seq, unchanged_ok=False)
        key = tuple([vals[i] for i in rel.key_idx])
        buf.add(lsn, seq, ts, xid, rel.table, "I", key, None, rel.names, vals, (), rel.version)  # type: ignore[arg-type]
        return self._added(msg.xid)

    def _update(self, msg: Update) -> Sequence[Event]:
        rel = self._rel(msg.relid, "Update")
        t = self._target("Update")
        if t is None or not rel.captured:
            self.dropped += not rel.captured
            return _EMPTY
        buf, lsn, seq, ts, xid = t
        vals = msg.new
        names: Sequence[str] = rel.names
        old = msg.old
        if len(vals) != len(names) or msg.flags & HAS_BINARY:
            self._check(rel, vals, msg.flags, "Update", lsn, seq, unchanged_ok=True)
        if old is not None and len(old) != len(names):
            self._check(rel, old, 0, "Update old tuple", lsn, seq, unchanged_ok=True)
        unchanged: tuple[str, ...] = ()
        if msg.flags & HAS_UNCHANGED:
            key = self._key_with_fallback(rel, vals, old, lsn, seq)
            unchanged = tuple(sorted(n for n, v in zip(names, vals, strict=True) if v is UNCHANGED))
            kept = [(n, v) for n, v in zip(names, vals, strict=True) if v is not UNCHANGED]
            names = [n for n, _ in kept]
            vals = [v for _, v in kept]
        else:
            key = tuple([vals[i] for i in rel.key_idx])  # type: ignore[misc]
        old_key: Key | None = None
        if old is not None:
            ok = tuple([old[i] if old[i] is not UNCHANGED else key[j] for j, i in enumerate(rel.key_idx)])
            if ok != key:
                old_key = ok  # type: ignore[assignment]
        buf.add(
            lsn,
            seq,
            ts,
            xid,
            rel.table,
            "U",
            key,
            old_key,
            names,
            vals,  # type: ignore[arg-type]
            unchanged,
            rel.version,
        )
        return self._added(msg.xid)

    def _delete(self, msg: Delete) -> Sequence[Event]:
        rel = self._rel(msg.relid, "Delete")
        t = self._target("Delete")
        if t is None or not rel.captured:
            self.dropped += not rel.captured
            return _EMPTY
        buf, lsn, seq, ts, xid = t
        old = msg.old
        if len(old) != len(rel.names) or msg.flags & HAS_BINARY:
            self._check(rel, old, msg.flags, "Delete", lsn, seq, unchanged_ok=True)
        key = tuple([old[i] for i in rel.key_idx])
        if msg.flags & HAS_UNCHANGED and UNCHANGED in key:
            raise self._unknown_key(rel, "Delete", lsn, seq)
        buf.add(lsn, seq, ts, xid, rel.table, "D", key, None, None, None, (), rel.version)  # type: ignore[arg-type]
        return self._added(msg.xid)

    def _truncate(self, msg: Truncate) -> Sequence[Event]:
        events: list[Event] = []
        for relid in msg.relids:
            rel = self._rel(relid, "Truncate")
            t = self._target("Truncate")
            if t is None or not rel.captured:
                self.dropped += not rel.captured
                continue
            buf, lsn, seq, ts, xid = t
            buf.add(lsn, seq, ts, xid, rel.table, "T", (), None, None, None, (), rel.version)
            events.extend(self._added(msg.xid))
        return events

    def _check(
        self, rel: RelInfo, vals: list[TupleValue], flags: int, what: str, lsn: int, seq: int, unchanged_ok: bool
    ) -> None:
        where = {"table": rel.table, "position": str(Position(lsn, seq))}
        if len(vals) != len(rel.names):
            raise DecodeError(
                f"{what} on {rel.table} has {len(vals)} columns but its Relation message has {len(rel.names)}",
                hint="the replication stream is damaged",
                **where,
            )
        if flags & HAS_BINARY:
            raise DecodeError(
                f"{what} on {rel.table} carries binary-format values, which mirrorline does not ask for",
                hint="the replication stream is not what mirrorline asked for",
                **where,
            )
        if flags & HAS_UNCHANGED and not unchanged_ok:
            raise DecodeError(
                f"{what} on {rel.table} marks a column as an unchanged TOAST value",
                hint="the replication stream is damaged",
                **where,
            )

    def _key_with_fallback(
        self, rel: RelInfo, vals: list[TupleValue], old: list[TupleValue] | None, lsn: int, seq: int
    ) -> Key:
        key = []
        for i in rel.key_idx:
            v = vals[i]
            if v is UNCHANGED:
                if old is None or old[i] is UNCHANGED:
                    raise self._unknown_key(rel, "Update", lsn, seq)
                v = old[i]
            key.append(v)
        return tuple(key)  # type: ignore[arg-type]

    def _unknown_key(self, rel: RelInfo, what: str, lsn: int, seq: int) -> SourceError:
        return SourceError(
            f"{what} on {rel.table} did not send the value of a key column (an unchanged TOASTed value)",
            hint="configure a key without large values for this table (tables.key)",
            table=rel.table,
            position=str(Position(lsn, seq)),
        )


def _new_width(buf: RowBuffer) -> int:
    """Flat new-image entries of the buffer's last row."""
    return max(buf.new_len[-1], 0) if len(buf) else 0


def infer_attnums(nums: Sequence[int]) -> list[int]:
    """A Relation message's columns come in attnum order. A column the catalog no longer names as it was (renamed
    since, as capture may read the WAL late) has attnum 0 here; it gets the attnum its neighbours leave for it when
    they leave exactly as many as there are such columns between them (else 0: unknown)."""
    out = list(nums)
    i = 0
    while i < len(out):
        if out[i]:
            i += 1
            continue
        j = i
        while j < len(out) and not out[j]:
            j += 1
        before = out[i - 1] if i > 0 else 0
        if j < len(out) and out[j] - before - 1 == j - i:
            out[i:j] = range(before + 1, out[j])
        i = j
    return out
