"""A target's snapshot state, kept in the target itself (``mirrorline_snapshot``, one row per table) next to apply's
applied positions (``mirrorline_applied``), and the target states of DESIGN §7:

- ``new``: nothing loaded yet;
- ``waiting for files``: nothing loaded yet, and the target is loaded by ``snapshot load`` (``initial = "files"``);
- ``loading``: a snapshot is being loaded (or was interrupted: load it again);
- ``catching up``: loaded; applying the log until it has applied what the source had committed when the load ended;
- ``live``: it has;
- ``needs reload``: the log's cap (``max_age`` / ``max_size``) removed changes it had not applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mirrorline.apply import state as applied
from mirrorline.apply.session import Session
from mirrorline.apply.sql import Dialect
from mirrorline.model import quote_ident
from mirrorline.position import Position

SNAPSHOT_TABLE = "mirrorline_snapshot"
NEW, LOADING, CATCHING_UP, LIVE = "new", "loading", "catching up", "live"
WAITING = "waiting for files"
NEEDS_RELOAD = "needs reload"  # the log's cap removed changes it had not applied
STATES = (NEW, WAITING, LOADING, CATCHING_UP, LIVE, NEEDS_RELOAD)


@dataclass(frozen=True)
class TableSnapshot:
    """How one table of a target was loaded."""

    table: str
    state: str  # "loading" or "loaded"
    position: Position  # the snapshot's consistent position (the table's applied position after the load)
    end_lsn: int  # the source's WAL position when the load ended: applied past it, the target is live
    rows: int
    origin: str  # "wire" or the export's id
    updated_at: str


now = applied.now  # the time stamp of a state row


def create_sql(d: Dialect) -> list[str]:
    t = d.text_type
    return [
        f"CREATE TABLE IF NOT EXISTS {d.own(SNAPSHOT_TABLE)} ({quote_ident('table')} {t} PRIMARY KEY, "
        f"state {t} NOT NULL, lsn BIGINT NOT NULL, seq BIGINT NOT NULL, position {t}, end_lsn BIGINT NOT NULL, "
        f"{quote_ident('rows')} BIGINT NOT NULL, origin {t}, updated_at {t})"
    ]


def upsert_sql(d: Dialect) -> str:
    p = d.param
    cols = ["table", "state", "lsn", "seq", "position", "end_lsn", "rows", "origin", "updated_at"]
    names = ", ".join(quote_ident(c) for c in cols)
    sets = ", ".join(f"{quote_ident(c)} = excluded.{quote_ident(c)}" for c in cols[1:])
    return (
        f"INSERT INTO {d.own(SNAPSHOT_TABLE)} ({names}) VALUES ({', '.join([p] * len(cols))}) "
        f"ON CONFLICT ({quote_ident('table')}) DO UPDATE SET {sets}"
    )


def ensure_tables(s: Session) -> None:
    for stmt in create_sql(s.dialect):
        s.execute(stmt)


def write(s: Session, rows: Iterable[TableSnapshot]) -> None:
    sql = upsert_sql(s.dialect)
    for r in rows:
        s.execute(
            sql,
            (
                r.table,
                r.state,
                r.position.lsn,
                r.position.seq,
                str(r.position),
                r.end_lsn,
                r.rows,
                r.origin,
                r.updated_at,
            ),
        )


def write_positions(s: Session, tables: Iterable[str], position: Position, whole: bool) -> None:
    """The applied positions a load sets: each loaded table's, and (``whole``: the target was loaded entirely) the
    unit end every table has reached (:mod:`mirrorline.apply.state`)."""
    applied.ensure(s)
    tables = list(tables)
    applied.write(s, tables, position, unit=whole)
    for t in tables:  # a table stopped alone at the target (held) applies again from its load
        applied.release(s, t)


def read(s: Session) -> dict[str, TableSnapshot]:
    d = s.dialect
    cols = ", ".join(
        quote_ident(c) for c in ["table", "state", "lsn", "seq", "end_lsn", "rows", "origin", "updated_at"]
    )
    if s.table_columns(f"public.{d.own_name(SNAPSHOT_TABLE)}") is None:
        return {}
    rows: list[tuple[Any, ...]] = s.query(f"SELECT {cols} FROM {d.own(SNAPSHOT_TABLE)}")
    return {
        r[0]: TableSnapshot(r[0], r[1], Position(int(r[2]), int(r[3])), int(r[4]), int(r[5]), r[6] or "", r[7] or "")
        for r in rows
    }


def target_state(
    snapshots: Mapping[str, TableSnapshot], tables: Iterable[str], applied: Position | None, caught_up: bool
) -> str:
    """The state of a target over ``tables`` (the configured ones). ``applied``: its applied position;
    ``caught_up``: it has applied everything the log holds and capture has confirmed past the load's end."""
    tables = list(tables)
    mine = [snapshots[t] for t in tables if t in snapshots]
    if any(r.state == "loading" for r in mine):
        return LOADING
    if not mine:
        return NEW
    if len(mine) < len(tables):
        return LOADING  # a table was added to the configuration and is not loaded yet
    end = max(r.end_lsn for r in mine)
    if caught_up or (applied is not None and applied.lsn >= end):
        return LIVE
    return CATCHING_UP
