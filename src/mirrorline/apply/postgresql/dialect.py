"""PostgreSQL's SQL: types, text parameters, key operands and TRUNCATE."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirrorline.apply import types as type_map
from mirrorline.apply.sql import Dialect
from mirrorline.model import Column

if TYPE_CHECKING:
    pass


class PostgresDialect(Dialect):
    name = "postgresql"
    default_schema = "public"
    param = "%s"
    ordered_inserts = True  # rows in key order meet the key's index page by page
    row_id = "ctid"

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        """PostgreSQL holds its own types; whether the target database has a user-defined type is checked against it.
        Text types are assigned without an explicit cast so that a too-long value is an error, not a truncation."""
        b = type_map.base_type(col.type_name)
        if b in type_map.TEXT_TYPES:
            return type_map.TypeInfo(col.type_name, col.type_name, "text")
        return type_map.TypeInfo(col.type_name, col.type_name, "cast")

    def text_param(self) -> str:
        return "CAST(%s AS text)"

    def key_operands(self, target: str, text: str, info: type_map.TypeInfo, table: str, col: Column) -> tuple[str, str]:
        """A type without ``=`` (json, xml, the geometric types: part of a bag table's key) is compared as its text,
        which PostgreSQL writes the same way at the source and here."""
        if col.has_equality:
            return super().key_operands(target, text, info, table, col)
        return f"CAST({target} AS text)", text

    def truncate(self, table: str) -> str:
        return f"TRUNCATE {self.table(table)}"


POSTGRESQL = PostgresDialect()
