"""DuckDB's SQL: its types, conversions and how verify reads a column."""

from __future__ import annotations

from mirrorline.apply import types as type_map
from mirrorline.apply.sql import Dialect, lit
from mirrorline.model import Column, quote_ident

CATALOG = "mirrorline_target"
"""The name a DuckDB target's database file is attached under (:class:`~mirrorline.apply.duckdb.DuckdbTarget`), and
the first part of every table name this dialect writes: a name of three parts is never read as a catalog's, so a
schema named ``temp``, ``system``, ``memory`` or like the file means that schema."""


class DuckdbDialect(Dialect):
    name = "duckdb"
    default_schema = "main"
    rebuilds_to_alter = True  # "Cannot change the type of this column: an index depends on it!", even in a rebuild's
    # transaction after DROP INDEX
    text_type = "VARCHAR"

    def table(self, table: str) -> str:
        return f"{quote_ident(CATALOG)}.{super().table(table)}"

    def own(self, name: str) -> str:
        return f"{quote_ident(CATALOG)}.{super().own(name)}"

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
