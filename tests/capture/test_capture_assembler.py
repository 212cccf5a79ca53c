"""The assembler, without a server: decoded pgoutput messages -> changes at their positions, keys, unchanged TOAST,
TRUNCATE, schema versions, streamed transactions (spill events), large transactions, skipping what the log has."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from decoder_vectors import REAL, col

from mirrorline.capture.assembler import Assembler
from mirrorline.capture.decoder import (
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
)
from mirrorline.capture.events import (
    Committed,
    Event,
    SkippedTxn,
    SpillAbort,
    SpillBlockEnd,
    SpillChanges,
    SpillCommit,
    TableInfo,
)
from mirrorline.capture.rowbuf import to_changes
from mirrorline.errors import DecodeError, SourceError
from mirrorline.model import Change, Op, TableSchema
from mirrorline.position import Position

TYPES = {23: "integer", 25: "text", 1043: "character varying(20)", 1700: "numeric(10,2)", 17: "bytea"}


class Schemas:
    """record_schema for tests: versions per table, reused for identical columns and key (as the log does)."""

    def __init__(self) -> None:
        self.recorded: list[TableSchema] = []

    def __call__(self, s: TableSchema) -> TableSchema:
        same = [r for r in self.recorded if r.table == s.table]
        for r in same:
            if r.columns == s.columns and r.key == s.key:
                return r
        out = replace(s, version=len(same) + 1)
        self.recorded.append(out)
        return out


def make(tables: dict[str, TableInfo] | None = None, **kw: int) -> tuple[Assembler, Schemas]:
    schemas = Schemas()
    return Assembler(lambda oid, typmod: TYPES.get(oid), schemas, tables, **kw), schemas


def feed(asm: Assembler, *msgs: Message) -> list[Event]:
    out: list[Event] = []
    for m in msgs:
        out.extend(asm.feed(m))
    return out


def taken(asm: Assembler) -> list[Change]:
    t = asm.take()
    return list(to_changes(t)) if t is not None else []


ORDERS = Relation(None, 1, "public", "orders", "d", (col("id", 23, True), col("note", 25), col("amount", 1700)))
FULL = Relation(None, 2, "public", "events", "f", (col("at", 23, True), col("body", 25, True), col("kind", 1043, True)))
TS = 800_000_000_000_000  # pgoutput timestamp (microseconds since 2000-01-01)


def txn(lsn: int, *msgs: Message, xid: int = 500) -> list[Message]:
    return [Begin(lsn, TS, xid), *msgs, Commit(0, lsn, lsn + 48, TS)]


# ------------------------------------------------------------------------------------------------ transactions


def test_positions_timestamps_tables_and_every_op() -> None:
    asm, schemas = make()
    events = feed(
        asm,
        ORDERS,
        *txn(
            0x16B374D848,
            Insert(None, 1, ["1", "first", "1.50"]),
            Update(None, 1, None, None, ["1", "second", "1.50"]),
            Delete(None, 1, "K", ["1", None, None]),
            Truncate(None, 0, (1,)),
        ),
    )
    assert events == [Committed(500, 0x16B374D848, 0x16B374D848 + 48, TS + PG_EPOCH_UNIX_US, 4)]
    changes = taken(asm)
    assert [c.pos for c in changes] == [Position(0x16B374D848, i) for i in range(4)]
    assert {c.commit_ts for c in changes} == {TS + PG_EPOCH_UNIX_US}
    assert {c.xid for c in changes} == {500}
    assert {c.table for c in changes} == {"public.orders"}
    assert [c.op for c in changes] == [Op.INSERT, Op.UPDATE, Op.DELETE, Op.TRUNCATE]
    assert changes[0].new == {"id": "1", "note": "first", "amount": "1.50"} and changes[0].key == ("1",)
    assert changes[1].new == {"id": "1", "note": "second", "amount": "1.50"} and changes[1].old_key is None
    assert changes[2].key == ("1",) and changes[2].new is None
    assert changes[3].key == () and changes[3].new is None
    assert {c.schema_version for c in changes} == {1}
    (s,) = schemas.recorded
    assert s.key == ("id",) and [c.type_name for c in s.columns] == ["integer", "text", "numeric(10,2)"]
    assert asm.take() is None


def test_commit_timestamp_is_unix_microseconds() -> None:
    asm, _ = make()
    # 2024-01-01T00:00:00Z is 1704067200 s after the Unix epoch, 757382400 s after PostgreSQL's
    (ev,) = feed(asm, ORDERS, *txn(100, Insert(None, 1, ["1", "a", "1"])))[-1:]
    assert isinstance(ev, Committed)
    feed(
        asm,
        Begin(200, 757_382_400_000_000, 7),
        Insert(None, 1, ["2", "a", "1"]),
        Commit(0, 200, 248, 757_382_400_000_000),
    )
    assert taken(asm)[-1].commit_ts == 1_704_067_200_000_000


def test_null_and_unchanged_toast_are_different() -> None:
    asm, _ = make()
    feed(asm, ORDERS, *txn(100, Update(None, 1, None, None, ["1", UNCHANGED, None], 1)))
    (c,) = taken(asm)
    assert c.new == {"id": "1", "amount": None}
    assert c.unchanged == frozenset({"note"})


def test_update_that_changes_the_key_carries_old_key() -> None:
    asm, _ = make()
    feed(asm, ORDERS, *txn(100, Update(None, 1, "K", ["1", None, None], ["2", "x", "1.00"])))
    (c,) = taken(asm)
    assert (c.key, c.old_key) == (("2",), ("1",))


def test_old_key_sent_but_unchanged_is_not_a_key_change() -> None:
    asm, _ = make()
    feed(asm, FULL, *txn(100, Update(None, 2, "O", ["1", "b", "k"], ["1", "b2", "k"])))
    (c,) = taken(asm)
    assert c.key == ("1", "b2", "k") and c.old_key == ("1", "b", "k")  # no primary key: every column is the key


def test_replica_identity_full_uses_the_primary_key_found_at_reconcile() -> None:
    tables = {"public.events": TableInfo("public.events", primary_key=("at",))}
    asm, schemas = make(tables)
    feed(
        asm,
        FULL,
        *txn(100, Update(None, 2, "O", ["1", "b", "k"], ["1", "b", "k2"]), Delete(None, 2, "O", ["1", "b", "k2"])),
    )
    up, de = taken(asm)
    assert up.key == ("1",) and up.old_key is None and de.key == ("1",)
    assert schemas.recorded[0].key == ("at",)


def test_replica_identity_full_without_primary_key_is_a_bag_keyed_on_every_column() -> None:
    """Every column identifies a row, text ones included: two rows differing only in a text column
    are two rows."""
    asm, schemas = make()
    feed(asm, FULL, *txn(100, Update(None, 2, "O", ["1", "b", "k"], ["1", "b", "k2"])))
    (c,) = taken(asm)
    assert schemas.recorded[0].key == ("at", "body", "kind") and schemas.recorded[0].bag
    assert c.key == ("1", "b", "k2") and c.old_key == ("1", "b", "k")


def test_unchanged_toast_in_a_bag_tables_update_is_taken_from_the_old_image() -> None:
    asm, _ = make()
    feed(asm, FULL, *txn(100, Update(None, 2, "O", ["1", "long", "k"], ["1", UNCHANGED, "k2"], 1)))
    (c,) = taken(asm)
    assert c.key == ("1", "long", "k2") and c.old_key == ("1", "long", "k") and c.unchanged == {"body"}


def test_configured_key_wins() -> None:
    tables = {"public.orders": TableInfo("public.orders", key=("note",))}
    asm, _ = make(tables)
    feed(asm, ORDERS, *txn(100, Insert(None, 1, ["1", "n", "2"])))
    assert taken(asm)[0].key == ("n",)


def test_configured_key_missing_from_the_relation_is_an_error() -> None:
    asm, _ = make({"public.orders": TableInfo("public.orders", key=("nope",))})
    with pytest.raises(SourceError, match="nope"):
        feed(asm, ORDERS)


def test_tables_not_configured_are_dropped_and_counted() -> None:
    asm, schemas = make({"public.events": TableInfo("public.events")})
    events = feed(asm, ORDERS, FULL, *txn(100, Insert(None, 1, ["1", "a", "1"]), Insert(None, 2, ["1", "b", "k"])))
    assert events[-1] == Committed(500, 100, 148, TS + PG_EPOCH_UNIX_US, 1)
    assert [c.table for c in taken(asm)] == ["public.events"]
    assert asm.dropped == 1
    assert [s.table for s in schemas.recorded] == ["public.events"]


def test_truncate_of_several_tables_is_one_change_each() -> None:
    asm, _ = make()
    feed(asm, ORDERS, FULL, *txn(100, Truncate(None, 1, (2, 1))))
    assert [(c.table, c.op, c.pos.seq) for c in taken(asm)] == [
        ("public.events", Op.TRUNCATE, 0),
        ("public.orders", Op.TRUNCATE, 1),
    ]


def test_column_add_and_drop_give_new_schema_versions() -> None:
    asm, schemas = make()
    wider = replace(ORDERS, columns=(*ORDERS.columns, col("extra", 1043)))
    feed(asm, ORDERS, *txn(100, Insert(None, 1, ["1", "a", "1"])))
    feed(asm, *txn(200, wider, Insert(None, 1, ["2", "a", "1", "x"])))
    feed(asm, *txn(300, ORDERS, Insert(None, 1, ["3", "a", "1"])))
    changes = taken(asm)
    assert [c.schema_version for c in changes] == [1, 2, 1]
    assert changes[1].new == {"id": "2", "note": "a", "amount": "1", "extra": "x"}
    assert [len(s.columns) for s in schemas.recorded] == [3, 4]
    assert schemas.recorded[1].since == Position(200)


def test_type_messages_name_types_the_lookup_does_not_know() -> None:
    asm, schemas = make()
    rel = Relation(None, 3, "public", "e", "d", (col("id", 23, True), col("m", 16385)))
    feed(asm, Type(None, 16385, "public", "mood"), rel)
    assert schemas.recorded[0].columns[1].type_name == "public.mood"


def test_origin_and_messages_are_ignored_and_empty_transactions_commit() -> None:
    asm, _ = make()
    events = feed(asm, *txn(100, Origin(5, "up"), LogicalMessage(None, 1, 90, "p", b"x")))
    assert events == [Committed(500, 100, 148, TS + PG_EPOCH_UNIX_US, 0)]
    assert asm.take() is None


def test_take_leaves_the_open_transaction_in_place() -> None:
    asm, _ = make()
    feed(asm, ORDERS, *txn(100, Insert(None, 1, ["1", "a", "1"])), Begin(200, TS, 9), Insert(None, 1, ["2", "b", "1"]))
    assert asm.in_transaction and asm.buffered == 1
    assert [c.key for c in taken(asm)] == [("1",)]
    feed(asm, Insert(None, 1, ["3", "b", "1"]), Commit(0, 200, 248, TS))
    assert [(c.key, c.pos) for c in taken(asm)] == [(("2",), Position(200, 0)), (("3",), Position(200, 1))]


def test_large_transaction_goes_to_a_spill_in_chunks() -> None:
    asm, _ = make(chunk_changes=3)
    events = feed(asm, ORDERS, *txn(100, *[Insert(None, 1, [str(i), "x", "1"]) for i in range(7)], xid=61))
    assert [type(e) for e in events] == [SpillChanges, SpillChanges, SpillChanges, SpillCommit]
    rows = [c for e in events if isinstance(e, SpillChanges) for c in to_changes(e.rows)]
    assert [c.key for c in rows] == [(str(i),) for i in range(7)]
    assert [c.pos for c in rows] == [Position(100, i) for i in range(7)]
    assert events[-1] == SpillCommit(61, 100, 148, TS + PG_EPOCH_UNIX_US)


def test_transactions_at_or_before_skip_through_are_skipped() -> None:
    asm, _ = make(skip_through=200)
    events = feed(
        asm,
        ORDERS,
        *txn(100, Insert(None, 1, ["1", "a", "1"])),
        *txn(200, Insert(None, 1, ["2", "a", "1"])),
        *txn(300, Insert(None, 1, ["3", "a", "1"])),
    )
    assert [type(e) for e in events] == [SkippedTxn, SkippedTxn, Committed]
    assert [c.key for c in taken(asm)] == [("3",)]


# ------------------------------------------------------------------------------------------------ streams


def test_streamed_transaction_blocks_subtransactions_and_commit() -> None:
    asm, _ = make()
    events = feed(
        asm,
        StreamStart(700, True),
        replace(ORDERS, xid=700),
        Insert(700, 1, ["1", "a", "1"]),
        Insert(700, 1, ["2", "a", "1"]),
        StreamStop(),
        ORDERS,
        *txn(150, Insert(None, 1, ["9", "other", "1"]), xid=650),  # an ordinary one in between
        StreamStart(700, False),
        Insert(701, 1, ["3", "sub", "1"]),
        Insert(701, 1, ["4", "sub", "1"]),
        Insert(700, 1, ["5", "a", "1"]),
        StreamStop(),
        StreamCommit(700, 0, 300, 348, TS),
    )
    kinds = [(type(e).__name__, getattr(e, "subxid", None)) for e in events]
    assert kinds == [
        ("SpillChanges", 700),
        ("SpillBlockEnd", None),
        ("Committed", None),
        ("SpillChanges", 701),
        ("SpillChanges", 700),
        ("SpillBlockEnd", None),
        ("SpillCommit", None),
    ]
    spilled = [c for e in events if isinstance(e, SpillChanges) for c in to_changes(e.rows)]
    assert [c.key for c in spilled] == [("1",), ("2",), ("3",), ("4",), ("5",)]
    assert [c.pos.seq for c in spilled] == [0, 1, 2, 3, 4]  # arrival order; lsn 0 until the commit
    assert {c.pos.lsn for c in spilled} == {0} and {c.xid for c in spilled} == {700}
    assert events[-1] == SpillCommit(700, 300, 348, TS + PG_EPOCH_UNIX_US)
    assert [c.key for c in taken(asm)] == [("9",)]
    assert asm.open_streams == frozenset()


def test_stream_abort_of_a_subtransaction_and_of_the_whole() -> None:
    asm, _ = make()
    events = feed(
        asm, ORDERS, StreamStart(700, True), Insert(701, 1, ["1", "a", "1"]), StreamStop(), StreamAbort(700, 701)
    )
    assert events[-1] == SpillAbort(700, 701)
    assert asm.open_streams == {700}
    events = feed(asm, StreamAbort(700, 700))
    assert events == [SpillAbort(700, 700)] and asm.open_streams == frozenset()


def test_stream_sent_again_from_its_first_segment_discards_the_stale_spill() -> None:
    asm, _ = make()
    feed(asm, ORDERS, StreamStart(700, True), Insert(700, 1, ["1", "a", "1"]), StreamStop())
    events = feed(asm, StreamStart(700, True))
    assert events == [SpillAbort(700, 700)]


def test_stream_relation_applies_inside_its_stream_and_globally_after_commit() -> None:
    asm, _ = make()
    wider = replace(ORDERS, xid=700, columns=(*ORDERS.columns, col("extra", 25)))
    events = feed(
        asm,
        ORDERS,
        StreamStart(700, True),
        wider,
        Insert(700, 1, ["1", "a", "1", "x"]),
        StreamStop(),
        *txn(150, Insert(None, 1, ["2", "a", "1"])),
    )  # concurrent ordinary transaction: old schema
    assert [c.schema_version for c in taken(asm)] == [1]
    spilled = next(e for e in events if isinstance(e, SpillChanges))
    assert [c.schema_version for c in to_changes(spilled.rows)] == [2]
    feed(asm, StreamCommit(700, 0, 300, 348, TS), *txn(400, Insert(None, 1, ["3", "a", "1", "y"])))
    assert [c.schema_version for c in taken(asm)] == [2]


def test_streamed_transaction_already_in_the_log_is_discarded_at_commit() -> None:
    asm, _ = make(skip_through=300)
    events = feed(
        asm,
        ORDERS,
        StreamStart(700, True),
        Insert(700, 1, ["1", "a", "1"]),
        StreamStop(),
        StreamCommit(700, 0, 300, 348, TS),
    )
    assert events[-2:] == [SpillAbort(700, 700), SkippedTxn(700, 300, 348)]


def test_big_stream_block_is_chunked() -> None:
    asm, _ = make(chunk_changes=2)
    events = feed(
        asm, ORDERS, StreamStart(700, True), *[Insert(700, 1, [str(i), "a", "1"]) for i in range(5)], StreamStop()
    )
    assert [type(e) for e in events] == [SpillChanges, SpillChanges, SpillChanges, SpillBlockEnd]
    assert [e.rows.num_rows for e in events if isinstance(e, SpillChanges)] == [2, 2, 1]


def test_reset_drops_open_work_and_aborts_open_spills() -> None:
    asm, _ = make(chunk_changes=2)
    feed(
        asm,
        ORDERS,
        *txn(100, Insert(None, 1, ["1", "a", "1"])),
        StreamStart(700, True),
        Insert(700, 1, ["2", "a", "1"]),
        StreamStop(),
        Begin(200, TS, 9),
        *[Insert(None, 1, ["3", "a", "1"])] * 3,
    )
    events = asm.reset()
    assert events == [SpillAbort(700, 700), SpillAbort(9, 9)]
    assert not asm.in_transaction and asm.open_streams == frozenset() and asm.relations == {}
    assert [c.key for c in taken(asm)] == [("1",)]  # committed before the reset: kept


# ------------------------------------------------------------------------------------------------ protocol errors


@pytest.mark.parametrize(
    ("msgs", "reason"),
    [
        ([Insert(None, 1, ["1", "a", "1"])], "outside a transaction"),
        ([Begin(1, 2, 3), Insert(None, 9, ["1"])], "relation id 9 that no Relation message described"),
        ([Begin(1, 2, 3), Begin(4, 5, 6)], "still open"),
        ([Commit(0, 1, 2, 3)], "without a Begin"),
        ([Begin(1, 2, 3), Commit(0, 5, 6, 3)], "differs from the Begin's final LSN"),
        ([Begin(1, 2, 3), Insert(None, 1, ["1", "a"])], "has 2 columns but its Relation message has 3"),
        ([Begin(1, 2, 3), Insert(None, 1, ["1", b"a", "1"], 2)], "binary-format"),
        ([Begin(1, 2, 3), Insert(None, 1, ["1", UNCHANGED, "1"], 1)], "unchanged TOAST"),
        ([StreamStop()], "Stream Stop outside"),
    ],
)
def test_protocol_errors(msgs: list[Message], reason: str) -> None:
    asm, _ = make()
    feed(asm, ORDERS)
    with pytest.raises(DecodeError, match=reason):
        feed(asm, *msgs)


def test_delete_without_a_key_value_is_an_error_naming_the_table() -> None:
    asm, _ = make()
    with pytest.raises(SourceError, match=r"public\.orders"):
        feed(asm, ORDERS, Begin(1, 2, 3), Delete(None, 1, "O", [UNCHANGED, None, None], 1))


def test_real_postgresql_messages_assemble() -> None:
    """The captured PostgreSQL 15 vectors (ordinary part) through decoder and assembler."""
    d = Decoder()
    asm, _ = make()
    # Begin, Relation, Insert, Update, Update with old key, Delete, Commit
    for i in (0, 1, 2, 4, 5, 6, 3):
        data = bytes.fromhex(REAL[i][0])
        asm.feed(d.decode(data))
    t = asm.take()
    assert isinstance(t, pa.Table)
    changes = list(to_changes(t))
    assert [(c.op, c.key, c.old_key) for c in changes] == [
        (Op.INSERT, ("1",), None),
        (Op.UPDATE, ("1",), None),
        (Op.UPDATE, ("3",), ("2",)),
        (Op.DELETE, ("1",), None),
    ]
