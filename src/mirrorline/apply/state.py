"""The applied positions a target keeps in ``mirrorline_applied``, in the same transaction as the data they describe:
created, written and read here only (apply's units, a snapshot's load and ``verify`` all come through it).

One row per scope: a table's own position (a table loaded or applied on its own: snapshotted into a live target, or
one lane of ``threads > 1``), and :data:`~mirrorline.apply.sql.GLOBAL_SCOPE` for the unit end every table has
reached. :class:`AppliedState` turns them into the position every change up to which is applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mirrorline.apply.session import Session
from mirrorline.apply.sql import GLOBAL_SCOPE, STATE_TABLE
from mirrorline.log.schemas import schema_from_json, schema_to_json
from mirrorline.model import TableSchema
from mirrorline.position import ZERO, Position

# state rows holding a table's shape at the target: the logged schema version (lsn; 0: none) and, in the position
# column, the shape itself as JSON (what the snapshot loaded, or the version the target last followed)
SHAPE_SCOPE = "#shape:"


@dataclass(frozen=True)
class AppliedState:
    """What a target has applied: the unit end every table has reached, and each table's own position."""

    unit_end: Position = ZERO
    tables: dict[str, Position] = field(default_factory=dict)
    # the logged schema version each table's shape at the target follows (absent: not known)
    shapes: dict[str, int] = field(default_factory=dict)
    # each table's shape at the target, by content (absent: recorded by a version that did not keep it)
    shape_docs: dict[str, TableSchema] = field(default_factory=dict)

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
    """The state from the table's rows (``Dialect.read_state``: scope, lsn, seq, end_lsn, end_seq, position)."""
    unit_end, tables, shapes, docs = ZERO, {}, {}, {}
    for scope, lsn, seq, *rest in rows:
        if scope == GLOBAL_SCOPE:
            unit_end = Position(int(lsn), int(seq))
        elif scope.startswith(SHAPE_SCOPE):
            table = scope[len(SHAPE_SCOPE) :]
            if int(lsn):
                shapes[table] = int(lsn)
            doc = rest[2] if len(rest) > 2 else None
            if doc and str(doc).startswith("{"):
                docs[table] = schema_from_json(json.loads(doc))
        else:
            tables[scope] = Position(int(lsn), int(seq))
    return AppliedState(unit_end, tables, shapes, docs)


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


def write_shape(s: Session, shape: TableSchema, version: int) -> None:
    """Record ``shape`` as the shape of its table at the target, following the logged schema ``version`` (0: none,
    as after a load from the source's catalog, whose shape may be one the log never recorded)."""
    doc = json.dumps(schema_to_json(shape), sort_keys=True)
    s.execute(s.dialect.upsert_state(), (SHAPE_SCOPE + shape.table, version, 0, version, 0, doc, now()))


def write_missing(s: Session, positions: dict[str, Position]) -> None:
    """Record tables' own positions where the table has none yet (kept when it has one)."""
    stamp = now()
    for t, p in positions.items():
        s.execute(s.dialect.insert_state_if_missing(), (t, p.lsn, p.seq, p.lsn, p.seq, str(p), stamp))
