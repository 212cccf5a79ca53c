"""A Delta target's session: mirrorline's own state in ``_mirrorline.sqlite`` beside the tables, and the consistent read
``verify`` checksums; values typed by DuckDB's casts."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from mirrorline.apply import types as type_map
from mirrorline.apply.canonical import native_text
from mirrorline.apply.chunks import read_chunk
from mirrorline.apply.delta.dialect import DELTA, STATE_FILE, _open, duck_connection, table_position
from mirrorline.apply.session import Session
from mirrorline.apply.sqlite import SqliteSession
from mirrorline.apply.state import read as read_state
from mirrorline.apply.target import TargetRead
from mirrorline.errors import ApplyError, TargetError
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import Position

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from mirrorline.apply.delta.target import DeltaTarget

log = logging.getLogger(__name__)


class DeltaSession(Session):
    """A transaction on ``_mirrorline.sqlite`` (mirrorline's own tables: positions, snapshot state, rejects, through a
    SQLite session it holds) plus the Delta writes of a snapshot's load: the tables emptied (:meth:`truncate`) are
    overwritten at :meth:`commit`, each in one Delta commit with the position the transaction gave it, before the
    state file commits (a crash in between leaves the load ``loading``: it is loaded again)."""

    dialect = DELTA
    db_errors: tuple[type[BaseException], ...] = (*SqliteSession.db_errors, duckdb.Error, OSError)

    def __init__(self, target: DeltaTarget) -> None:
        try:
            target.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TargetError(
                f"target {target.name}: cannot use {target.root} as the Delta target's folder: {e.strerror or e}",
                hint="point the target's url at a folder (delta:///relative/path or delta:////absolute/path)",
                target=target.name,
            ) from e
        self.state = SqliteSession(str(target.root / STATE_FILE))
        self.target = target
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
            self._pending[ts.table].append(typed(self._con, data, ts, list(ts.column_names)))
            n += batch.num_rows
        return n

    def table_columns(self, table: str) -> list[str] | None:
        """A Delta table's columns, or one of mirrorline's own tables' in the state file."""
        dt = _open(self.dialect.table_dir(self.target.root, table))
        if dt is not None:
            return [f.name for f in dt.schema().fields]
        return self.state.table_columns(table)

    def is_data_error(self, exc: BaseException) -> bool:
        if isinstance(exc, duckdb.ConversionException | duckdb.InvalidInputException | duckdb.OutOfRangeException):
            return True
        return self.state.is_data_error(exc)

    def disconnect(self) -> None:
        if self._con is not None:
            self._con.close()
        self.state.disconnect()


def typed(con: duckdb.DuckDBPyConnection, data: pa.Table, ts: TableSchema, columns: Sequence[str]) -> pa.Table:
    """Text rows holding ``columns`` of ``ts`` -> the Delta table's Arrow types (every column of ``ts``, missing
    ones null)."""
    view = "mirrorline_text"
    con.register(view, data)
    try:
        have = set(columns)
        exprs = [
            (DELTA.convert(quote_ident(c.name), ts, c) if c.name in have else "NULL") + f" AS {quote_ident(c.name)}"
            for c in ts.columns
        ]
        out = con.sql(f"SELECT {', '.join(exprs)} FROM {view}").to_arrow_table()
    finally:
        con.unregister(view)
    return out.cast(DELTA.arrow_schema(ts))


@dataclass
class _Failure:
    kind: str  # D, U, I, M (the row to take unsent columns from)
    key: list[Any]
    position: str
    what: str
    image: dict[str, Any] | None
    error: ApplyError | None = None  # the error to stop with, when it is not the generic one
    op: str = ""  # the kind of the last change folded into the net change, when known (I, U, D)


class _DeltaRead(TargetRead):
    def __init__(self, target: DeltaTarget) -> None:
        self.target = target
        self.position = target.applied_positions().live  # (a table stopped alone is behind it: not compared)
        self._tables: dict[str, DeltaTable | None] = {}

    def _table(self, table: str) -> DeltaTable | None:
        if table not in self._tables:
            dt = _open(DELTA.table_dir(self.target.root, table))
            if dt is not None and table_position(dt, self.target.name) > self.position:
                self._as_of(table, dt)
            self._tables[table] = dt
        return self._tables[table]

    def _as_of(self, table: str, dt: DeltaTable) -> None:
        """A table one unit ahead of the target's position (its commit landed, the unit end not yet): read the
        version of its last commit at or before the position (later commits of others, such as a compaction,
        change no rows)."""
        name = self.target.name
        for commit in dt.history():
            pos = commit.get("mirrorline.position")
            if commit.get("mirrorline.target") == name and pos and Position.parse(pos) <= self.position:
                dt.load_as_version(int(commit["version"]))
                return
            if commit.get("operation") in ("CREATE TABLE", "CREATE OR REPLACE TABLE"):
                dt.load_as_version(int(commit["version"]))
                return
        raise TargetError(
            f"target {name}: {table} is ahead of the target's position {self.position} and its history no longer "
            "holds the version at that position",
            hint="run mirrorline again so that the target's position catches up with its tables, then verify",
            target=name,
            table=table,
        )

    def columns(self, table: str) -> list[str] | None:
        dt = self._table(table)
        return None if dt is None else [f.name for f in dt.schema().fields]

    def rows(self, ts: TableSchema) -> Iterator[list[Sequence[str | None]]]:
        dt = self._table(ts.table)
        assert dt is not None
        convs = [native_text(c.type_name) for c in ts.columns]
        infos = [DELTA.type_info(ts.table, c) for c in ts.columns]
        # dates and timestamps as DuckDB's text of them: Python's have no year before 1 AD
        sel = ", ".join(
            type_map.duck_text(quote_ident(c.name), i.target_type == "timestamp")
            if i.conv == "time"
            else quote_ident(c.name)
            for c, i in zip(ts.columns, infos, strict=True)
        )
        con = duck_connection()
        try:
            for batch in dt.to_pyarrow_dataset().to_batches(columns=list(ts.column_names), batch_size=10_000):
                con.register("mirrorline_rows", batch)
                data = con.sql(f"SELECT {sel} FROM mirrorline_rows").to_arrow_table()
                con.unregister("mirrorline_rows")
                cols = [data.column(i).to_pylist() for i in range(data.num_columns)]
                yield [[f(v) for f, v in zip(convs, row, strict=True)] for row in zip(*cols, strict=True)]
        finally:
            con.close()
