"""The type matrix: every PostgreSQL built-in type a table can hold, and user types PostgreSQL sends as
text (an enum, a domain, a composite), each with its edge values, through a real PostgreSQL, capture, the log, Spark's
compile and apply into one target of each kind; inserted, updated, deleted and inserted again; then a snapshot of
the same table into a second target of each kind. Each target is read through its own client (psycopg2, sqlite3,
duckdb, deltalake, pyiceberg), its values turned into the text PostgreSQL shows by this file's own rules, not
mirrorline's, and compared with the source's values as PostgreSQL's output functions write them (what psql shows);
then ``verify`` must say equal.

Where a target kind cannot hold a value (README, "Types"), the documented value is expected instead: NULL for a
``numeric(p,s)`` NaN on DuckDB, Delta and Iceberg, NULL for a date or timestamp outside the years 1 to 9999 on Delta
and Iceberg."""

from __future__ import annotations

import datetime as dt
import math
import re
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import configs
import duckdb
import numpy as np
import psycopg2
import pytest
from pipeline_support import target_url

from mirrorline import config as cfg
from mirrorline.capture.session import Capture
from mirrorline.pipeline import Applier
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

TABLE = "public.matrix"
KINDS = ["postgresql", "sqlite", "duckdb", "delta", "iceberg"]
USER_TYPES = (
    "CREATE TYPE mood AS ENUM ('happy', 'so \"so\"', 'sad');"
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0);"
    "CREATE TYPE pair AS (n integer, s text);"
)

# column -> (type, values as SQL literals' text; row i takes value i, NULL past the end)
COLUMNS: dict[str, tuple[str, list[str]]] = {
    "c_int2": ("smallint", ["-32768", "32767", "0"]),
    "c_int4": ("integer", ["-2147483648", "2147483647"]),
    "c_int8": ("bigint", ["-9223372036854775808", "9223372036854775807"]),
    "c_num": (
        "numeric",
        ["NaN", "Infinity", "-Infinity", "0.000000000000000000000000000001", "123456789012345678901234567890.12", "-0"],
    ),
    "c_num_ps": ("numeric(10,2)", ["NaN", "-99999999.99", "0.01", "1.5"]),
    "c_num_wide": ("numeric(60,10)", ["12345678901234567890123456789012345678901234567890.0123456789"]),
    "c_real": ("real", ["NaN", "Infinity", "-Infinity", "-0", "1e-45", "3.4028235e+38", "0.1"]),
    "c_float8": (
        "double precision",
        ["NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e+308", "0.1"],
    ),
    "c_money": ("money", ["-92233720368547758.08", "92233720368547758.07", "0"]),
    "c_text": ("text", ["", 'it\'s "q" \\ tab\t nl\n é 😀', " trailing  "]),
    "c_varchar": ("character varying(10)", ["abc", "é😀"]),
    "c_char": ("character(5)", ["ab", "", "abcde"]),
    "c_qchar": ('"char"', ["a", "Z"]),
    "c_name": ("name", ["pg_class"]),
    "c_bytea": ("bytea", ["\\x", "\\x00ff00", "\\x5c78"]),
    "c_bool": ("boolean", ["t", "f"]),
    "c_date": ("date", ["infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "2000-02-29", "0001-01-01 BC"]),
    "c_time": ("time without time zone", ["24:00:00", "00:00:00", "23:59:59.999999"]),
    "c_time3": ("time(3) without time zone", ["12:34:56.789"]),
    "c_timetz": ("time with time zone", ["24:00:00-15:59", "00:00:00+15:59"]),
    "c_ts": (
        "timestamp without time zone",
        [
            "infinity",
            "-infinity",
            "4713-01-01 00:00:00 BC",
            "294246-12-31 23:59:59.999999",
            "2000-01-01 00:00:00.000001",
        ],
    ),
    "c_tstz": (
        "timestamp with time zone",
        [
            "infinity",
            "-infinity",
            "0044-03-15 12:00:00+00 BC",
            "2020-06-01 12:00:00+05:30",
            "1999-12-31 23:59:59.5+00",
            "294276-12-31 00:00:00+00",
        ],
    ),
    "c_interval": ("interval", ["1 year -2 days +03:04:05.6", "-178000000 years", "00:00:00"]),
    "c_uuid": ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    "c_json": ("json", ['{"a": "\\u00e9\\u0000",  "b": [1, 2.50]}', '"x"', "null"]),
    "c_jsonb": ("jsonb", ['{"a": "\\u00e9", "b": [1, 2.50]}', "[]"]),
    "c_xml": ("xml", ['<a b="1">x &amp; y</a>']),
    "c_inet": ("inet", ["192.168.0.1/24", "::ffff:1.2.3.4"]),
    "c_cidr": ("cidr", ["10.0.0.0/8", "2001:db8::/32"]),
    "c_macaddr": ("macaddr", ["08:00:2b:01:02:03"]),
    "c_macaddr8": ("macaddr8", ["08:00:2b:01:02:03:04:05"]),
    "c_bit": ("bit(4)", ["1010", "0000"]),
    "c_varbit": ("bit varying(8)", ["", "101"]),
    "c_point": ("point", ["(1.5,-2)"]),
    "c_line": ("line", ["{1,-1,0}"]),
    "c_lseg": ("lseg", ["[(0,0),(1,1)]"]),
    "c_box": ("box", ["(1,1),(0,0)"]),
    "c_path": ("path", ["[(0,0),(1,1),(2,0)]"]),
    "c_polygon": ("polygon", ["((0,0),(1,1),(1,0))"]),
    "c_circle": ("circle", ["<(0,0),1.5>"]),
    "c_tsvector": ("tsvector", ["'a':1 'fat':2 cat"]),
    "c_tsquery": ("tsquery", ["fat & (rat | cat)"]),
    "c_int4range": ("int4range", ["[1,10)", "empty"]),
    "c_int8range": ("int8range", ["(1,9223372036854775806]"]),
    "c_numrange": ("numrange", ["(,1.5]"]),
    "c_tsrange": ("tsrange", ["[2020-01-01,infinity)"]),
    "c_tstzrange": ("tstzrange", ["[2020-01-01 00:00+00,2021-01-01 00:00+00)"]),
    "c_daterange": ("daterange", ["[2020-01-01,2020-02-01)"]),
    "c_multirange": ("int4multirange", ["{[1,3), [5,7)}"]),
    "c_oid": ("oid", ["4294967295", "0"]),
    "c_lsn": ("pg_lsn", ["16/B374D848"]),
    "c_jsonpath": ("jsonpath", ["$.a[*] ? (@ > 1)"]),
    "c_snapshot": ("pg_snapshot", ["10:20:10,14,15"]),
    "c_int_arr": ("integer[]", ["{1,NULL,3}", "{}", "{{1,2},{3,4}}"]),
    "c_text_arr": ("text[]", ['{"a b","q\\"uote",NULL,"NULL",""}']),
    "c_regclass": ("regclass", ["pg_class"]),
    "c_regtype": ("regtype", ["integer", "character varying"]),
    "c_interval_ds": ("interval day to second", ["1 day 02:03:04.5"]),
    "c_ts0": ("timestamp(0) without time zone", ["2020-01-01 00:00:01"]),
    "c_bpchar": ("character", ["x"]),
    "c_date_arr": ("date[]", ["{infinity,2020-01-01,NULL}"]),
    "c_enum": ("mood", ["happy", 'so "so"']),
    "c_domain": ("posint", ["5", "2147483647"]),
    "c_composite": ("pair", ['(1,"x y")', "(,)"]),
}
# as psql shows them: the types' output functions (a composite of NULLs IS NULL: its text is not)
SHOWN = ", ".join(f"CASE WHEN {n}::text IS NOT NULL THEN format('%s', {n}) END" for n in COLUMNS)
ROWS = max(len(v) for _, v in COLUMNS.values())
NAMES = list(COLUMNS)

# what a target kind holds instead of a value it cannot (README, "Types"): column -> values held as NULL (a set) or
# as another value (a dict)
NULLED = {
    "sqlite": {"c_real": {"-0": "0"}, "c_float8": {"-0": "0"}},  # SQLite stores a real -0 as 0
    "duckdb": {  # DuckDB's timestamps end in 294247
        "c_num_ps": {"NaN"},
        "c_ts": {"294276-12-31 23:59:59.999999"},
        "c_tstz": {"294276-12-31 00:00:00+00"},
    },
    "delta": {  # Delta's dates and timestamps are those of the years 1 to 9999
        "c_num_ps": {"NaN"},
        "c_date": {"infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "0001-01-01 BC"},
        "c_ts": {
            "infinity",
            "-infinity",
            "4713-01-01 00:00:00 BC",
            "294246-12-31 23:59:59.999999",
            "294276-12-31 23:59:59.999999",
        },
        "c_tstz": {"infinity", "-infinity", "0044-03-15 12:00:00+00 BC", "294276-12-31 00:00:00+00"},
    },
}
NULLED["iceberg"] = NULLED["delta"]  # the same years, the same decimals


def _lit(v: str | None) -> str:
    return "NULL" if v is None else "'" + v.replace("'", "''") + "'"


def _row_values(i: int, shift: int = 0) -> list[str | None]:
    out: list[str | None] = []
    for _, values in COLUMNS.values():
        j = i + shift
        out.append(values[j % len(values)] if (shift or j < len(values)) else None)
    return out


def _insert(ident: int, values: list[str | None]) -> str:
    cols = ", ".join(["id", *NAMES])
    lits = ", ".join([str(ident), *(f"{_lit(v)}::{COLUMNS[n][0]}" for n, v in zip(NAMES, values, strict=True))])
    return f"INSERT INTO {TABLE} ({cols}) VALUES ({lits})"


def _update(ident: int, values: list[str | None]) -> str:
    sets = ", ".join(f'"{n}" = {_lit(v)}::{COLUMNS[n][0]}' for n, v in zip(NAMES, values, strict=True))
    return f"UPDATE {TABLE} SET {sets} WHERE id = {ident}"


def _source(dsn: str) -> dict[int, list[str | None]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TimeZone = 'UTC'")
            cur.execute(f"SELECT id, {SHOWN} FROM {TABLE}")
            return {r[0]: list(r[1:]) for r in cur.fetchall()}
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------ independent readers


def _bc(text: str) -> str:
    """DuckDB's and Arrow's ways of writing a year before 1 AD -> PostgreSQL's: ``0044-03-15 (BC) 12:00:00`` and
    ``-0043-03-15 12:00:00`` -> ``0044-03-15 12:00:00 BC``."""
    m = re.match(r"^(\d+)-(\d\d-\d\d) \(BC\)(.*)$", text)
    if m:
        return f"{m.group(1)}-{m.group(2)}{m.group(3)} BC"
    m = re.match(r"^-(\d+)-(\d\d-\d\d)(.*)$", text)
    if m:
        return f"{int(m.group(1)) + 1:04d}-{m.group(2)}{m.group(3)} BC"
    return text


def _utc(text: str) -> str:
    """A timestamp with time zone written with any offset -> the same instant as PostgreSQL shows it in UTC."""
    m = re.match(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d(?::?\d\d)?)$", text)
    if not m:
        return text
    off = m.group(2).replace(":", "")
    off = off + "00" if len(off) == 3 else off
    ts = dt.datetime.strptime(
        m.group(1) + off, "%Y-%m-%d %H:%M:%S.%f%z" if "." in m.group(1) else "%Y-%m-%d %H:%M:%S%z"
    )
    u = ts.astimezone(dt.UTC)
    frac = f".{u.microsecond:06d}".rstrip("0") if u.microsecond else ""
    return f"{u:%Y-%m-%d %H:%M:%S}{frac}+00"


def _same_value(kind: str, typ: str, src: str | None, got: Any) -> bool:
    """Does the target's value ``got`` (as its own client returns it) show what PostgreSQL shows as ``src``?"""
    if src is None or got is None:
        return src is None and got is None
    if kind == "postgresql":  # read as its output function writes it
        return bool(src == got)
    if typ in ("real", "double precision"):
        want = float(np.float32(src)) if typ == "real" else float(src)  # a real held as float32, or as a double
        if isinstance(got, str):  # SQLite keeps a NaN as text
            return got == src == "NaN"
        if typ == "real":
            got = float(np.float32(got))
        return (math.isnan(want) and math.isnan(got)) or (
            want == got and math.copysign(1, want) == math.copysign(1, got)
        )
    if typ in ("smallint", "integer", "bigint", "oid"):
        return int(src) == int(got)
    if typ == "boolean":
        return {"t": True, "f": False}[src] == bool(got)
    if typ == "bytea":
        return src == "\\x" + bytes(got).hex()
    if typ.startswith("numeric("):
        return src == "NaN" == got if src == "NaN" else Decimal(src) == Decimal(str(got))
    if typ == "timestamp with time zone":
        return _utc(src) == _utc(_bc(str(got)))
    if typ in ("date", "timestamp without time zone", "time without time zone", "time(3) without time zone"):
        return src == _bc(str(got))
    return src == str(got)


_TEMPORAL = {"date", "timestamp without time zone", "timestamp with time zone", "time without time zone"}


def _target(kind: str, url: str) -> dict[int, list[Any]]:
    cols = ", ".join(["id", *(f'"{n}"' for n in NAMES)])
    if kind == "postgresql":
        conn = psycopg2.connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute("SET TimeZone = 'UTC'")
                cur.execute(f"SELECT id, {SHOWN} FROM {TABLE}")
                return {r[0]: list(r[1:]) for r in cur.fetchall()}
        finally:
            conn.close()
    path = url.split(":///", 1)[1]
    if kind == "sqlite":
        with sqlite3.connect(path) as sconn:
            return {r[0]: list(r[1:]) for r in sconn.execute(f"SELECT {cols} FROM matrix")}
    if kind == "duckdb":  # dates, times and timestamps as DuckDB writes them (Python's datetime has no infinity, BC)
        sel = ", ".join(
            ["id"]
            + [
                f'CAST("{n}" AS VARCHAR)' if COLUMNS[n][0].split("(")[0] in _TEMPORAL | {"time"} else f'"{n}"'
                for n in NAMES
            ]
        )
        dconn = duckdb.connect(path)
        try:
            dconn.execute("SET TimeZone = 'UTC'")
            return {r[0]: list(r[1:]) for r in dconn.execute(f"SELECT {sel} FROM matrix").fetchall()}
        finally:
            dconn.close()
    if kind == "iceberg":  # pyiceberg's own scan, the table found in the embedded catalog
        import oracle

        data = oracle.iceberg_table(path, TABLE).scan().to_arrow()
    else:
        from deltalake import DeltaTable

        data = DeltaTable(str(Path(path) / "matrix")).to_pyarrow_table()
    con = duckdb.connect()  # Arrow's dates and timestamps written by DuckDB, for the same reason
    try:
        con.register("data", data)
        con.execute("SET TimeZone = 'UTC'")
        sel = ", ".join(["id"] + [f'CAST("{n}" AS VARCHAR)' if COLUMNS[n][0] in _TEMPORAL else f'"{n}"' for n in NAMES])
        return {r[0]: list(r[1:]) for r in con.execute(f"SELECT {sel} FROM data").fetchall()}
    finally:
        con.close()


def _compare(kind: str, src: dict[int, list[str | None]], got: dict[int, list[Any]]) -> None:
    assert sorted(got) == sorted(src), f"{kind}: ids {sorted(got)}, source {sorted(src)}"
    wrong = []
    for ident, row in src.items():
        for n, s, g in zip(NAMES, row, got[ident], strict=True):
            instead = NULLED.get(kind, {}).get(n, {})
            want = (instead.get(s) if isinstance(instead, dict) else None) if s in instead else s
            if not _same_value(kind, COLUMNS[n][0], want, g):
                wrong.append(f"{n} (row {ident}): source {s!r}, {kind} {g!r}")
    assert not wrong, f"{kind}: " + "; ".join(wrong)


# ---------------------------------------------------------------------------------------------------------- test


def test_every_type_and_edge_value_reaches_every_target_kind(
    pg: Any, pg_cluster: Any, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    columns = ", ".join(f'"{n}" {t}' for n, (t, _) in COLUMNS.items())
    pg.execute(f"{USER_TYPES} CREATE TABLE {TABLE} (id integer PRIMARY KEY, {columns})")
    urls = {}
    for kind in KINDS:
        for role in ("live", "snap"):
            name = f"{role}_{kind}"
            urls[name] = target_url(kind, tmp_path, pg_cluster, f"tm_{name}_{pg.name[-6:]}")
            if kind == "postgresql":  # like PostgreSQL's own subscriber, a PostgreSQL target needs the user types
                conn = psycopg2.connect(urls[name])
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute(USER_TYPES)
                conn.close()
    live = {n: u for n, u in urls.items() if n.startswith("live_")}

    def config_file(name: str, targets: dict[str, str]) -> cfg.Config:
        return configs.load(tmp_path / name, source=pg.dsn, log=tmp_path / "log", tables=[TABLE], targets=targets)

    live_conf = config_file("live.toml", live)
    conf = config_file("all.toml", urls)
    Capture(live_conf, once=True).run()
    for name in live:  # the table is empty: loaded at once, then replicated
        snapshot_target(live_conf, name, options=Options(progress=False))
    # what each target holds otherwise is said once, when it creates the table
    said = [r.getMessage() for r in caplog.records if "is held as" in r.getMessage()]
    assert (
        "target live_duckdb: public.matrix: c_num_ps (numeric(10,2) as DECIMAL(10,2): NaN is held as NULL)"
        in " ".join(said)
    )
    assert any(m.startswith("target live_sqlite: public.matrix: c_real (real as REAL: -0 is held as 0)") for m in said)
    assert any("target live_delta: public.matrix:" in m and "c_date (date as date: values outside" in m for m in said)
    assert any(
        "target live_iceberg: public.matrix:" in m and "c_num_ps (numeric(10,2) as decimal(10,2)" in m for m in said
    )
    assert not any("live_postgresql" in m for m in said)
    applier = Applier(live_conf, spark=spark)
    try:

        def step(sql: str) -> None:
            pg.execute(sql)
            Capture(live_conf, once=True).run()
            assert applier.catch_up()
            src = _source(pg.dsn)
            for name, url in live.items():
                _compare(name.removeprefix("live_"), src, _target(name.removeprefix("live_"), url))

        step(";".join(_insert(i, _row_values(i)) for i in range(ROWS + 1)))  # the last row: every column NULL
        step(";".join(_update(i, _row_values(i, shift=1)) for i in range(ROWS)))  # every value moves one row on
        step(f"DELETE FROM {TABLE} WHERE id = 0; {_insert(100, _row_values(0))}; {_update(ROWS, _row_values(2, 3))}")
    finally:
        applier.close()
    src = _source(pg.dsn)
    for kind in KINDS:
        snapshot_target(conf, f"snap_{kind}", options=Options(progress=False))
        _compare(kind, src, _target(kind, urls[f"snap_{kind}"]))
    report = verify(conf)
    assert report.ok, report.text()
    # a value changed behind replication in a column DuckDB holds lossily (numeric(10,2), NaN held as NULL): the
    # source's NaN row is compared as DuckDB holds it, the changed row is found and shown
    dconn = duckdb.connect(urls["live_duckdb"].split(":///", 1)[1])
    try:
        dconn.execute("UPDATE matrix SET c_num_ps = 7 WHERE id = 3")
    finally:
        dconn.close()
    report = verify(conf, ["live_duckdb"], diff=5)
    (check,) = report.targets[0].tables
    assert not report.ok and check.differing_rows == 1, report.text()
    (row,) = check.diffs or []
    assert row.kind == "changed" and row.key == ("3",) and row.columns == {"c_num_ps": ("NaN", "7.00")}
