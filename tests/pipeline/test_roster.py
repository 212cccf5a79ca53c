"""The applier's roster (pipeline/roster.py) and its backoffs (pipeline/backoff.py), without a target's I/O: each
target's phase through its life, the one failure handler's choice between a table and its target, and backoffs
shared by threads."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mirrorline import stopped
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.config import parse
from mirrorline.errors import MirrorlineError, TransientTargetError
from mirrorline.pipeline.backoff import RETRY_FIRST, RETRY_MOST, Backoffs, next_delay
from mirrorline.pipeline.roster import Phase, Roster
from mirrorline.position import Position


class FakeTarget:
    """What the roster asks of a target: its lock, a table held in its state, closing."""

    def __init__(self) -> None:
        self.closed = False
        self.holds: dict[str, str] = {}
        self.refuse_hold = False

    @contextlib.contextmanager
    def exclusive(self, wait: float) -> Iterator[None]:
        yield

    def hold(self, table: str, error: Exception) -> Position:
        if self.refuse_hold:
            raise MirrorlineError("the target's state cannot be written")
        self.holds[table] = str(error)
        return Position(7, 0)

    def close(self) -> None:
        self.closed = True


def _roster(tmp_path: Path, names: list[str], all_or_nothing: bool = False) -> tuple[Roster, dict[str, FakeTarget]]:
    targets = {n: {"url": f"sqlite:///{tmp_path / n}.db", "all_or_nothing": all_or_nothing} for n in names}
    conf = parse(
        {"source": {"dsn": "postgresql://x@127.0.0.1:1/x"}, "log": {"path": str(tmp_path / "log")}, "targets": targets},
        tmp_path / "m.toml",
    )
    (tmp_path / "log").mkdir()
    fakes = {n: FakeTarget() for n in names}
    roster = Roster(conf, names)
    for n, t in fakes.items():
        roster.add(n, t)  # type: ignore[arg-type]
    return roster, fakes


def _batch(*tables: str) -> NetBatch:
    return NetBatch(start=Position(1, 0), end=Position(9, 0), tables=list(tables), rows=NET_ARROW.empty_table())


def test_a_target_fails_is_tried_again_joins_and_is_live(tmp_path: Path) -> None:
    roster, _ = _roster(tmp_path, ["a", "b"])
    assert roster.phases() == {"a": Phase.LIVE, "b": Phase.LIVE}
    roster.fail("a", MirrorlineError("gone"), Position(5, 0))
    assert roster.phases()["a"] is Phase.FAILED
    assert "a" in stopped.read(tmp_path / "log")  # recorded for status
    stop = roster.failed.get("a")
    assert stop is not None and stop.delay == RETRY_FIRST
    assert roster.ready(stop.retry_at - 0.1, retry=True) == ["b"]  # its delay has not passed
    assert roster.ready(stop.retry_at, retry=True) == ["a", "b"]
    assert roster.phases()["a"] is Phase.JOINING  # tried again: it catches up with the others
    roster.recovered("a")
    assert "a" not in roster.failed and "a" not in stopped.read(tmp_path / "log")
    roster.joined({"a": Position(3, 0), "b": Position(5, 0)})
    assert roster.phases()["a"] is Phase.JOINING  # still behind the others
    roster.joined({"a": Position(5, 0), "b": Position(5, 0)})
    assert roster.phases()["a"] is Phase.LIVE


def test_a_failure_again_doubles_the_delay_up_to_the_most() -> None:
    delays = []
    b: Backoffs[str] = Backoffs()
    for _ in range(8):
        delays.append(b.fail("t", RuntimeError("x"), now=0.0).delay)
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert next_delay(None) == RETRY_FIRST and next_delay(RETRY_MOST) == RETRY_MOST
    b.again_now("t")  # it made progress: due now, and a failure after it starts from the first delay
    assert b.due("t", now=0.0) and b.fail("t", RuntimeError("x"), now=0.0).delay == 2.0


def test_one_stopped_before_this_process_is_tried_once_at_once() -> None:
    b: Backoffs[tuple[str, str]] = Backoffs()
    stop = b.stopped(("a", "t"), RuntimeError("held since yesterday"))
    assert stop.due(0.0, retry=False)  # catch_up (no retries) still tries it once
    b.fail(("a", "t"), RuntimeError("again"), now=0.0)
    assert not b.due(("a", "t"), now=1.0, retry=False) and not b.due(("a", "t"), now=1.0)
    assert b.stopped(("a", "t"), RuntimeError("other")).error.args == ("again",)  # known: kept


def test_requests_from_other_threads_take_effect_at_the_next_step(tmp_path: Path) -> None:
    roster, fakes = _roster(tmp_path, ["a", "b"])
    roster.loading("c")
    out = roster.pause("b")
    assert roster.phases() == {"a": Phase.LIVE, "b": Phase.PAUSED, "c": Phase.LOADING}
    roster.admit("c")
    assert roster.phases()["c"] is Phase.NEW and roster.requested()
    opened: dict[str, FakeTarget] = {}
    roster.take_requests(lambda n: opened.setdefault(n, FakeTarget()))  # type: ignore[arg-type,return-value]
    assert out.is_set() and fakes["b"].closed and "b" not in roster.targets and "b" not in roster.names
    assert roster.phases() == {"a": Phase.LIVE, "c": Phase.JOINING} and roster.names == ["a", "c"]
    assert not roster.requested()


def test_admits_and_pauses_from_many_threads_are_all_taken(tmp_path: Path) -> None:
    roster, _ = _roster(tmp_path, ["a"])
    names = [f"t{i}" for i in range(200)]
    threads = [threading.Thread(target=roster.admit, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    roster.take_requests(lambda n: FakeTarget())  # type: ignore[arg-type,return-value]
    assert set(roster.targets) == {"a", *names}


@pytest.mark.parametrize(
    ("error", "all_or_nothing", "spared", "only", "stops"),
    [
        (MirrorlineError("refused", table="public.t"), False, set(), None, "table"),
        (MirrorlineError("refused", table="public.t"), True, set(), None, "target"),  # all_or_nothing
        (MirrorlineError("refused", table="public.t"), False, {"public.t"}, None, "target"),  # held in this unit
        (MirrorlineError("refused", table="public.other"), False, set(), None, "target"),  # not the unit's table
        (MirrorlineError("refused", table="public.t"), False, set(), "public.u", "target"),  # a held unit of another
        (TransientTargetError("connection lost", table="public.t"), False, set(), None, "target"),
        (RuntimeError("no context"), False, set(), None, "target"),
    ],
)
def test_the_one_failure_handler(
    tmp_path: Path, error: Exception, all_or_nothing: bool, spared: set[str], only: str | None, stops: str
) -> None:
    roster, fakes = _roster(tmp_path, ["a"], all_or_nothing)
    got = roster.failure("a", error, _batch("public.t", "public.u"), spared=spared, only=only)
    if stops == "table":
        assert got == "public.t" and fakes["a"].holds and ("a", "public.t") in roster.held
        assert roster.phases()["a"] is Phase.HELD and "a" not in roster.failed
    else:
        assert got is None and not fakes["a"].holds and roster.phases()["a"] is Phase.FAILED
        assert roster.failed.errors()["a"] is error


def test_a_hold_that_cannot_be_written_stops_the_target(tmp_path: Path) -> None:
    roster, fakes = _roster(tmp_path, ["a"])
    fakes["a"].refuse_hold = True
    assert roster.failure("a", MirrorlineError("refused", table="public.t"), _batch("public.t"), spared=set()) is None
    assert "cannot be written" in str(roster.failed.errors()["a"])


def test_a_failed_compile_is_no_targets(tmp_path: Path) -> None:
    roster, _ = _roster(tmp_path, ["a"])
    batch = _batch("public.t")

    def check() -> None:
        raise MirrorlineError("the unit's compile failed")

    batch.check = check
    with pytest.raises(MirrorlineError, match="compile failed"):
        roster.failure("a", MirrorlineError("refused", table="public.t"), batch, spared=set())
    assert roster.phases()["a"] is Phase.LIVE


def test_remove_forgets_everything_of_a_target(tmp_path: Path) -> None:
    roster, fakes = _roster(tmp_path, ["a", "b"])
    roster.fail("a", MirrorlineError("gone"), None)
    roster.held.fail(("a", "t"), MirrorlineError("held"))
    roster.loading("a")
    assert roster.remove("a") is fakes["a"] and fakes["a"].closed
    assert roster.phases() == {"b": Phase.LIVE} and not roster.failed and not roster.held


def test_given_targets_are_not_closed(tmp_path: Path) -> None:
    roster, _ = _roster(tmp_path, [])
    given: Any = FakeTarget()
    r = Roster(roster.config, ["g"], {"g": given})
    r.remove("g")
    r.close()
    assert not given.closed


def test_a_held_table_this_process_loads_again_is_not_tried_meanwhile(tmp_path: Path) -> None:
    """While ``run`` loads a held table again at a target (its reload holds the table's lock from before it empties
    the table to the load's end), the held table's own units do not look at it: a unit applied into the emptied
    table would put rows there that the load brings too (a duplicate key in the load's COPY). Once the load lets
    go, the table is tried again."""
    from mirrorline.apply.state import AppliedState
    from mirrorline.pipeline import held

    class Untouched:
        """Units that must not be asked while the load runs."""

        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the held table was tried while its load ran ({name})")

    roster, _ = _roster(tmp_path, ["a"])
    state = AppliedState(
        unit_end=Position(9, 0), tables={"public.t": Position(5, 0)}, held={"public.t": Position(5, 0)}
    )
    roster.held.stopped(("a", "public.t"), MirrorlineError("rows changed with nothing logged"))
    guard = roster.table_lock(("a", "public.t"))
    assert roster.table_lock(("a", "public.t")) is guard and roster.table_lock(("a", "public.u")) is not guard
    with guard:  # run's reload of the table
        assert held.unit(roster, Untouched(), {"a": state}, Position(9, 0), True) is None  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="session"):  # free: it goes on to read the table's snapshot state
        held.unit(roster, Untouched(), {"a": state}, Position(9, 0), True)  # type: ignore[arg-type]
