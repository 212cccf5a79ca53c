"""A table format's session: mirrorline's own state in ``_mirrorline.sqlite`` beside the tables, the writes of a
snapshot's load, and the consistent read ``verify`` checksums; values typed by DuckDB's casts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from mirrorline.apply import types as type_map
from mirrorline.apply.canonical import native_text
from mirrorline.apply.chunks import read_chunk
from mirrorline.apply.history import HistoryShape
from mirrorline.apply.lake.dialect import STATE_FILE, LakeDialect, duck_connection
from mirrorline.apply.session import Session
from mirrorline.apply.sqlite import SqliteSession
from mirrorline.apply.state import read as read_state
from mirrorline.apply.target import TargetRead
from mirrorline.errors import ApplyError, TargetError
from mirrorline.model import TableSchema, quote_ident

if TYPE_CHECKING:
    from mirrorline.apply.lake.target import LakeTarget

log = logging.getLogger(__name__)


class LakeSession(Session):
    """A transaction on ``_mirrorline.sqlite`` (mirrorline's own tables: positions, snapshot state, rejects, through a
    SQLite session it holds) plus the table writes of a snapshot's load: the tables emptied (:meth:`truncate`) are
    overwritten at :meth:`commit`, each in one commit of its format with the position the transaction gave it, before
    the state file commits (a crash in between leaves the load ``loading``: it is loaded again)."""

    dialect: LakeDialect
    db_errors: tuple[type[BaseException], ...] = (*SqliteSession.db_errors, duckdb.Error, OSError)

    def __init__(self, target: LakeTarget) -> None:
        try:
            target.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TargetError(
                f"target {target.name}: cannot use {target.root} as the {target.dialect.title} target's folder: "
                f"{e.strerror or e}",
                hint=f"point the target's url at a folder ({target.kind}:///relative/path or "
                f"{target.kind}:////absolute/path)",
                target=target.name,
            ) from e
        self.state = SqliteSession(str(target.root / STATE_FILE))
        self.target = target
        self.dialect = target.dialect
        self._pending: dict[str, list[pa.Table]] = {}
        self._emptied: set[str] = set()
        self._con: duckdb.DuckDBPyConnection | None = None

    # -- the state file ----------------------------------------------------------------------------------------------
    def begin(self) -> None:
        self._pending, self._emptied = {}, set()
        self.state.begin()

    def rollback(self) -> None:
        self._pending, self._emptied = {}, set()
        self.state.rollback()

    def commit(self) -> None:
        if self._pending:
            positions = read_state(self)  # as this transaction set them
            for table, parts in self._pending.items():
                self.target.write(table, parts, positions.table(table), overwrite=table in self._emptied)
            self._pending, self._emptied = {}, set()
        self.state.commit()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.state.execute(sql, params)

    def dml(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.state.dml(sql, params)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.state.query(sql, params)

    def begin_read(self) -> None:
        self.state.begin_read()

    def fetch(self, sql: str, size: int = 10_000) -> Iterator[list[tuple[Any, ...]]]:
        return self.state.fetch(sql, size)

    def load(self, name: str, columns: Sequence[str], data: pa.Table) -> None:
        self.state.load(name, columns, data)

    def bulk_begin(self) -> None:
        self.state.bulk_begin()

    def error_text(self, exc: BaseException) -> str:
        return self.state.error_text(exc)

    def reusable(self) -> bool:
        return self.state.reusable()

    def reset(self) -> bool:
        self._pending, self._emptied = {}, set()
        return self.state.reset()

    # -- the tables --------------------------------------------------------------------------------------------------
    def truncate(self, table: str) -> None:
        self._pending[table] = []
        self._emptied.add(table)

    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """The chunk's rows converted, kept until :meth:`commit` writes them (added to the table's rows, or in
        place of them when it was emptied in this transaction)."""
        self._pending.setdefault(ts.table, [])
        if self._con is None:
            self._con = duck_connection()
        n = 0
        for batch in read_chunk(path, ts.column_names, header):
            data = pa.Table.from_batches([batch]).rename_columns(list(ts.column_names))
            shaped = self.target.shape(ts)  # (a table kept with its history: its columns filled by ``loaded``)
            self._pending[ts.table].append(typed(self._con, data, shaped, list(ts.column_names), self.dialect))
            n += batch.num_rows
        return n

    def rework(self, table: str, change: Callable[[pa.Table], pa.Table]) -> None:
        """Each of the rows loaded into ``table`` in this transaction changed by ``change`` before they commit."""
        self._pending[table] = [change(p) for p in self._pending.get(table, [])]

    def table_columns(self, table: str) -> list[str] | None:
        """A table's columns, or one of mirrorline's own tables' in the state file."""
        handle = self.target.open_table(table)
        if handle is not None:
            return self.target.columns_of(handle)
        return self.state.table_columns(table)

    def is_data_error(self, exc: BaseException) -> bool:
        if isinstance(exc, duckdb.ConversionException | duckdb.InvalidInputException | duckdb.OutOfRangeException):
            return True
        return self.state.is_data_error(exc)

    def disconnect(self) -> None:
        if self._con is not None:
            self._con.close()
        self.state.disconnect()


def typed(
    con: duckdb.DuckDBPyConnection, data: pa.Table, ts: TableSchema, columns: Sequence[str], dialect: LakeDialect
) -> pa.Table:
    """Text rows holding ``columns`` of ``ts`` -> the table's Arrow types in ``dialect`` (every column of ``ts``,
    missing ones null)."""
    view = "mirrorline_text"
    con.register(view, data)
    try:
        have = set(columns)
        exprs = [
            (dialect.convert(quote_ident(c.name), ts, c) if c.name in have else "NULL") + f" AS {quote_ident(c.name)}"
            for c in ts.columns
        ]
        out = con.sql(f"SELECT {', '.join(exprs)} FROM {view}").to_arrow_table()
    finally:
        con.unregister(view)
    return out.cast(dialect.arrow_schema(ts))


@dataclass
class Failure:
    kind: str  # D, U, I, M (the row to take unsent columns from)
    key: list[Any]
    position: str
    what: str
    image: dict[str, Any] | None
    error: ApplyError | None = None  # the error to stop with, when it is not the generic one
    op: str = ""  # the kind of the last change folded into the net change, when known (I, U, D)


class LakeRead(TargetRead):
    """The target's applied position and each table as of it: its current version, or (a table whose commit of a
    later unit landed before the unit end) the version of its last commit at or before the position
    (:meth:`LakeTarget.as_of`)."""

    def __init__(self, target: LakeTarget) -> None:
        self.target = target
        self.position = target.applied_positions().live  # (a table stopped alone is behind it: not compared)
        self._tables: dict[str, Any] = {}

    def _table(self, table: str) -> Any:
        if table not in self._tables:
            handle = self.target.open_table(table)
            if handle is not None and self.target.table_position(handle) > self.position:
                handle = self.target.as_of(table, handle, self.position)
            self._tables[table] = handle
        return self._tables[table]

    def columns(self, table: str) -> list[str] | None:
        handle = self._table(table)
        return None if handle is None else self.target.columns_of(handle)

    def rows(self, ts: TableSchema) -> Iterator[list[Sequence[str | None]]]:
        handle = self._table(ts.table)
        assert handle is not None
        dialect = self.target.dialect
        convs = [native_text(c.type_name) for c in ts.columns]
        infos = [dialect.type_info(ts.table, c) for c in ts.columns]
        # dates and timestamps as DuckDB's text of them: Python's have no year before 1 AD
        sel = ", ".join(
            type_map.duck_text(quote_ident(c.name), i.target_type in dialect.zoned)
            if i.conv == "time"
            else quote_ident(c.name)
            for c, i in zip(ts.columns, infos, strict=True)
        )
        hs = self.target.shape(ts)  # (a table kept with its history: its current rows)
        current = f" WHERE {hs.current}" if isinstance(hs, HistoryShape) else ""
        read = list(ts.column_names) + [c for c in hs.column_names if current and c not in ts.column_names]
        con = duck_connection()
        try:
            for batch in self.target.batches(handle, read):
                con.register("mirrorline_rows", batch)
                data = con.sql(f"SELECT {sel} FROM mirrorline_rows{current}").to_arrow_table()
                con.unregister("mirrorline_rows")
                cols = [data.column(i).to_pylist() for i in range(data.num_columns)]
                yield [[f(v) for f, v in zip(convs, row, strict=True)] for row in zip(*cols, strict=True)]
        finally:
            con.close()
