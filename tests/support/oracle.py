"""An independent reader: a table read from the source through psycopg2 as text and from a target through
that target's own client (psycopg2, sqlite3, duckdb, deltalake), every value turned into one comparable Python value
by this file's own rules (not mirrorline's canonical form), and the two compared as multisets of rows. Tests ask it
before they ask ``verify``.

Values: integers as ``int``; ``numeric`` as ``Decimal``; ``double precision`` as its exact bits (``float.hex``), so
``-0`` differs from ``0``; ``real`` as its 4 bytes; booleans as ``bool``; ``timestamp with time zone`` as an aware UTC
``datetime``; ``timestamp`` and ``date`` as ``datetime`` / ``date``; ``bytea`` as ``bytes``; ``char(n)`` without its
padding; every other type as PostgreSQL's text of it.
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import struct
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg2

_INTS = {"smallint", "integer", "bigint", "oid"}


def _base(type_name: str) -> str:
    """``"timestamp(3) with time zone"`` -> ``"timestamp with time zone"``; arrays keep their ``[]``."""
    return re.sub(r"\s+", " ", re.sub(r"\([^)]*\)", "", type_name)).strip()


def _real(x: float) -> bytes:
    return struct.pack(">f", x)


def value(type_name: str, v: Any) -> Any:
    """A value of a column of ``type_name``, as PostgreSQL's text or as a client's own Python value -> the
    comparable value."""
    if v is None:
        return None
    b = _base(type_name)
    if b.endswith("[]"):
        return str(v)
    if b in _INTS:
        return int(v)
    if b == "numeric":
        return Decimal(str(v)).normalize() if str(v) not in ("NaN", "Infinity", "-Infinity") else str(v)
    if b == "double precision":
        return float(v).hex()
    if b == "real":
        return _real(float(v))
    if b == "boolean":
        return v in (True, 1, "t", "true") if not isinstance(v, str) else v in ("t", "true")
    if b == "timestamp with time zone":
        if isinstance(v, str):
            if v in ("infinity", "-infinity") or v.endswith(" BC"):
                return v
            v = dt.datetime.fromisoformat(v)
        return v.astimezone(dt.UTC)
    if b == "timestamp without time zone":
        if isinstance(v, str):
            return v if v in ("infinity", "-infinity") or v.endswith(" BC") else dt.datetime.fromisoformat(v)
        return v
    if b == "date":
        if isinstance(v, str):
            return v if v in ("infinity", "-infinity") or v.endswith(" BC") else dt.date.fromisoformat(v)
        return v
    if b == "bytea":
        return bytes.fromhex(v[2:]) if isinstance(v, str) else bytes(v)
    if b in ("character", "char", "bpchar"):
        return str(v).rstrip(" ")
    return str(v)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _relation(table: str) -> str:
    schema, name = table.split(".", 1)
    return f"{_q(schema)}.{_q(name)}"


def columns(dsn: str, table: str) -> list[tuple[str, str]]:
    """(name, format_type) of the source table's columns, in order (generated columns are not replicated)."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' "
                "ORDER BY attnum",
                (_relation(table),),
            )
            return [(str(n), str(t)) for n, t in cur.fetchall()]
    finally:
        conn.close()


def _pg_rows(dsn: str, table: str, cols: list[tuple[str, str]], relation: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            sel = ", ".join(f'"{n}"::text' for n, _ in cols)
            cur.execute(f"SELECT {sel} FROM {relation}")
            return [tuple(value(t, v) for (_, t), v in zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        conn.close()


def source(dsn: str, table: str) -> Counter[tuple[Any, ...]]:
    cols = columns(dsn, table)
    return Counter(_pg_rows(dsn, table, cols, _relation(table)))


def read(
    kind: str, location: str, table: str, names: list[str], *, pg_text: bool = False
) -> list[tuple[Any, ...]] | None:
    """A target's rows of ``table`` (None: it has no such table) as the kind's own client gives them: the one reader
    of each kind in the tests. ``location``: the target's DSN or path; ``pg_text``: PostgreSQL's values as its text."""
    schema, name = table.split(".", 1)
    sel = ", ".join(_q(n) for n in names)
    if kind == "postgresql":
        conn = psycopg2.connect(location)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)", (_relation(table),))
                if cur.fetchone()[0] is None:
                    return None
                cur.execute("SET TimeZone = 'UTC'")
                cols = ", ".join(f"{_q(n)}::text" for n in names) if pg_text else sel
                cur.execute(f"SELECT {cols} FROM {_relation(table)}")
                return list(cur.fetchall())
        finally:
            conn.close()
    one_name = name if schema == "public" else table  # SQLite has no schemas: "s.t" is one name
    if kind == "delta":
        from deltalake import DeltaTable

        from mirrorline.apply import target_class

        folder = target_class("delta").dialect.table_dir(Path(location), table)  # type: ignore[attr-defined]
        if not DeltaTable.is_deltatable(str(folder)):
            return None
        data = DeltaTable(str(folder)).to_pyarrow_table(columns=list(names))
        return list(zip(*(data[n].to_pylist() for n in names), strict=True))
    if kind == "iceberg":
        data = iceberg_table(location, table)
        if data is None:
            return None
        got = data.scan(selected_fields=tuple(names)).to_arrow()
        return list(zip(*(got[n].to_pylist() for n in names), strict=True))
    if kind == "sqlite":
        with sqlite3.connect(location) as sconn:
            found = sconn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (one_name,)).fetchone()
            if found is None:
                return None
            return sconn.execute(f"SELECT {sel} FROM {_q(one_name)}").fetchall()
    from mirrorline.apply.duckdb.home import reading

    duck_schema = "main" if schema == "public" else schema
    with reading(location) as dconn:  # as a target of this process opens it (a second open of the file is refused)
        dconn.execute("SET TimeZone = 'UTC'")
        n = dconn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_catalog = current_database() "
            "AND table_schema = ? AND table_name = ?",
            (duck_schema, name),
        ).fetchone()
        if not n or not n[0]:
            return None
        return dconn.execute(f"SELECT {sel} FROM {_q(duck_schema)}.{_q(name)}").fetchall()


def iceberg_table(location: str, table: str) -> Any:
    """The Iceberg table of source table ``table`` in the embedded catalog of the target in folder ``location``,
    found by pyiceberg's own catalog as the table whose ``mirrorline.table`` property names it (None: none)."""
    from pyiceberg.catalog.sql import SqlCatalog

    root = Path(location)
    if not (root / "_catalog.sqlite").exists():
        return None
    catalog = SqlCatalog(
        "mirrorline", uri=f"sqlite:///{root / '_catalog.sqlite'}", warehouse=(root / "warehouse").as_uri()
    )
    try:
        for ns in catalog.list_namespaces():
            for ident in catalog.list_tables(ns):
                t = catalog.load_table(ident)
                if t.properties.get("mirrorline.table") == table:
                    return t
        return None
    finally:
        catalog.engine.dispose()


def location(url: str) -> str:
    """A target URL's DSN or path."""
    return url if url.startswith(("postgresql:", "postgres:")) else url.split(":///", 1)[1]


def target(kind: str, url: str, table: str, cols: list[tuple[str, str]]) -> Counter[tuple[Any, ...]] | None:
    """The target's rows of ``table`` (None: it has no such table), each value by this file's rules."""
    raw = read(kind, location(url), table, [n for n, _ in cols], pg_text=True)
    if raw is None:
        return None
    return Counter(tuple(value(t, v) for (_, t), v in zip(cols, r, strict=True)) for r in raw)


def assert_same(dsn: str, kind: str, url: str, table: str) -> None:
    """The target holds exactly the source's rows of ``table`` (as multisets), each value as PostgreSQL shows it."""
    src = source(dsn, table)
    _equal(f"{table} at the {kind} target {url}", src, target(kind, url, table, columns(dsn, table)))


def assert_same_part(dsn: str, kind: str, url: str, table: str, names: list[str], where: str) -> None:
    """The target holds exactly the source's rows of ``table`` for which ``where`` is true, in the columns
    ``names`` (a table replicated in part)."""
    cols = [(n, t) for n, t in columns(dsn, table) if n in names]
    src = Counter(_pg_rows(dsn, table, cols, f"(SELECT * FROM {_relation(table)} WHERE ({where})) AS part"))
    _equal(f"{table} (in part) at the {kind} target {url}", src, target(kind, url, table, cols))


def _equal(what: str, src: Counter[tuple[Any, ...]], got: Counter[tuple[Any, ...]] | None) -> None:
    """The target's rows (None: no such table) are the source's, as multisets; else an error saying what differs."""
    assert got is not None, f"{what}: no such table"
    if got != src:
        missing, extra = src - got, got - src
        raise AssertionError(
            f"{what}: {sum(src.values())} source rows, {sum(got.values())} target rows; "
            f"missing {sorted(missing, key=repr)[:3]}, extra {sorted(extra, key=repr)[:3]}"
        )


def versions(
    dsn: str, kind: str, url: str, table: str, prefix: str = "_ml_"
) -> list[tuple[tuple[Any, ...], int, int | None, bool, bool, tuple[Any, ...]]]:
    """A table kept in versions at a target, every version (history mode), read by the kind's own client: per
    version (its values of the source's current columns, by this file's rules; start lsn; end lsn; deleted; whether
    its start and end times are set as its lsns are), ordered by start lsn."""
    cols = columns(dsn, table)
    meta = [f"{prefix}start_lsn", f"{prefix}end_lsn", f"{prefix}deleted", f"{prefix}start_at", f"{prefix}end_at"]
    raw = read(kind, location(url), table, [n for n, _ in cols] + meta, pg_text=False)
    assert raw is not None, f"{table} at the {kind} target {url}: no such table"
    out = []
    n = len(cols)
    for r in raw:
        vals = tuple(value(t, v) for (_, t), v in zip(cols, r[:n], strict=True))
        start, end, deleted, start_at, end_at = r[n:]
        timed = start_at is not None and (end is None) == (end_at is None)
        out.append((vals, int(start), None if end is None else int(end), bool(deleted), timed))
    return sorted(out, key=lambda v: (v[1], str(v[0])))
