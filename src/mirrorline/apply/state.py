"""The applied positions a target keeps in ``mirrorline_applied``, in the same transaction as the data they describe:
created, written and read here only (apply's units, a snapshot's load and ``verify`` all come through it).

One row per scope: a table's own position (a table loaded or applied on its own: snapshotted into a live target, or
one lane of ``threads > 1``), and :data:`~mirrorline.apply.sql.GLOBAL_SCOPE` for the unit end every table has
reached. :class:`AppliedState` turns them into the position every change up to which is applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mirrorline.apply.session import Session
from mirrorline.apply.sql import GLOBAL_SCOPE, STATE_TABLE
from mirrorline.position import ZERO, Position

SHAPE_SCOPE = "#shape:"  # state rows holding a table's schema version (lsn), not a position


@dataclass(frozen=True)
class AppliedState:
    """What a target has applied: the unit end every table has reached, and each table's own position."""

    unit_end: Position = ZERO
    tables: dict[str, Position] = field(default_factory=dict)
    # the logged schema version each table's shape at the target follows (issue 14; absent: not known)
    shapes: dict[str, int] = field(default_factory=dict)

    @property
    def position(self) -> Position:
        """Every change up to this position is applied (per-table positions taken into account)."""
        if not self.tables:
            return self.unit_end
        return max(self.unit_end, min(self.tables.values()))

    def table(self, table: str) -> Position:
        """Every change of ``table`` up to this position is applied."""
        return max(self.unit_end, self.tables.get(table, ZERO))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def ensure(s: Session) -> None:
    """Create the state table if it is missing (inside the caller's transaction, or on its own)."""
    s.execute(s.dialect.create_state())


def parse(rows: Iterable[Sequence[Any]]) -> AppliedState:
    """The state from the table's rows (``Dialect.read_state``: scope, lsn, seq, ...)."""
    unit_end, tables, shapes = ZERO, {}, {}
    for scope, lsn, seq, *_ in rows:
        if scope == GLOBAL_SCOPE:
            unit_end = Position(int(lsn), int(seq))
        elif scope.startswith(SHAPE_SCOPE):
            if int(lsn):
                shapes[scope[len(SHAPE_SCOPE) :]] = int(lsn)
        else:
            tables[scope] = Position(int(lsn), int(seq))
    return AppliedState(unit_end, tables, shapes)


def read(s: Session) -> AppliedState:
    """The target's state; nothing applied when the table does not exist yet."""
    if s.table_columns(f"public.{s.dialect.own_name(STATE_TABLE)}") is None:
        return AppliedState()
    return parse(s.query(s.dialect.read_state()))


def write(s: Session, tables: Iterable[str], end: Position, unit: bool) -> None:
    """Set each of ``tables``' positions, and with ``unit`` the unit end every table has reached, to ``end``."""
    stamp = now()
    for scope in [*tables, *([GLOBAL_SCOPE] if unit else [])]:
        s.execute(s.dialect.upsert_state(), (scope, end.lsn, end.seq, end.lsn, end.seq, str(end), stamp))


def write_shape(s: Session, table: str, version: int) -> None:
    """Record that ``table``'s shape at the target follows the logged schema ``version`` (0: not known, as after a
    reload from the source's catalog)."""
    s.execute(s.dialect.upsert_state(), (SHAPE_SCOPE + table, version, 0, version, 0, f"schema {version}", now()))


def write_missing(s: Session, positions: dict[str, Position]) -> None:
    """Record tables' own positions where the table has none yet (kept when it has one)."""
    stamp = now()
    for t, p in positions.items():
        s.execute(s.dialect.insert_state_if_missing(), (t, p.lsn, p.seq, p.lsn, p.seq, str(p), stamp))
