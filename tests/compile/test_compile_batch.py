"""A compiled batch settles itself: a route that leaves a check running (the inserts and updates routes) hands its
rows to apply as they are read, and whoever reads a table's rows to their end waits for the unit's check and gets
what it found, so no target kind has to remember to ask. The route's own check reads the rows without that gate."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from mirrorline.compile.batch import POSITION_COLUMNS, Feed, Inserts, NetBatch
from mirrorline.errors import Unverified
from mirrorline.position import Position

LAYOUT = pa.schema([("id", pa.string()), (POSITION_COLUMNS[0], pa.int64()), (POSITION_COLUMNS[1], pa.int64())])


def _chunk(*ids: str) -> pa.Table:
    return pa.table({"id": list(ids), POSITION_COLUMNS[0]: [1] * len(ids), POSITION_COLUMNS[1]: [0] * len(ids)}, LAYOUT)


def _batch(check_fails: bool, release: threading.Event) -> tuple[NetBatch, Feed, list[int]]:
    feed = Feed(LAYOUT)
    seen: list[int] = []

    def check() -> None:
        release.wait(10)
        seen.append(feed.rows())  # the check reads the feed itself: without the gate, or it would wait on itself
        if check_fails:
            raise Unverified("a key is inserted twice", start="0/1", end="0/2")

    batch = NetBatch(
        start=Position(1, 0),
        end=Position(2, 0),
        tables=["public.t"],
        inserts={"public.t": Inserts(None, ("id",), feed)},
        changes=3,
        check=check,
    )
    return batch, feed, seen


@pytest.mark.parametrize("fails", [False, True])
def test_reading_a_tables_rows_to_their_end_waits_for_the_units_check(fails: bool) -> None:
    release = threading.Event()
    batch, feed, seen = _batch(fails, release)
    feed.put(_chunk("1", "2"))
    feed.put(_chunk("3"))
    feed.close()
    assert batch.inserts is not None
    chunks = batch.inserts["public.t"].chunks()
    assert next(chunks).num_rows == 2 and next(chunks).num_rows == 1  # as they come, before the check ends ...
    done: list[object] = []

    def rest() -> None:
        try:
            done.append(list(chunks))
        except Unverified as e:
            done.append(e)

    t = threading.Thread(target=rest)
    t.start()
    t.join(0.3)
    assert t.is_alive() and not done  # ... but not the end
    release.set()
    t.join(10)
    assert seen == [3]
    if fails:
        assert isinstance(done[0], Unverified)
        with pytest.raises(Unverified):  # the same for every reader, checked once
            batch.arrow()
        with pytest.raises(Unverified):
            batch.verify()
        assert seen == [3]
    else:
        assert done == [[]]
        arrow = batch.arrow()
        assert arrow is not None and sorted(arrow["key"].to_pylist()) == [["1"], ["2"], ["3"]]


def test_a_batch_without_a_check_is_not_gated() -> None:
    feed = Feed(LAYOUT)
    feed.put(_chunk("1"))
    feed.close()
    batch = NetBatch(
        start=Position(1, 0),
        end=Position(2, 0),
        tables=["public.t"],
        inserts={"public.t": Inserts(None, ("id",), feed)},
    )
    assert feed.gate is None
    assert batch.counts() == {"public.t": {"D": 0, "U": 0, "I": 1}}
