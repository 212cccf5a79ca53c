"""Planning the next unit of work (DESIGN §5): where it ends and when it closes. Pure: it reads the log only through
:class:`LogShape` (positions, counts and commit times; :class:`~mirrorline.log.reader.ChangeLog` is one) and the
clock only through the arguments, so that tests/pipeline/test_pipeline_plan.py checks it on a log held in memory.

- **Size** (:func:`next_unit`): a unit holds at most ``small`` changes while the log holds fewer than ``catch_up``
  beyond its start (a live pipeline that fell a little behind catches up in quick units on the small route), else
  ``max_changes`` (catching up: Spark's parallel scan pays off). It ends at a transaction's end; a single
  transaction larger than the size is taken whole. The sizes are in ``mirrorline/limits.py``.
- **Schema changes**: a unit ends before the first change of a configured table whose schema version differs from
  that table's first change in the unit (the changes after it take the next unit, applied with the new shape).
- **Latency** (:func:`closes_at`): a unit that is not full closes once its first change is ``latency`` old, counted
  from the change's commit (the age ``status`` reports as lag), never later than ``latency`` from now.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from mirrorline import limits
from mirrorline.position import Position


class LogShape(Protocol):
    """What planning reads of the change log."""

    def advance(
        self, after: Position | None, max_changes: int, upto: Position | None = None
    ) -> tuple[Position | None, int]:
        """The furthest transaction end ``p <= upto`` with at most ``max_changes`` changes in ``(after, p]`` (one
        larger transaction whole), and how many changes that is."""
        ...

    def changing_schemas(self) -> bool:
        """Has any table more than one schema version (so that a unit may have to be cut)?"""
        ...

    def unit_versions(
        self, after: Position | None, upto: Position, tables: Iterable[str] | None = None
    ) -> tuple[Position, int, dict[str, int]]:
        """``(after, upto]`` cut before the first change whose table's schema version differs from that table's
        first change in it: the end, its changes, each table's version."""
        ...


@dataclass(frozen=True)
class Sizes:
    """How many changes a unit holds (see the module's docstring)."""

    max_changes: int  # [apply] max_changes
    small: int = limits.SMALL_UNIT
    catch_up: int = limits.CATCH_UP_CHANGES


@dataclass(frozen=True)
class Unit:
    """The next unit ``(start, end]``: ``end`` None or ``start`` when the log holds nothing after ``start``."""

    start: Position
    end: Position | None
    changes: int
    size: int  # the size it was planned at: a unit holding fewer is not full

    @property
    def empty(self) -> bool:
        return self.end is None or self.end <= self.start

    @property
    def full(self) -> bool:
        return self.changes >= self.size


def next_unit(log: LogShape, start: Position, upto: Position, sizes: Sizes, tables: Collection[str] = ()) -> Unit:
    """The unit after ``start``, at most to ``upto`` (the log's durable end, or a target's position that the unit
    stops at); ``tables``: the configured tables (empty: every table), whose schema changes cut units."""
    small = min(sizes.small, sizes.max_changes)
    far = min(sizes.catch_up, sizes.max_changes)
    end, n = log.advance(start, far, upto)
    size = small
    if n >= far:
        size = sizes.max_changes
        if far < sizes.max_changes:
            end, n = log.advance(start, sizes.max_changes, upto)
    elif n > small:
        end, n = log.advance(start, small, upto)
    end, n = cut_at_schema_change(log, start, end, n, tables)
    return Unit(start, end, n, size)


def cut_at_schema_change(
    log: LogShape, start: Position, end: Position | None, n: int, tables: Collection[str] = ()
) -> tuple[Position | None, int]:
    """``(start, end]`` (of ``n`` changes) ended before a configured table's schema changes inside it."""
    if end is None or end <= start or not log.changing_schemas():
        return end, n
    cut, m, _ = log.unit_versions(start, end, tables or None)
    return (cut, m) if cut < end else (end, n)


def closes_at(first_commit_us: int | None, latency: float, now: float, wall: float) -> float:
    """When a unit whose first change committed at ``first_commit_us`` (microseconds since the epoch; None: no
    change yet) closes, on the clock of ``now`` (``time.monotonic()``), ``wall`` being ``time.time()`` at the same
    moment: once the change is ``latency`` seconds old, so changes that waited for capture or for the previous unit
    do not wait the whole latency again; never later than ``latency`` from now (a source clock ahead of this
    machine's cannot hold a unit open longer; one behind it closes units sooner, as a smaller latency would)."""
    if first_commit_us is None:
        return now + latency
    age = wall - first_commit_us / 1e6
    return now + min(latency, max(0.0, latency - age))
