"""The configuration reconciled at start (001): a new target is loaded, a second target is added while the first is
live, a table added to the configuration is snapshotted into live targets at its own consistent point and then
replicated, a removed table is left as it is; status shows the states; verify finds everything equal, and finds a
difference made behind mirrorline's back."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import oracle
import pytest
from snapshot_support import CaptureThread, Workload, capture_once, create_items, target_urls, write_config

from mirrorline.cli.main import main
from mirrorline.pipeline import catch_up_target
from mirrorline.snapshot import Options, reconcile_targets
from mirrorline.status import render_prometheus, status
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

SMALL = Options(chunk_mb=0.04, progress=False)


def _started(cfg: Any) -> CaptureThread:
    ready = threading.Event()
    cap = CaptureThread(cfg)
    cap.capture.on_ready = lambda _stats: ready.set()
    cap.start()
    assert ready.wait(60), cap.error
    return cap


def test_targets_and_tables_added_while_live(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str], capsys: Any
) -> None:
    create_items(pg.dsn, rows=1000)
    create_items(pg.dsn, "public.parts", rows=200, start=10_000)
    urls = target_urls(tmp_path, pg.cluster, ["sqlite", "postgresql"], target_dbs)
    one = write_config(tmp_path, pg.dsn, {"cache": urls["sqlite"]}, {"public.items": {}}, "one.toml")
    assert [t.state for t in status(one).targets] == ["new"]

    first = reconcile_targets(one, options=SMALL)  # a new target: loaded whole, creating the slot
    assert first[0].whole and first[0].loaded == ["public.items"]
    cap = _started(one)
    work = Workload(pg.dsn, max_id=1000).start()
    try:
        catch_up_target(one, "cache")
        # a second target while the first is live (replication keeps going)
        two = write_config(
            tmp_path, pg.dsn, {"cache": urls["sqlite"], "dw": urls["postgresql"]}, {"public.items": {}}, "two.toml"
        )
        done = {r.target: r for r in reconcile_targets(two, options=SMALL)}
        assert done["dw"].whole and not done["cache"].loaded
    finally:
        work.stop()
        cap.stop()

    # a table added to the configuration: capture restarts with it (the publication gains it), then the targets
    three = write_config(
        tmp_path,
        pg.dsn,
        {"cache": urls["sqlite"], "dw": urls["postgresql"]},
        {"public.items": {}, "public.parts": {"sequence": 5}},
        "three.toml",
    )
    cap = _started(three)
    works = [
        Workload(pg.dsn, max_id=work.next_id + 10, seed=3).start(),
        Workload(pg.dsn, "public.parts", max_id=10_200, seed=4).start(),
    ]
    try:
        added = {r.target: r for r in reconcile_targets(three, options=SMALL)}
        assert added["cache"].loaded == ["public.parts"] and not added["cache"].whole
        assert added["dw"].loaded == ["public.parts"]
    finally:
        for w in works:
            w.stop()
        cap.stop()
    capture_once(three)
    for name, kind in (("cache", "sqlite"), ("dw", "postgresql")):
        catch_up_target(three, name)
        for table in ("public.items", "public.parts"):  # read independently before verify is asked
            oracle.assert_same(pg.dsn, kind, urls[kind], table)
    report = verify(three)
    assert report.ok, report.text()
    assert {c.table for t in report.targets for c in t.tables} == {"public.items", "public.parts"}

    st = status(three)
    assert {t.name: t.state for t in st.targets} == {"cache": "live", "dw": "live"}
    assert all(t.lag_bytes == 0 for t in st.targets) and st.slot_retained_bytes is not None
    prom = render_prometheus(st)
    assert 'mirrorline_target_state{target="dw",state="live"} 1' in prom
    assert "# TYPE mirrorline_slot_retained_wal_bytes gauge" in prom
    assert main(["status", "-c", str(three.file), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["state"] for t in doc["targets"]] == ["live", "live"] and doc["healthy"] and doc["problems"] == []
    assert main(["status", "-c", str(three.file), "--check", "--max-lag", "1h"]) == 0
    assert capsys.readouterr().out.startswith("OK: lag cache ")

    # a table removed from the configuration is left as it is
    assert reconcile_targets(two, options=SMALL)[0].removed == ["public.parts"]
    db = sqlite3.connect(tmp_path / "target.sqlite")
    assert db.execute("SELECT count(*) FROM parts").fetchone()[0] > 0

    # a change behind mirrorline's back is found, and verify exits 1 naming the table
    db.execute("UPDATE items SET qty = qty + 1 WHERE id = (SELECT min(id) FROM items)")
    db.commit()
    db.close()
    assert main(["verify", "-c", str(two.file), "--target", "cache"]) == 1
    captured = capsys.readouterr()
    assert "public.items" in captured.err and "DIFFERS" in captured.out
