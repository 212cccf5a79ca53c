"""Canonical row text and order-independent checksums, the same on every engine. Pure.

Every value is compared in PostgreSQL's text form as a session with ``TimeZone = UTC``, ``DateStyle = ISO``,
``extra_float_digits = 1`` and ``bytea_output = hex`` prints it (booleans ``t``/``f``). Values a target holds in its
own types (:mod:`mirrorline.apply.types`) are turned back into that form: SQLite integers, reals, 1/0 booleans and
blobs; DuckDB's booleans, numbers, decimals, dates, times, timestamps, UUIDs and blobs; timestamps with time zone
stored as text in another zone are moved to UTC.

A row's hash is the first 8 bytes of BLAKE2b over its values, each length-prefixed (NULL is distinct from every
text); a table's checksum is the sum of its rows' hashes modulo 2^64, so row order does not matter and duplicate
rows count.

It sits in ``apply`` because every kind reads its rows back into this form for ``verify`` (and the snapshot and
verify read the source in it, :data:`SESSION_SETTINGS`): ``verify`` and ``snapshot`` use it from below.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from mirrorline.apply.types import LOSSY, TEMPORAL_TYPES, base_type, pg_temporal

MASK = (1 << 64) - 1
Canon = Callable[[Any], str | None]

_FLOAT8 = {"double precision", "float8"}
_FLOAT4 = {"real", "float4"}
_INTS = {"smallint", "integer", "bigint", "oid", "int2", "int4", "int8"}
_BPCHAR = {"character", "char", "bpchar"}

# the session settings every snapshot and verify connection uses, so that values read as text are PostgreSQL's
# canonical text forms (the same ones pgoutput sends, whatever the client's environment says)
SESSION_SETTINGS = (
    "SET DateStyle = 'ISO, MDY'",
    "SET IntervalStyle = 'postgres'",
    "SET extra_float_digits = 1",
    "SET bytea_output = 'hex'",
)


Held = tuple[tuple[int, str], ...]  # (column index, the rule of the values a target holds otherwise there)


def held(rows: Iterable[Sequence[str | None]], lossy: Held) -> Iterator[Sequence[str | None]]:
    """The source's rows as a target holds them: in the columns of ``lossy``, the values their type cannot hold
    there as the target holds them instead (:attr:`mirrorline.apply.types.TypeInfo.lossy`)."""
    if not lossy:
        yield from rows
        return
    rules = [(i, LOSSY[rule].held) for i, rule in lossy]
    for r in rows:
        out = list(r)
        for i, rule in rules:
            v = out[i]
            if v is not None:
                out[i] = rule(v)
        yield out


def row_hash(values: Sequence[str | None]) -> int:
    parts = [("\x00" if v is None else f"{len(v)}:{v}") for v in values]
    return int.from_bytes(hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest(), "little")


def checksum(rows: Iterable[Sequence[str | None]]) -> tuple[int, int]:
    """(row count, sum of row hashes mod 2^64)."""
    n = total = 0
    for r in rows:
        n += 1
        total += row_hash(r)
    return n, total & MASK


def combine(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], (a[1] + b[1]) & MASK


def pg_float_text(x: float, single: bool = False) -> str:
    """``float8out`` / ``float4out`` with extra_float_digits = 1: the shortest text that reads back exactly, in
    exponent form when the exponent is below -4 or at least 15 (6 for real)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0" if str(x).startswith("-") else "0"
    sci = np.format_float_scientific(np.float32(x) if single else np.float64(x), unique=True, trim="-")
    mant, _, exp_s = sci.partition("e")
    exp = int(exp_s)
    sign = "-" if mant.startswith("-") else ""
    digits = mant.lstrip("-").replace(".", "")
    if exp < -4 or exp >= (6 if single else 15):
        frac = digits[1:]
        return f"{sign}{digits[0]}{'.' + frac if frac else ''}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp >= 0:
        whole = digits[: exp + 1].ljust(exp + 1, "0")
        frac = digits[exp + 1 :]
        return f"{sign}{whole}{'.' + frac if frac else ''}"
    return f"{sign}0.{'0' * (-exp - 1)}{digits}"


def _frac(us: int) -> str:
    return f".{us:06d}".rstrip("0") if us else ""


def time_text(t: dt.time) -> str:
    return f"{t.hour:02d}:{t.minute:02d}:{t.second:02d}{_frac(t.microsecond)}"


def timestamp_text(ts: dt.datetime) -> str:
    if ts.tzinfo is not None:
        ts = ts.astimezone(dt.UTC)
        return f"{ts.date().isoformat()} {time_text(ts.time())}+00"
    return f"{ts.date().isoformat()} {time_text(ts.time())}"


_TSTZ_RE = re.compile(r"^(\d{4}-\d\d-\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?$")


def timestamptz_utc(text: str) -> str:
    """PostgreSQL ISO text of a timestamp with time zone, in any zone -> the same instant as a UTC session prints
    it. Texts outside what Python's datetime holds (BC, infinity) are kept as they are."""
    m = _TSTZ_RE.match(text)
    if not m:
        return text
    try:
        date = dt.date.fromisoformat(m.group(1))
        frac = m.group(5) or ""
        us = int((frac[1:] + "000000")[:6]) if frac else 0
        off = dt.timedelta(hours=int(m.group(7)), minutes=int(m.group(8) or 0), seconds=int(m.group(9) or 0))
        tz = dt.timezone(off if m.group(6) == "+" else -off)
        ts = dt.datetime(
            date.year, date.month, date.day, int(m.group(2)), int(m.group(3)), int(m.group(4)), us, tzinfo=tz
        )
        return timestamp_text(ts)
    except (ValueError, OverflowError):
        return text


def _none(f: Callable[[Any], str]) -> Canon:
    def g(v: Any) -> str | None:
        return None if v is None else f(v)

    return g


def _as_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, bytes | bytearray | memoryview):
        return "\\x" + bytes(v).hex()
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, float):
        return pg_float_text(v)
    if isinstance(v, dt.datetime):
        return timestamp_text(v)
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, dt.time):
        return time_text(v)
    return str(v)


def native_text(type_name: str) -> Canon:
    """How a value a target engine holds in its own types (SQLite's, DuckDB's: :mod:`mirrorline.apply.types`) for
    a column of PostgreSQL type ``type_name`` becomes canonical text."""
    b = base_type(type_name)
    if b.endswith("[]"):
        return _none(_as_text)
    if b in _FLOAT8:
        return _none(lambda v: pg_float_text(float(v)))
    if b in _FLOAT4:
        return _none(lambda v: pg_float_text(float(v), single=True))
    if b == "boolean":
        return _none(lambda v: "t" if v in (True, 1, "t", "1") else "f")
    if b in _INTS:
        return _none(lambda v: str(int(v)))
    if b in ("timestamp with time zone", "timestamptz"):
        return _none(lambda v: timestamptz_utc(pg_temporal(v)) if isinstance(v, str) else _as_text(v))
    if b in TEMPORAL_TYPES:  # as text where the engine's client cannot hold it (infinite, BC: DuckDB's text)
        return _none(lambda v: pg_temporal(v) if isinstance(v, str) else _as_text(v))
    if b in _BPCHAR:  # char(n): PostgreSQL's text of it drops the padding (the targets keep it as sent)
        return _none(lambda v: _as_text(v).rstrip(" "))
    return _none(_as_text)


def select_text(column: str, type_name: str) -> str:
    """The PostgreSQL expression reading a column as canonical text (``column`` already quoted)."""
    b = base_type(type_name)
    if b == "boolean":
        return f"CASE WHEN {column} THEN 't' WHEN NOT {column} THEN 'f' END"
    if b == "inet":  # its cast to text adds a host's /32 or /128; its output (what pgoutput sends) does not
        return f"CASE WHEN {column} IS NOT NULL THEN format('%s', {column}) END"  # (format() gives '' for NULL)
    return f"{column}::text"
