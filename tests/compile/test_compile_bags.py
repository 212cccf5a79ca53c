"""Tables without a key are bags of rows (DESIGN §5): duplicates allowed, a delete removes one copy, an
update changes one copy, and the net change per distinct image is a count. The reference fold states the rule; the
Spark compile (general path, small path, inserts-only path) must give the same, on named cases and on generated
histories checked against a replay of the changes one by one on a multiset."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from compile_support import changes_frame, collect_result, find_invalid

from mirrorline.compile.reference import NetResult, fold
from mirrorline.compile.small import SmallUnits, qualifies
from mirrorline.compile.spark import compile_changes
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.rows import changes_to_table
from mirrorline.log.stats import table_stats
from mirrorline.model import Change, Key, Op
from mirrorline.position import ZERO, Position

T = "public.hist"
COLS = ("a", "note")
BAGS = {T: COLS}
Bag = Counter[Key]


def bag_change(i: int, op: Op, key: Key = (), old: Key | None = None, table: str = T) -> Change:
    new = dict(zip(COLS, key, strict=True)) if op in (Op.INSERT, Op.UPDATE) else None
    return Change(Position(100 + i, 0), 0, 1, table, op, key, new, frozenset(), old)


def net_counts(result: NetResult, table: str = T) -> dict[str, dict[Key, int]]:
    net = result.nets[table]
    return {k: {key: r.count for key, r in net.of(k).items()} for k in "DI" if net.of(k)}


def apply_bag(state: Bag, result: NetResult, table: str = T) -> Bag:
    """A set-based apply of a bag table's net rows: TRUNCATE, then per image delete ``count`` copies (fewer are
    an error), then insert ``count`` copies."""
    out = Counter() if table in result.truncated else Counter(state)
    net = result.nets.get(table)
    if net is None:
        return out
    for key, r in net.deletes.items():
        assert out[key] >= r.count, f"deleting {r.count} copies of {key}, the state has {out[key]}"
        out[key] -= r.count
    for key, r in net.inserts.items():
        assert r.new == dict(zip(COLS, key, strict=True))
        out[key] += r.count
    return +out


def replay_bag(state: Bag, changes: list[Change]) -> Bag:
    out = Counter(state)
    for c in sorted(changes, key=lambda c: c.pos):
        if c.op is Op.TRUNCATE:
            out.clear()
        elif c.op is Op.INSERT:
            out[c.key] += 1
        elif c.op is Op.DELETE:
            assert out[c.key] > 0
            out[c.key] -= 1
        elif c.old_key is not None:
            assert out[c.old_key] > 0
            out[c.old_key] -= 1
            out[c.key] += 1
    return +out


# -- the rule, on the reference fold ---------------------------------------------------------------------------------


def test_one_delete_removing_two_identical_rows_is_two_copies_deleted() -> None:
    """``DELETE FROM t WHERE a = 1`` on two identical rows sends two identical deletes."""
    got = fold([bag_change(1, Op.DELETE, ("1", "x")), bag_change(2, Op.DELETE, ("1", "x"))], bags=BAGS)
    assert net_counts(got) == {"D": {("1", "x"): 2}}
    assert got.nets[T].deletes[("1", "x")].pos == Position(102, 0)


def test_identical_inserts_are_copies() -> None:
    got = fold(
        [
            bag_change(1, Op.INSERT, ("1", "x")),
            bag_change(2, Op.INSERT, ("1", "x")),
            bag_change(3, Op.INSERT, ("1", "y")),
        ],
        bags=BAGS,
    )
    assert net_counts(got) == {"I": {("1", "x"): 2, ("1", "y"): 1}}
    assert got.nets[T].inserts[("1", "x")].new == {"a": "1", "note": "x"}


def test_rows_differing_only_in_a_text_column_are_different_rows() -> None:
    got = fold([bag_change(1, Op.UPDATE, ("1", "y2"), old=("1", "y"))], bags=BAGS)
    assert net_counts(got) == {"D": {("1", "y"): 1}, "I": {("1", "y2"): 1}}


def test_counts_cancel_whatever_the_order() -> None:
    changes = [
        bag_change(1, Op.DELETE, ("1", "x")),
        bag_change(2, Op.INSERT, ("1", "x")),
        bag_change(3, Op.INSERT, ("2", "x")),
        bag_change(4, Op.UPDATE, ("3", "x"), old=("2", "x")),
        bag_change(5, Op.DELETE, ("3", "x")),
        bag_change(6, Op.UPDATE, ("1", "x"), old=("1", "x")),  # an update that changed nothing
    ]
    assert fold(changes, bags=BAGS).nets[T].deletes == {} and fold(changes, bags=BAGS).nets[T].inserts == {}


def test_truncate_then_copies() -> None:
    got = fold(
        [bag_change(1, Op.DELETE, ("1", "x")), bag_change(2, Op.TRUNCATE), bag_change(3, Op.INSERT, ("1", "x"))],
        bags=BAGS,
    )
    assert got.truncated == {T: Position(102, 0)} and net_counts(got) == {"I": {("1", "x"): 1}}


def test_more_deletes_than_inserts_after_a_truncate_is_invalid() -> None:
    changes = [
        bag_change(1, Op.TRUNCATE),
        bag_change(2, Op.INSERT, ("1", "x")),
        bag_change(3, Op.DELETE, ("1", "x")),
        bag_change(4, Op.DELETE, ("1", "x")),
    ]
    with pytest.raises(InvalidSequenceError, match="cannot follow T") as e:
        fold(changes, bags=BAGS)
    assert (e.value.table, e.value.first_pos, e.value.second_pos) == (T, Position(101, 0), Position(103, 0))


def test_actions_keep_only_their_kinds() -> None:
    changes = [bag_change(1, Op.DELETE, ("1", "x")), bag_change(2, Op.UPDATE, ("2", "x"), old=("1", "y"))]
    assert net_counts(fold(changes, {T: "I"}, bags=BAGS)) == {"I": {("2", "x"): 1}}
    assert net_counts(fold(changes, {T: "D"}, bags=BAGS)) == {"D": {("1", "x"): 1, ("1", "y"): 1}}


def test_a_keyed_table_in_the_same_unit_keeps_the_keyed_rules() -> None:
    k = "public.keyed"
    changes = [bag_change(1, Op.INSERT, ("1", "x"), table=k), bag_change(2, Op.INSERT, ("1", "x"), table=k)]
    with pytest.raises(InvalidSequenceError):
        fold(changes, bags=BAGS)


# -- generated histories ---------------------------------------------------------------------------------------------

IMAGES = [(a, n) for a in ("1", "2", None) for n in ("x", "y", "", None)]


def history(rng: random.Random, n: int, truncates: bool = True) -> tuple[Bag, list[Change]]:
    """A valid history on a bag table: a start state with duplicates, then inserts of any image, deletes and
    updates of copies that are there, now and then a TRUNCATE."""
    state: Bag = Counter(rng.choice(IMAGES) for _ in range(rng.randint(0, 8)))
    cur = Counter(state)
    out: list[Change] = []
    for i in range(n):
        there = sorted(+cur, key=lambda k: tuple((v is None, v or "") for v in k))
        r = rng.random()
        if truncates and r < 0.03:
            out.append(bag_change(i, Op.TRUNCATE))
            cur.clear()
        elif r < 0.45 or not there:
            img = rng.choice(IMAGES)
            out.append(bag_change(i, Op.INSERT, img))
            cur[img] += 1
        elif r < 0.75:
            img = rng.choice(there)
            out.append(bag_change(i, Op.DELETE, img))
            cur[img] -= 1
        else:
            old, img = rng.choice(there), rng.choice(IMAGES)
            out.append(bag_change(i, Op.UPDATE, img, old=old if old != img else None))
            cur[old] -= 1
            cur[img] += 1
    return +state, out


@pytest.mark.parametrize("seed", range(40))
def test_generated_histories_reference(seed: int) -> None:
    state, changes = history(random.Random(seed), 30)
    assert apply_bag(state, fold(changes, bags=BAGS)) == replay_bag(state, changes), seed


SEEDS = list(range(24))


def _unit(seeds: list[int], truncates: bool = True) -> tuple[list[Change], dict[str, Bag], dict[str, tuple[str, ...]]]:
    """Many histories in one unit, each its own table (tables are independent), plus one keyed table."""
    changes: list[Change] = []
    states: dict[str, Bag] = {}
    bags: dict[str, tuple[str, ...]] = {}
    for s in seeds:
        table = f"public.h{s}"
        state, hist = history(random.Random(s), 40, truncates)
        states[table] = state
        bags[table] = COLS
        for i, c in enumerate(hist):
            changes.append(Change(Position(1000 * i + 10, s), 0, 1, table, c.op, c.key, c.new, c.unchanged, c.old_key))
    keyed = "public.keyed"
    changes += [bag_change(1, Op.INSERT, ("1", "x"), table=keyed), bag_change(2, Op.UPDATE, ("1", "z"), table=keyed)]
    return changes, states, bags


def _check(got: NetResult, changes: list[Change], states: dict[str, Bag], bags: dict[str, tuple[str, ...]]) -> None:
    want = fold(changes, bags=bags)
    assert (got.tables, got.truncated, got.rows()) == (want.tables, want.truncated, want.rows())
    for table, state in states.items():
        mine = [c for c in changes if c.table == table]
        if table in got.tables:
            assert apply_bag(state, got, table) == replay_bag(state, mine), table


@pytest.mark.spark
@pytest.mark.parametrize("with_stats", [False, True])
def test_spark_general_path_equals_the_reference(spark: Any, with_stats: bool) -> None:
    changes, states, bags = _unit(SEEDS)
    stats = table_stats(changes_to_table(sorted(changes, key=lambda c: c.pos))) if with_stats else None
    batch = compile_changes(changes_frame(spark, changes), stats=stats, bags=bags)
    try:
        _check(collect_result(batch, bags), changes, states, bags)
    finally:
        batch.release()


@pytest.mark.spark
def test_spark_small_path_equals_the_reference(spark: Any) -> None:
    changes, states, bags = _unit(SEEDS, truncates=False)
    su = SmallUnits(spark, None, bags)
    for part in (changes, changes[: len(changes) // 2]):  # two units on one plan
        rows = changes_to_table(sorted(part, key=lambda c: c.pos))
        stats = table_stats(rows)
        assert qualifies(stats)
        batch = su.compile(rows, stats, ZERO, max(c.pos for c in part))
        _check(collect_result(batch, bags), part, {t: states[t] for t in {c.table for c in part} & set(states)}, bags)


@pytest.mark.spark
def test_spark_names_a_negative_count_after_a_truncate(spark: Any) -> None:
    changes = [
        bag_change(1, Op.TRUNCATE),
        bag_change(2, Op.INSERT, ("1", "x")),
        bag_change(3, Op.DELETE, ("1", "x")),
        bag_change(4, Op.DELETE, ("1", "x")),
    ]
    (err,) = find_invalid(changes_frame(spark, changes), bags=BAGS)
    assert (err.table, err.first_pos, err.second_pos) == (T, Position(101, 0), Position(103, 0))
    with pytest.raises(InvalidSequenceError, match="cannot follow T"):
        compile_changes(changes_frame(spark, changes), bags=BAGS)
