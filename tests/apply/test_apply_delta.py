"""The Delta target's own promises: one commit per table and unit carrying the position, the type mapping (read back
by deltalake and by DuckDB from the Parquet files of the current version), the checks made before a commit, rejects,
a read as of the target's position, compaction and cleanup while units are applied."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import threading
from pathlib import Path
from typing import Any

import configs
import duckdb
import pytest
from apply_support import ITEMS, ORDERS, P, batch, fetch, net, open_target
from deltalake import DeltaTable

from mirrorline.apply import Needs
from mirrorline.apply.delta import DeltaTarget, table_position
from mirrorline.errors import ApplyError, TargetError
from mirrorline.model import Column, TableSchema

pytestmark = pytest.mark.spark

SCHEMAS = {ITEMS.table: ITEMS, ORDERS.table: ORDERS}
COLS = ["id", "name", "qty", "note"]


def items(i: int, name: str | None = None) -> tuple[Any, ...]:
    return net("public.items", "I", [i], {"id": i, "name": name or f"n{i}", "qty": i * 10, "note": None})


def delta(request: Any, tmp_path: Path, **kw: Any) -> DeltaTarget:
    t = open_target("delta", request, tmp_path, **kw)
    assert isinstance(t, DeltaTarget)
    return t


def test_each_unit_is_one_commit_per_table_carrying_the_position(spark: Any, request: Any, tmp_path: Path) -> None:
    t = delta(request, tmp_path)
    t.apply(batch(spark, [items(1), items(2)], P(0), P(0x100)), SCHEMAS)
    a = DeltaTable(str(t.path("public.items")))
    v1 = a.version()
    rows = [
        net("public.items", "D", [1]),
        net("public.items", "U", [2], {"id": 2, "qty": 7}, unchanged=["name", "note"]),
        items(3),
        net("public.orders", "I", [5], {"id": 5, "item": 2, "status": "new"}),
    ]
    t.apply(batch(spark, rows, P(0x100), P(0x2AB, 4)), SCHEMAS)
    a = DeltaTable(str(t.path("public.items")))
    assert a.version() == v1 + 1  # deletes, updates and inserts of the unit: one commit
    assert (a.transaction_version("t1"), a.transaction_version("t1.seq")) == (0x2AB, 4)
    last = a.history(1)[0]
    assert last["operation"] == "MERGE"
    assert last["mirrorline.position"] == str(P(0x2AB, 4)) and last["mirrorline.target"] == "t1"
    assert table_position(DeltaTable(str(t.path("public.orders"))), "t1") == P(0x2AB, 4)
    assert fetch(t, "public.items", COLS) == [(2, "n2", 7, None), (3, "n3", 30, None)]
    described = t.describe()
    assert described["items"]["version"] == v1 + 1 and described["items"]["position"] == str(P(0x2AB, 4))
    assert described["items"]["files"] >= 1
    # the unit again: skipped, no new commit
    assert t.apply(batch(spark, rows, P(0x100), P(0x2AB, 4)), SCHEMAS).noop
    assert DeltaTable(str(t.path("public.items"))).version() == v1 + 1


TYPES = TableSchema(
    "public.kinds",
    (
        Column("id", "integer", nullable=False),
        Column("s", "smallint"),
        Column("b", "bigint"),
        Column("r", "real"),
        Column("d", "double precision"),
        Column("ok", "boolean"),
        Column("price", "numeric(12,2)"),
        Column("big", "numeric"),
        Column("raw", "bytea"),
        Column("day", "date"),
        Column("at", "timestamp without time zone"),
        Column("atz", "timestamp with time zone"),
        Column("u", "uuid"),
        Column("j", "jsonb"),
        Column("arr", "text[]"),
        Column("t", "time without time zone"),
        Column("iv", "interval"),
        Column("Odd Name", "character varying(10)"),
    ),
    key=("id",),
)
VALUES = {
    "id": "1",
    "s": "-32768",
    "b": "9223372036854775807",
    "r": "NaN",
    "d": "-Infinity",
    "ok": "t",
    "price": "1234567890.12",
    "big": "123456789012345678901234567890.000000000000000000001",
    "raw": "\\x00ff10",
    "day": "2024-02-29",
    "at": "2024-02-29 23:59:59.123456",
    "atz": "2024-02-29 23:59:59.5+02",
    "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "j": '{"a": "\\u00e9", "b": [1, null]}',
    "arr": '{"x,y",NULL,"q\\"uote"}',
    "t": "24:00:00",
    "iv": "1 year -2 days +03:00:00",
    "Odd Name": "c  ",
}
EXPECTED_TYPES = {
    "id": "int32",
    "s": "int16",
    "b": "int64",
    "r": "float",
    "d": "double",
    "ok": "bool",
    "price": "decimal128(12, 2)",
    "big": "string",
    "raw": "binary",
    "day": "date32[day]",
    "at": "timestamp[us]",
    "atz": "timestamp[us, tz=UTC]",
    "u": "string",
    "j": "string",
    "arr": "string",
    "t": "string",
    "iv": "string",
    "Odd Name": "string",
}


def _check_values(row: dict[str, Any]) -> None:
    assert row["s"] == -32768 and row["b"] == 9223372036854775807
    assert math.isnan(row["r"]) and row["d"] == -math.inf and row["ok"] is True
    assert row["price"] == decimal.Decimal("1234567890.12") and row["big"] == VALUES["big"]
    assert row["raw"] == b"\x00\xff\x10" and row["day"] == dt.date(2024, 2, 29)
    assert row["at"] == dt.datetime(2024, 2, 29, 23, 59, 59, 123456)
    assert row["atz"].astimezone(dt.UTC) == dt.datetime(2024, 2, 29, 21, 59, 59, 500000, tzinfo=dt.UTC)
    for c in ("u", "j", "arr", "t", "iv", "Odd Name"):
        assert row[c] == VALUES[c], c


def test_types_map_as_documented_and_read_back_by_deltalake_and_duckdb(
    spark: Any, request: Any, tmp_path: Path
) -> None:
    t = delta(request, tmp_path)
    t.apply(batch(spark, [net("public.kinds", "I", [1], VALUES)], P(0), P(0x10)), {TYPES.table: TYPES})
    table = DeltaTable(str(t.path("public.kinds")))
    data = table.to_pyarrow_table()
    assert {f.name: str(f.type) for f in data.schema} == EXPECTED_TYPES
    _check_values(data.to_pylist()[0])
    # DuckDB reading the Parquet files of the current version: the same values
    files = [u.removeprefix("file://") for u in table.file_uris()]
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    got = con.sql(f"SELECT * FROM read_parquet({files!r})").to_arrow_table().to_pylist()
    con.close()
    assert len(got) == 1
    _check_values(got[0])


def test_a_value_that_is_no_date_stops_the_unit_with_nothing_written(spark: Any, request: Any, tmp_path: Path) -> None:
    """Dates Delta cannot hold (infinite, BC, after 9999) are held as NULL, decided by the type; a text that is no
    date at all stops the unit."""
    schema = TableSchema("public.days", (Column("id", "integer", nullable=False), Column("d", "date")), key=("id",))
    t = delta(request, tmp_path)
    held = [
        net("public.days", "I", [i], {"id": i, "d": d})
        for i, d in enumerate(["2024-01-01", "infinity", "-infinity", "0044-03-15 BC", "12024-01-01"], 1)
    ]
    t.apply(batch(spark, held, P(0), P(1)), {"public.days": schema})
    assert sorted(fetch(t, "public.days", ["id", "d"])) == [
        (1, dt.date(2024, 1, 1)),
        (2, None),
        (3, None),
        (4, None),
        (5, None),
    ]
    v = DeltaTable(str(t.path("public.days"))).version()
    bad = [net("public.days", "I", [9], {"id": 9, "d": "2024-02-30"})]
    with pytest.raises(ApplyError, match=r"public\.days\.d: '2024-02-30' is not a valid date value for a Delta date"):
        t.apply(batch(spark, bad, P(1), P(2)), {"public.days": schema})
    assert DeltaTable(str(t.path("public.days"))).version() == v
    assert t.applied_position() == P(1)


@pytest.mark.parametrize("mode", ["update", "mirror"])
def test_stop_names_the_net_change_and_commits_nothing(mode: str, spark: Any, request: Any, tmp_path: Path) -> None:
    t = delta(request, tmp_path, mode=mode)
    t.apply(batch(spark, [items(1), items(2)], P(0), P(0x100)), SCHEMAS)
    v = DeltaTable(str(t.path("public.items"))).version()
    for rows, what in [
        ([net("public.items", "D", [9])], "no row with this key at the target to delete"),
        ([items(2)], "a row with this key is at the target already"),
    ]:
        with pytest.raises(ApplyError, match=what) as e:
            t.apply(batch(spark, [net("public.items", "D", [1]), *rows], P(0x100), P(0x200)), SCHEMAS)
        assert e.value.context["table"] == "public.items"
        assert DeltaTable(str(t.path("public.items"))).version() == v
        assert t.applied_position() == P(0x100)
    assert sorted(fetch(t, "public.items", ["id"])) == [(1,), (2,)]
    if mode == "update":
        with pytest.raises(ApplyError, match="no row with this key at the target to update"):
            t.apply(batch(spark, [net("public.items", "U", [7], {"id": 7, "qty": 1})], P(0x100), P(0x200)), SCHEMAS)
    else:  # mirror: an update of a missing row inserts it
        t.apply(
            batch(
                spark,
                [net("public.items", "U", [7], {"id": 7, "name": "m", "qty": 1, "note": None})],
                P(0x100),
                P(0x200),
            ),
            SCHEMAS,
        )
        assert (7, "m", 1, None) in fetch(t, "public.items", COLS)


def test_reject_sets_failing_net_changes_aside_and_applies_the_rest(spark: Any, request: Any, tmp_path: Path) -> None:
    t = delta(request, tmp_path, on_error="reject")
    t.apply(batch(spark, [items(1), items(2)], P(0), P(0x100)), SCHEMAS)
    rows = [
        net("public.items", "D", [9]),
        net("public.items", "U", [8], {"id": 8, "qty": 1}, unchanged=["name", "note"]),
        net("public.items", "I", [2], {"id": 2, "name": "dup", "qty": 0, "note": None}, pos=P(0x150, 3)),
        net("public.items", "U", [1], {"id": 1, "qty": 11}, unchanged=["name", "note"]),
        items(3),
        net("public.items", "I", [4], {"id": 4, "name": "q", "qty": "lots", "note": None}, pos=P(0x160)),
    ]
    res = t.apply(batch(spark, rows, P(0x100), P(0x200)), SCHEMAS)
    assert res.rejects == 4
    assert fetch(t, "public.items", COLS) == [(1, "n1", 11, None), (2, "n2", 20, None), (3, "n3", 30, None)]
    assert t.applied_position() == P(0x200)
    s = t.session()
    try:
        got = s.query('SELECT "table", "key", op, position, error FROM mirrorline_rejects ORDER BY op, "key"')
    finally:
        s.close()
    assert [(r[0], r[1], r[2]) for r in got] == [
        ("public.items", '["9"]', "D"),
        ("public.items", '["2"]', "I"),
        ("public.items", '["4"]', "I"),
        ("public.items", '["8"]', "U"),
    ]
    assert got[1][3] == str(P(0x150, 3)) and "already" in got[1][4]
    assert got[2][3] == str(P(0x160)) and "'lots' is not a valid bigint value" in got[2][4]


def test_a_read_is_as_of_the_targets_position_when_a_table_is_ahead(
    spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    t = delta(request, tmp_path)
    t.apply(
        batch(spark, [items(1), net("public.orders", "I", [1], {"id": 1, "item": 1, "status": "a"})], P(0), P(0x100)),
        SCHEMAS,
    )
    unit = [items(2), net("public.orders", "I", [2], {"id": 2, "item": 2, "status": "b"})]
    real = DeltaTarget._apply_table

    def orders_fail(self: DeltaTarget, u: Any, ts: TableSchema) -> Any:
        if ts.table == "public.orders":
            raise RuntimeError("killed before orders")
        return real(self, u, ts)

    monkeypatch.setattr(DeltaTarget, "_apply_table", orders_fail)
    with pytest.raises(RuntimeError):
        t.apply(batch(spark, unit, P(0x100), P(0x200)), SCHEMAS)
    monkeypatch.setattr(DeltaTarget, "_apply_table", real)
    assert len(fetch(t, "public.items", COLS)) == 2  # items' commit landed
    t.maintain(retention_hours=10_000)  # a compaction commit after it changes no rows
    with t.consistent_read() as rd:
        assert rd.position == P(0x100)
        got = [r for b in rd.rows(ITEMS) for r in b]
    assert [r[0] for r in got] == ["1"]
    res = t.apply(batch(spark, unit, P(0x100), P(0x200)), SCHEMAS)
    assert res.skipped == ["public.items"] and res.applied == ["public.orders"]
    with t.consistent_read() as rd:
        assert rd.position == P(0x200)
        assert sorted(r[0] for b in rd.rows(ITEMS) for r in b) == ["1", "2"]


def test_compaction_and_cleanup_while_units_are_applied(spark: Any, request: Any, tmp_path: Path) -> None:
    t = delta(request, tmp_path)
    t.apply(batch(spark, [items(i) for i in range(50)], P(0), P(1)), SCHEMAS)
    units = []
    for n in range(2, 22):
        units.append(
            batch(
                spark,
                [net("public.items", "U", [n], {"id": n, "name": f"u{n}", "qty": n, "note": "x"}), items(100 + n)],
                P(n - 1),
                P(n),
            )
        )
    for u in units:  # Spark jobs before the race: the apply thread only reads the rows back
        u.arrow() if u.rows is not None else None
    errors: list[BaseException] = []
    done = threading.Event()

    def upkeep() -> None:
        try:
            while not done.is_set():
                t.maintain(retention_hours=1)  # what a unit being applied reads is younger than that
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    worker = threading.Thread(target=upkeep)
    worker.start()
    try:
        for u in units:
            t.apply(u, SCHEMAS)
    finally:
        done.set()
        worker.join()
    assert not errors, errors
    t.maintain(retention_hours=0)
    table = DeltaTable(str(t.path("public.items")))
    assert len(table.file_uris()) == 1
    on_disk = list(Path(t.path("public.items")).glob("*.parquet"))
    assert len(on_disk) == 1  # vacuumed: no file left that the current version does not read
    expected = {(i, f"n{i}", i * 10, None) for i in range(50)}
    expected = {r for r in expected if not 2 <= r[0] < 22} | {(n, f"u{n}", n, "x") for n in range(2, 22)}
    expected |= {(100 + n, f"n{100 + n}", (100 + n) * 10, None) for n in range(2, 22)}
    assert set(fetch(t, "public.items", COLS)) == expected
    assert t.applied_position() == P(21)


def test_a_constraint_error_and_a_missing_folder_are_clear(spark: Any, request: Any, tmp_path: Path) -> None:
    t = delta(request, tmp_path)
    t.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)
    DeltaTable(str(t.path("public.items"))).alter.add_constraint({"small": "qty < 100"})
    with pytest.raises(ApplyError, match=r"breaks a constraint of the Delta table public\.items"):
        t.apply(batch(spark, [items(50)], P(1), P(2)), SCHEMAS)
    assert t.applied_position() == P(1)
    other = DeltaTarget("t2", str(tmp_path / "file-not-folder"))
    (tmp_path / "file-not-folder").write_text("x")
    with pytest.raises(TargetError, match=r"cannot use .*file-not-folder as the Delta target's folder"):
        other.applied_positions()


def _config(tmp_path: Path, lake: dict[str, Any], **targets: dict[str, Any]) -> Path:
    """The target ``lake`` (delta:///lake, with the settings ``lake``) and ``targets``."""
    return configs.write(
        tmp_path / "m.toml", log=tmp_path / "log", targets={"lake": {"url": "delta:///lake", **lake}, **targets}
    )


@pytest.mark.parametrize(
    ("lake", "targets", "key", "reason"),
    [
        ({"vacuum_retention": "10m"}, {}, "targets.lake.vacuum_retention", "must be at least 1h"),
        ({"compact_every": "often"}, {}, "targets.lake.compact_every", "expected a duration"),
        (
            {},
            {"db": {"url": "sqlite:///x.db", "compact_every": "1h"}},
            "targets.db.compact_every",
            "has no files to compact",
        ),
    ],
)
def test_upkeep_settings_are_checked(
    tmp_path: Path, lake: dict[str, Any], targets: dict[str, dict[str, Any]], key: str, reason: str
) -> None:
    from mirrorline import config
    from mirrorline.errors import ConfigError

    with pytest.raises(ConfigError, match=reason) as e:
        config.load(_config(tmp_path, lake, **targets))
    assert e.value.key == key


def test_run_compacts_on_schedule_and_the_command_does_it_at_once(spark: Any, tmp_path: Path, capsys: Any) -> None:
    from mirrorline import config
    from mirrorline.apply import open_target as open_configured
    from mirrorline.cli.main import main
    from mirrorline.pipeline import Applier

    conf = config.load(_config(tmp_path, {"compact_every": "200ms", "vacuum_retention": "2h"}))
    assert (conf.targets["lake"].compact_every, conf.targets["lake"].retention_hours) == (0.2, 2)
    t = open_configured(conf.targets["lake"])
    for n in range(1, 4):
        t.apply(batch(spark, [items(n)], P(n - 1), P(n)), SCHEMAS)
    t.close()
    path = tmp_path / "lake" / "items"
    assert len(DeltaTable(str(path)).file_uris()) == 3
    applier = Applier(conf, spark=spark, open_targets=True)
    try:
        applier.upkeep()  # starts the clock
        assert DeltaTable(str(path)).history(1)[0]["operation"] != "OPTIMIZE"
        import time

        time.sleep(0.3)
        applier.upkeep()
    finally:
        applier.close()  # waits for the upkeep running
    assert len(DeltaTable(str(path)).file_uris()) == 1
    assert any(c["operation"] == "OPTIMIZE" for c in DeltaTable(str(path)).history(3))
    # the command: nothing left to compact; its report per table
    t = open_configured(conf.targets["lake"])
    t.apply(batch(spark, [items(9)], P(3), P(4)), SCHEMAS)
    t.close()
    assert main(["maintain", "-c", str(tmp_path / "m.toml"), "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["lake"]["items"]["compacted"] == {"removed": 2, "added": 1}
    assert main(["maintain", "-c", str(tmp_path / "m.toml"), "--target", "nope"]) == 2
    assert sorted(fetch(t, "public.items", ["id"])) == [(1,), (2,), (3,), (9,)]


def test_status_shows_each_delta_tables_version_files_and_position(spark: Any, tmp_path: Path) -> None:
    from mirrorline import config
    from mirrorline.apply import open_target as open_configured
    from mirrorline.status import status

    conf = config.load(_config(tmp_path, {}))
    t = open_configured(conf.targets["lake"])
    t.apply(batch(spark, [items(1), items(2)], P(0), P(0x10, 2)), SCHEMAS)
    t.close()
    st = status(conf)
    (lake,) = st.targets
    assert lake.details == {"items": {"version": 1, "files": 1, "position": str(P(0x10, 2))}}
    assert st.to_json()["targets"][0]["table_details"]["items"]["version"] == 1
    assert f"  items: version 1, files 1, position {P(0x10, 2)}" in st.text()


def test_a_replace_writes_the_row_whether_it_was_there_or_not(spark: Any, request: Any, tmp_path: Path) -> None:
    # with actions that drop D, the compile sends every first insert of a key as a delete and an insert (the row may
    # be kept at the target): on Delta that is one replaced row, written either way
    t = delta(request, tmp_path)
    t.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)
    rows = [net("public.items", "D", [1]), items(1, "again"), net("public.items", "D", [2]), items(2, "new")]
    res = t.apply(batch(spark, rows, P(1), P(2)), SCHEMAS)
    assert res.rejects == 0
    assert fetch(t, "public.items", COLS) == [(1, "again", 10, None), (2, "new", 20, None)]


def test_bad_values_in_keys_are_set_aside_once_with_the_rest_applied(spark: Any, request: Any, tmp_path: Path) -> None:
    t = delta(request, tmp_path, on_error="reject")
    t.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)
    rows = [
        net("public.items", "I", ["x1"], {"id": "x1", "name": "k", "qty": 1, "note": None}, pos=P(2, 1)),  # bad key
        net("public.items", "I", [1], {"id": 1, "name": "dup", "qty": "lots", "note": None}, pos=P(2, 2)),  # twice bad
        net("public.items", "D", ["y"]),  # bad key of a delete
        items(5),
    ]
    res = t.apply(batch(spark, rows, P(1), P(2, 9)), SCHEMAS)
    assert res.rejects == 3
    assert fetch(t, "public.items", COLS) == [(1, "n1", 10, None), (5, "n5", 50, None)]
    s = t.session()
    try:
        got = s.query('SELECT "key", op, error FROM mirrorline_rejects ORDER BY "key"')
    finally:
        s.close()
    assert [(k, op) for k, op, _ in got] == [('["1"]', "I"), ('["x1"]', "I"), ('["y"]', "D")]
    assert "'x1' is not a valid integer value" in got[1][2]
    # stop: the same unit names the first one and writes nothing
    (tmp_path / "stop").mkdir()
    s2 = delta(request, tmp_path / "stop")
    s2.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)
    with pytest.raises(ApplyError, match=r"'y' is not a valid integer value") as e:
        s2.apply(batch(spark, rows, P(1), P(2, 9)), SCHEMAS)
    assert e.value.context["key"] == ["y"] and e.value.context["op"] == "D"
    assert s2.applied_position() == P(1) and fetch(s2, "public.items", ["id"]) == [(1,)]


@pytest.mark.parametrize("keep", [False, True])
def test_a_column_dropped_at_the_source(spark: Any, request: Any, tmp_path: Path, keep: bool) -> None:
    """Dropped from the Delta table (its rows written again without it, the table's position kept); with
    ``dropped_columns = "keep"`` kept, NULL in later writes."""
    t = delta(request, tmp_path)
    t.needs = Needs(table_policy=lambda table: (keep, True))
    t.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)  # the Delta table has note
    narrower = TableSchema("public.items", ITEMS.columns[:3], key=("id",), version=2)
    rows = [net("public.items", "I", [7], {"id": 7, "name": "n7", "qty": 70})]
    t.apply(batch(spark, rows, P(1), P(2)), {"public.items": narrower})  # append
    cols = COLS if keep else COLS[:3]
    tail = (None,) * keep
    assert sorted(fetch(t, "public.items", cols)) == [(1, "n1", 10, *tail), (7, "n7", 70, *tail)]
    assert t.applied_position() == P(2)
    t.apply(batch(spark, rows, P(2), P(3), truncated={"public.items": P(3)}), {"public.items": narrower})  # overwrite
    assert fetch(t, "public.items", cols) == [(7, "n7", 70, *tail)]


def test_a_public_table_whose_name_holds_a_dot_has_a_folder_of_its_own(
    spark: Any, request: Any, tmp_path: Path
) -> None:
    dotted = TableSchema("public.a.b", (Column("id", "integer", nullable=False),), key=("id",))
    other = TableSchema("a.b", (Column("id", "integer", nullable=False),), key=("id",))
    t = delta(request, tmp_path)
    t.apply(batch(spark, [net("public.a.b", "I", [1], {"id": 1})], P(0), P(1)), {"public.a.b": dotted})
    t.apply(batch(spark, [net("a.b", "I", [2], {"id": 2})], P(1), P(2)), {"a.b": other})
    assert t.path("public.a.b").name == "public.a.b" and t.path("a.b").name == "a.b"
    state = t.applied_positions()
    assert state.tables["public.a.b"] == P(1) and state.tables["a.b"] == P(2) and state.position == P(2)
    assert fetch(t, "public.a.b", ["id"]) == [(1,)] and fetch(t, "a.b", ["id"]) == [(2,)]


@pytest.mark.parametrize(
    "table",
    ["public.../../outside", "public./tmp/abs", "public._mirrorline.sqlite", "public._mirrorline.lock", "x.y.z/..",
     "public.100%", "public..hidden"],
)  # fmt: skip
def test_a_hostile_table_name_stays_inside_the_folder(spark: Any, request: Any, tmp_path: Path, table: str) -> None:
    ts = TableSchema(table, (Column("id", "integer", nullable=False),), key=("id",))
    root = tmp_path / "lake"
    root.mkdir()
    t = DeltaTarget("h", str(root))
    request.addfinalizer(t.close)
    t.apply(batch(spark, [net(table, "I", [1], {"id": 1})], P(0), P(1)), {table: ts})
    folder = t.path(table)
    assert folder.parent == root and folder.name not in (".", "..", "_mirrorline.sqlite", "_mirrorline.lock")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake"]  # nothing written beside the target's folder
    assert (root / "_mirrorline.sqlite").is_file() and fetch(t, table, ["id"]) == [(1,)]
    assert t.applied_positions().tables[table] == P(1)  # the folder maps back to the table


def test_a_folder_that_cannot_hold_tables_is_a_target_error_for_schema_and_upkeep(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    t = DeltaTarget("t3", str(tmp_path / "file"))
    with pytest.raises(TargetError, match=r"writing the Delta table public\.items failed"):
        t.ensure_schema([ITEMS])
    ok = DeltaTarget("t4", str(tmp_path / "lake"))
    ok.ensure_schema([ITEMS])
    (tmp_path / "lake" / "items" / "_delta_log" / "00000000000000000000.json").write_text("not json")
    with pytest.raises(TargetError):
        ok.maintain()
