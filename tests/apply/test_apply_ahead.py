"""A streamed transaction applied ahead of its commit (:class:`mirrorline.apply.target.Ahead`), on every SQL kind: its
parts' net changes applied in turn inside one target transaction, nothing visible and the position unmoved until
``finish``; abandoned or failed, the target is as it was and free for the usual apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import oracle
import pyarrow as pa
import pytest
from apply_support import ITEMS, KINDS, MODES, SQL_KINDS, P, fetch, net, open_target

from mirrorline.apply.target import NotAhead
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.model import Column, TableSchema

SCHEMAS = {ITEMS.table: ITEMS}
COLS = ["id", "name", "qty", "note"]
OTHER = TableSchema("public.other", (Column("k", "text", nullable=False), Column("v", "integer")), key=("k",))


def part(rows: list[tuple[Any, ...]], start: Any, end: Any) -> NetBatch:
    """Net rows on the driver, as a part compiled ahead comes."""
    cols = list(zip(*rows, strict=True))
    data = {n: list(c) for n, c in zip(NET_ARROW.names, cols, strict=True)}
    data["new"] = [None if v is None else list(v.items()) for v in data["new"]]
    table = pa.table(data, schema=NET_ARROW)
    return NetBatch(start=start, end=end, tables=list(dict.fromkeys(r[0] for r in rows)), rows=table, changes=len(rows))


def seeded(kind: str, request: Any, tmp_path: Path, mode: str = "update") -> Any:
    t = open_target(kind, request, tmp_path, mode)
    rows = [net("public.items", "I", [i], {"id": i, "name": f"n{i}", "qty": i, "note": None}) for i in range(1, 6)]
    t.apply(part(rows, P(0), P(0x100)), SCHEMAS)
    return t


SEEDED = [(i, f"n{i}", i, None) for i in range(1, 6)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", SQL_KINDS)
def test_parts_applied_ahead_become_visible_with_the_position_at_finish(
    kind: str, mode: str, request: Any, tmp_path: Path
) -> None:
    t = seeded(kind, request, tmp_path, mode)
    ahead = t.ahead(P(0x100), 5.0)
    # part 1: an update, a delete, an insert; part 2 changes the row part 1 inserted, and a table new to the target
    ahead.part(
        part(
            [
                net("public.items", "U", [1], {"id": 1, "qty": 10}, unchanged=["name", "note"]),
                net("public.items", "D", [2]),
                net("public.items", "I", [7], {"id": 7, "name": "n7", "qty": 7, "note": "x"}),
            ],
            P(0),
            P(0),
        ),
        SCHEMAS,
    )
    ahead.part(
        part(
            [
                net("public.items", "U", [7], {"id": 7, "name": "m7", "qty": 70, "note": "y"}),
                net("public.items", "D", [3]),
                net("public.other", "I", ["a b"], {"k": "a b", "v": 1}),
            ],
            P(0),
            P(0),
        ),
        {**SCHEMAS, OTHER.table: OTHER},
    )
    assert fetch(t, "public.items", COLS) == SEEDED  # nothing committed yet
    assert t.applied_position() == P(0x100)
    result = ahead.finish(P(0x300, 5))
    assert result.rows["public.items"] == {"D": 2, "U": 2, "I": 1}
    assert fetch(t, "public.items", COLS) == [
        (1, "n1", 10, None),
        (4, "n4", 4, None),
        (5, "n5", 5, None),
        (7, "m7", 70, "y"),
    ]
    assert fetch(t, "public.other", ["k", "v"]) == [("a b", 1)]
    state = t.applied_positions()
    assert state.position == P(0x300, 5)
    assert state.table("public.other") == P(0x300, 5)
    # exactly once: the transaction's unit, formed after its commit, is a no-op now
    assert t.apply(part([net("public.items", "D", [1])], P(0x100), P(0x300, 5)), SCHEMAS).noop


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_an_abandoned_transaction_leaves_the_target_as_it_was_and_free(kind: str, request: Any, tmp_path: Path) -> None:
    t = seeded(kind, request, tmp_path)
    ahead = t.ahead(P(0x100), 5.0)
    ahead.part(
        part([net("public.items", "D", [1]), net("public.other", "I", ["k"], {"k": "k", "v": 2})], P(0), P(0)),
        {**SCHEMAS, OTHER.table: OTHER},
    )
    ahead.abandon()
    assert fetch(t, "public.items", COLS) == SEEDED
    assert oracle.read(kind, t.location, "public.other", ["k", "v"]) is None  # the table made for it went with it
    assert t.applied_position() == P(0x100)
    # the transaction applied after its commit instead, by the usual path (the applier lock was let go)
    t.apply(part([net("public.items", "D", [1])], P(0x100), P(0x200)), SCHEMAS)
    assert fetch(t, "public.items", COLS) == SEEDED[1:]


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_a_part_that_does_not_fit_ends_it_with_nothing_applied(kind: str, request: Any, tmp_path: Path) -> None:
    """What the unit's failure path would look for (here an update of a row the target lacks) is not looked for
    ahead: the transaction is rolled back, to be applied after its commit where that path runs."""
    t = seeded(kind, request, tmp_path)
    ahead = t.ahead(P(0x100), 5.0)
    ahead.part(part([net("public.items", "D", [1])], P(0), P(0)), SCHEMAS)
    with pytest.raises(NotAhead, match="updated 0 rows, expected 1"):
        ahead.part(
            part([net("public.items", "U", [42], {"id": 42, "qty": 1}, unchanged=["name", "note"])], P(0), P(0)),
            SCHEMAS,
        )
    with pytest.raises(NotAhead, match="abandoned"):
        ahead.finish(P(0x200))
    assert fetch(t, "public.items", COLS) == SEEDED
    assert t.applied_position() == P(0x100)
    t.apply(part([net("public.items", "D", [5])], P(0x100), P(0x200)), SCHEMAS)
    assert fetch(t, "public.items", COLS) == SEEDED[:4]


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_a_target_behind_the_log_or_holding_a_table_is_not_applied_ahead(
    kind: str, request: Any, tmp_path: Path
) -> None:
    t = seeded(kind, request, tmp_path)
    with pytest.raises(NotAhead, match="has not applied the log up to"):
        t.ahead(P(0x180), 5.0)
    t.ahead(P(0x80), 5.0).abandon()  # a snapshot left it beyond the log's end: the transaction comes after
    t.hold("public.items", RuntimeError("held for the test"))
    with pytest.raises(NotAhead, match="held"):
        t.ahead(P(0x100), 5.0)
    t.release("public.items")
    t.ahead(P(0x100), 5.0).abandon()


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in SQL_KINDS] or ["delta"])
def test_a_kind_without_long_transactions_applies_after_the_commit(kind: str, request: Any, tmp_path: Path) -> None:
    t = open_target(kind, request, tmp_path)
    assert t.ahead(P(0), 5.0) is None
