"""SQLite target: one file, one writer at a time. Worktables are TEMP tables filled with ``executemany`` inside the
unit's transaction (``BEGIN IMMEDIATE``, so concurrent apply threads queue for the write lock instead of failing).
WAL journal, ``synchronous = NORMAL``: a crash may lose the last units, but never data without its position.

SQLite's casts never fail, so conversions are checked in SQL and a bad value calls ``mirrorline_bad``, which raises
with the table, column, type and value."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from mirrorline.apply.engine import Target
from mirrorline.apply.session import Session
from mirrorline.apply.sql import SQLITE
from mirrorline.errors import TargetError

_UDF_FAILED = "user-defined function raised exception"


class SqliteSession(Session):
    dialect = SQLITE
    db_errors = (sqlite3.Error,)

    def __init__(self, path: str) -> None:
        try:
            self.conn = sqlite3.connect(path, timeout=120, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise TargetError(f"cannot open SQLite database {path}: {e}", target=path) from e
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.last_bad: str | None = None
        self.conn.create_function("mirrorline_bad", 4, self._bad, deterministic=True)
        self.conn.create_function("mirrorline_unhex", 1, self._unhex, deterministic=True)

    def _bad(self, value: Any, type_name: str, table: str, column: str) -> None:
        if value is None:
            return None
        self.last_bad = f"{table}.{column}: {value!r} is not a valid {type_name} value for SQLite"
        raise ValueError(self.last_bad)

    def _unhex(self, value: str) -> bytes:
        try:
            return bytes.fromhex(value[2:])
        except ValueError:
            self.last_bad = f"{value[:40]!r} is not a valid bytea value (expected \\x and hex digits)"
            raise

    def begin(self) -> None:
        self.last_bad = None
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(sql, tuple(params))

    def dml(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, tuple(params)).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, tuple(params)).fetchall()

    def load(self, name: str, columns: Sequence[str], data: pa.Table) -> None:
        self.execute(self.dialect.create_worktable(name, columns))
        marks = ", ".join("?" * len(columns))
        rows = zip(*(data.column(i).to_pylist() for i in range(data.num_columns)), strict=True)
        self.conn.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)

    def table_columns(self, table: str) -> list[str] | None:
        _, name = self.dialect.names(table)
        cols = [r[1] for r in self.conn.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()]
        return cols or None

    def is_data_error(self, exc: BaseException) -> bool:
        if isinstance(exc, sqlite3.IntegrityError | sqlite3.DataError):
            return True
        return isinstance(exc, sqlite3.OperationalError) and _UDF_FAILED in str(exc)

    def error_text(self, exc: BaseException) -> str:
        if _UDF_FAILED in str(exc) and self.last_bad:
            return self.last_bad
        return super().error_text(exc)

    def reusable(self) -> bool:
        return not self.conn.in_transaction

    def reset(self) -> bool:
        self.rollback()
        return self.reusable()

    def disconnect(self) -> None:
        self.conn.close()


class SqliteTarget(Target):
    kind = "sqlite"
    dialect = SQLITE

    def connect(self) -> Session:
        return SqliteSession(self.location)
