"""Type mapping, what every target kind shares: PostgreSQL's types classified (as ``format_type()`` prints them),
:class:`TypeInfo` (a column's type at the target and how a value that arrives as PostgreSQL text is turned into it),
and the error for a type a target cannot hold. Each kind's mapping is its dialect's ``type_info`` (in its module).
Pure code.

Values travel as PostgreSQL's text output: booleans ``t``/``f``, ``bytea`` as ``\\x`` + hex, timestamps as ISO text,
numerics as exact decimal text, arrays / json / ranges as their text forms.

============================  =====================  ==========================  ===================================
PostgreSQL type               PostgreSQL target      SQLite target               DuckDB target
============================  =====================  ==========================  ===================================
smallint, integer, bigint     same                   INTEGER (checked)           SMALLINT, INTEGER, BIGINT
oid                           same                   INTEGER (checked)           UBIGINT
boolean                       same                   INTEGER 1/0                 BOOLEAN
real, double precision        same                   REAL (checked; NaN refused) REAL, DOUBLE
numeric(p,s)                  same                   TEXT (exact decimal)        DECIMAL(p,s) if p <= 38, else VARCHAR
numeric (no precision)        same                   TEXT (exact decimal)        VARCHAR (exact decimal text)
money                         same                   TEXT                        VARCHAR
text, varchar(n), char(n),    same                   TEXT                        VARCHAR
name, citext
bytea                         same                   BLOB                        BLOB
date                          same                   TEXT (ISO)                  DATE
time [without time zone]      same                   TEXT (ISO)                  TIME
timestamp [without t. z.]     same                   TEXT (ISO)                  TIMESTAMP
timestamp with time zone      same                   TEXT (ISO, with offset)     TIMESTAMPTZ
uuid                          same                   TEXT                        UUID
json, jsonb                   same                   TEXT                        JSON
interval, time with time      same                   TEXT                        VARCHAR
zone, xml, inet, cidr,
macaddr, macaddr8, bit(n),
bit varying(n), any array
anything else (enums,         the target must have   error                       error
geometric, ranges,            the type (checked)
tsvector, domains ...)
============================  =====================  ==========================  ===================================

A value that does not convert is an error of the database (PostgreSQL, DuckDB) or of mirrorline's checking functions
(SQLite), never a silent zero or null.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mirrorline.errors import TargetError

INT_TYPES = {"smallint": "SMALLINT", "integer": "INTEGER", "bigint": "BIGINT", "oid": "UBIGINT"}
FLOAT_TYPES = {"real": "REAL", "double precision": "DOUBLE"}
TEXT_TYPES = {"text", "character varying", "varchar", "character", "char", "bpchar", "name", "citext", '"char"'}
AS_TEXT_TYPES = {
    "interval",
    "time with time zone",
    "xml",
    "inet",
    "cidr",
    "macaddr",
    "macaddr8",
    "bit",
    "bit varying",
    "money",
}
DIRECT_TYPES = {
    "date": "DATE",
    "time without time zone": "TIME",
    "time": "TIME",
    "timestamp without time zone": "TIMESTAMP",
    "timestamp": "TIMESTAMP",
    "timestamp with time zone": "TIMESTAMPTZ",
    "timestamptz": "TIMESTAMPTZ",
    "uuid": "UUID",
    "json": "JSON",
    "jsonb": "JSON",
}
_TYPMOD_RE = re.compile(r"\(([^)]*)\)")


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """How one PostgreSQL column type lives in a target."""

    pg_type: str  # as given: "numeric(10,2)"
    target_type: str  # the column type to create in the target
    conv: str  # how text becomes a value: "text" (as is), "cast", "int", "real", "bool", "bytea"


def base_type(type_name: str) -> str:
    """``"character varying(20)"`` -> ``"character varying"``; ``"timestamp(3) with time zone"`` -> ``"timestamp with
    time zone"``; arrays keep their ``[]``."""
    t = type_name.strip().lower()
    t = _TYPMOD_RE.sub("", t)
    return re.sub(r"\s+", " ", t).strip()


def typmod(type_name: str) -> list[int]:
    m = _TYPMOD_RE.search(type_name)
    if not m:
        return []
    try:
        return [int(x) for x in m.group(1).split(",")]
    except ValueError:
        return []


def decimal(type_name: str) -> tuple[int, int] | None:
    """``numeric(p,s)`` with 1 <= p <= 38 and 0 <= s <= p (what DECIMAL types hold) -> (p, s); else None."""
    mod = typmod(type_name)
    if mod and 1 <= mod[0] <= 38:
        scale = mod[1] if len(mod) > 1 else 0
        if 0 <= scale <= mod[0]:
            return mod[0], scale
    return None


def cannot_hold(dialect: str, table: str, column: str, type_name: str) -> TargetError:
    return TargetError(
        f"the {dialect} target cannot hold column {column} of {table}: type {type_name}",
        hint="exclude the table, change the column's type at the source, or use a PostgreSQL target",
        table=table,
        column=column,
        type=type_name,
    )
