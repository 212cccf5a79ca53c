"""The assembler fed with message bytes as they arrive: row messages are gathered and decoded column-wise a batch at a
time (:mod:`mirrorline.capture.fastrows`), across small transactions and inside stream blocks. Capture's hot path.

Everything else (and any batch the column-wise decoder does not take) goes through the reference path of
:class:`mirrorline.capture.assembler.Assembler`, message by message; both give the same rows and events (tested).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mirrorline.capture.assembler import _EMPTY, Assembler, _Stream
from mirrorline.capture.decoder import (
    PG_EPOCH_UNIX_US,
    Begin,
    Delete,
    Insert,
    Message,
    Relation,
    StreamCommit,
    StreamStop,
    Truncate,
    Update,
    decode,
)
from mirrorline.capture.events import Event, SpillChanges, TableInfo
from mirrorline.capture.fastrows import Fallback, Segment, decode_rows
from mirrorline.capture.rowbuf import RowBuffer
from mirrorline.model import TableSchema

_AFTER_RAW = frozenset({Relation, Insert, Update, Delete, Truncate, StreamCommit})  # wait for gathered rows
_AFTER_BLOCK_RAW = frozenset({Relation, Insert, Update, Delete, Truncate, StreamStop})
RAW_ROWS = 8192  # row messages decoded column-wise together
RAW_BYTES = 4 << 20  # ... or this many bytes of them


class BatchAssembler(Assembler):
    """:class:`Assembler` plus :meth:`feed_bytes`: the same events and rows, decoded a batch at a time."""

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
        super().__init__(
            type_name,
            record_schema,
            tables,
            skip_through=skip_through,
            chunk_changes=chunk_changes,
            attributes=attributes,
        )
        # row messages of ordinary transactions not decoded yet: committed transactions' first, then the open one's
        self._raw: list[bytes] = []
        self._raw_bytes = 0
        self._raw_segs: list[Segment] = []  # each transaction's run in _raw
        self._raw_committed = 0  # how many of _raw belong to committed transactions
        self._raw_open = False  # the last run belongs to the open transaction
        self._block_raw: list[bytes] = []  # row messages of the current stream block not decoded yet
        self._block_bytes = 0

    @property
    def buffered(self) -> int:
        """Rows of committed transactions waiting for :meth:`take` (rows of tables not captured may be counted)."""
        return super().buffered + self._raw_committed

    def take(self) -> pa.Table | None:
        if self._raw_committed:
            self._flush_raw(chunking=False)
        return super().take()

    def reset(self) -> list[Event]:
        self._block_raw, self._block_bytes = [], 0
        if self._raw:
            self._flush_raw(chunking=False)
        return super().reset()

    def _commit_rows(self) -> tuple[list[Event], int]:
        events: list[Event] = []
        if self._spilled and self._raw:
            events.extend(self._flush_raw())
        pending = len(self._raw) - self._raw_segs[-1][0] if self._raw_open else 0
        self._raw_open = False
        self._raw_committed = len(self._raw)
        return events, len(self._out) - self._txn_mark + pending

    def feed(self, msg: Message) -> Sequence[Event]:
        """Take one decoded message; return the events it completes (mostly none)."""
        st = self._stream
        if st is not None and self._block_raw and type(msg) in _AFTER_BLOCK_RAW:
            events = self._flush_block(st)
            more = self.feed(msg)
            return [*events, *more] if events else more
        if self._raw and type(msg) in _AFTER_RAW:
            events = self._flush_raw()
            more = self._handlers[type(msg)](msg)
            return [*events, *more] if events else more
        return self._handlers[type(msg)](msg)

    def feed_bytes(self, data: bytes) -> Sequence[Event]:
        """Take one message as sent (the payload of an XLogData): the same as ``feed(decoder.decode(data))``, but
        row messages of ordinary transactions are gathered and decoded a batch at a time, column-wise."""
        k = data[0] if data else 0
        txn = self._txn
        if (k == 73 or k == 85 or k == 68) and self.decoder.in_stream:
            st = self._stream
            if st is not None:
                self._block_raw.append(data)
                self._block_bytes += len(data)
                if len(self._block_raw) >= RAW_ROWS or self._block_bytes >= RAW_BYTES:
                    return self._flush_block(st)
                return _EMPTY
        elif (k == 73 or k == 85 or k == 68) and txn is not None:
            if self._skipping:
                return _EMPTY
            raw = self._raw
            if not self._raw_open:
                self._raw_segs.append((len(raw), txn.final_lsn, self._txn_ts, txn.xid, self._seq))
                self._raw_open = True
            raw.append(data)
            self._raw_bytes += len(data)
            if len(raw) >= RAW_ROWS or self._raw_bytes >= RAW_BYTES:
                events = self._flush_raw()
                return [*events, *self._chunk()] if events else self._chunk()
            return _EMPTY
        return self.feed(self.decoder.decode(data))

    def pull(self, read: Callable[[], Any], budget: int) -> tuple[int, Sequence[Event], bool]:
        """Take up to ``budget`` messages from ``read`` (a replication cursor's ``read_message``: each with its bytes
        in ``payload``, None when nothing is waiting): the same as :meth:`feed_bytes` of each payload in turn, with
        the row messages of a stream block or of a transaction gathered in a loop of their own, which is capture's
        hottest (``./dev bench capture --shape delete --profile``). Returns how many messages it took, the events the
        last of them completed (it stops after a message that completes any, so that they are handled in order),
        and whether ``read`` ran dry."""
        n = 0
        feed_bytes = self.feed_bytes
        while n < budget:
            st = self._stream
            if st is not None and self.decoder.in_stream:
                taken, events, dry = self._pull_block(read, budget - n, st)
            elif self._txn is not None and not self._skipping and not self.decoder.in_stream:
                taken, events, dry = self._pull_txn(read, budget - n)
            else:
                msg = read()
                if msg is None:
                    return n, _EMPTY, True
                taken, events, dry = 1, feed_bytes(msg.payload), False
            n += taken
            if events or dry:
                return n, events, dry
        return n, _EMPTY, False

    def _pull_block(self, read: Callable[[], Any], budget: int, st: _Stream) -> tuple[int, Sequence[Event], bool]:
        """:meth:`pull` inside a stream block, until a message that is not a row (which it feeds, and returns)."""
        raw, size, n, dry = self._block_raw, self._block_bytes, 0, False
        while n < budget:
            msg = read()
            if msg is None:
                dry = True
                break
            n += 1
            data = msg.payload
            k = data[0]
            if k == 73 or k == 85 or k == 68:
                raw.append(data)
                size += len(data)
                if len(raw) >= RAW_ROWS or size >= RAW_BYTES:
                    self._block_bytes = size
                    return n, self._flush_block(st), False
                continue
            self._block_bytes = size
            return n, self.feed(self.decoder.decode(data)), False
        self._block_bytes = size
        return n, _EMPTY, dry

    def _pull_txn(self, read: Callable[[], Any], budget: int) -> tuple[int, Sequence[Event], bool]:
        """:meth:`pull` inside an ordinary transaction, until a message that is not a row (fed, and returned)."""
        raw, n = self._raw, 0
        while n < budget:
            msg = read()
            if msg is None:
                return n, _EMPTY, True
            n += 1
            data = msg.payload
            k = data[0]
            if k == 73 or k == 85 or k == 68:
                if not self._raw_open:
                    txn = self._txn
                    assert txn is not None
                    self._raw_segs.append((len(raw), txn.final_lsn, self._txn_ts, txn.xid, self._seq))
                    self._raw_open = True
                raw.append(data)
                self._raw_bytes += len(data)
                if len(raw) >= RAW_ROWS or self._raw_bytes >= RAW_BYTES:
                    events = self._flush_raw()
                    return n, ([*events, *self._chunk()] if events else self._chunk()), False
                continue
            return n, self.feed(self.decoder.decode(data)), False
        return n, _EMPTY, False

    def _flush_raw(self, chunking: bool = True) -> Sequence[Event]:
        """Decode the gathered row messages into rows (column-wise; the reference path if need be). Events come only
        from the reference path (a large transaction's chunk)."""
        raw, segs, open_run = self._raw, self._raw_segs, self._raw_open
        had_committed = len(segs) > 1 or not open_run
        self._raw, self._raw_segs, self._raw_bytes, self._raw_committed, self._raw_open = [], [], 0, 0, False
        if not raw:
            return _EMPTY
        try:
            rows, kept, _ = decode_rows(raw, self.relations, segs)
        except Fallback:
            return self._replay(raw, segs, open_run, chunking)
        self.dropped += len(raw) - sum(kept)
        if not open_run:
            self._out.append_table(rows)
            if self._txn is not None:
                self._txn_mark = len(self._out)
            return _EMPTY
        mine = kept[-1]
        self._out.append_table(rows.slice(0, rows.num_rows - mine))
        if had_committed:
            self._txn_mark = len(self._out)
        self._out.append_table(rows.slice(rows.num_rows - mine))
        self._seq = segs[-1][4] + mine
        return _EMPTY

    def _replay(self, raw: list[bytes], segs: list[Segment], open_run: bool, chunking: bool) -> Sequence[Event]:
        """The reference path for a batch: each transaction's messages through the per-message handlers."""
        saved = (self._txn, self._txn_ts, self._skipping)
        seq = self._seq
        stream, self._stream = self._stream, None  # these rows belong to ordinary transactions
        events: list[Event] = []
        bounds = [sg[0] for sg in segs] + [len(raw)]
        try:
            for i, (first, lsn, ts, xid, seq0) in enumerate(segs):
                mine = open_run and i == len(segs) - 1
                if mine:
                    self._txn, self._txn_ts, self._skipping = saved
                    if i:
                        self._txn_mark = len(self._out)
                    self._replaying = not chunking
                else:
                    self._txn, self._txn_ts, self._skipping = Begin(lsn, ts - PG_EPOCH_UNIX_US, xid), ts, False
                    self._replaying = True
                self._seq = seq0
                for data in raw[first : bounds[i + 1]]:
                    m = decode(data, False)
                    events.extend(self._handlers[type(m)](m))
                self._replaying = False
                if mine:
                    seq = self._seq
        finally:
            self._replaying = False
            self._txn, self._txn_ts, self._skipping = saved
            self._seq = seq
            self._stream = stream
        if not open_run and self._txn is not None:
            self._txn_mark = len(self._out)
        return events

    def _flush_block(self, st: _Stream) -> Sequence[Event]:
        """Decode a stream block's gathered row messages; one spill event per run of one subtransaction."""
        raw, self._block_raw, self._block_bytes = self._block_raw, [], 0
        rels = {**self.relations, **st.relations} if st.relations else self.relations
        try:
            rows, _, subxids = decode_rows(raw, rels, [(0, 0, 0, st.xid, st.seq)], in_stream=True)
        except Fallback:  # the reference path
            events: list[Event] = []
            for data in raw:
                m = decode(data, True)
                events.extend(self._handlers[type(m)](m))
            return events
        n = rows.num_rows
        events = []
        if len(st.pending):
            events.append(SpillChanges(st.xid, st.subxid, st.pending.to_arrow()))
            st.pending = RowBuffer()
        if n:
            cuts = [0, *(np.flatnonzero(subxids[1:] != subxids[:-1]) + 1).tolist(), n]
            for a, b in itertools.pairwise(cuts):
                st.subxid = int(subxids[a])
                events.append(SpillChanges(st.xid, st.subxid, rows.slice(a, b - a)))
            st.seq += n
        return events
