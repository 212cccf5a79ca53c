"""The applied positions a target keeps in ``mirrorline_applied``, in the same transaction as the data they describe:
created, written and read here only (apply's units, a snapshot's load and ``verify`` all come through it).

One row per scope: a table's own position (a table loaded or applied on its own: snapshotted into a live target, or
one lane of ``threads > 1``), :data:`~mirrorline.apply.sql.GLOBAL_SCOPE` for the unit end every table has
reached, and a *held* table's (:data:`HOLD_SCOPE`): one that failed and stopped alone, while the target's other tables
went on; its changes are applied from its own position until it reaches the others. :class:`AppliedState` turns
them into the position every change up to which is applied.
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
# state rows of tables stopped alone (held): the position the table is applied up to and, in the position column,
# why it stopped and since when, as JSON ({"error", "kind", "since"})
HOLD_SCOPE = "#held:"


@dataclass(frozen=True)
class AppliedState:
    """What a target has applied: the unit end every table has reached, and each table's own position."""

    unit_end: Position = ZERO
    tables: dict[str, Position] = field(default_factory=dict)
    # the logged schema version each table's shape at the target follows (absent: not known)
    shapes: dict[str, int] = field(default_factory=dict)
    # each table's shape at the target, by content (absent: recorded by a version that did not keep it)
    shape_docs: dict[str, TableSchema] = field(default_factory=dict)
    # tables stopped alone: the position each is held at, and why ({"error", "kind", "since"})
    held: dict[str, Position] = field(default_factory=dict)
    holds: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def live(self) -> Position:
        """Every change of every table not held is applied up to this position: where the target's next unit
        starts."""
        own = [p for t, p in self.tables.items() if t not in self.held]
        return max(self.unit_end, min(own)) if own else self.unit_end

    @property
    def position(self) -> Position:
        """Every change up to this position is applied (per-table positions and held tables taken into account)."""
        return min([self.live, *(self.table(t) for t in self.held)])

    def table(self, table: str) -> Position:
        """Every change of ``table`` up to this position is applied."""
        if table in self.held:  # (its own position may be ahead of the hold: a Delta commit before the hold moved)
            return max(self.held[table], self.tables.get(table, ZERO))
        return max(self.unit_end, self.tables.get(table, ZERO))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def ensure(s: Session) -> None:
    """Create the state table if it is missing (inside the caller's transaction, or on its own)."""
    s.execute(s.dialect.create_state())


def parse(rows: Iterable[Sequence[Any]]) -> AppliedState:
    """The state from the table's rows (``Dialect.read_state``: scope, lsn, seq, end_lsn, end_seq, position)."""
    unit_end, tables, shapes, docs = ZERO, {}, {}, {}
    held: dict[str, Position] = {}
    holds: dict[str, dict[str, str]] = {}
    for scope, lsn, seq, *rest in rows:
        if scope == GLOBAL_SCOPE:
            unit_end = Position(int(lsn), int(seq))
        elif scope.startswith(HOLD_SCOPE):
            table = scope[len(HOLD_SCOPE) :]
            held[table] = Position(int(lsn), int(seq))
            try:
                doc = json.loads(rest[2]) if len(rest) > 2 and rest[2] else {}
            except ValueError:
                doc = {}
            holds[table] = {k: str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
        elif scope.startswith(SHAPE_SCOPE):
            table = scope[len(SHAPE_SCOPE) :]
            if int(lsn):
                shapes[table] = int(lsn)
            doc = rest[2] if len(rest) > 2 else None
            if doc and str(doc).startswith("{"):
                docs[table] = schema_from_json(json.loads(doc))
        else:
            tables[scope] = Position(int(lsn), int(seq))
    return AppliedState(unit_end, tables, shapes, docs, held, holds)


def read(s: Session) -> AppliedState:
    """The target's state; nothing applied when the table does not exist yet."""
    if s.table_columns(f"public.{s.dialect.own_name(STATE_TABLE)}") is None:
        return AppliedState()
    return parse(s.query(s.dialect.read_state()))


WRITE_ROWS = 100  # scopes per statement of write (700 parameters: below every kind's limit)


def write(s: Session, tables: Iterable[str], end: Position, unit: bool) -> None:
    """Set each of ``tables``' positions, and with ``unit`` the unit end every table has reached, to ``end``."""
    stamp = now()
    scopes = list(dict.fromkeys([*tables, *([GLOBAL_SCOPE] if unit else [])]))
    # one statement for a unit's scopes (a DuckDB statement costs about 1.5 ms of CPU to plan: bench/live --phases
    # r300, CPU per 1,000 changes)
    row = (end.lsn, end.seq, end.lsn, end.seq, str(end), stamp)
    for i in range(0, len(scopes), WRITE_ROWS):
        part = scopes[i : i + WRITE_ROWS]
        s.execute(s.dialect.upsert_state(len(part)), [v for scope in part for v in (scope, *row)])


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


def hold(s: Session, table: str, position: Position, error: str, kind: str, since: str | None = None) -> None:
    """Hold ``table`` at ``position`` (every change of it up to there applied): it failed with ``error`` (of class
    ``kind``) and stops alone, since ``since`` (default: now)."""
    doc = json.dumps({"error": error, "kind": kind, "since": since or now()})
    s.execute(
        s.dialect.upsert_state(),
        (HOLD_SCOPE + table, position.lsn, position.seq, position.lsn, position.seq, doc, now()),
    )


def move_hold(s: Session, table: str, end: Position, release: bool) -> None:
    """``table``, held, applied up to ``end``: its hold moves there, or (``release``: it reached the target's other
    tables) ends, its own position set to ``end``."""
    if release:
        s.execute(s.dialect.delete_state(), (HOLD_SCOPE + table,))
    else:
        s.execute(s.dialect.move_state(), (end.lsn, end.seq, end.lsn, end.seq, now(), HOLD_SCOPE + table))
    write(s, [table], end, unit=False)


def release(s: Session, table: str) -> None:
    """End ``table``'s hold (a reload, or it has nothing left to catch up)."""
    s.execute(s.dialect.delete_state(), (HOLD_SCOPE + table,))
