"""A Delta target's names, types and commits: the dialect (PostgreSQL types as Arrow's), a table's folder, its
position in its Delta commits."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from mirrorline.apply import types as type_map
from mirrorline.apply.sql import Dialect, lit
from mirrorline.errors import TargetError, first_line
from mirrorline.model import Column, TableSchema, split_table_name
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)


STATE_FILE = "_mirrorline.sqlite"
LOCK_FILE = "_mirrorline.lock"  # the applier lock (mirrorline.apply.lock)
COMMIT_ATTEMPTS = 5  # a table's commit of a unit, redone when a concurrent commit (a compaction) won
OP_COL, GROUP_COL = "_ml_op", "_ml_group"

# Delta type -> (DuckDB type its text is cast to, Arrow type written)
_TYPES: dict[str, tuple[str, pa.DataType]] = {
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
_INTS = {"smallint": "short", "integer": "integer", "bigint": "long", "oid": "long"}
_FLOATS = {"real": "float", "double precision": "double"}
_TIMES = {
    "date": "date",
    "timestamp without time zone": "timestamp_ntz",
    "timestamp": "timestamp_ntz",
    "timestamp with time zone": "timestamp",
    "timestamptz": "timestamp",
}
_STRING_TYPES = {"uuid", "json", "jsonb", "time", "time without time zone"}


class DeltaDialect(Dialect):
    """The type mapping of the Delta target: PostgreSQL types as Delta's (Arrow's), the DuckDB SQL that converts text
    to them, a table's folder. mirrorline's own tables (positions, rejects) live in ``_mirrorline.sqlite`` beside the
    tables, so the statements the engine writes for them are plain SQL with ``?`` parameters and no schemas."""

    name = "delta"
    default_schema = None  # no schemas: "sales.orders" is one name (and one folder, see table_dir)

    def names(self, table: str) -> tuple[str | None, str]:
        schema, name = split_table_name(table)
        return None, (name if schema == "public" else f"{schema}.{name}")

    def schema(self, table: str) -> str | None:
        return None

    def text_param(self) -> str:
        return "?"

    def retype(self, table: str, c: Column) -> list[str] | None:
        return None  # a column's type changes by rewriting the table (DeltaTarget.follow_schema)

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        b = type_map.base_type(col.type_name)
        if b.endswith("[]") or b in type_map.TEXT_TYPES or b in type_map.AS_TEXT_TYPES or b in _STRING_TYPES:
            return type_map.TypeInfo(col.type_name, "string", "text")
        if b in _INTS:
            return type_map.TypeInfo(col.type_name, _INTS[b], "cast")
        if b in _FLOATS:
            return type_map.TypeInfo(col.type_name, _FLOATS[b], "cast")
        if b == "boolean":
            return type_map.TypeInfo(col.type_name, "boolean", "cast")
        if b == "bytea":
            return type_map.TypeInfo(col.type_name, "binary", "bytea")
        if b == "numeric":
            ps = type_map.decimal(col.type_name)
            if ps is not None:  # Delta's decimals have no NaN
                return type_map.TypeInfo(col.type_name, f"decimal({ps[0]},{ps[1]})", "cast", type_map.NAN)
            return type_map.TypeInfo(col.type_name, "string", "text")
        if b in _TIMES:  # Delta's dates and timestamps: years 1 to 9999
            return type_map.TypeInfo(col.type_name, _TIMES[b], "time", type_map.OUTSIDE_1_9999)
        return type_map.TypeInfo(col.type_name, "string", "text")  # every other type as PostgreSQL's text of it

    def arrow_type(self, info: type_map.TypeInfo) -> pa.DataType:
        t = info.target_type
        if t.startswith("decimal("):
            p, s = (int(x) for x in t[len("decimal(") : -1].split(","))
            return pa.decimal128(p, s)
        return _TYPES[t][1]

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
        duck = info.target_type.upper() if decimal else _TYPES[info.target_type][0]
        text = type_map.duck_temporal(expr) if info.conv == "time" else expr
        return type_map.lossy_sql(expr, info.lossy, f"CAST({text} AS {duck})")

    def bad_value(self, expr: str, info: type_map.TypeInfo) -> str | None:
        """DuckDB SQL true for a text ``expr`` that :meth:`convert` refuses (None: every text converts)."""
        if info.conv == "text":
            return None
        if info.conv == "bytea":
            return f"({expr} IS NOT NULL AND NOT regexp_full_match({expr}, '\\\\x([0-9a-fA-F]{{2}})*'))"
        decimal = info.target_type.startswith("decimal(")
        duck = info.target_type.upper() if decimal else _TYPES[info.target_type][0]
        text = type_map.duck_temporal(expr) if info.conv == "time" else expr
        bad = f"({expr} IS NOT NULL AND TRY_CAST({text} AS {duck}) IS NULL)"
        cond = type_map.LOSSY[info.lossy].null_if if info.lossy else None
        if cond:
            return f"({bad} AND NOT {cond.format(expr)})"
        return bad

    def table_dir(self, root: Path, table: str) -> Path:
        """``public.orders`` -> ``orders``; ``sales.orders`` (and a public name holding a dot) -> ``schema.name``.
        A name never leaves the folder or meets mirrorline's own files: ``/``, ``\\``, ``%``, ``~`` and a leading dot
        (``..``) are written ``~XX`` (their code in hex), and so is a dot in the schema and a name that is one of this
        folder's own files."""
        schema, name = split_table_name(table)
        if schema == "public" and "." not in name:
            return root / _folder_part(name)
        return root / f"{_folder_part(schema).replace('.', '~2E')}.{_folder_part(name)}"


DELTA = DeltaDialect()


def commit_properties(target: str, position: Position) -> Any:
    """A commit carrying the target's position: two application transactions and the commit's metadata."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata={"mirrorline.target": target, "mirrorline.position": str(position)},
        app_transactions=[Transaction(target, position.lsn), Transaction(f"{target}.seq", position.seq)],
    )


def table_position(dt: DeltaTable, target: str) -> Position:
    """What the table's last commit by ``target`` applied (ZERO: none yet)."""
    lsn = dt.transaction_version(target)
    if lsn is None:
        return ZERO
    return Position(int(lsn), int(dt.transaction_version(f"{target}.seq") or 0))


def _open(path: Path) -> DeltaTable | None:
    """The Delta table in ``path`` (None: there is none); one whose log cannot be read is a TargetError."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        return DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None
    except (DeltaError, OSError) as e:
        raise TargetError(
            f"cannot read the Delta table in {path}: {first_line(e)}",
            hint="repair the table (or move the folder away and snapshot the table again)",
            path=str(path),
        ) from e


def duck_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con


def _fit(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` as the Delta table's columns: one the table has and the rows lack (dropped at the source since) is
    NULL, as it is in the rows a MERGE writes."""
    n = data.num_rows
    have = set(data.column_names)
    return pa.table(
        [data[f.name].cast(f.type) if f.name in have else pa.nulls(n, f.type) for f in schema], schema=schema
    )


def _folder_part(part: str) -> str:
    # escaped as ~XX (delta-rs decodes %XX in a path): ~, /, \\, NUL, a leading dot, and this folder's own files
    out = "".join(f"~{ord(ch):02X}" if ch in "~/\\\x00%" else ch for ch in part)
    if out.startswith("."):
        out = "~2E" + out[1:]
    if out in (STATE_FILE, LOCK_FILE):
        out = "~5F" + out[1:]
    return out


def _unescape(part: str) -> str:
    return re.sub(r"~([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), part)


def _table_of(folder: str) -> str:
    """The source table whose Delta table is in ``folder`` (the inverse of :meth:`DeltaDialect.table_dir`)."""
    if "." not in folder:
        return f"public.{_unescape(folder)}"
    schema, name = folder.split(".", 1)
    return f"{_unescape(schema)}.{_unescape(name)}"


class _Conflict(Exception):
    """A commit lost to a concurrent one (a compaction, another writer): the table's apply is redone."""


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids)) or "-1"
