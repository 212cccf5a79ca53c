"""SQLite's SQL: no schemas, checked conversions (its casts never fail), rowid deletes."""

from __future__ import annotations

from collections.abc import Sequence

from mirrorline.apply import types as type_map
from mirrorline.apply.sql import Dialect, lit
from mirrorline.model import Column, TableSchema, quote_ident, split_table_name


class SqliteDialect(Dialect):
    name = "sqlite"
    default_schema = None  # no schemas: "public.orders" is "orders", "sales.orders" is "sales.orders"

    def names(self, table: str) -> tuple[str | None, str]:
        schema, name = split_table_name(table)
        return None, (name if schema == "public" else f"{schema}.{name}")

    def schema(self, table: str) -> str | None:
        return None

    def text_param(self) -> str:
        return "?"

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        b = type_map.base_type(col.type_name)
        if b.endswith("[]"):
            return type_map.TypeInfo(col.type_name, "TEXT", "text")
        if b in type_map.INT_TYPES:
            return type_map.TypeInfo(col.type_name, "INTEGER", "int")
        if b in type_map.FLOAT_TYPES:  # a -0 is stored as 0
            return type_map.TypeInfo(col.type_name, "REAL", "real", type_map.NEGATIVE_ZERO)
        if b == "boolean":
            return type_map.TypeInfo(col.type_name, "INTEGER", "bool")
        if b == "bytea":
            return type_map.TypeInfo(col.type_name, "BLOB", "bytea")
        return type_map.TypeInfo(col.type_name, "TEXT", "text")  # every other type as PostgreSQL's text of it

    def insert_values(self, s: TableSchema, rows: int) -> str:
        """Insert ``rows`` rows of text parameters (``s``'s columns, row after row), each value converted as a
        worktable's would be (:meth:`conv`, on the columns ``column1``... of the VALUES list)."""
        names = ", ".join(quote_ident(c.name) for c in s.columns)
        exprs = ", ".join(
            self.conv(f"column{i}", self.type_info(s.table, c), s.table, c.name) for i, c in enumerate(s.columns, 1)
        )
        return f"INSERT INTO {self.table(s.table)} ({names}) SELECT {exprs} FROM ({values_list(len(s.columns), rows)})"

    def retype(self, table: str, c: Column) -> list[str] | None:
        return None  # SQLite cannot change a column's type in place

    def conv(self, expr: str, info: type_map.TypeInfo, table: str = "", column: str = "") -> str:
        # SQLite casts never fail (CAST('abc' AS INTEGER) is 0): check first, else call the error function (which
        # returns NULL for a NULL value).
        if info.conv == "text":
            return expr
        bad = f"mirrorline_bad({expr}, {lit(info.pg_type)}, {lit(table)}, {lit(column)})"
        if info.conv == "int":
            ok = f"CAST(CAST({expr} AS INTEGER) AS TEXT) = {expr}"
            return f"CASE WHEN {ok} THEN CAST({expr} AS INTEGER) ELSE {bad} END"
        if info.conv == "bool":
            return f"CASE {expr} WHEN 't' THEN 1 WHEN 'f' THEN 0 ELSE {bad} END"
        if info.conv == "real":
            ok = f"{expr} GLOB '*[0-9]*' AND NOT {expr} GLOB '*[^0-9eE.+-]*'"
            return (  # a REAL column keeps a NaN as the text 'NaN' (SQLite's reals have none)
                f"CASE WHEN {ok} THEN CAST({expr} AS REAL) WHEN {expr} = 'Infinity' THEN 9e999 "
                f"WHEN {expr} = '-Infinity' THEN -9e999 WHEN {expr} = 'NaN' THEN 'NaN' ELSE {bad} END"
            )
        if info.conv == "bytea":
            return f"CASE WHEN substr({expr}, 1, 2) = '\\x' THEN mirrorline_unhex({expr}) ELSE {bad} END"
        raise ValueError(f"unknown conversion {info.conv}")

    def eq(self, a: str, b: str, nullable: bool) -> str:
        return f"{a} = {b}" if not nullable else f"{a} IS {b}"

    def join_delete(self, s: TableSchema, work: str, masks: Sequence[str] | None = None) -> str:
        tgt = self.table(s.table)
        match = self._key_match(s, "t", "w") + self._mask_filter("w", masks)
        return f"DELETE FROM {tgt} WHERE rowid IN (SELECT t.rowid FROM {work} AS w JOIN {tgt} AS t ON {match})"


def values_list(columns: int, rows: int) -> str:
    """``VALUES (?, ...), ...``: ``rows`` rows of ``columns`` parameters."""
    row = f"({', '.join('?' * columns)})"
    return "VALUES " + ", ".join([row] * rows)


SQLITE = SqliteDialect()
