"""The plain-Python reference of the net-change rules (mirrorline.compile.reference): the seeds' worked examples, one
named test per rule and edge case (tests/support/compile_cases.py), and the invariant on generated histories."""

from __future__ import annotations

import pytest
from compile_cases import CASES, Case, pos, render, unit
from compile_histories import histories, invalid_histories, normalized
from hypothesis import given, settings

from mirrorline.compile.reference import apply_net, fold, mirror, replay
from mirrorline.errors import InvalidSequenceError
from mirrorline.model import Change, Op
from mirrorline.position import Position


def run(case: Case) -> list[str]:
    return render(fold(case.changes(), case.actions or None))


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.error is None])
def test_rule(name: str) -> None:
    case = CASES[name]
    assert run(case) == case.expected


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.error is not None])
def test_invalid(name: str) -> None:
    case = CASES[name]
    assert case.error is not None
    first_op, first_line, second_op, second_line, key, table = case.error
    with pytest.raises(InvalidSequenceError) as e:
        run(case)
    assert (e.value.table, e.value.key) == (table, key)
    assert e.value.context["first_op"] == first_op and e.value.first_pos == pos(first_line)
    assert e.value.context["second_op"] == second_op and e.value.second_pos == pos(second_line)
    assert str(pos(second_line)) in str(e.value) and table in str(e.value)


def test_seed000_example1_six_ops_compile_to_the_last_insert() -> None:
    result = fold(CASES["seed000_example1"].changes())
    assert result.operations() == [("public.t", "I", ("1",), {"k": "1", "c": "13"})]


def test_seed000_example2_three_updates_compile_to_the_last_update() -> None:
    result = fold(CASES["seed000_example2"].changes())
    assert result.operations() == [("public.t", "U", ("1",), {"k": "1", "c": "16"})]


def test_seed003_mirror_apply_matches_the_document() -> None:
    """003's target-side statements, in order: per table all deletes, then all inserts; tables in first-seen order;
    the update of keycolval3 applied as a delete and an insert (the mirror form)."""
    result = mirror(fold(CASES["seed003_net_effect"].changes()))
    ops = [(t.removeprefix("public."), kind, key[0] if key else None) for t, kind, key, _ in result.operations()]
    assert ops == [
        ("TABLE1", "D", "2"), ("TABLE1", "D", "3"),
        ("TABLE1", "I", "1"), ("TABLE1", "I", "3"), ("TABLE1", "I", "4"),
        ("TABLE2", "D", "1"), ("TABLE2", "I", "1"), ("TABLE2", "I", "2"),
        ("TABLE3", "I", "1"), ("TABLE3", "I", "2"),
    ]  # fmt: skip
    images = {(t, key): img for t, kind, key, img in result.operations() if kind == "I"}
    assert images[("public.TABLE1", ("3",))] == {"k": "3", "othercol": "othercolval3"}


def test_net_rows_carry_the_position_of_their_last_change() -> None:
    result = fold(unit("I 1 c=1", "U 1 c=2", "U 2 c=1", "D 3", "U 2 c=2", "U 4 c=1", "D 4"))
    net = result.nets["public.t"]
    assert net.inserts[("1",)].pos == pos(2)
    assert net.updates[("2",)].pos == pos(5)
    assert net.deletes[("3",)].pos == pos(4)
    assert net.deletes[("4",)].pos == pos(7)


def test_replace_delete_carries_the_position_of_the_delete() -> None:
    net = fold(unit("U 1 c=1", "D 1", "I 1 c=2", "U 1 c=3")).nets["public.t"]
    assert net.deletes[("1",)].pos == pos(2) and net.inserts[("1",)].pos == pos(4)
    # without D in the actions the I itself replaced the row
    net = fold(unit("U 1 c=1", "I 1 c=2", "U 1 c=3"), {"public.t": "IU"}).nets["public.t"]
    assert net.deletes[("1",)].pos == pos(2) and net.inserts[("1",)].pos == pos(3)


def test_truncate_position_is_the_last_truncate() -> None:
    result = fold(unit("T", "I 1 c=1", "T"))
    assert result.truncated == {"public.t": pos(3)}


def test_input_out_of_order_is_folded_in_position_order() -> None:
    changes = unit("I 1 c=1", "U 1 c=2", "D 1", "I 1 c=3")
    assert render(fold(list(reversed(changes)))) == ["t: I 1 c=3"]


def test_positions_order_by_lsn_then_sequence() -> None:
    changes = [
        Change(Position(5, 1), 0, 1, "public.t", Op.UPDATE, ("1",), {"k": "1", "c": "late"}),
        Change(Position(5, 0), 0, 1, "public.t", Op.UPDATE, ("1",), {"k": "1", "c": "early"}),
        Change(Position(4, 9), 0, 1, "public.t", Op.UPDATE, ("1",), {"k": "1", "c": "earliest"}),
    ]
    assert render(fold(changes)) == ["t: U 1 c=late"]


def test_column_both_sent_and_marked_counts_as_sent() -> None:
    c = Change(Position(1, 0), 0, 1, "public.t", Op.UPDATE, ("1",), {"k": "1", "d": "sent"}, frozenset({"d"}))
    assert render(fold([c])) == ["t: U 1 d=sent"]


def test_replay_and_apply_net_agree_on_a_seed() -> None:
    state = {"public.t": {("1",): {"k": "1", "c": "9"}}}
    changes = CASES["seed000_example1"].changes()
    with pytest.raises(InvalidSequenceError):  # the example inserts k = 1, so it must be absent before
        replay(state, changes)
    assert replay({}, changes) == apply_net({}, fold(changes)) == {"public.t": {("1",): {"k": "1", "c": "13"}}}


def test_apply_net_refuses_a_duplicate_insert() -> None:
    with pytest.raises(KeyError):
        apply_net({"public.t": {("1",): {"k": "1"}}}, fold(unit("I 1 c=1")))


@settings(max_examples=2000)
@given(histories())
def test_invariant_apply_net_equals_replay(h) -> None:
    expected = replay(h.state, h.changes)
    assert normalized(apply_net(h.state, fold(h.changes))) == normalized(expected)


@settings(max_examples=800)
@given(histories(with_actions=True))
def test_invariant_with_actions(h) -> None:
    expected = replay(h.before, h.changes, h.actions)
    assert normalized(apply_net(h.before, fold(h.changes, h.actions))) == normalized(expected)


@settings(max_examples=500)
@given(invalid_histories())
def test_invalid_histories_raise_naming_both_positions(inj) -> None:
    with pytest.raises(InvalidSequenceError) as e:
        fold(inj.history.changes)
    assert (e.value.table, e.value.key) == (inj.table, inj.key)
    assert (e.value.context["first_op"], e.value.first_pos) == inj.first
    assert (e.value.context["second_op"], e.value.second_pos) == inj.second


def test_apply_net_takes_unchanged_columns_from_the_row_at_moved_from() -> None:
    state = {"public.t": {("1",): {"k": "1", "c": "0", "d": "toast"}}}
    changes = unit("U 1>2 c=1 ~d", "U 2>3 c=2 ~d")
    want = {"public.t": {("3",): {"k": "3", "c": "2", "d": "toast"}}}
    assert apply_net(state, fold(changes)) == replay(state, changes) == want
    with pytest.raises(KeyError, match="no row"):  # the source row is missing: an error, never a NULL
        apply_net({"public.t": {}}, fold(changes))


def test_mirror_update_with_unchanged_columns_inserts_from_its_own_key() -> None:
    result = mirror(fold(unit("U 1 c=1 ~d")))
    assert render(result) == ["t: D 1", "t: I 1 c=1 ~d <1"]
    state = {"public.t": {("1",): {"k": "1", "c": "0", "d": "x"}}}
    assert apply_net(state, result) == {"public.t": {("1",): {"k": "1", "c": "1", "d": "x"}}}


def test_generated_histories_hold_key_changes_with_unchanged_columns() -> None:
    """The generator really exercises the case: key changes not sending b, resolved in the unit or from the target."""
    from compile_histories import random_histories

    rows = [r for h in random_histories(7, 300) for r in fold(h.changes).rows() if r[1] == "I"]
    assert any(r[6] is not None for r in rows)  # still marked: moved_from names the source key
    hs = [h for h in random_histories(7, 300) if any(c.old_key and c.unchanged for c in h.changes)]
    assert len(hs) > 30
