"""Generated histories on Spark (DESIGN §5's invariant): (a) the Spark compiler gives exactly the reference's result,
(b) applying it to the state before the unit gives the state that replaying every op gives, (c) invalid histories
raise the named error at the injected op. Spark costs ~1 s per job, so each example packs a hundred independent
histories into one unit (each under its own table names, tables being independent) and compiles them in one job."""

from __future__ import annotations

from typing import Any

import pytest
from compile_histories import Picker, inject, pack, prefixed, random_histories, unpack
from compile_support import changes_frame, collect_result, find_invalid
from hypothesis import given, settings
from hypothesis import strategies as st

from mirrorline.compile.reference import apply_net, fold, replay
from mirrorline.compile.spark import compile_changes
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.rows import changes_to_table
from mirrorline.log.stats import table_stats

pytestmark = pytest.mark.spark

PER_JOB = 100
seeds = st.integers(0, 2**32 - 1)


def _describe(h: Any) -> str:
    lines = [f"actions={h.actions} state={h.before}"]
    lines += [f"  {c.pos} {c.table} {c.op} {c.old_key}->{c.key} {c.new} ~{sorted(c.unchanged)}" for c in h.changes]
    return "\n".join(lines)


def _check_batch(spark: Any, seed: int, with_actions: bool, with_stats: bool = False, to_driver: bool = False) -> None:
    """``with_stats``: the tables' metadata from the log's statistics of the changes instead of a Spark job;
    ``to_driver``: the net rows brought to the driver through Arrow (unless the unit has key changes leaving
    columns unsent, which take the Parquet path)."""
    hs = random_histories(seed, PER_JOB, with_actions=with_actions)
    changes, actions = pack(hs)
    stats = table_stats(changes_to_table(sorted(changes, key=lambda c: c.pos)))
    frame = changes_frame(spark, changes)
    batch = compile_changes(frame, actions=actions, stats=stats if with_stats else None, to_driver=to_driver)
    try:
        moves = any(s.moves for s in stats.values())
        assert batch.on_driver == (to_driver and not moves)
        result = collect_result(batch)
    finally:
        batch.release()
    assert batch.changes == len(changes)
    for i, h in enumerate(hs):
        got = unpack(result, i, hs)
        want = fold(h.changes, h.actions or None)
        assert (got.tables, got.truncated, got.rows()) == (want.tables, want.truncated, want.rows()), _describe(h)
        assert apply_net(h.before, got) == {**h.before, **replay(h.before, h.changes, h.actions or None)}, _describe(h)


@settings(max_examples=3)
@given(seeds)
def test_spark_equals_reference_and_invariant_holds(spark: Any, seed: int) -> None:
    _check_batch(spark, seed, with_actions=False)


@settings(max_examples=2)
@given(seeds)
def test_spark_equals_reference_with_actions(spark: Any, seed: int) -> None:
    _check_batch(spark, seed, with_actions=True)


@settings(max_examples=2)
@given(seeds)
def test_spark_equals_reference_with_actions_and_log_statistics(spark: Any, seed: int) -> None:
    _check_batch(spark, seed, with_actions=True, with_stats=True)


@settings(max_examples=2)
@given(seeds)
def test_spark_equals_reference_with_the_net_rows_on_the_driver(spark: Any, seed: int) -> None:
    _check_batch(spark, seed, with_actions=True, with_stats=True, to_driver=True)


@settings(max_examples=2)
@given(seeds)
def test_invalid_histories_raise_the_named_error(spark: Any, seed: int) -> None:
    import random

    rnd = random.Random(seed)
    injected = [inj for h in random_histories(seed, PER_JOB) if (inj := inject(Picker(rnd=rnd), h)) is not None]
    hs = [inj.history for inj in injected]
    changes, _ = pack(hs)
    frame = changes_frame(spark, changes)

    # every history's earliest error, all in one job
    earliest: dict[int, InvalidSequenceError] = {}
    for e in find_invalid(frame, limit=10 * len(hs)):
        earliest.setdefault(int(e.table.partition(".")[0][1:]), e)
    assert len(earliest) == len(injected)
    for i, inj in enumerate(injected):
        e = earliest[i]
        shift = i * 1_000_000
        assert (e.table, e.key) == (prefixed(i, inj.table), inj.key), _describe(inj.history)
        assert (e.context["first_op"], e.first_pos.lsn - shift, e.first_pos.seq) == (
            inj.first[0],
            inj.first[1].lsn,
            inj.first[1].seq,
        )
        assert (e.context["second_op"], e.second_pos.lsn - shift, e.second_pos.seq) == (
            inj.second[0],
            inj.second[1].lsn,
            inj.second[1].seq,
        )

    # compiling stops at the unit's earliest, the same as the reference's, the net rows on the driver or not
    with pytest.raises(InvalidSequenceError) as want:
        fold(changes)
    for to_driver in (False, True):
        with pytest.raises(InvalidSequenceError) as got:
            compile_changes(frame, to_driver=to_driver)
        assert (got.value.table, got.value.key, got.value.first_pos, got.value.second_pos) == (
            want.value.table,
            want.value.key,
            want.value.first_pos,
            want.value.second_pos,
        )
