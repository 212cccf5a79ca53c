"""Canonical text and checksums: the values each engine stores come back to PostgreSQL's text form."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from mirrorline.apply.canonical import checksum, native_text, pg_float_text, row_hash, select_text, timestamptz_utc

# (value, float8 text, real text) as PostgreSQL 15 prints them (extra_float_digits = 1)
FLOATS = [
    (1e15, "1e+15", "1e+15"),
    (1e14, "100000000000000", "1e+14"),
    (1e16, "1e+16", "1e+16"),
    (1.5e-5, "1.5e-05", "1.5e-05"),
    (0.0001, "0.0001", "0.0001"),
    (0.00001, "1e-05", "1e-05"),
    (123456789012345678.0, "1.2345678901234568e+17", "1.2345679e+17"),
    (100.0, "100", "100"),
    (-0.0, "-0", "-0"),
    (2.5, "2.5", "2.5"),
    (3.14159e22, "3.14159e+22", "3.14159e+22"),
    (123456789012345.6, "123456789012345.6", "1.2345679e+14"),
    (1e6, "1000000", "1e+06"),
    (999999.0, "999999", "999999"),
    (1234567.0, "1234567", "1.234567e+06"),
    (0.1, "0.1", "0.1"),
    (float("inf"), "Infinity", "Infinity"),
    (float("-inf"), "-Infinity", "-Infinity"),
    (float("nan"), "NaN", "NaN"),
]


@pytest.mark.parametrize(("value", "f8", "f4"), FLOATS)
def test_float_text_matches_postgresql(value: float, f8: str, f4: str) -> None:
    assert pg_float_text(value) == f8
    assert pg_float_text(value, single=True) == f4


def test_timestamptz_text_in_any_zone_becomes_utc() -> None:
    assert timestamptz_utc("2024-01-02 03:04:05.12+02") == "2024-01-02 01:04:05.12+00"
    assert timestamptz_utc("2024-01-02 03:04:05+05:30") == "2024-01-01 21:34:05+00"
    assert timestamptz_utc("2024-01-02 03:04:05.5-03") == "2024-01-02 06:04:05.5+00"
    assert timestamptz_utc("infinity") == "infinity"


def test_engine_values_to_postgresql_text() -> None:
    assert native_text("boolean")(1) == "t" and native_text("boolean")(False) == "f"
    assert native_text("bigint")(42) == "42"
    assert native_text("bytea")(b"\x01\xff") == "\\x01ff"
    assert native_text("numeric(10,2)")(Decimal("1.50")) == "1.50"
    assert native_text("numeric(12,10)")(Decimal("0E-10")) == "0.0000000000"
    assert native_text("date")(dt.date(2024, 1, 2)) == "2024-01-02"
    assert (
        native_text("timestamp without time zone")(dt.datetime(2024, 1, 2, 3, 4, 5, 120000)) == "2024-01-02 03:04:05.12"
    )
    aware = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert native_text("timestamp with time zone")(aware) == "2024-01-02 01:04:05+00"
    assert native_text("timestamp with time zone")("2024-01-02 03:04:05+02") == "2024-01-02 01:04:05+00"
    assert native_text("time without time zone")(dt.time(3, 4, 5, 500000)) == "03:04:05.5"
    assert native_text("real")(0.10000000149011612) == "0.1"
    assert native_text("text")(None) is None
    assert select_text('"b"', "boolean").startswith("CASE WHEN")


def test_checksum_ignores_order_and_counts_duplicates() -> None:
    rows = [("1", "a"), ("2", None), ("2", None)]
    assert checksum(rows) == checksum(list(reversed(rows)))
    assert checksum(rows) != checksum(rows[:2])
    assert row_hash(("a", None)) != row_hash(("a", "")) != row_hash(("a,", ""))
    assert row_hash(("ab", "c")) != row_hash(("a", "bc"))


def test_char_n_padding_is_not_a_difference() -> None:
    # PostgreSQL's text of char(n) drops the padding; the targets keep what COPY or pgoutput sent (padded)
    from mirrorline.apply.canonical import native_text

    assert native_text("character(84)")("some text" + " " * 75) == "some text"
    assert native_text("character(3)")("   ") == "" and native_text("character(3)")(None) is None
    assert native_text("text")("kept  ") == "kept  "
