"""verify against real targets: no false difference on the values that used to cry wolf (char(n) padding, as in
pgbench's filler), and a real difference narrowed down by --diff to its rows and columns on every target kind."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import oracle
import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from snapshot_support import create_items, target_urls, write_config

from mirrorline.cli.main import main
from mirrorline.log.writer import LogWriter, writer_pid
from mirrorline.snapshot import Options, snapshot_target
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

SMALL = Options(chunk_mb=0.04, progress=False)
KINDS = ["postgresql", "sqlite", "duckdb", "delta", "iceberg"]


def _source(dsn: str) -> None:
    create_items(dsn, rows=3000)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE public.accounts (aid integer PRIMARY KEY, bid integer, abalance integer, filler char(84))"
        )
        cur.execute("INSERT INTO accounts SELECT g, g % 10, 0, '' FROM generate_series(1, 2000) g")
        cur.execute("UPDATE accounts SET filler = 'some text' WHERE aid % 7 = 0")
    conn.close()


def _break(kind: str, url: str, tmp_path: Path) -> None:
    """Behind mirrorline's back (each target's own client): item 5's qty changed, item 7 gone, item 99999 added;
    item 15's NULL name made empty and item 9's empty name NULL; item 20's float one ulp off; item 30's timestamp a
    microsecond later (the differences a canonical form could hide)."""
    ts = {
        "postgresql": "ts + interval '1 microsecond'",
        "sqlite": "replace(ts, '.25', '.250001')",
        "duckdb": "ts + INTERVAL 1 MICROSECOND",
    }.get(kind, "")
    stmts = [
        "UPDATE {t} SET qty = 4242 WHERE id = 5",
        "DELETE FROM {t} WHERE id = 7",
        "INSERT INTO {t} (id, name, qty) VALUES (99999, 'stray', 1)",
        "UPDATE {t} SET name = '' WHERE id = 15",
        "UPDATE {t} SET name = NULL WHERE id = 9",
        "UPDATE {t} SET f8 = 1.5000000000000002e-05 WHERE id = 20",
        f"UPDATE {{t}} SET ts = {ts} WHERE id = 30",
    ]
    if kind == "postgresql":
        conn = psycopg2.connect(url)
        with conn, conn.cursor() as cur:
            for s in stmts:
                cur.execute(s.format(t="public.items"))
        conn.close()
    elif kind == "sqlite":
        db = sqlite3.connect(tmp_path / "target.sqlite")
        for s in stmts:
            db.execute(s.format(t="items"))
        db.commit()
        db.close()
    elif kind == "duckdb":
        con = duckdb.connect(str(tmp_path / "target.duckdb"))
        for s in stmts:
            con.execute(s.format(t="main.items"))
        con.close()
    else:  # the lake formats: the table's rows changed in Arrow and written back by the format's own library
        path = str(tmp_path / "target.delta" / "items")
        iceberg = oracle.iceberg_table(str(tmp_path / "target.iceberg"), "public.items") if kind == "iceberg" else None
        data = iceberg.scan().to_arrow() if iceberg is not None else DeltaTable(path).to_pyarrow_table()
        ids = data["id"].to_pylist()
        qty = [4242 if i == 5 else q for i, q in zip(ids, data["qty"].to_pylist(), strict=True)]
        data = data.set_column(data.schema.get_field_index("qty"), "qty", pa.array(qty, data["qty"].type))
        data = data.filter(pc.not_equal(data["id"], 7))
        ids = data["id"].to_pylist()

        def put(col: str, values: dict[int, Any]) -> pa.Table:
            vals = [values.get(i, v) for i, v in zip(ids, data[col].to_pylist(), strict=True)]
            return data.set_column(data.schema.get_field_index(col), col, pa.array(vals, data[col].type))

        import datetime as dt

        at = {i: v for i, v in zip(ids, data["ts"].to_pylist(), strict=True) if i == 30}
        data = put("name", {15: "", 9: None})
        data = put("f8", {20: 1.5000000000000002e-05})
        data = put("ts", {30: at[30] + dt.timedelta(microseconds=1)})
        stray = {c: [None] for c in data.column_names} | {"id": [99999], "name": ["stray"], "qty": [1]}
        data = pa.concat_tables([data, pa.table(stray, schema=data.schema)])
        if iceberg is not None:
            iceberg.overwrite(data)
        else:
            write_deltalake(path, data, mode="overwrite")


def test_no_false_difference_and_diff_names_rows_and_columns(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str], capsys: Any
) -> None:
    _source(pg.dsn)
    urls = target_urls(tmp_path, pg.cluster, KINDS, target_dbs)
    cfg = write_config(tmp_path, pg.dsn, urls, {"public.items": {}, "public.accounts": {}})
    for kind in KINDS:
        snapshot_target(cfg, kind, options=SMALL)
    report = verify(cfg, diff=5)
    assert report.ok, report.text()  # char(84) filler included: equal everywhere
    for kind in KINDS:
        _break(kind, urls[kind], tmp_path)
    report = verify(cfg, diff=10)
    assert not report.ok
    for t in report.targets:
        assert t.differing == ["public.items"], (t.target, report.text())
        (items,) = [c for c in t.tables if c.table == "public.items"]
        assert items.exact and items.differing_rows == 7 and items.key == ["id"]
        got = {(d.kind, d.key): d.columns for d in items.diffs or []}
        assert got[("changed", ("5",))] == {"qty": ("35", "4242")}, (t.target, got)
        assert ("missing", ("7",)) in got and got[("missing", ("7",))]["qty"] == ("49", None)
        assert got[("extra", ("99999",))]["name"] == (None, "stray")
        assert got[("changed", ("15",))] == {"name": (None, "")}, (t.target, got)
        assert got[("changed", ("9",))] == {"name": ("", None)}, (t.target, got)
        assert list(got[("changed", ("20",))]) == ["f8"], (t.target, got)
        assert list(got[("changed", ("30",))]) == ["ts"], (t.target, got)
    text = report.text()
    assert "7 row(s) differ" in text and "changed id='5': qty '35' at the source, '4242' at the target" in text
    assert main(["verify", "-c", str(cfg.file), "--target", "delta", "--diff", "2", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (items_doc,) = [c for c in doc["targets"][0]["tables"] if c["table"] == "public.items"]
    assert items_doc["differing_rows"] == 7 and len(items_doc["rows"]) == 2 and items_doc["key"] == ["id"]


def test_verify_captures_itself_once_the_capture_it_waited_for_stops(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    """A writer held the log when verify began (a ``run`` stopped while verify waited for it): once it lets go,
    verify captures up to its point itself, well before its wait runs out, and the target is compared at it."""
    create_items(pg.dsn, rows=500)
    urls = target_urls(tmp_path, pg.cluster, ["sqlite"], target_dbs)
    cfg = write_config(tmp_path, pg.dsn, urls, {"public.items": {}})
    snapshot_target(cfg, "sqlite", options=SMALL)
    conn = psycopg2.connect(pg.dsn)
    with conn, conn.cursor() as cur:  # changes after the snapshot, in no log yet
        cur.execute("UPDATE public.items SET qty = qty + 1 WHERE id <= 100")
        cur.execute("DELETE FROM public.items WHERE id > 450")
    conn.close()
    writer = LogWriter(cfg.log.path)
    release = threading.Timer(3.0, writer.close)
    release.start()
    t0 = time.monotonic()
    try:
        report = verify(cfg, wait_seconds=90)
    finally:
        release.join()
    assert report.ok, report.text()
    assert time.monotonic() - t0 < 60
    assert writer_pid(cfg.log.path) is None
    oracle.assert_same(pg.dsn, "sqlite", urls["sqlite"], "public.items")
