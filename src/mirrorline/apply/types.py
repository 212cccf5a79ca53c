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
real, double precision        same                   REAL (checked; NaN is kept  REAL, DOUBLE
                                                     as the text 'NaN')
numeric(p,s), p <= 38         same                   TEXT (exact decimal)        DECIMAL(p,s); **NaN becomes NULL**
numeric (no precision, or     same                   TEXT (exact decimal)        VARCHAR (exact decimal text)
p > 38)
money                         same                   TEXT                        VARCHAR
text, varchar(n), char(n),    same                   TEXT                        VARCHAR
name, citext, "char"
bytea                         same                   BLOB                        BLOB
date                          same                   TEXT (ISO)                  DATE (infinite and BC dates too)
time [without time zone]      same                   TEXT (ISO)                  TIME (24:00:00 too)
timestamp [without t. z.]     same                   TEXT (ISO)                  TIMESTAMP (infinite, BC too;
                                                                                 after the year 294246: NULL)
timestamp with time zone      same                   TEXT (ISO, with offset)     TIMESTAMPTZ (the same)
uuid                          same                   TEXT                        UUID
json, jsonb                   same                   TEXT                        JSON
any other type: interval,     same; a user type      TEXT (PostgreSQL's text)    VARCHAR (PostgreSQL's text)
time with time zone, xml,     (enum, domain,
inet, cidr, macaddr(8),       composite) must exist
bit(n), varbit, arrays,       in the target database
geometric, ranges and         (checked when the
multiranges, tsvector,        table is first seen)
tsquery, pg_lsn, jsonpath,
pg_snapshot, enums, domains,
composites
============================  =====================  ==========================  ===================================

The Delta target (:mod:`mirrorline.apply.delta`) maps the same way to Delta's types, and holds an infinite date or
timestamp, a date or timestamp outside the years 1 to 9999 AD (Delta's range), and a ``numeric(p,s)`` NaN, as NULL.
SQLite stores a real -0 as 0; DuckDB holds a timestamp after the year 294246 as NULL. A value a target cannot hold
is decided by the column's type when the table is first seen, never by a row mid-stream: :attr:`TypeInfo.lossy`
names the rule (:data:`LOSSY`) saying which PostgreSQL texts the column holds otherwise, and how; apply writes them
so, and ``verify`` compares the source's values the same way for that target.

A value that does not convert is an error of the database (PostgreSQL, DuckDB) or of mirrorline's checking functions
(SQLite), never a silent zero or null.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
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
    conv: str  # how text becomes a value: "text" (as is), "cast", "int", "real", "bool", "bytea", "time"
    lossy: str = ""  # the rule (LOSSY) for values the column's type cannot hold: how it holds them instead


NAN, OUTSIDE_1_9999, NEGATIVE_ZERO = "NaN", "outside the years 1 to 9999", "negative zero"
AFTER_294246 = "after the year 294246"
_YEARS_1_9999 = re.compile(r"^\d{4}-")
_LONG_YEAR = re.compile(r"^(\d{6,})-")


def _after_294246(v: str) -> bool:
    m = _LONG_YEAR.match(v)
    return m is not None and not v.endswith(" BC") and int(m.group(1)) > 294246


@dataclass(frozen=True, slots=True)
class Lossy:
    """Values of a column's type that a target's type for it cannot hold, and how the target holds them."""

    what: str  # for people: "NaN is held as NULL"
    null_if: str | None  # DuckDB SQL ({0}: the text) true for a value apply writes as NULL; None: the engine decides
    held: Callable[[str], str | None]  # PostgreSQL's text -> the text the target then holds (None: NULL)


LOSSY: dict[str, Lossy] = {
    NAN: Lossy("NaN is held as NULL", "{0} = 'NaN'", lambda v: None if v == "NaN" else v),
    OUTSIDE_1_9999: Lossy(  # infinity, BC and years beyond 9999 do not start with four digits and a dash
        "values outside the years 1 to 9999 (infinity, BC) are held as NULL",
        "(NOT regexp_matches({0}, '^[0-9]{{4}}-') OR ends_with({0}, ' BC'))",
        lambda v: None if not _YEARS_1_9999.match(v) or v.endswith(" BC") else v,
    ),
    NEGATIVE_ZERO: Lossy("-0 is held as 0", None, lambda v: "0" if v == "-0" else v),  # SQLite stores -0.0 as 0
    AFTER_294246: Lossy(  # DuckDB's timestamps end at 294247-01-10, PostgreSQL's in 294276
        "timestamps after the year 294246 are held as NULL",
        "(regexp_matches({0}, '^[0-9]{{6,}}-') AND NOT ends_with({0}, ' BC') "
        "AND CAST(split_part({0}, '-', 1) AS BIGINT) > 294246)",
        lambda v: None if _after_294246(v) else v,
    ),
}
TEMPORAL_TYPES = {
    "date",
    "time without time zone",
    "time",
    "timestamp without time zone",
    "timestamp",
    "timestamp with time zone",
    "timestamptz",
}


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


def lossy_note(infos: Iterable[tuple[str, TypeInfo]]) -> str:
    """``"c (numeric(10,2) as DECIMAL(10,2): NaN is held as NULL)"`` for each column (name, type) that holds some
    values otherwise; empty when none does."""
    return "; ".join(f"{name} ({i.pg_type} as {i.target_type}: {LOSSY[i.lossy].what})" for name, i in infos if i.lossy)


def lossy_sql(expr: str, lossy: str, value_sql: str) -> str:
    """``value_sql`` (converting ``expr``), or NULL where the rule ``lossy`` holds ``expr`` as NULL (DuckDB SQL)."""
    cond = LOSSY[lossy].null_if if lossy else None
    return f"CASE WHEN {cond.format(expr)} THEN NULL ELSE {value_sql} END" if cond else value_sql


def duck_temporal(expr: str) -> str:
    """DuckDB SQL turning PostgreSQL's text of a date or timestamp into the form DuckDB's casts read: a year before
    1 AD is written ``0044-03-15 12:00:00 BC`` by PostgreSQL, ``0044-03-15 (BC) 12:00:00`` by DuckDB (which reads the
    former as 44 AD)."""
    return (
        f"CASE WHEN ends_with({expr}, ' BC') THEN "
        f"regexp_replace({expr}, '^([0-9]+-[0-9]+-[0-9]+)(.*) BC$', '\\1 (BC)\\2') ELSE {expr} END"
    )


def duck_text(column: str, with_time_zone: bool) -> str:
    """DuckDB SQL reading a date, time or timestamp column as DuckDB's text of it (:func:`pg_temporal` turns that
    into PostgreSQL's); a timestamp with time zone in UTC, whatever the connection's TimeZone."""
    if with_time_zone:
        return (
            f"CASE WHEN isinf({column}) THEN CAST({column} AS VARCHAR) "
            f"ELSE CAST(timezone('UTC', {column}) AS VARCHAR) || '+00' END"
        )
    return f"CAST({column} AS VARCHAR)"


_DUCK_BC = re.compile(r"^(\d+-\d\d-\d\d) \(BC\)(.*)$")


def pg_temporal(text: str) -> str:
    """DuckDB's text of a date or timestamp -> PostgreSQL's (``0044-03-15 (BC) 12:00:00`` -> ``0044-03-15 12:00:00
    BC``); any other text as it is."""
    m = _DUCK_BC.match(text)
    return f"{m.group(1)}{m.group(2)} BC" if m else text


def cannot_hold(dialect: str, table: str, column: str, type_name: str) -> TargetError:
    return TargetError(
        f"the {dialect} target cannot hold column {column} of {table}: type {type_name}",
        hint="exclude the table, change the column's type at the source, or use a PostgreSQL target",
        table=table,
        column=column,
        type=type_name,
    )
