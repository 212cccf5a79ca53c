"""DuckDB target: one file, opened once per target; every session (apply thread) is a cursor of that database.
Worktables are TEMP tables created straight from the Arrow rows (DuckDB scans a registered Arrow table without
copying it through Python)."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from mirrorline.apply import lock
from mirrorline.apply import types as type_map
from mirrorline.apply.chunks import read_chunk
from mirrorline.apply.engine import Target
from mirrorline.apply.lock import TargetBusy
from mirrorline.apply.session import Session
from mirrorline.apply.sql import OWN_INDEX, Dialect, lit
from mirrorline.apply.state import AppliedState
from mirrorline.errors import TargetError
from mirrorline.model import Column, TableSchema, quote_ident

_DATA_ERRORS = (
    duckdb.ConstraintException,
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.OutOfRangeException,
    duckdb.TypeMismatchException,
)
_views = itertools.count(1)


class DuckdbDialect(Dialect):
    name = "duckdb"
    default_schema = "main"
    rebuilds_to_alter = True  # "Cannot change the type of this column: an index depends on it!", even in a rebuild's
    # transaction after DROP INDEX
    text_type = "VARCHAR"

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        b = type_map.base_type(col.type_name)
        if b.endswith("[]") or b in type_map.TEXT_TYPES or b in type_map.AS_TEXT_TYPES:
            return type_map.TypeInfo(col.type_name, "VARCHAR", "text")
        if b in type_map.INT_TYPES:
            return type_map.TypeInfo(col.type_name, type_map.INT_TYPES[b], "cast")
        if b in type_map.FLOAT_TYPES:
            return type_map.TypeInfo(col.type_name, type_map.FLOAT_TYPES[b], "cast")
        if b == "boolean":
            return type_map.TypeInfo(col.type_name, "BOOLEAN", "cast")
        if b == "bytea":
            return type_map.TypeInfo(col.type_name, "BLOB", "bytea")
        if b == "numeric":
            ps = type_map.decimal(col.type_name)
            if ps is not None:  # DECIMAL has no NaN
                return type_map.TypeInfo(col.type_name, f"DECIMAL({ps[0]},{ps[1]})", "cast", type_map.NAN)
            return type_map.TypeInfo(col.type_name, "VARCHAR", "text")
        if b in type_map.TEMPORAL_TYPES:
            target = type_map.DIRECT_TYPES[b]
            lossy = type_map.AFTER_294246 if target.startswith("TIMESTAMP") else ""
            return type_map.TypeInfo(col.type_name, target, "time", lossy)
        if b in type_map.DIRECT_TYPES:
            return type_map.TypeInfo(col.type_name, type_map.DIRECT_TYPES[b], "cast")
        return type_map.TypeInfo(col.type_name, "VARCHAR", "text")  # every other type as PostgreSQL's text of it

    def conv(self, expr: str, info: type_map.TypeInfo, table: str = "", column: str = "") -> str:
        if info.conv == "bytea":  # PostgreSQL's hex form, \x...
            bad = f"error({lit(f'{table}.{column}: not a bytea value: ')} || {expr})"
            return f"CASE WHEN starts_with({expr}, '\\x') THEN unhex(substr({expr}, 3)) ELSE {bad} END"
        if info.conv == "time":
            return type_map.lossy_sql(expr, info.lossy, f"CAST({type_map.duck_temporal(expr)} AS {info.target_type})")
        return type_map.lossy_sql(expr, info.lossy, super().conv(expr, info, table, column))

    def read_expr(self, column: str, info: type_map.TypeInfo) -> str:
        """Dates, times and timestamps read as DuckDB's text of them: Python's have no infinity, no year before 1
        AD and no 24:00:00; a timestamp with time zone in UTC, whatever the connection's TimeZone."""
        if info.conv != "time":
            return column
        return type_map.duck_text(column, info.target_type == "TIMESTAMPTZ")


DUCKDB = DuckdbDialect()


class DuckdbSession(Session):
    dialect = DUCKDB
    db_errors = (duckdb.Error,)

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self.cur = conn.cursor()

    savepoints = False  # DuckDB has none: a reject restarts the serial pass

    def begin(self) -> None:
        self.cur.execute("BEGIN TRANSACTION")

    def commit(self) -> None:
        self.cur.execute("COMMIT")

    def rollback(self) -> None:
        self.cur.execute("ROLLBACK")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.cur.execute(sql, list(params) if params else None)

    def dml(self, sql: str, params: Sequence[Any] = ()) -> int:
        row = self.cur.execute(sql, list(params) if params else None).fetchone()
        return int(row[0]) if row else 0

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.cur.execute(sql, list(params) if params else None).fetchall()

    def fetch(self, sql: str, size: int = 10_000) -> Iterator[list[tuple[Any, ...]]]:
        res = self.cur.execute(sql)
        while batch := res.fetchmany(size):
            yield batch

    def load(self, name: str, columns: Sequence[str], data: pa.Table) -> None:
        view = f"mirrorline_arrow_{next(_views)}"
        self.cur.register(view, data.rename_columns(list(columns)))
        try:
            self.cur.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {view}")
        finally:
            self.cur.unregister(view)

    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """Each batch of the file registered as an Arrow view and converted by one INSERT ... SELECT."""
        d = self.dialect
        cols = ", ".join(quote_ident(c) for c in ts.column_names)
        exprs = ", ".join(
            d.conv(f"v.c{i}", d.type_info(ts.table, c), ts.table, c.name) for i, c in enumerate(ts.columns)
        )
        n = 0
        for batch in read_chunk(path, ts.column_names, header):
            n += batch.num_rows
            view = f"mirrorline_snap_{next(_views)}"
            self.cur.register(view, pa.Table.from_batches([batch]))
            try:
                self.cur.execute(f"INSERT INTO {d.table(ts.table)} ({cols}) SELECT {exprs} FROM {view} AS v")
            finally:
                self.cur.unregister(view)
        return n

    def table_columns(self, table: str) -> list[str] | None:
        schema, name = self.dialect.names(table)
        rows = self.cur.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = current_database() "
            "AND table_schema = ? AND table_name = ? ORDER BY ordinal_position",
            [schema, name],
        ).fetchall()
        return [r[0] for r in rows] or None

    def user_indexes(self, table: str) -> list[tuple[str, str]]:
        schema, name = self.dialect.names(table)
        rows = self.cur.execute(
            "SELECT index_name, sql FROM duckdb_indexes() WHERE database_name = current_database() "
            "AND schema_name = ? AND table_name = ? AND sql IS NOT NULL",
            [schema, name],
        ).fetchall()
        return [(n, q) for n, q in rows if not n.startswith(OWN_INDEX)]

    def is_data_error(self, exc: BaseException) -> bool:
        return isinstance(exc, _DATA_ERRORS)

    def error_text(self, exc: BaseException) -> str:
        text = str(exc).strip()
        return text.split("\n\nLINE")[0].strip() if text else type(exc).__name__

    def disconnect(self) -> None:
        self.cur.close()


class DuckdbTarget(Target):
    kind = "duckdb"
    dialect = DUCKDB

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._db: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    # DuckDB lets one process open a database file to write it. This target keeps it open between units, and lets
    # go of it when another mirrorline process takes its applier lock (verify, apply), so that one can open it.

    open_wait = 10.0  # seconds a connection waits for another process to close the database (a status, a reader)

    def connect(self) -> Session:
        with self._lock:
            deadline = time.monotonic() + self.open_wait
            while self._db is None:
                try:
                    self._db = duckdb.connect(self.location)
                except duckdb.Error as e:
                    if "lock" in str(e).lower() and time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    if "lock" in str(e).lower():
                        raise TargetBusy(
                            f"target {self.name}: another process holds the DuckDB database {self.location} open "
                            f"({str(e).strip().splitlines()[0]})",
                            hint="DuckDB lets one process open a database to write it: stop that process, or let it "
                            "finish",
                            target=self.name,
                        ) from e
                    raise TargetError(
                        f"cannot open DuckDB database {self.location}: {e}",
                        hint="check the path and the file",
                        target=self.name,
                    ) from e
            return DuckdbSession(self._db)

    def try_lock(self) -> Any:
        handle = super().try_lock()
        if handle is None:  # another mirrorline process applies to it, or reads it: it needs the file
            self._let_go()
        return handle

    def applied_positions(self) -> AppliedState:
        """As every kind's; and, looked at while another mirrorline process holds the applier lock (``verify``), the
        database let go of (:class:`TargetBusy`), so that process can open it."""
        if not lock.held_here(self):
            handle = super().try_lock()
            if handle is None:
                self._let_go()
                raise TargetBusy(
                    f"target {self.name}: another process holds its applier lock ({self.lock_holder()})",
                    target=self.name,
                )
            self.unlock(handle)
        return super().applied_positions()

    def _let_go(self) -> None:
        """Close the database (its idle sessions first), so that another process can open it."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for sess in idle:
            with contextlib.suppress(Exception):
                sess.disconnect()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def close(self) -> None:
        super().close()
        self._let_go()
