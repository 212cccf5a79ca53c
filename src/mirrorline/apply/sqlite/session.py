"""SQLite target: one file, one writer at a time. Worktables are TEMP tables filled with ``executemany`` inside the
unit's transaction (``BEGIN IMMEDIATE``, so concurrent apply threads queue for the write lock instead of failing).
WAL journal, ``synchronous = NORMAL``: a crash may lose the last units, but never data without its position.
Checkpoints run after each commit in a thread of their own (:mod:`mirrorline.apply.sqlite.checkpoint`), not in the
committing connection.

SQLite's casts never fail, so conversions are checked in SQL and a bad value calls ``mirrorline_bad``, which raises
with the table, column, type and value."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply.chunks import read_chunk
from mirrorline.apply.session import Session
from mirrorline.apply.sql import OWN_INDEX, Dialect
from mirrorline.apply.sqlite.checkpoint import Checkpointer
from mirrorline.apply.sqlite.dialect import SQLITE, values_list
from mirrorline.errors import TargetError
from mirrorline.limits import slice_rows
from mirrorline.model import TableSchema, quote_ident

_UDF_FAILED = "user-defined function raised exception"


ROWS_A_STATEMENT = 4_000  # rows of an INSERT of many (fewer when they would pass SQLite's limit of parameters)


def _values(columns: Sequence[pa.Array]) -> list[Any]:
    """Arrow columns as Python values: text through NumPy (an object array, made in C), the rest as lists."""
    text = (pa.types.is_string, pa.types.is_large_string)
    return [c.to_numpy(zero_copy_only=False) if any(t(c.type) for t in text) else c.to_pylist() for c in columns]


def sqlite_values(batch: pa.RecordBatch, schema: TableSchema, dialect: Dialect) -> list[list[Any]]:
    """Columns of Python values as apply's SQLite conversions store them."""
    out: list[list[Any]] = []
    for arr, col in zip(batch.columns, schema.columns, strict=True):
        conv = dialect.type_info(schema.table, col).conv
        if conv == "int":
            out.append(pc.cast(arr, pa.int64()).to_pylist())
        elif conv == "real":  # a NaN as the text 'NaN' (SQLite's reals have none)
            vals = pc.cast(arr, pa.float64())
            out.append(["NaN" if v is not None and v != v else v for v in vals.to_pylist()])
        elif conv == "bool":
            out.append(pc.cast(pc.equal(arr, "t"), pa.int64()).to_pylist())
        elif conv == "bytea":
            out.append([None if v is None else bytes.fromhex(v[2:]) for v in arr.to_pylist()])
        else:
            out.append(arr.to_pylist())
    return out


class SqliteSession(Session):
    dialect = SQLITE
    db_errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: str, checkpointer: Checkpointer | None = None, page_size: int | None = None) -> None:
        self.checkpointer = checkpointer
        try:
            self.conn = sqlite3.connect(path, timeout=120, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise TargetError(f"cannot open SQLite database {path}: {e}", target=path) from e
        if page_size is not None:  # a new database's (before anything is written); an existing one keeps its own
            self.conn.execute(f"PRAGMA page_size = {int(page_size)}")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        if checkpointer is not None:  # its checkpoints run in their own thread, not inside COMMIT
            self.conn.execute("PRAGMA wal_autocheckpoint = 0")
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
        if self.checkpointer is not None:
            self.checkpointer.settle()
        self.conn.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.conn.execute("COMMIT")
        if self.checkpointer is not None:
            self.checkpointer.due()

    def rollback(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(sql, tuple(params))

    def dml(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, tuple(params)).rowcount

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, tuple(params)).fetchall()

    def begin_read(self) -> None:
        self.conn.execute("BEGIN")  # deferred: a read snapshot at the first read, writers not blocked (WAL)

    def fetch(self, sql: str, size: int = 10_000) -> Iterator[list[tuple[Any, ...]]]:
        cur = self.conn.execute(sql)
        while batch := cur.fetchmany(size):
            yield batch

    def insert_many(self, sql_of: Callable[[int], str], columns: Sequence[Sequence[Any]]) -> int:
        """Rows given as columns of Python values (of equal length), inserted by statements of many rows each:
        ``sql_of(r)`` takes ``r`` rows of parameters, row after row. SQLite runs each statement without the GIL, where
        ``executemany`` takes the GIL back after every row, and beside a thread busy in Python each row then waits for
        it (``bench/bigtxn``: SQLite's apply of 1M inserts beside ``run``'s other threads). Returns the number of rows
        inserted."""
        k, rows = len(columns), len(columns[0]) if columns else 0
        grid = np.empty((rows, k), dtype=object)
        for j, col in enumerate(columns):
            grid[:, j] = col
        flat = grid.ravel().tolist()
        per = max(1, min(ROWS_A_STATEMENT, self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // max(k, 1)))
        full, n = sql_of(per), 0
        for i in range(0, rows, per):
            r = min(per, rows - i)
            n += self.conn.execute(full if r == per else sql_of(r), flat[i * k : (i + r) * k]).rowcount
        return n

    def load(self, name: str, columns: Sequence[str], data: pa.Table) -> None:
        self.execute(self.dialect.create_worktable(name, columns))
        for part in data.to_batches(max_chunksize=slice_rows(data.nbytes, data.num_rows)):  # one slice's Python objects
            self.insert_many(lambda r: f"INSERT INTO {name} {values_list(len(columns), r)}", _values(part.columns))

    def insert_rows(self, ts: TableSchema, data: Iterable[pa.Table]) -> int:
        """Statements of many rows (:meth:`insert_many`), their text converted and checked in SQL as a worktable's
        rows would be (:meth:`SqliteDialect.insert_values`): one pass over the table's own columns."""
        n = 0
        for chunk in data:
            for part in chunk.to_batches(max_chunksize=slice_rows(chunk.nbytes, chunk.num_rows)):  # one slice's objects
                cols = [part.column(part.schema.get_field_index(c)) for c in ts.column_names]
                n += self.insert_many(lambda r: self.dialect.insert_values(ts, r), _values(cols))
        return n

    def bulk_begin(self) -> None:
        self.conn.execute("PRAGMA synchronous = OFF")  # the load is one transaction: it commits whole or not at all

    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """Rows converted as apply's conversions store them, by statements of many rows (:meth:`insert_many`)."""
        cols = ", ".join(quote_ident(c) for c in ts.column_names)
        head = f"INSERT INTO {self.dialect.table(ts.table)} ({cols}) "
        n = 0
        for batch in read_chunk(path, ts.column_names, header):
            n += self.insert_many(
                lambda r: head + values_list(len(ts.columns), r), sqlite_values(batch, ts, self.dialect)
            )
        return n

    def table_columns(self, table: str) -> list[str] | None:
        _, name = self.dialect.names(table)
        cols = [r[1] for r in self.conn.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()]
        return cols or None

    def user_indexes(self, table: str) -> list[tuple[str, str]]:
        _, name = self.dialect.names(table)
        rows = self.conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
            (name,),
        ).fetchall()
        return [(n, q) for n, q in rows if not n.startswith(OWN_INDEX)]

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
        self.conn.execute("PRAGMA synchronous = NORMAL")  # after a snapshot's load (bulk_begin)
        return self.reusable()

    def disconnect(self) -> None:
        self.conn.close()
