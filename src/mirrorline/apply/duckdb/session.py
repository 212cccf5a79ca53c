"""A DuckDB target's session: a cursor of the target's one open database."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from mirrorline.apply.chunks import read_chunk
from mirrorline.apply.duckdb.dialect import DUCKDB
from mirrorline.apply.session import Session
from mirrorline.apply.sql import OWN_INDEX
from mirrorline.model import TableSchema, quote_ident

_DATA_ERRORS = (
    duckdb.ConstraintException,
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.OutOfRangeException,
    duckdb.TypeMismatchException,
)
_views = itertools.count(1)


class DuckdbSession(Session):
    dialect = DUCKDB
    db_errors = (duckdb.Error,)

    def __init__(self, conn: duckdb.DuckDBPyConnection, catalog: str | None = None) -> None:
        """A cursor of ``conn``; ``catalog``: the attached database its unqualified names mean."""
        self.cur = conn.cursor()
        if catalog is not None:
            self.cur.execute(f"USE {quote_ident(catalog)}")
        self._worktables: set[str] = set()  # Arrow tables registered as worktables (see load)
        self.appended = 0  # rows appended by insert_rows and load_chunk (the target counts them as it lets go)

    savepoints = False  # DuckDB has none: a reject restarts the serial pass

    def begin(self) -> None:
        self.cur.execute("BEGIN TRANSACTION")

    def commit(self) -> None:
        self.cur.execute("COMMIT")

    def rollback(self) -> None:
        self.cur.execute("ROLLBACK")
        self._unregister()

    def _unregister(self) -> None:
        """Let go of the worktables a failed transaction left registered (a rollback does not touch them)."""
        for name in list(self._worktables):
            self.drop_worktable(name)

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
        """The rows registered as they are: DuckDB scans the Arrow table in place, no copy into a temp table (a 1M-row
        worktable is ~100 MB the process need not hold twice: bench/bigtxn's peak memory)."""
        self.cur.register(name, data.rename_columns(list(columns)))
        self._worktables.add(name)

    def drop_worktable(self, name: str) -> None:
        if name in self._worktables:
            self.cur.unregister(name)
            self._worktables.discard(name)
        else:
            super().drop_worktable(name)

    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """Each batch of the file registered as an Arrow view and converted by one INSERT ... SELECT."""
        return sum(self._insert_view(ts, pa.Table.from_batches([b])) for b in read_chunk(path, ts.column_names, header))

    def insert_rows(self, ts: TableSchema, data: Iterable[pa.Table]) -> int:
        """Each chunk, as it comes, registered as an Arrow view and converted by one INSERT ... SELECT (the
        conversions of a worktable's insert-select): the first rows land while the last are still being read."""
        return sum(self._insert_view(ts, chunk.select(list(ts.column_names))) for chunk in data)

    def _insert_view(self, ts: TableSchema, rows: pa.Table) -> int:
        """``rows`` (text, ``ts``'s columns in order) into its table, converted; the number inserted."""
        d = self.dialect
        cols = ", ".join(quote_ident(c) for c in ts.column_names)
        exprs = ", ".join(
            d.conv(f"v.c{i}", d.type_info(ts.table, c), ts.table, c.name) for i, c in enumerate(ts.columns)
        )
        view = f"mirrorline_view_{next(_views)}"
        # registered as a stream read once, not as the table: DuckDB holds a registered table's Arrow buffers until
        # the transaction ends, unregistered or not, so a unit's inserts would all stay in run's process until its
        # commit (tests/apply/test_apply_targets.py); a worktable: a failed INSERT aborts the transaction (no
        # unregister then), whose rollback lets go of it
        renamed = rows.rename_columns([f"c{i}" for i in range(len(ts.columns))])
        self.cur.register(view, pa.RecordBatchReader.from_batches(renamed.schema, renamed.to_batches()))
        self._worktables.add(view)
        n = self.dml(f"INSERT INTO {d.table(ts.table)} ({cols}) SELECT {exprs} FROM {view} AS v")
        self.drop_worktable(view)
        self.appended += n
        return n

    def table_columns(self, table: str) -> list[str] | None:
        return self.tables_columns([table])[table]

    def tables_columns(self, tables: Sequence[str]) -> dict[str, list[str] | None]:
        """One catalog query for all of ``tables`` (duckdb_columns(), what information_schema.columns is a view
        over, in a third of its time; a query costs about 0.5 ms of CPU however few tables it asks for: a unit asks
        for its tables' columns before it writes)."""
        names = {self.dialect.names(t): t for t in tables}
        found: dict[str, list[str]] = {}
        if names:
            marks = ", ".join("?" * len(names))
            rows = self.cur.execute(
                "SELECT schema_name, table_name, column_name FROM duckdb_columns() WHERE database_name = "
                f"current_database() AND table_name IN ({marks}) ORDER BY schema_name, table_name, column_index",
                [n for _, n in names],
            ).fetchall()
            for schema, name, column in rows:
                if (schema, name) in names:
                    found.setdefault(names[schema, name], []).append(column)
        return {t: found.get(t) for t in tables}

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
        self._worktables.clear()
        self.cur.close()
