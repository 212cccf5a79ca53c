"""SQL text of the apply stage, per dialect, without servers; the type mapping; round-robin dealing; worktable rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from mirrorline.apply import deal
from mirrorline.apply import rows as work_rows
from mirrorline.apply.duckdb import DUCKDB
from mirrorline.apply.postgresql import POSTGRESQL
from mirrorline.apply.sql import MASK_SEP, mask_of, parse_mask
from mirrorline.apply.sqlite import SQLITE
from mirrorline.apply.state import AppliedState
from mirrorline.apply.types import (
    AFTER_294246,
    LOSSY,
    NAN,
    NEGATIVE_ZERO,
    OUTSIDE_1_9999,
    TypeInfo,
    base_type,
    pg_temporal,
)
from mirrorline.model import Column, TableSchema
from mirrorline.position import Position

T = TableSchema("public.T", (Column("k", "integer", nullable=False), Column("c", "integer")), key=("k",))
ODD = TableSchema('sales.we"ird', (Column('i"d', "bigint", nullable=False), Column("v", "bytea")), key=('i"d',))


def test_seed000_join_update_is_the_worktable_update() -> None:
    # 000 example 2: update T set T.c=#rs_uT.c from T,#rs_uT where T.k=#rs_uT.k
    assert POSTGRESQL.join_update(T, "w_u", ["c"], None) == (
        'UPDATE "public"."T" AS t SET "c" = CAST(w."c" AS integer) FROM w_u AS w '
        'WHERE t."k" = CAST(w._ml_k0 AS integer)'
    )
    assert DUCKDB.join_update(T, "w_u", ["c"], None) == (
        'UPDATE "mirrorline_target"."main"."T" AS t SET "c" = CAST(w."c" AS INTEGER) FROM w_u AS w '
        'WHERE t."k" = CAST(w._ml_k0 AS INTEGER)'
    )


def test_join_delete_per_dialect() -> None:
    assert POSTGRESQL.join_delete(T, "w_d") == (
        'DELETE FROM "public"."T" AS t USING w_d AS w WHERE t."k" = CAST(w._ml_k0 AS integer)'
    )
    assert DUCKDB.join_delete(T, "w_d").startswith(
        'DELETE FROM "mirrorline_target"."main"."T" AS t USING w_d AS w WHERE'
    )
    sqlite = SQLITE.join_delete(T, "w_d")
    assert sqlite.startswith('DELETE FROM "T" WHERE rowid IN (SELECT t.rowid FROM w_d AS w JOIN "T" AS t ON t."k" = ')
    assert "mirrorline_bad(w._ml_k0, 'integer', 'public.T', 'k')" in sqlite


def test_inserts_in_key_order_on_postgresql() -> None:
    stmt = POSTGRESQL.insert_select(ODD, "w_i", ["v", *ODD.key], key_order=True)
    assert stmt.endswith(" FROM w_i AS w ORDER BY 2")
    assert "ORDER BY" not in POSTGRESQL.insert_select(ODD, "w_i", ODD.column_names)
    assert "ORDER BY" not in SQLITE.insert_select(ODD, "w_i", ODD.column_names, key_order=True)


def test_every_identifier_is_quoted() -> None:
    stmt = POSTGRESQL.insert_select(ODD, "w_i", ODD.column_names)
    assert stmt.startswith('INSERT INTO "sales"."we""ird" ("i""d", "v") SELECT CAST(w."i""d" AS bigint)')
    assert SQLITE.table(ODD.table) == '"sales.we""ird"'
    assert SQLITE.table("public.orders") == '"orders"'
    assert DUCKDB.table("public.orders") == '"mirrorline_target"."main"."orders"'
    ddl = DUCKDB.create_table(ODD)
    assert ddl[0] == 'CREATE SCHEMA IF NOT EXISTS "sales"'
    assert ddl[1] == (
        'CREATE TABLE IF NOT EXISTS "mirrorline_target"."sales"."we""ird" ("i""d" BIGINT NOT NULL, "v" BLOB, '
        'PRIMARY KEY ("i""d"))'
    )


def test_update_writes_only_the_given_columns_and_filters_masks() -> None:
    s = TableSchema(
        "public.t", (Column("id", "integer", nullable=False), Column("a", "text"), Column("b", "jsonb")), key=("id",)
    )
    stmt = POSTGRESQL.join_update(s, "w", ["a"], [mask_of(["b"])])
    assert 'SET "a" = w."a" FROM' in stmt and '"b" =' not in stmt
    assert stmt.endswith("AND COALESCE(w._ml_unchanged, '') IN ('b')")
    assert parse_mask(mask_of(["b", "a"])) == {"a", "b"}
    assert parse_mask("") == frozenset()


def test_all_columns_key_matches_nulls() -> None:
    s = TableSchema("public.t", (Column("a", "integer"), Column("b", "text")), key=("a", "b"))
    assert "IS NOT DISTINCT FROM" in POSTGRESQL.join_delete(s, "w")
    assert 't."b" IS w._ml_k1' in SQLITE.join_delete(s, "w")
    ddl = POSTGRESQL.create_table(s)
    assert "PRIMARY KEY" not in ddl[0] and ddl[1].startswith('CREATE INDEX IF NOT EXISTS "mirrorline_key_t"')


def test_state_and_rejects_tables() -> None:
    assert POSTGRESQL.create_state().startswith('CREATE TABLE IF NOT EXISTS "public"."mirrorline_applied" (scope TEXT')
    assert "ON CONFLICT (scope) DO UPDATE" in SQLITE.upsert_state()
    assert SQLITE.upsert_state().count("?") == 7
    assert '"table"' in DUCKDB.create_rejects() and "VARCHAR" in DUCKDB.create_rejects()
    assert POSTGRESQL.insert_reject().count("%s") == 9


def test_state_write_sets_many_scopes_in_few_statements(tmp_path: Any) -> None:
    """A unit of more tables than one statement takes (state.WRITE_ROWS) sets every table's position and the unit's
    end, on SQLite and DuckDB, over positions written before."""
    from mirrorline.apply import state as applied
    from mirrorline.apply.duckdb.dialect import CATALOG
    from mirrorline.apply.duckdb.home import Home
    from mirrorline.apply.duckdb.session import DuckdbSession
    from mirrorline.apply.sqlite.session import SqliteSession

    assert SQLITE.upsert_state(3).count("?") == 21
    tables = [f'public."t {i}"' for i in range(applied.WRITE_ROWS * 2 + 5)]
    home = Home.of(str(tmp_path / "d.duckdb"))
    for s in (
        SqliteSession(str(tmp_path / "s.sqlite")),
        DuckdbSession(home.enter(), CATALOG),
    ):
        s.begin()
        applied.ensure(s)
        applied.write(s, tables[:7], Position(5, 1), unit=True)
        applied.write(s, tables, Position(9, 2), unit=True)
        applied.write(s, tables[-3:], Position(10, 0), unit=False)
        applied.write(s, tables[:1], Position(11, 0), unit=False)
        s.commit()
        got = applied.read(s)
        assert got.unit_end == Position(9, 2)
        want = {t: Position(9, 2) for t in tables} | {t: Position(10, 0) for t in tables[-3:]}
        assert got.tables == want | {tables[0]: Position(11, 0)}
        s.disconnect()
    home.leave()


def test_serial_one_row_worktable() -> None:
    assert POSTGRESQL.one_row(["_ml_k0", "c"]) == '(SELECT CAST(%s AS text) AS "_ml_k0", CAST(%s AS text) AS "c")'
    assert DUCKDB.one_row(["c"]) == '(SELECT CAST(? AS VARCHAR) AS "c")'


def test_mirror_image_keeps_unchanged_columns_from_the_target() -> None:
    s = TableSchema(
        "public.t", (Column("id", "integer", nullable=False), Column("a", "text"), Column("b", "text")), key=("id",)
    )
    stmt = POSTGRESQL.mirror_image(s, "w", "w_m", ["a", "b"], frozenset({"b"}), ["b"])
    assert stmt.startswith(
        'CREATE TEMP TABLE w_m AS SELECT CAST(w._ml_k0 AS integer) AS "id", w."a" AS "a", '
        't."b" AS "b" FROM w AS w JOIN "public"."t" AS t ON'
    )


@pytest.mark.parametrize(
    ("pg", "sqlite", "duck"),
    [
        ("integer", "INTEGER", "INTEGER"),
        ("bigint", "INTEGER", "BIGINT"),
        ("boolean", "INTEGER", "BOOLEAN"),
        ("numeric(10,2)", "TEXT", "DECIMAL(10,2)"),
        ("numeric", "TEXT", "VARCHAR"),
        ("numeric(60,2)", "TEXT", "VARCHAR"),
        ("character varying(20)", "TEXT", "VARCHAR"),
        ("bytea", "BLOB", "BLOB"),
        ("timestamp with time zone", "TEXT", "TIMESTAMPTZ"),
        ("timestamp(3) without time zone", "TEXT", "TIMESTAMP"),
        ("jsonb", "TEXT", "JSON"),
        ("integer[]", "TEXT", "VARCHAR"),
        ("uuid", "TEXT", "UUID"),
        ("double precision", "REAL", "DOUBLE"),
    ],
)
def test_type_mapping(pg: str, sqlite: str, duck: str) -> None:
    assert SQLITE.type_info("public.t", Column("c", pg)).target_type == sqlite
    assert DUCKDB.type_info("public.t", Column("c", pg)).target_type == duck


@pytest.mark.parametrize("pg", ["tsvector", "point", "mood", "int4range", "pg_lsn", "time with time zone"])
def test_other_types_are_held_as_postgresql_text_by_file_targets(pg: str) -> None:
    """Types SQLite and DuckDB have no counterpart of (geometric, ranges, text search, enums, domains, composites)
    are held as PostgreSQL's text of their values, decided by the type, never refused by a row."""
    assert SQLITE.type_info("public.t", Column("c", pg)) == TypeInfo(pg, "TEXT", "text")
    assert DUCKDB.type_info("public.t", Column("c", pg)) == TypeInfo(pg, "VARCHAR", "text")


def test_values_a_target_type_cannot_hold_are_decided_by_the_type() -> None:
    assert DUCKDB.type_info("public.t", Column("c", "numeric(10,2)")).lossy == NAN
    assert DUCKDB.type_info("public.t", Column("c", "numeric")).lossy == ""  # VARCHAR: NaN kept
    assert SQLITE.type_info("public.t", Column("c", "real")).lossy == NEGATIVE_ZERO
    assert DUCKDB.type_info("public.t", Column("c", "timestamp(3) with time zone")).lossy == AFTER_294246
    assert DUCKDB.type_info("public.t", Column("c", "date")).lossy == ""  # DuckDB's dates go further
    after = LOSSY[AFTER_294246].held
    assert after("294247-01-01 00:00:00") is None and after("294246-12-31 23:59:59.999999") is not None
    assert after("294276-01-01 00:00:00 BC") is not None and after("2020-01-01 00:00:00") is not None
    assert LOSSY[NAN].held("NaN") is None and LOSSY[NAN].held("1.5") == "1.5"
    assert LOSSY[NEGATIVE_ZERO].held("-0") == "0" and LOSSY[NEGATIVE_ZERO].held("-0.5") == "-0.5"
    outside = LOSSY[OUTSIDE_1_9999].held
    for v in ("infinity", "-infinity", "0044-03-15 BC", "10000-01-01", "0001-01-01 00:00:00+00 BC"):
        assert outside(v) is None, v
    for v in ("0001-01-01", "9999-12-31 23:59:59.999999", "2020-06-01 12:00:00+05:30"):
        assert outside(v) == v


def test_bc_dates_in_duckdb_text() -> None:
    assert pg_temporal("0044-03-15 (BC) 12:00:00+00") == "0044-03-15 12:00:00+00 BC"
    assert pg_temporal("4713-01-01 (BC)") == "4713-01-01 BC"
    assert pg_temporal("2020-01-01") == "2020-01-01"


def test_base_type() -> None:
    assert base_type("timestamp(3) with time zone") == "timestamp with time zone"
    assert base_type("character varying(20)[]") == "character varying[]"


def test_seed003_round_robin_dealing() -> None:
    # 003: "TABLE1 and TABLE3 would have been applied by thread 0, and TABLE2 would have been applied by thread 1"
    assert deal(["TABLE1", "TABLE2", "TABLE3"], 2) == [["TABLE1", "TABLE3"], ["TABLE2"]]
    assert deal(["a", "b"], 1) == [["a", "b"]]


def test_applied_state_min_over_tables() -> None:
    st = AppliedState(Position(10), {"a": Position(30), "b": Position(20)})
    assert st.position == Position(20) and st.table("a") == Position(30) and st.table("c") == Position(10)
    assert AppliedState(Position(40), {"a": Position(30)}).position == Position(40)


def test_flatten_net_rows_to_worktable_rows() -> None:
    s = TableSchema(
        "public.t", (Column("id", "integer", nullable=False), Column("a", "text"), Column("b", "text")), key=("id",)
    )
    net = pa.table(
        {
            "table": ["public.t", "public.t"],
            "kind": ["U", "U"],
            "key": [["1"], ["2"]],
            "new": pa.array(
                [[("id", "1"), ("a", "x")], [("id", "2"), ("a", None), ("b", "y")]], pa.map_(pa.string(), pa.string())
            ),
            "unchanged": [["b"], []],
            "lsn": [1, 1],
            "seq": [0, 1],
        }
    )
    w = work_rows.flatten(net, s, "U")
    assert w.column_names == ["_ml_k0", "a", "b", "_ml_unchanged"]
    assert w.to_pylist() == [
        {"_ml_k0": "1", "a": "x", "b": None, "_ml_unchanged": "b"},
        {"_ml_k0": "2", "a": None, "b": "y", "_ml_unchanged": ""},
    ]
    assert work_rows.flatten(net, s, "I").column_names == [
        "id",
        "a",
        "b",
        "_ml_unchanged",
        "_ml_m0",
        "_ml_lsn",
        "_ml_seq",
    ]
    moved = net.append_column("moved_from", pa.array([["7"], None], pa.list_(pa.string())))
    assert work_rows.flatten(moved, s, "I").select(["_ml_unchanged", "_ml_m0", "_ml_lsn", "_ml_seq"]).to_pylist() == [
        {"_ml_unchanged": "b", "_ml_m0": "7", "_ml_lsn": "1", "_ml_seq": "0"},
        {"_ml_unchanged": "", "_ml_m0": None, "_ml_lsn": "1", "_ml_seq": "1"},
    ]
    assert mask_of(["x", "y"]) == f"x{MASK_SEP}y"


def test_worktable_rows_come_in_key_order() -> None:
    # integer keys as numbers (10 after 9), text keys as text, composite keys column by column
    s = TableSchema("public.t", (Column("id", "bigint", nullable=False), Column("a", "text")), key=("id",))
    ids = ["10", "9", "-3", "100"]
    net = pa.table(
        {
            "table": ["public.t"] * 4,
            "kind": ["U"] * 4,
            "key": [[i] for i in ids],
            "new": pa.array([[("id", i), ("a", f"v{i}")] for i in ids], pa.map_(pa.string(), pa.string())),
            "unchanged": pa.array([[]] * 4, pa.list_(pa.string())),
            "lsn": [1] * 4,
            "seq": [0, 1, 2, 3],
        }
    )
    assert work_rows.flatten(net, s, "U")["_ml_k0"].to_pylist() == ["-3", "9", "10", "100"]
    assert work_rows.flatten(net, s, "D")["_ml_k0"].to_pylist() == ["-3", "9", "10", "100"]
    assert work_rows.flatten(net, s, "I")["id"].to_pylist() == ["-3", "9", "10", "100"]
    assert work_rows.flatten(net, s, "I")["a"].to_pylist() == ["v-3", "v9", "v10", "v100"]  # whole rows move together
    t = TableSchema(
        "public.t", (Column("k", "text", nullable=False), Column("n", "integer", nullable=False)), key=("k", "n")
    )
    keys = [["b", "2"], ["a", "10"], ["b", "1"], ["a", "9"]]
    net2 = net.set_column(net.schema.get_field_index("key"), "key", pa.array(keys, pa.list_(pa.string())))
    assert work_rows.flatten(net2, t, "D").to_pylist() == [
        {"_ml_k0": "a", "_ml_k1": "9"},
        {"_ml_k0": "a", "_ml_k1": "10"},
        {"_ml_k0": "b", "_ml_k1": "1"},
        {"_ml_k0": "b", "_ml_k1": "2"},
    ]


def test_rows_already_in_key_order_are_kept_as_they_are() -> None:
    # the check that skips the sort must not mistake text order for number order, nor a repeat for order
    s = TableSchema("public.t", (Column("id", "bigint", nullable=False), Column("a", "text")), key=("id",))
    t = TableSchema("public.t", (Column("id", "text", nullable=False), Column("a", "text")), key=("id",))
    sorted_ints = pa.table({"id": ["-3", "9", "10", "100"], "a": ["w", "x", "y", "z"]})
    assert work_rows.key_order(sorted_ints, s, ["id"]) is sorted_ints  # no copy
    assert work_rows.key_order(sorted_ints, t, ["id"])["id"].to_pylist() == ["-3", "10", "100", "9"]
    chunked = pa.concat_tables([sorted_ints.slice(2), sorted_ints.slice(0, 2)])  # two chunks, out of order
    assert work_rows.key_order(chunked, s, ["id"])["a"].to_pylist() == ["w", "x", "y", "z"]
    nulls = pa.table({"id": pa.array(["b", None, "c"]), "a": ["1", "2", "3"]})
    assert work_rows.key_order(nulls, t, ["id"])["id"].to_pylist() == ["b", "c", None]
