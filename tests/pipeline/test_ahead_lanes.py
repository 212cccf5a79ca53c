"""The lanes of a transaction applied ahead (pipeline/ahead.py ``_Txn``): a target's lane may run behind the others by
parts weighing up to ``LANE_BYTES`` (a faster target is not held to the slowest's pace), never by more than that
plus one part, and a lane's parts run in the order given."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from changes import ch

from mirrorline.log.columns import changes_to_arrow
from mirrorline.log.stream import StreamCut
from mirrorline.pipeline import ahead
from mirrorline.pipeline.ahead import _Txn
from mirrorline.position import ZERO


def test_a_fast_lane_is_not_held_to_a_slow_lanes_pace_within_the_bound() -> None:
    tx = _Txn(xid=1, start=ZERO, targets={})
    gate = threading.Event()  # the slow lane's parts wait for it
    done: dict[str, list[int]] = {"fast": [], "slow": []}

    def job(name: str, i: int) -> None:
        if name == "slow":
            gate.wait(30)
        done[name].append(i)

    bound, weight = 100, 30
    try:
        t0 = time.monotonic()
        for i in range(3):  # three parts of 30 behind in the slow lane: 90, within the bound of 100
            tx.lane("fast", lambda i=i: job("fast", i), weight)
            tx.lane("slow", lambda i=i: job("slow", i), weight)
            tx.wait(bound)
        assert time.monotonic() - t0 < 5  # no wait for the slow lane
        assert done["slow"] == []
        waited = threading.Event()

        def fourth() -> None:  # 120 queued in the slow lane: the wait lasts until it has room again
            tx.lane("fast", lambda: job("fast", 3), weight)
            tx.lane("slow", lambda: job("slow", 3), weight)
            tx.wait(bound)
            waited.set()

        th = threading.Thread(target=fourth)
        th.start()
        assert not waited.wait(0.5)
        gate.set()
        assert waited.wait(30)
        th.join()
    finally:
        gate.set()
        tx.close()
    assert done == {"fast": [0, 1, 2, 3], "slow": [0, 1, 2, 3]}


def test_a_lane_with_a_part_heavier_than_the_bound_waits_for_it_before_the_next() -> None:
    tx = _Txn(xid=1, start=ZERO, targets={})
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def heavy() -> None:
        started.set()
        release.wait(30)
        ran.append("heavy")

    try:
        tx.lane("t", heavy, 500)
        tx.wait(100)  # one part is always allowed, whatever its weight
        assert started.wait(30)
        tx.lane("t", lambda: ran.append("next"), 1)
        th = threading.Thread(target=tx.wait, args=(100,))
        th.start()
        th.join(0.3)
        assert th.is_alive()  # 501 queued: waits for the heavy part
        release.set()
        th.join(30)
        assert not th.is_alive()
    finally:
        release.set()
        tx.close()
    assert ran == ["heavy", "next"]


def test_cuts_waiting_carry_their_rows_only_within_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capture tells the cuts in its thread while the ahead's thread may be behind: the cuts waiting carry their rows
    in memory while they weigh at most ``HELD_BYTES``; the next is read from its parts when its turn comes, and once
    the cuts are taken their bytes count no more."""
    rows = changes_to_arrow([ch(k, new={"id": str(k), "v": "x" * 1_000}) for k in range(100)], 0, 0, 0)
    cuts = [StreamCut(9, tmp_path, (), i * 100, i * 100 + 99, rows) for i in range(4)]
    monkeypatch.setattr(ahead, "HELD_BYTES", 2 * rows.nbytes)
    a = ahead.AheadApplier()
    a._applier = cast(Any, object())  # (told of cuts; its thread not yet started: nothing takes them)
    a._skip.add(9)  # (taken, they are passed over)
    for c in cuts[:3]:
        a.cut(c)
    told = list(a._events.queue)
    assert [e[1].rows is not None for e in told] == [True, True, False]
    assert [e[2] for e in told] == [rows.nbytes, rows.nbytes, 0]
    assert all(e[1] == c for e, c in zip(told, cuts[:3], strict=True))  # (the same cut otherwise)
    thread = threading.Thread(target=a._main)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while (a._events.qsize() or a._held) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a._held == 0
        a._stop.set()
        thread.join()
        a.cut(cuts[3])
        assert a._events.get_nowait()[1].rows is not None
    finally:
        a._stop.set()
        thread.join()
