"""The pure parts of a snapshot: the consistent position, chunks, SQL text, chunk names and headers."""

from __future__ import annotations

import itertools

from mirrorline.apply.postgresql import POSTGRESQL
from mirrorline.apply.postgresql.load import copy_in_sql
from mirrorline.model import Column, TableSchema
from mirrorline.position import Position
from mirrorline.snapshot.plan import (
    SEQ_MAX,
    TableStat,
    chunk_header,
    consistent_position,
    copy_out_sql,
    is_bag,
    parse_chunk_file_name,
    parse_chunk_header,
    plan_chunks,
    point_of,
    table_key,
)
from mirrorline.snapshot.state import TableSnapshot, target_state

S = TableSchema("public.t", (Column("id", "bigint", nullable=False), Column("v", "text")), ("id",))


def test_position_boundary_commit_lsn_below_point_is_in_the_snapshot() -> None:
    a = consistent_position(0x2000)
    assert a == Position(0x1FFF, SEQ_MAX) and point_of(a) == 0x2000
    assert Position(0x1FFF, 123456) <= a  # committed before the point: in the snapshot, not applied again
    assert Position(0x2000, 0) > a  # committed at or after the point: from the log


def test_chunks_cover_the_table_and_sort_in_load_order() -> None:
    b = TableStat(S, "r", 100, 1000, sequence=5, index=1)
    a = TableStat(TableSchema("public.a", S.columns, S.key), "r", 7, 70, sequence=-1, index=0)
    p = TableStat(TableSchema("public.p", S.columns, S.key), "p", 50, 10, sequence=9, index=2)
    chunks = plan_chunks([b, a, p], chunk_blocks=30)
    assert [c.table for c in chunks] == ["public.a"] + ["public.t"] * 4 + ["public.p"]
    t = [c for c in chunks if c.table == "public.t"]
    assert t[0].first is None and t[-1].stop is None  # open at both ends
    assert all(x.stop == y.first for x, y in itertools.pairwise(t))
    names = [c.file_name for c in chunks]
    assert names == sorted(names)
    assert parse_chunk_file_name(names[1]) == (1, 0, "public.t")
    assert t[1].where() == "ctid >= '(25,0)'::tid AND ctid < '(50,0)'::tid"
    assert chunks[-1].where() == ""  # a partitioned table is read whole


def test_copy_statements_quote_everything() -> None:
    odd = TableSchema('s"x.t y', (Column("a b", "integer"),), ("a b",))
    assert copy_out_sql(odd, None, "csv") == 'COPY (SELECT "a b" FROM "s""x"."t y") TO STDOUT WITH (FORMAT csv)'
    assert copy_in_sql(POSTGRESQL.table('s"x.t y'), ["a b"], "binary") == (
        'COPY "s""x"."t y" ("a b") FROM STDIN WITH (FORMAT binary)'
    )


def test_chunk_header_round_trip() -> None:
    c = plan_chunks([TableStat(S, "r", 1, 1)], 10)[0]
    h = chunk_header("abc", c)
    assert '"' not in h and h.endswith("\n")
    assert parse_chunk_header(h) == {"export": "abc", "table": "public.t", "chunk": "0"}
    assert parse_chunk_header("1,2,3\n") is None


def test_key_rule_matches_capture() -> None:
    cols = (Column("id", "bigint"), Column("doc", "text"), Column("n", "integer"))
    assert table_key(cols, "d", ("id",), ("id",)) == ("id",)
    assert table_key(cols, "f", ("id",), ("id", "doc", "n")) == ("id",)
    assert table_key(cols, "f", (), ("id", "doc", "n")) == ("id", "doc", "n")  # no primary key: every column
    assert is_bag(cols, "f", (), ("id", "doc", "n"))
    assert not is_bag(cols, "f", ("id",), ("id", "doc", "n")) and not is_bag(cols, "d", ("id",), ("id",))
    assert not is_bag(cols, "f", (), ("id", "doc", "n"), configured=("n",))
    assert table_key(cols, "d", ("id",), ("id",), configured=("n",)) == ("n",)


def test_target_states() -> None:
    a = Position(0x100, SEQ_MAX)
    loaded = {"public.t": TableSnapshot("public.t", "loaded", a, 0x500, 10, "wire", "")}
    assert target_state({}, ["public.t"], None, False) == "new"
    loading = {"public.t": TableSnapshot("public.t", "loading", a, 0, 0, "wire", "")}
    assert target_state(loading, ["public.t"], None, False) == "loading"
    assert target_state(loaded, ["public.t"], a, False) == "catching up"
    assert target_state(loaded, ["public.t"], Position(0x500, 0), False) == "live"
    assert target_state(loaded, ["public.t"], a, True) == "live"
    assert target_state(loaded, ["public.t", "public.new"], a, True) == "loading"  # a table added, not loaded yet
