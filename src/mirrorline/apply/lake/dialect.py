"""What the table formats (Delta, Iceberg) share of a dialect: PostgreSQL types as the format's, written as Arrow's,
and the DuckDB SQL that converts the text values of the net rows to them (an error names table, column and value)."""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import pyarrow as pa

from mirrorline.apply import types as type_map
from mirrorline.apply.sql import Dialect, lit
from mirrorline.model import Column, TableSchema, split_table_name

STATE_FILE = "_mirrorline.sqlite"
LOCK_FILE = "_mirrorline.lock"  # the applier lock (mirrorline.apply.lock)
COMMIT_ATTEMPTS = 5  # a table's commit of a unit, redone when a concurrent commit (a compaction) won
OP_COL, GROUP_COL = "_ml_op", "_ml_group"

# a table format's type -> (DuckDB type its text is cast to, Arrow type written); each format names its own
TYPES: dict[str, tuple[str, pa.DataType]] = {
    "short": ("SMALLINT", pa.int16()),
    "integer": ("INTEGER", pa.int32()),
    "long": ("BIGINT", pa.int64()),
    "float": ("REAL", pa.float32()),
    "double": ("DOUBLE", pa.float64()),
    "boolean": ("BOOLEAN", pa.bool_()),
    "date": ("DATE", pa.date32()),
    "timestamp_ntz": ("TIMESTAMP", pa.timestamp("us")),
    "timestamp": ("TIMESTAMPTZ", pa.timestamp("us", tz="UTC")),
    "binary": ("BLOB", pa.binary()),
    "string": ("VARCHAR", pa.string()),
}
INTS = {"smallint": "short", "integer": "integer", "bigint": "long", "oid": "long"}
FLOATS = {"real": "float", "double precision": "double"}
TIMES = {
    "date": "date",
    "timestamp without time zone": "timestamp_ntz",
    "timestamp": "timestamp_ntz",
    "timestamp with time zone": "timestamp",
    "timestamptz": "timestamp",
}
STRING_TYPES = {"uuid", "json", "jsonb", "time", "time without time zone"}


class LakeDialect(Dialect):
    """The type mapping of a table format: PostgreSQL types as the format's (written as Arrow's), and the DuckDB SQL
    that converts text to them. mirrorline's own tables (positions, rejects) live in a SQLite file beside the tables,
    so the statements the engine writes for them are plain SQL with ``?`` parameters and no schemas. A format gives
    its type names (:attr:`TYPES` and the maps after it), its name for messages (:attr:`title`) and where a table
    lives."""

    title = "lake"  # the format, in messages ("a Delta decimal(10,2) column")
    types = TYPES  # the format's type names: their DuckDB and Arrow types
    ints, floats, times, string_types = INTS, FLOATS, TIMES, STRING_TYPES  # PostgreSQL's types -> the format's
    zoned = frozenset({"timestamp"})  # the format's types of timestamps with a time zone
    default_schema = None  # no schemas: "sales.orders" is one name (and one folder, see table_dir)

    def names(self, table: str) -> tuple[str | None, str]:
        schema, name = split_table_name(table)
        return None, (name if schema == "public" else f"{schema}.{name}")

    def schema(self, table: str) -> str | None:
        return None

    def text_param(self) -> str:
        return "?"

    def retype(self, table: str, c: Column) -> list[str] | None:
        return None  # a column's type changes by rewriting the table (the format's follow_schema)

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        b = type_map.base_type(col.type_name)
        if b.endswith("[]") or b in type_map.TEXT_TYPES or b in type_map.AS_TEXT_TYPES or b in self.string_types:
            return type_map.TypeInfo(col.type_name, "string", "text")
        if b in self.ints:
            return type_map.TypeInfo(col.type_name, self.ints[b], "cast")
        if b in self.floats:
            return type_map.TypeInfo(col.type_name, self.floats[b], "cast")
        if b == "boolean":
            return type_map.TypeInfo(col.type_name, "boolean", "cast")
        if b == "bytea":
            return type_map.TypeInfo(col.type_name, "binary", "bytea")
        if b == "numeric":
            ps = type_map.decimal(col.type_name)
            if ps is not None:  # the formats' decimals have no NaN
                return type_map.TypeInfo(col.type_name, f"decimal({ps[0]},{ps[1]})", "cast", type_map.NAN)
            return type_map.TypeInfo(col.type_name, "string", "text")
        if b in self.times:  # the formats' dates and timestamps: years 1 to 9999
            return type_map.TypeInfo(col.type_name, self.times[b], "time", type_map.OUTSIDE_1_9999)
        return type_map.TypeInfo(col.type_name, "string", "text")  # every other type as PostgreSQL's text of it

    def arrow_type(self, info: type_map.TypeInfo) -> pa.DataType:
        t = info.target_type
        if t.startswith("decimal("):
            p, s = (int(x) for x in t[len("decimal(") : -1].split(","))
            return pa.decimal128(p, s)
        return self.types[t][1]

    def arrow_schema(self, ts: TableSchema) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, self.arrow_type(self.type_info(ts.table, c)), nullable=True) for c in ts.columns]
        )

    def convert(self, expr: str, ts: TableSchema, col: Column) -> str:
        """DuckDB SQL turning the text ``expr`` into the column's value (an error names table, column and value)."""
        info = self.type_info(ts.table, col)
        if info.conv == "text":
            return expr
        where = lit(f"{ts.table}.{col.name}: ")
        if info.conv == "bytea":
            bad = f"error({where} || 'not a bytea value: ' || {expr})"
            return f"CASE WHEN starts_with({expr}, '\\x') THEN unhex(substr({expr}, 3)) ELSE {bad} END"
        decimal = info.target_type.startswith("decimal(")
        duck = info.target_type.upper() if decimal else self.types[info.target_type][0]
        text = type_map.duck_temporal(expr) if info.conv == "time" else expr
        return type_map.lossy_sql(expr, info.lossy, f"CAST({text} AS {duck})")

    def bad_value(self, expr: str, info: type_map.TypeInfo) -> str | None:
        """DuckDB SQL true for a text ``expr`` that :meth:`convert` refuses (None: every text converts)."""
        if info.conv == "text":
            return None
        if info.conv == "bytea":
            return f"({expr} IS NOT NULL AND NOT regexp_full_match({expr}, '\\\\x([0-9a-fA-F]{{2}})*'))"
        decimal = info.target_type.startswith("decimal(")
        duck = info.target_type.upper() if decimal else self.types[info.target_type][0]
        text = type_map.duck_temporal(expr) if info.conv == "time" else expr
        bad = f"({expr} IS NOT NULL AND TRY_CAST({text} AS {duck}) IS NULL)"
        cond = type_map.LOSSY[info.lossy].null_if if info.lossy else None
        if cond:
            return f"({bad} AND NOT {cond.format(expr)})"
        return bad


def duck_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con


def fit(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` as the table's columns: one the table has and the rows lack (dropped at the source since) is
    NULL, as it is in the rows a merge writes."""
    n = data.num_rows
    have = set(data.column_names)
    return pa.table(
        [data[f.name].cast(f.type) if f.name in have else pa.nulls(n, f.type) for f in schema], schema=schema
    )


class Conflict(Exception):
    """A commit lost to a concurrent one (a compaction, another writer): the table's apply is redone."""


def id_list(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids)) or "-1"
