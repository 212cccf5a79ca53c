"""One connection to a target, the same small surface for every engine: transactions, statements, bulk loading
of a worktable from Arrow, catalog lookups. Each target module implements it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from mirrorline.apply.sql import Dialect
from mirrorline.errors import first_line
from mirrorline.model import TableSchema


class RowMissing(Exception):
    """A single-row change of the failure path found no row to change (``op``: U, D; I an insert that wrote none; M
    an insert whose unsent columns come from the old key's row)."""

    def __init__(self, op: str) -> None:
        what = {
            "U": "no row with this key at the target to update",
            "I": "the insert of this key wrote no row (a rule or trigger at the target swallowed it?)",
            "M": "no row with the old key at the target to take the columns the key change did not send from",
        }.get(op, "no row with this key at the target to delete")
        super().__init__(what if op == "I" else f"{what} (it was removed there, or never copied)")


class Session(ABC):
    dialect: Dialect
    db_errors: tuple[type[BaseException], ...] = ()  # what the engine's driver raises
    savepoints = True  # SAVEPOINT / ROLLBACK TO / RELEASE inside a transaction (not DuckDB)
    release: Callable[[Session], None] | None = None  # set by the target that keeps idle sessions for reuse

    @abstractmethod
    def begin(self) -> None: ...

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def rollback(self) -> None: ...

    @abstractmethod
    def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    @abstractmethod
    def dml(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run an INSERT/UPDATE/DELETE; the number of rows it touched."""

    @abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def begin_read(self) -> None:
        """Start a transaction that reads one consistent state of the database without blocking its writers."""
        self.begin()

    def fetch(self, sql: str, size: int = 10_000) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of a query in batches of ``size`` (native values), inside the current transaction."""
        rows = self.query(sql)
        for i in range(0, len(rows), size):
            yield rows[i : i + size]

    def before_joins(self, ts: TableSchema, rows: int) -> None:
        """The statements that follow, in this transaction, join a worktable of ``rows`` rows to ``ts``'s table by
        its key (the unit's deletes or updates): a session whose engine can be told how to join them says so here.
        Nothing by default."""
        return None

    def truncate(self, table: str) -> None:
        """Empty the target's table for the source table ``table`` (inside the current transaction)."""
        self.execute(self.dialect.truncate(table))

    @abstractmethod
    def load(self, name: str, columns: Sequence[str], data: pa.Table) -> None:
        """Create the temp worktable ``name`` (text columns) and bulk-load ``data`` into it."""

    def drop_worktable(self, name: str) -> None:
        """Drop a worktable :meth:`load` made (inside the current transaction)."""
        self.execute(self.dialect.drop_table(name))

    def insert_rows(self, ts: TableSchema, data: Iterable[pa.Table]) -> int:
        """Bulk-load text rows (``ts``'s columns, in its order), in chunks loaded as they come, straight into its
        table (engines whose bulk path converts text to the column's type as the worktables' conversions would:
        :attr:`SqlTarget.direct_inserts`). Returns the number of rows loaded."""
        raise NotImplementedError(f"{type(self).__name__} has no direct bulk insert")

    def bulk_begin(self) -> None:
        """Before a snapshot's load, one transaction that commits whole or not at all: what makes the engine's bulk
        path faster (undone by :meth:`reset` before the session serves again)."""
        return None

    @abstractmethod
    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """Load a snapshot's chunk file (:mod:`mirrorline.apply.chunks`) into ``ts``'s table by the engine's fastest
        bulk path, values stored as apply stores them; the number of rows loaded."""

    @abstractmethod
    def table_columns(self, table: str) -> list[str] | None:
        """The columns of the target's table for the source table ``table``, or None when it does not exist."""

    def tables_columns(self, tables: Sequence[str]) -> dict[str, list[str] | None]:
        """:meth:`table_columns` of each of ``tables`` (a kind whose catalog read has a cost of its own per query
        reads them in one)."""
        return {t: self.table_columns(t) for t in tables}

    def user_indexes(self, table: str) -> list[tuple[str, str]]:
        """The indexes made on the target's table by others than mirrorline (name, the statement that makes it):
        what a rebuild makes again afterwards. None known by default."""
        return []

    @abstractmethod
    def is_data_error(self, exc: BaseException) -> bool:
        """True when ``exc`` is about the data (a bad value, a constraint), not the connection or the server."""

    def error_text(self, exc: BaseException) -> str:
        return first_line(exc)

    def reusable(self) -> bool:
        """Can this connection serve the next unit: open, no transaction, no error (engines that keep their
        connections between units say so; worktables live inside the unit's transaction, so none is left)."""
        return False

    def reset(self) -> bool:
        """End what its last user left open, as closing the connection would (a rollback), and say whether it can
        serve again (:meth:`reusable`)."""
        return False

    @abstractmethod
    def disconnect(self) -> None:
        """Close the connection."""

    def close(self) -> None:
        """Done with it: back to its target, which keeps it for the next use when it is :meth:`reusable`, else
        disconnected."""
        if self.release is not None:
            self.release(self)
        else:
            self.disconnect()
