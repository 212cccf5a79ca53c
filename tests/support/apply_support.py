"""Shared helpers for the apply tests (no tests here): net batches built on Spark, targets of every kind, reading a
target's rows back."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from mirrorline.apply import Target, target_class
from mirrorline.compile.batch import NET_DDL, NetBatch
from mirrorline.model import Change, Column, Op, TableSchema
from mirrorline.position import Position

KINDS = [
    pytest.param("postgresql", marks=pytest.mark.pg, id="postgresql"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("duckdb", id="duckdb"),
    pytest.param("delta", id="delta"),
    pytest.param("iceberg", id="iceberg"),
]
SQL_KINDS = KINDS[:3]  # the databases (the failure path that re-applies changes one by one in SQL)
MODES = ["update", "mirror"]

ITEMS = TableSchema(
    "public.items",
    (Column("id", "integer", nullable=False), Column("name", "text"), Column("qty", "bigint"), Column("note", "text")),
    key=("id",),
)
ORDERS = TableSchema(
    "public.orders",
    (Column("id", "bigint", nullable=False), Column("item", "integer"), Column("status", "character varying(10)")),
    key=("id",),
)


def P(lsn: int, seq: int = 0) -> Position:
    return Position(lsn, seq)


DEFAULT_POS = Position(0x100)


def net(
    table: str,
    kind: str,
    key: Sequence[Any],
    new: dict[str, Any] | None = None,
    unchanged: Iterable[str] = (),
    pos: Position = DEFAULT_POS,
    moved_from: Sequence[Any] | None = None,
) -> tuple[Any, ...]:
    """One net row in the compile -> apply layout."""
    str_new = None if new is None else {k: (None if v is None else str(v)) for k, v in new.items()}
    moved = None if moved_from is None else [str(k) for k in moved_from]
    return (table, kind, [str(k) for k in key], str_new, sorted(unchanged), pos.lsn, pos.seq, moved)


def batch(
    spark: Any,
    rows: list[tuple[Any, ...]],
    start: Position,
    end: Position,
    tables: list[str] | None = None,
    truncated: dict[str, Position] | None = None,
    changes: int | None = None,
) -> NetBatch:
    df = spark.createDataFrame(rows, NET_DDL)
    if tables is None:
        tables = list(dict.fromkeys(r[0] for r in rows))
    return NetBatch(
        start=start,
        end=end,
        tables=tables,
        net=df,
        truncated=truncated or {},
        changes=len(rows) if changes is None else changes,
    )


def change(
    table: str,
    op: str,
    key: Sequence[Any],
    new: dict[str, Any] | None = None,
    pos: Position = DEFAULT_POS,
    unchanged: Iterable[str] = (),
    old_key: Sequence[Any] | None = None,
) -> Change:
    str_new = None if new is None else {k: (None if v is None else str(v)) for k, v in new.items()}
    return Change(
        pos=pos,
        commit_ts=0,
        xid=1,
        table=table,
        op=Op(op),
        key=tuple(str(k) for k in key),
        new=str_new,
        unchanged=frozenset(unchanged),
        old_key=None if old_key is None else tuple(str(k) for k in old_key),
    )


def open_target(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    mode: str = "update",
    on_error: str = "stop",
    threads: int = 1,
    **options: Any,
) -> Target:
    location = request.getfixturevalue("pg").dsn if kind == "postgresql" else str(tmp_path / f"target.{kind}")
    target = target_class(kind)("t1", location, mode=mode, on_error=on_error, threads=threads, **options)
    request.addfinalizer(target.close)
    return target


def sql(target: Target, statement: str) -> list[tuple[Any, ...]]:
    """Run one statement on the target in its own transaction; rows for a query."""
    s = target.session()
    try:
        s.begin()
        rows = s.query(statement) if statement.lstrip().upper().startswith("SELECT") else (s.execute(statement), [])[1]
        s.commit()
        return rows
    finally:
        s.close()


def fetch(target: Target, table: str, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The target's rows of ``table`` read by the kind's own client (:func:`oracle.read`, not through mirrorline),
    sorted."""
    import oracle

    rows = oracle.read(target.kind, target.location, table, list(columns))
    assert rows is not None, f"target {target.name}: no table {table}"
    return sorted(rows, key=repr)
