"""The column-wise hot path (``Assembler.feed_bytes`` with :mod:`mirrorline.capture.fastrows`) gives exactly the rows
and events of the reference path (``Assembler.feed(decode(...))``), on generated histories: several tables, default
and FULL replica identity, nulls, unchanged TOAST, key changes, tables not captured, schema changes between rows,
large transactions, takes at random moments, and damaged messages (both paths then raise DecodeError)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from decoder_vectors import col, encode
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorline.capture import batching as batching_module
from mirrorline.capture.batching import BatchAssembler
from mirrorline.capture.decoder import (
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
)
from mirrorline.capture.events import Committed, Event, SpillChanges, TableInfo
from mirrorline.capture.rowbuf import to_changes
from mirrorline.errors import DecodeError
from mirrorline.model import Change, TableSchema

RELS = {
    1: Relation(None, 1, "public", "a", "d", (col("id", 23, True), col("v", 25), col("w", 25))),
    2: Relation(None, 2, "public", "b", "f", (col("k1", 23, True), col("k2", 25, True), col("body", 25, True))),
    3: Relation(None, 3, "other", "skipped", "d", (col("id", 23, True),)),
}
TABLES = {"public.a": TableInfo("public.a"), "public.b": TableInfo("public.b", primary_key=("k1",))}

text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
maybe = st.one_of(st.none(), text)


@st.composite
def row_message(draw: Any, relid: int) -> Message:
    ncols = len(RELS[relid].columns)
    key = draw(st.integers(0, 5)).__str__()
    vals: list[Any] = [key, *[draw(maybe) for _ in range(ncols - 1)]]
    kind = draw(st.sampled_from("IUUD"))
    if kind == "I":
        return Insert(None, relid, vals)
    if kind == "D":
        old = [key] + ([None] * (ncols - 1) if relid != 2 else vals[1:])
        return Delete(None, relid, "K" if relid != 2 else "O", old)
    # updates: maybe an unchanged TOAST column, maybe an old key or old row
    if ncols > 2 and draw(st.booleans()):
        vals[-1] = UNCHANGED
    old_kind = draw(st.sampled_from([None, "K"])) if relid != 2 else "O"
    old = None
    if old_kind == "K":
        old = [draw(st.integers(0, 5)).__str__()] + [None] * (ncols - 1)
    elif old_kind == "O":
        old = [draw(st.integers(0, 5)).__str__(), *vals[1 : ncols - 1], draw(maybe)]
    flags = 1 if UNCHANGED in vals else 0
    return Update(None, relid, old_kind, old, vals, flags)


def in_stream(m: Message, xid: int) -> Message:
    return replace(m, xid=xid)  # type: ignore[type-var]


@st.composite
def stream_block(draw: Any, xid: int, first: bool) -> list[bytes | str]:
    """One block of streamed transaction ``xid``: rows of it and of two subtransactions, maybe a schema change."""
    out: list[bytes | str] = [encode(StreamStart(xid, first))]
    if first and draw(st.booleans()):
        out.append(encode(in_stream(RELS[1], xid)))
    for _ in range(draw(st.integers(0, 12))):
        what = draw(st.integers(0, 30))
        if what == 0:
            out.append(encode(in_stream(Truncate(None, 0, (2,)), xid)))
        elif what == 1:
            wider = replace(RELS[1], xid=xid, columns=(*RELS[1].columns, col("x", 1043)))
            out += [encode(wider), encode(Insert(xid, 1, ["9", "w", None, "x"])), encode(in_stream(RELS[1], xid))]
        else:
            sub = draw(st.sampled_from([xid, xid, xid + 1, xid + 2]))
            out.append(encode(in_stream(draw(row_message(draw(st.sampled_from([1, 1, 2, 3])))), sub)))
    out.append(encode(StreamStop()))
    return out


@st.composite
def history(draw: Any) -> list[bytes | str]:
    """Encoded messages, with "take" markers where the consumer takes committed rows."""
    out: list[bytes | str] = [encode(RELS[r]) for r in (1, 2, 3)]
    lsn = 1000
    streams: dict[int, int] = {}  # open streamed transactions: xid -> blocks sent
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 2)) == 0:  # a block of a streamed transaction, maybe its end
            xid = draw(st.sampled_from([900, 950]))
            out += draw(stream_block(xid, xid not in streams))
            streams[xid] = streams.get(xid, 0) + 1
            end = draw(st.integers(0, 3))
            if end == 0:
                lsn += 10
                out.append(encode(StreamCommit(xid, 0, lsn, lsn + 8, 5_000_000)))
                del streams[xid]
            elif end == 1:
                out.append(encode(StreamAbort(xid, draw(st.sampled_from([xid, xid + 1])))))
                if out[-1] == encode(StreamAbort(xid, xid)):
                    del streams[xid]
        lsn += draw(st.integers(1, 500))
        xid = lsn // 7
        out.append(encode(Begin(lsn, 5_000_000, xid)))
        for _ in range(draw(st.integers(0, 12))):
            what = draw(st.integers(0, 40))
            if what == 0:
                out.append(encode(Truncate(None, 0, (1, 2))))
            elif what == 1:  # schema change: an extra column on table a, then back
                wider = replace(RELS[1], columns=(*RELS[1].columns, col("x", 1043)))
                out.append(encode(wider))
                out.append(encode(Insert(None, 1, ["9", "w", None, "x"])))
                out.append(encode(RELS[1]))
            elif what == 2:
                out.append(encode(LogicalMessage(None, 1, lsn, "p", b"c")))
            elif what == 3:
                out.append("take")
            else:
                out.append(encode(draw(row_message(draw(st.sampled_from([1, 1, 2, 3]))))))
        out.append(encode(Commit(0, lsn, lsn + 40, 5_000_000)))
        if draw(st.booleans()):
            out.append("take")
    return out


class _Msg:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload


def run(
    msgs: list[bytes | str], fast: bool, chunk: int = 1_000_000, pull: int = 0
) -> tuple[list[Event], list[Change], int]:
    """The events and rows of ``msgs`` through the reference path, or the hot path (``fast``): each message's bytes
    to ``feed_bytes``, or with ``pull`` the messages read by ``BatchAssembler.pull`` at most ``pull`` at a time, from
    a reader that runs dry before every third message."""
    recorded: list[TableSchema] = []

    def record(s: TableSchema) -> TableSchema:
        same = [r for r in recorded if r.table == s.table]
        for r in same:
            if r.columns == s.columns and r.key == s.key:
                return r
        recorded.append(replace(s, version=len(same) + 1))
        return recorded[-1]

    asm = BatchAssembler(lambda o, m: "text", record, TABLES, chunk_changes=chunk)
    events: list[Event] = []
    changes: list[Change] = []
    if pull:
        waiting: list[Any] = []
        for i, m in enumerate(msgs):
            waiting += [None] if i % 3 == 2 else []
            waiting.append(m if m == "take" else _Msg(m))  # type: ignore[arg-type]
        waiting.append(None)

        def read() -> Any:
            return waiting.pop(0) if waiting and waiting[0] != "take" else None

        while waiting:
            if waiting[0] == "take":
                waiting.pop(0)
                t = asm.take()
                changes.extend(to_changes(t) if t is not None else [])
                continue
            taken, got, dry = asm.pull(read, pull)
            assert 0 <= taken <= pull and not (got and dry)
            events.extend(got)
            if dry and waiting and waiting[0] is None:
                waiting.pop(0)
        msgs = []
    for m in msgs:
        if m == "take":
            t = asm.take()
            changes.extend(to_changes(t) if t is not None else [])
            continue
        assert isinstance(m, bytes)
        events.extend(asm.feed_bytes(m) if fast else asm.feed(asm.decoder.decode(m)))
    t = asm.take()
    changes.extend(to_changes(t) if t is not None else [])
    spilled = [(e.xid, e.subxid, c) for e in events if isinstance(e, SpillChanges) for c in to_changes(e.rows)]
    return events, changes + spilled, asm.dropped  # type: ignore[operator]


def _normal(events: list[Event]) -> list[Any]:
    """Committed.rows of the hot path counts rows of tables not captured too, and the hot path cuts spilled rows
    into other pieces (the rows themselves are compared apart): compare the rest."""
    return [
        (type(e).__name__, e.xid, getattr(e, "commit_lsn", None)) if isinstance(e, Committed) else e
        for e in events
        if not isinstance(e, SpillChanges)
    ]


@settings(max_examples=60)
@given(history())
def test_hot_path_gives_the_reference_rows_and_events(msgs: list[bytes | str]) -> None:
    ref_events, ref_changes, ref_dropped = run(msgs, fast=False)
    events, changes, dropped = run(msgs, fast=True)
    assert changes == ref_changes
    assert _normal(events) == _normal(ref_events)
    assert dropped == ref_dropped
    committed = [e for e in events if isinstance(e, Committed)]
    ref_committed = [e for e in ref_events if isinstance(e, Committed)]
    assert all(e.rows >= r.rows for e, r in zip(committed, ref_committed, strict=True))


@settings(max_examples=60)
@given(history(), st.integers(1, 7), st.integers(1, 5))
def test_messages_pulled_a_budget_at_a_time_give_the_rows_and_events_of_each_fed_alone(
    msgs: list[bytes | str], budget: int, batch: int
) -> None:
    """``BatchAssembler.pull`` (capture's loop: row messages gathered in a loop of its own) is ``feed_bytes`` of
    each message in turn, whatever its budget, where the reader runs dry, and how few rows make a batch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batching_module, "RAW_ROWS", batch)
        ref_events, ref_changes, ref_dropped = run(msgs, fast=True)
        events, changes, dropped = run(msgs, fast=True, pull=budget)
    assert changes == ref_changes
    assert events == ref_events
    assert dropped == ref_dropped


@settings(max_examples=25)
@given(history(), st.integers(2, 20))
def test_hot_path_chunks_large_transactions_like_the_reference(msgs: list[bytes | str], chunk: int) -> None:
    _, ref_changes, _ = run(msgs, fast=False, chunk=chunk)
    _, changes, _ = run(msgs, fast=True, chunk=chunk)

    def plain(items: list[Any]) -> list[str]:  # where a row went (taken or spilled) may differ: compare rows
        return sorted(repr(c[2] if isinstance(c, tuple) else c) for c in items)

    assert plain(changes) == plain(ref_changes)


@settings(max_examples=60)
@given(history(), st.data())
def test_damaged_row_message_is_the_same_decode_error_on_both_paths(msgs: list[bytes | str], data: Any) -> None:
    rows = [i for i, m in enumerate(msgs) if isinstance(m, bytes) and m[:1] in (b"I", b"U", b"D", b"S", b"R")]
    if not rows:
        return
    i = data.draw(st.sampled_from(rows))
    m = msgs[i]
    assert isinstance(m, bytes)
    cut = data.draw(st.integers(1, len(m) - 1))
    damaged = [*msgs[:i], m[:cut] + data.draw(st.binary(max_size=3)), *msgs[i + 1 :]]
    outcomes = []
    for fast in (False, True):
        try:
            _, changes, _ = run(damaged, fast)
            outcomes.append(("ok", changes))
        except DecodeError as e:
            outcomes.append(("error", str(e)))
    assert outcomes[0] == outcomes[1]


def test_many_small_transactions_are_decoded_together(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = batching_module.decode_rows

    def counting(payloads: Any, *args: Any) -> Any:
        calls.append(len(payloads))
        return real(payloads, *args)

    monkeypatch.setattr(batching_module, "decode_rows", counting)
    msgs: list[bytes | str] = [encode(RELS[1])]
    for t in range(100):
        msgs += [
            encode(Begin(100 + t, 0, t)),
            encode(Insert(None, 1, [str(t), "a", None])),
            encode(Commit(0, 100 + t, 100 + t, 0)),
        ]
    _, changes, _ = run(msgs, fast=True)
    assert calls == [100]
    assert [(c.pos.lsn, c.pos.seq, c.xid) for c in changes] == [(100 + t, 0, t) for t in range(100)]


@pytest.mark.parametrize("ncols", [6, 70])
def test_columns_left_unsent_in_varying_sets_give_each_row_its_own_list(
    monkeypatch: pytest.MonkeyPatch, ncols: int
) -> None:
    """Updates of one transaction leaving different sets of TOASTed columns unsent (none, one, several, all but the
    key), on a table of a few columns and on one of more than 62 (the hot path counts each row's set by another
    means there): each row's list of columns unchanged is the reference path's."""
    rel = Relation(None, 4, "public", "w", "d", (col("id", 23, True), *(col(f"c{i}", 25) for i in range(1, ncols))))
    monkeypatch.setitem(TABLES, "public.w", TableInfo("public.w"))
    msgs: list[bytes | str] = [encode(rel), encode(Begin(2000, 5_000_000, 77))]
    for r in range(40):
        vals: list[Any] = [str(r), *(f"v{r}.{i}" for i in range(1, ncols))]
        for i in range(1, ncols):
            if (r % 4 == 1 and i == ncols - 1) or (r % 4 == 2 and i % 3 == 0) or (r % 4 == 3):
                vals[i] = UNCHANGED
        msgs.append(encode(Update(None, 4, None, None, vals, 1 if UNCHANGED in vals else 0)))
    msgs.append(encode(Commit(0, 2000, 2040, 5_000_000)))
    ref_events, ref_changes, _ = run(msgs, fast=False)
    events, changes, _ = run(msgs, fast=True)
    assert len(changes) == 40
    assert changes == ref_changes
    assert _normal(events) == _normal(ref_events)
    assert {c.unchanged for c in changes} == {
        frozenset(),
        frozenset({f"c{ncols - 1}"}),
        frozenset(f"c{i}" for i in range(1, ncols) if i % 3 == 0),
        frozenset(f"c{i}" for i in range(1, ncols)),
    }


def test_long_values_give_the_reference_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows whose values are long on average (2 kB texts, multibyte characters, a NULL among them: the hot path copies
    them a slice at a time) are the reference path's rows; so are those of short values beside them."""
    rel = Relation(None, 5, "public", "long", "d", (col("id", 23, True), col("body", 25), col("note", 25)))
    monkeypatch.setitem(TABLES, "public.long", TableInfo("public.long"))
    msgs: list[bytes | str] = [encode(rel), encode(Begin(3000, 5_000_000, 78))]
    for r in range(30):
        body = None if r == 7 else ("é€" * (300 + 37 * r) + f"#{r}")
        msgs.append(encode(Insert(None, 5, [str(r), body, "x" * (r % 3)])))
    msgs.append(encode(Commit(0, 3000, 3040, 5_000_000)))
    ref_events, ref_changes, _ = run(msgs, fast=False)
    monkeypatch.setattr(BatchAssembler, "_replay", lambda *a, **k: pytest.fail("the hot path fell back"))
    events, changes, _ = run(msgs, fast=True)
    assert len(changes) == 30
    assert changes == ref_changes
    assert _normal(events) == _normal(ref_events)
    assert changes[3].new["body"] == "é€" * (300 + 37 * 3) + "#3" and changes[7].new["body"] is None


def test_a_long_value_that_is_not_utf8_is_the_reference_paths_error(monkeypatch: pytest.MonkeyPatch) -> None:
    rel = Relation(None, 5, "public", "long", "d", (col("id", 23, True), col("body", 25)))
    monkeypatch.setitem(TABLES, "public.long", TableInfo("public.long"))
    good = encode(Insert(None, 5, ["1", "a" * 3000]))
    assert isinstance(good, bytes)
    bad = good[:-10] + b"\xff" + good[-9:]
    msgs: list[bytes | str] = [encode(rel), encode(Begin(3000, 5_000_000, 78)), good, bad]
    msgs.append(encode(Commit(0, 3000, 3040, 5_000_000)))
    errors = []
    for fast in (False, True):
        with pytest.raises(DecodeError) as e:
            run(msgs, fast=fast)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_a_key_in_another_order_than_the_columns_gives_the_reference_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A composite key whose columns are not in the table's order (its values do not ascend in the messages: the
    hot path copies them by another means) and NULLs, one the last value of the batch: the reference path's rows,
    without falling back to it."""
    rel = Relation(None, 6, "public", "c", "d", (col("k1", 23, True), col("v", 25), col("k2", 25, True)))
    monkeypatch.setitem(TABLES, "public.c", TableInfo("public.c", key=("k2", "k1")))
    msgs: list[bytes | str] = [encode(rel), encode(Begin(4000, 5_000_000, 79))]
    for r in range(20):
        msgs.append(encode(Insert(None, 6, [str(r), None if r % 3 == 0 else f"v{r}", f"k{r % 4}"])))
    msgs.append(encode(Update(None, 6, None, None, [str(5), "moved", "k1"], 0)))
    msgs.append(encode(Delete(None, 6, "K", [str(6), None, "k2"])))
    msgs.append(encode(Insert(None, 6, ["99", None, "k9"])))
    msgs.append(encode(Commit(0, 4000, 4040, 5_000_000)))
    ref_events, ref_changes, _ = run(msgs, fast=False)
    monkeypatch.setattr(BatchAssembler, "_replay", lambda *a, **k: pytest.fail("the hot path fell back"))
    events, changes, _ = run(msgs, fast=True)
    assert len(changes) == 23
    assert changes == ref_changes
    assert _normal(events) == _normal(ref_events)
    assert changes[0].key == ("k0", "0") and changes[21].key == ("k2", "6") and changes[22].new["v"] is None
