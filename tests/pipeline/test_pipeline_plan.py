"""Where the next unit ends (pure: a log held in memory, no files, no Spark): sized by how far behind the targets
are, bounded by ``max_changes`` and by the position it may reach, whole transactions, cut before a configured
table's schema change; and when a unit that is not full closes (its first change's commit time and the latency)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from mirrorline.pipeline.plan import Sizes, Unit, closes_at, next_unit
from mirrorline.position import ZERO, Position


@dataclass(frozen=True)
class Row:
    pos: Position
    table: str = "public.t"
    version: int = 1


class MemoryLog:
    """The log's shape as :class:`~mirrorline.pipeline.plan.LogShape` reads it, from rows in log order (a
    transaction's rows share their lsn)."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def _after(self, after: Position | None, upto: Position | None) -> list[Row]:
        return [r for r in self.rows if (after is None or r.pos > after) and (upto is None or r.pos <= upto)]

    def advance(
        self, after: Position | None, max_changes: int, upto: Position | None = None
    ) -> tuple[Position | None, int]:
        rows = self._after(after, upto)
        end, n = after, 0
        for i, r in enumerate(rows):
            last_of_txn = i + 1 == len(rows) or rows[i + 1].pos.lsn != r.pos.lsn
            if not last_of_txn:
                continue
            if i + 1 > max_changes and n > 0:
                break
            end, n = r.pos, i + 1
            if n >= max_changes:
                break
        return end, n

    def changing_schemas(self) -> bool:
        return len({(r.table, r.version) for r in self.rows}) > len({r.table for r in self.rows})

    def unit_versions(
        self, after: Position | None, upto: Position, tables: Iterable[str] | None = None
    ) -> tuple[Position, int, dict[str, int]]:
        keep = set(tables) if tables is not None else None
        versions: dict[str, int] = {}
        end, n = after or ZERO, 0
        for r in self._after(after, upto):
            if (keep is None or r.table in keep) and versions.setdefault(r.table, r.version) != r.version:
                return end, n, versions
            end, n = r.pos, n + 1
        return upto, n, versions


def txns(count: int, size: int = 10, first: int = 1, table: str = "public.t", version: int = 1) -> list[Row]:
    """``count`` transactions of ``size`` changes at lsn 10, 20, ... (from ``first``)."""
    return [Row(Position(k * 10, i), table, version) for k in range(first, first + count) for i in range(size)]


SIZES = Sizes(max_changes=1_000_000, small=1_000, catch_up=4_000)


def test_a_small_backlog_is_applied_in_small_units() -> None:
    log = MemoryLog(txns(350))  # 3,500 changes behind: fewer than catch_up
    assert next_unit(log, ZERO, Position(3500, 9), SIZES) == Unit(ZERO, Position(1000, 9), 1_000, 1_000)


def test_a_large_backlog_is_caught_up_in_large_units_then_small_ones_again() -> None:
    log = MemoryLog(txns(600))
    u = next_unit(log, ZERO, Position(6000, 9), SIZES)
    assert u == Unit(ZERO, Position(6000, 9), 6_000, 1_000_000) and not u.full  # open: the latency closes it
    u = next_unit(log, Position(2500, 9), Position(6000, 9), SIZES)  # 3,500 behind now
    assert u == Unit(Position(2500, 9), Position(3500, 9), 1_000, 1_000) and u.full


@pytest.mark.parametrize("max_changes", [500, 2_000])
def test_max_changes_bounds_every_unit(max_changes: int) -> None:
    log = MemoryLog(txns(600))
    u = next_unit(log, ZERO, Position(6000, 9), Sizes(max_changes, small=1_000, catch_up=4_000))
    assert (u.end, u.changes, u.size) == (Position(max_changes, 9), max_changes, max_changes)


def test_a_unit_never_passes_the_position_it_may_reach() -> None:
    log = MemoryLog(txns(350))
    assert next_unit(log, ZERO, Position(300, 9), SIZES) == Unit(ZERO, Position(300, 9), 300, 1_000)


def test_a_transaction_larger_than_the_unit_is_taken_whole_and_never_split() -> None:
    log = MemoryLog(txns(1, size=2_500) + txns(3, first=2))
    assert next_unit(log, ZERO, Position(40, 9), SIZES) == Unit(ZERO, Position(10, 2_499), 2_500, 1_000)
    u = next_unit(log, Position(10, 2_499), Position(40, 9), SIZES)
    assert (u.end, u.changes) == (Position(40, 9), 30)


def test_nothing_after_the_start_is_an_empty_unit() -> None:
    u = next_unit(MemoryLog(txns(3)), Position(30, 9), Position(30, 9), SIZES)
    assert u.empty and u.changes == 0


def test_a_unit_ends_before_a_configured_tables_schema_change() -> None:
    rows = txns(5) + txns(5, first=6, version=2)  # public.t changes shape at lsn 60
    log = MemoryLog(rows)
    assert next_unit(log, ZERO, Position(100, 9), SIZES, ["public.t"]) == Unit(ZERO, Position(50, 9), 50, 1_000)
    assert next_unit(log, Position(50, 9), Position(100, 9), SIZES, ["public.t"]).end == Position(100, 9)


def test_another_tables_schema_change_does_not_cut_the_unit() -> None:
    rows = txns(5) + txns(2, first=6, table="public.other") + txns(2, first=8, table="public.other", version=2)
    log = MemoryLog(rows)
    assert next_unit(log, ZERO, Position(90, 9), SIZES, ["public.t"]).end == Position(90, 9)
    assert next_unit(log, ZERO, Position(90, 9), SIZES).end == Position(70, 9)  # every table counts


def test_an_open_unit_closes_when_its_first_change_is_latency_old_by_its_commit_time() -> None:
    now, wall = 1_000.0, 1_700_000_000.0
    us = int(wall * 1e6)
    assert closes_at(us - 60_000_000, 2.0, now, wall) == now  # committed a minute ago: closes now
    assert closes_at(us - 500_000, 2.0, now, wall) == pytest.approx(now + 1.5)  # waited half a second already
    assert closes_at(us, 2.0, now, wall) == pytest.approx(now + 2.0)  # committed just now
    assert closes_at(us + 3_600_000_000, 2.0, now, wall) == now + 2.0  # a source clock an hour ahead: no longer
    assert closes_at(None, 2.0, now, wall) == now + 2.0  # no change yet
