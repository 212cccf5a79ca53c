"""The Iceberg target's own promises, each read back by pyiceberg's own catalog and scan (tests/support/oracle.py):
one commit per table and unit carrying the position, tables named as the source's (spaces, capitals, quotes, dots),
keys that are not the first column or are composite, a read as of the target's position, schema evolution by
Iceberg's own rules (a rename keeps the column's id, a widening writes no file), compaction, expiry and orphan files,
status, and the catalog a target's configuration names (its secrets from the environment, never printed)."""

from __future__ import annotations

import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import configs
import oracle
import pytest
from apply_support import ITEMS, ORDERS, P, batch, fetch, net, open_target

from mirrorline.apply.iceberg import IcebergTarget
from mirrorline.apply.state import AppliedState
from mirrorline.errors import ConfigError, TargetError
from mirrorline.model import Column, TableSchema

pytestmark = pytest.mark.spark

SCHEMAS = {ITEMS.table: ITEMS, ORDERS.table: ORDERS}
COLS = ["id", "name", "qty", "note"]


def items(i: int, name: str | None = None) -> tuple[Any, ...]:
    return net("public.items", "I", [i], {"id": i, "name": name or f"n{i}", "qty": i * 10, "note": None})


def iceberg(request: Any, tmp_path: Path, **kw: Any) -> IcebergTarget:
    t = open_target("iceberg", request, tmp_path, **kw)
    assert isinstance(t, IcebergTarget)
    return t


def table(t: IcebergTarget, name: str) -> Any:
    found = oracle.iceberg_table(t.location, name)
    assert found is not None, name
    return found


def test_each_unit_is_one_commit_per_table_carrying_the_position(spark: Any, request: Any, tmp_path: Path) -> None:
    t = iceberg(request, tmp_path)
    t.apply(batch(spark, [items(1), items(2), items(4)], P(0), P(0x100)), SCHEMAS)
    before = table(t, "public.items")
    n_meta = len(before.metadata.metadata_log)
    rows = [
        net("public.items", "D", [1]),
        net("public.items", "U", [2], {"id": 2, "qty": 7}, unchanged=["name", "note"]),  # name kept from the row
        items(3),
        net("public.orders", "I", [5], {"id": 5, "item": 2, "status": "new"}),
    ]
    t.apply(batch(spark, rows, P(0x100), P(0x2AB, 4)), SCHEMAS)
    after = table(t, "public.items")
    assert len(after.metadata.metadata_log) == n_meta + 1  # deletes, updates, inserts and position: one commit
    assert after.properties["mirrorline.position.t1"] == str(P(0x2AB, 4))
    snap = after.current_snapshot()
    assert snap.summary["mirrorline.position"] == str(P(0x2AB, 4)) and snap.summary["mirrorline.target"] == "t1"
    assert table(t, "public.orders").properties["mirrorline.position.t1"] == str(P(0x2AB, 4))
    assert fetch(t, "public.items", COLS) == [(2, "n2", 7, None), (3, "n3", 30, None), (4, "n4", 40, None)]
    described = t.describe()["public.items"]
    assert described["position"] == str(P(0x2AB, 4)) and described["snapshot"] == snap.snapshot_id
    assert described["data_files"] >= 1 and described["delete_files"] == 0
    # the unit again: skipped, no new commit
    assert t.apply(batch(spark, rows, P(0x100), P(0x2AB, 4)), SCHEMAS).noop
    assert len(table(t, "public.items").metadata.metadata_log) == n_meta + 1


ODD = TableSchema(
    'My Schema.Order "Items" v2.0',
    (Column("Note", "text"), Column("Region", "text", nullable=False), Column("Id", "bigint", nullable=False)),
    key=("Region", "Id"),  # composite, neither column first
)


def test_names_as_the_sources_and_a_composite_key_that_is_not_first(spark: Any, request: Any, tmp_path: Path) -> None:
    t = iceberg(request, tmp_path)
    name = ODD.table
    schemas = {name: ODD}

    def row(op: str, region: str, i: int, note: str | None = None, **kw: Any) -> tuple[Any, ...]:
        new = None if op == "D" else {"Region": region, "Id": i, "Note": note}
        return net(name, op, [region, i], new, **kw)

    first = [row("I", r, i, f"{r}{i}") for r in ("eu", "us") for i in range(1, 4)]
    t.apply(batch(spark, first, P(0), P(0x10)), schemas)
    ident = table(t, name).name()
    assert ident == ("My Schema", 'Order "Items" v2.0')
    assert "/warehouse/My~20Schema/Order~20~22Items~22~20v2~2E0" in table(t, name).location()
    # one key of several sharing its first key column deleted, one updated, one inserted: the others stay
    unit = [row("D", "eu", 1), row("U", "us", 2, "changed"), row("I", "eu", 9, "new")]
    t.apply(batch(spark, unit, P(0x10), P(0x20)), schemas)
    want = {("eu", 2, "eu2"), ("eu", 3, "eu3"), ("eu", 9, "new"), ("us", 1, "us1"), ("us", 2, "changed")}
    want.add(("us", 3, "us3"))
    assert set(fetch(t, name, ["Region", "Id", "Note"])) == want
    assert t.applied_positions().table(name) == P(0x20)
    with t.consistent_read() as rd:
        assert len([r for b in rd.rows(ODD) for r in b]) == 6


def test_a_read_is_as_of_the_targets_position_when_a_table_is_ahead(
    spark: Any, request: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    t = iceberg(request, tmp_path)
    t.apply(
        batch(spark, [items(1), net("public.orders", "I", [1], {"id": 1, "item": 1, "status": "a"})], P(0), P(0x100)),
        SCHEMAS,
    )
    unit = [items(2), net("public.orders", "I", [2], {"id": 2, "item": 2, "status": "b"})]
    real = IcebergTarget._apply_table

    def orders_fail(self: IcebergTarget, u: Any, ts: TableSchema) -> Any:
        if ts.table == "public.orders":
            raise RuntimeError("killed before orders")
        return real(self, u, ts)

    monkeypatch.setattr(IcebergTarget, "_apply_table", orders_fail)
    with pytest.raises(RuntimeError):
        t.apply(batch(spark, unit, P(0x100), P(0x200)), SCHEMAS)
    monkeypatch.setattr(IcebergTarget, "_apply_table", real)
    assert len(fetch(t, "public.items", COLS)) == 2  # items' commit landed
    with t.consistent_read() as rd:
        assert rd.position == P(0x100)
        assert [r[0] for b in rd.rows(ITEMS) for r in b] == ["1"]
    res = t.apply(batch(spark, unit, P(0x100), P(0x200)), SCHEMAS)
    assert res.skipped == ["public.items"] and res.applied == ["public.orders"]
    with t.consistent_read() as rd:
        assert rd.position == P(0x200)
        assert sorted(r[0] for b in rd.rows(ITEMS) for r in b) == ["1", "2"]


def _shape(ts: TableSchema, t: IcebergTarget) -> AppliedState:
    return AppliedState(shape_docs={ts.table: ts})  # the shape the table has, as recorded with the target's state


def _evo(n: str, label: str, c: str, version: int) -> TableSchema:
    """public.evo with columns n, label (by name) and c of these types (the attnums tell a rename from a drop)."""
    cols = (Column("id", "integer", nullable=False, attnum=1), Column("n", n, attnum=2))
    return TableSchema(
        "public.evo", (*cols, Column(label, "text", attnum=3), Column("c", c, attnum=4)), key=("id",), version=version
    )


def test_schema_changes_by_icebergs_own_evolution(spark: Any, request: Any, tmp_path: Path) -> None:
    t = iceberg(request, tmp_path)
    old = _evo("integer", "label", "integer", 1)
    t.ensure_schema([old])
    rows = [net("public.evo", "I", [i], {"id": i, "n": i, "label": f"l{i}", "c": str(i * 2)}) for i in range(3)]
    t.apply(batch(spark, rows, P(0), P(0x10)), {old.table: old})
    ids = {f.name: f.field_id for f in table(t, "public.evo").schema().fields}
    files = {task.file.file_path for task in table(t, "public.evo").scan().plan_files()}
    # a rename and a widening (integer to bigint): the schema changes, no data file is written
    renamed = _evo("bigint", "title", "integer", 2)
    done = t.follow_schema([renamed], _shape(old, t))
    assert done and "schema evolution" in done[0], done
    after = table(t, "public.evo")
    assert {f.name: f.field_id for f in after.schema().fields} == {
        "id": ids["id"],
        "n": ids["n"],
        "title": ids["label"],
        "c": ids["c"],
    }
    assert str(after.schema().find_field("n").field_type) == "long"
    assert {task.file.file_path for task in after.scan().plan_files()} == files
    # integer to numeric, which Iceberg cannot widen: the rows are written again in the same commit, the position kept
    typed = _evo("bigint", "title", "numeric(12,2)", 3)
    done = t.follow_schema([typed], _shape(renamed, t))
    assert "rows written again" in done[0], done
    after = table(t, "public.evo")
    assert str(after.schema().find_field("c").field_type) == "decimal(12, 2)"
    assert after.properties["mirrorline.position.t1"] == str(P(0x10))
    assert sorted(fetch(t, "public.evo", ["id", "n", "title", "c"])) == [
        (i, i, f"l{i}", Decimal(i * 2)) for i in range(3)
    ]


def test_compaction_expiry_and_orphans(spark: Any, request: Any, tmp_path: Path) -> None:
    t = iceberg(request, tmp_path)
    for n in range(1, 12):  # a data file per unit
        t.apply(batch(spark, [items(n)], P(n - 1), P(n)), SCHEMAS)
    t.apply(batch(spark, [net("public.items", "D", [3])], P(11), P(12)), SCHEMAS)
    it = table(t, "public.items")
    assert len(list(it.scan().plan_files())) == 10
    data = Path(it.location().removeprefix("file://")) / "data"
    stray = data / "left-by-a-crash.parquet"
    stray.write_bytes(b"PAR1")
    os.utime(stray, (time.time() - 7200, time.time() - 7200))
    fresh = data / "being-written.parquet"
    fresh.write_bytes(b"PAR1")
    report = t.maintain(retention_hours=1)["public.items"]
    assert report["compacted"] == {"removed": 10, "added": 1}
    assert report["orphans_removed"] == 1 and not stray.exists() and fresh.exists()  # a young file may be a commit
    it = table(t, "public.items")
    assert len(list(it.scan().plan_files())) == 1
    assert it.properties["mirrorline.position.t1"] == str(P(12))  # a compaction keeps the position
    assert sorted(r[0] for r in fetch(t, "public.items", COLS)) == [n for n in range(1, 12) if n != 3]
    snapshots = len(it.snapshots())
    assert t.maintain(retention_hours=0, compact=False)["public.items"]["expired"] == snapshots - 1
    it = table(t, "public.items")
    assert len(it.snapshots()) == 1
    assert len(list(data.iterdir())) == 1  # the compacted file: every file of an expired snapshot (and the stray) gone
    assert sorted(r[0] for r in fetch(t, "public.items", COLS)) == [n for n in range(1, 12) if n != 3]
    t.apply(batch(spark, [items(50)], P(12), P(13)), SCHEMAS)  # and units go on
    assert (50, "n50", 500, None) in fetch(t, "public.items", COLS)


def _config(tmp_path: Path, catalog: dict[str, str]) -> Path:
    path = tmp_path / "m.toml"
    configs.write(
        path,
        source="postgresql://nobody@127.0.0.1:1/none",
        log=tmp_path / "log",
        tables=["public.items"],
        targets={"ice": {"url": "iceberg:///ice", "catalog": catalog}},
    )
    return path


def test_a_catalog_named_by_the_configuration_with_secrets_from_the_environment(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from mirrorline import config
    from mirrorline.apply import open_target as open_configured

    elsewhere = tmp_path / "catalogs"
    elsewhere.mkdir()
    monkeypatch.setenv("ML_TEST_CATALOG_DIR", str(elsewhere))
    path = _config(
        tmp_path,
        {"type": "sql", "uri": "sqlite:///${ML_TEST_CATALOG_DIR}/cat.db", "warehouse": (elsewhere / "wh").as_uri()},
    )
    conf = config.load(path)
    assert dict(conf.targets["ice"].catalog)["uri"] == f"sqlite:///{elsewhere}/cat.db"
    t = open_configured(conf.targets["ice"])
    try:
        t.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)
    finally:
        t.close()
    assert (elsewhere / "cat.db").is_file() and not (tmp_path / "ice" / "_catalog.sqlite").exists()
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("mirrorline", uri=f"sqlite:///{elsewhere}/cat.db", warehouse=(elsewhere / "wh").as_uri())
    got = cat.load_table(("public", "items")).scan().to_arrow()
    assert got["id"].to_pylist() == [1]
    # a variable not set: the configuration says which
    monkeypatch.delenv("ML_TEST_CATALOG_DIR")
    with pytest.raises(ConfigError, match="ML_TEST_CATALOG_DIR is not set"):
        config.load(path)


def test_an_unreachable_rest_catalog_is_a_clear_error_that_prints_no_secret(tmp_path: Path, monkeypatch: Any) -> None:
    from mirrorline import config
    from mirrorline.apply import open_target as open_configured

    monkeypatch.setenv("ML_TEST_ICEBERG_TOKEN", "s3cr3t-t0ken-value")
    path = _config(tmp_path, {"type": "rest", "uri": "http://127.0.0.1:9/catalog", "token": "${ML_TEST_ICEBERG_TOKEN}"})
    conf = config.load(path)
    t = open_configured(conf.targets["ice"])
    try:
        with pytest.raises(TargetError) as e:
            t.applied_positions()
    finally:
        t.close()
    text = str(e.value) + str(e.value.hint)
    assert "target ice: cannot open the catalog" in text and "s3cr3t" not in text
    assert "s3cr3t" not in repr(conf.targets["ice"])  # held for pyiceberg, never shown


def test_a_catalog_table_is_refused_for_a_kind_without_one(tmp_path: Path) -> None:
    from mirrorline import config

    path = tmp_path / "m.toml"
    configs.write(
        path,
        source="postgresql://nobody@127.0.0.1:1/none",
        log=tmp_path / "log",
        tables=["public.items"],
        targets={"lake": {"url": "delta:///lake", "catalog": {"type": "rest"}}},
    )
    with pytest.raises(ConfigError, match="has no catalog"):
        config.load(path)


def test_status_shows_each_tables_snapshot_files_and_position_and_maintain_reports(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    import json

    from mirrorline import config
    from mirrorline.apply import open_target as open_configured
    from mirrorline.cli.main import main
    from mirrorline.status import status

    path = tmp_path / "m.toml"
    configs.write(
        path,
        source="postgresql://nobody@127.0.0.1:1/none",
        log=tmp_path / "log",
        tables=["public.items"],
        targets={"ice": "iceberg:///ice"},
    )
    conf = config.load(path)
    t = open_configured(conf.targets["ice"])
    t.apply(batch(spark, [items(1), items(2)], P(0), P(0x10, 2)), SCHEMAS)
    t.close()
    snap = oracle.iceberg_table(str(tmp_path / "ice"), "public.items").current_snapshot().snapshot_id
    st = status(conf)
    (ice,) = st.targets
    want = {"snapshot": snap, "data_files": 1, "delete_files": 0, "position": str(P(0x10, 2))}
    assert ice.details == {"public.items": want}
    assert st.to_json()["targets"][0]["table_details"]["public.items"]["snapshot"] == snap
    assert f"  public.items: snapshot {snap}, data_files 1, delete_files 0, position {P(0x10, 2)}" in st.text()
    capsys.readouterr()
    assert main(["maintain", "-c", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["ice"]["public.items"]
    assert report["compacted"]["skipped"] == "few files" and report["expired"] == 0 and report["orphans_removed"] == 0


def test_a_unit_of_many_keys_deletes_by_ranges_and_keeps_the_rows_between(
    spark: Any, request: Any, tmp_path: Path
) -> None:
    from mirrorline.apply.iceberg import target as ice

    t = iceberg(request, tmp_path)
    t.apply(batch(spark, [items(i) for i in range(1, 2001)], P(0), P(1)), SCHEMAS)
    touched = list(range(1, 2001, 3))  # 667 keys, more than IN_KEYS: the scope is ranges holding the others too
    assert len(touched) > ice.IN_KEYS
    unit = [
        net("public.items", "U", [i], {"id": i, "qty": -i}, unchanged=["name", "note"])
        if i % 2
        else net("public.items", "D", [i])
        for i in touched
    ]
    unit += [items(i) for i in range(5000, 5400)]
    res = t.apply(batch(spark, unit, P(1), P(2)), SCHEMAS)
    assert res.rows["public.items"] == {"D": len(touched) // 2, "U": len(touched) - len(touched) // 2, "I": 400}
    want = {(i, f"n{i}", i * 10, None) for i in range(1, 2001) if i not in touched}
    want |= {(i, f"n{i}", -i, None) for i in touched if i % 2}
    want |= {(i, f"n{i}", i * 10, None) for i in range(5000, 5400)}
    assert set(fetch(t, "public.items", COLS)) == want and len(fetch(t, "public.items", COLS)) == len(want)


def test_a_relative_folder(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A target made with a relative folder (the configuration makes its paths absolute; a program may not)."""
    monkeypatch.chdir(tmp_path)
    t = IcebergTarget("rel", "ice")
    try:
        t.apply(batch(spark, [items(1)], P(0), P(1)), SCHEMAS)
    finally:
        t.close()
    assert table(IcebergTarget("rel", str(tmp_path / "ice")), "public.items").scan().to_arrow()["id"].to_pylist() == [1]
