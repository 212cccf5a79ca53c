"""Snapshots through files: export a folder while the source changes, load it into targets, catch up, verify; a
damaged, incomplete or foreign folder is refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import oracle
import pytest
from snapshot_support import Workload, capture_once, create_items, target_urls, write_config

from mirrorline.errors import SnapshotError
from mirrorline.pipeline import catch_up_target
from mirrorline.snapshot import Options, check_folder, export_snapshot, load_snapshot
from mirrorline.snapshot.plan import parse_chunk_file_name
from mirrorline.snapshot.tasks import file_sha256
from mirrorline.verify import verify

pytestmark = [pytest.mark.pg, pytest.mark.spark]

SMALL = Options(chunk_mb=0.04, progress=False)


def test_export_load_catch_up_verify(pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]) -> None:
    create_items(pg.dsn, rows=1500)
    create_items(pg.dsn, "public.parts", rows=300, start=10_000)
    urls = target_urls(tmp_path, pg.cluster, ["postgresql", "sqlite", "delta", "iceberg"], target_dbs)
    cfg = write_config(tmp_path, pg.dsn, urls, {"public.items": {"sequence": 2}, "public.parts": {"sequence": 1}})
    out = tmp_path / "out"
    out.mkdir()
    work = Workload(pg.dsn, max_id=1500).start()
    try:
        res = export_snapshot(cfg, out, options=SMALL)
    finally:
        work.stop()
    folder = res.folder
    assert folder is not None and folder.parent == out
    manifest = check_folder(folder)
    chunk_files = sorted(n for n in os.listdir(folder) if parse_chunk_file_name(n))
    assert chunk_files == [c.file for c in manifest.chunks]  # sorted names give the load order
    tables_in_order = list(dict.fromkeys(c.table for c in manifest.chunks))
    assert tables_in_order == ["public.parts", "public.items"]  # sequence 1 before sequence 2
    assert len(manifest.chunks) > 2 and (folder / "END").is_file()
    assert manifest.rows()["public.parts"] == 300
    for name in ("postgresql", "sqlite", "delta", "iceberg"):
        loaded = load_snapshot(cfg, name, folder, options=SMALL)
        assert loaded.position == manifest.position
        assert loaded.rows == manifest.rows()
    Workload(pg.dsn, max_id=work.next_id + 100, seed=7).run_some(200)  # more changes after the loads
    capture_once(cfg)
    for name in ("postgresql", "sqlite", "delta", "iceberg"):
        catch_up_target(cfg, name)
        for table in ("public.items", "public.parts"):  # read independently before verify is asked
            oracle.assert_same(pg.dsn, name, urls[name], table)
    report = verify(cfg)
    assert report.ok, report.text()
    assert {t.target for t in report.targets} == {"postgresql", "sqlite", "delta", "iceberg"}


def _damage(folder: Path, how: str, other: Path) -> str:
    chunks = sorted(n for n in os.listdir(folder) if parse_chunk_file_name(n))
    victim = chunks[1]
    if how == "truncated":
        data = (folder / victim).read_bytes()
        (folder / victim).write_bytes(data[: len(data) // 2])
        return f"chunk {victim} is truncated"
    if how == "missing":
        (folder / victim).unlink()
        return f"chunk {victim} is missing"
    if how == "foreign":
        shutil.copyfile(other / victim, folder / victim)
        theirs = json.loads((other / "END").read_text())["export"]
        return f"chunk {victim} belongs to export {theirs}"
    if how == "altered":
        data = bytearray((folder / victim).read_bytes())
        data[-3] = ord("9") if data[-3] != ord("9") else ord("8")
        (folder / victim).write_bytes(bytes(data))
        return f"chunk {victim} is damaged"
    if how == "extra":
        shutil.copyfile(folder / victim, folder / "9999-000000-public.items.csv")
        return "chunk 9999-000000-public.items.csv is not part of export"
    if how == "no_end":
        (folder / "END").unlink()
        return "the end marker END is missing"
    # the manifest edited, its checksum in END fixed, as anyone editing it would
    doc = json.loads((folder / "manifest.json").read_text())
    entry = next(c for c in doc["chunks"] if c["file"] == victim)
    if how in ("outside", "absolute"):
        outside = folder.parent / f"outside-{how}.csv"
        shutil.copyfile(folder / victim, outside)
        (folder / victim).unlink()
        entry["file"] = "../" + outside.name if how == "outside" else str(outside)
        expected = f"names a chunk {entry['file']!r}, which is not a chunk file of this folder"
    elif how == "unconfigured":
        data = (folder / victim).read_bytes().replace(b"table=public.items", b"table=public.evil", 1)
        evil = victim.replace("public.items", "public.evil")
        (folder / evil).write_bytes(data)
        doc["chunks"].append(
            {**entry, "file": evil, "table": "public.evil", "bytes": len(data), "sha256": file_sha256(folder / evil)}
        )
        schema = json.loads(json.dumps(doc["tables"][0]))
        schema["schema"]["table"] = "public.evil"
        doc["tables"].append(schema)
        expected = "holds tables this configuration does not replicate: public.evil"
    else:
        raise AssertionError(how)
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    (folder / "manifest.json").write_bytes(data)
    end = json.loads((folder / "END").read_text())
    end["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (folder / "END").write_text(json.dumps(end) + "\n")
    return expected


def test_damaged_folders_are_refused_and_nothing_is_written(
    pg: Any, spark: Any, tmp_path: Path, target_dbs: list[str]
) -> None:
    create_items(pg.dsn, rows=800)
    urls = target_urls(tmp_path, pg.cluster, ["postgresql", "sqlite"], target_dbs)
    cfg = write_config(tmp_path, pg.dsn, urls, {"public.items": {}})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = export_snapshot(cfg, tmp_path / "a", options=SMALL).folder
    Workload(pg.dsn, max_id=800).run_some(50)
    second = export_snapshot(cfg, tmp_path / "b", options=SMALL).folder
    assert first is not None and second is not None
    for how in ("truncated", "missing", "foreign", "altered", "extra", "no_end", "outside", "absolute", "unconfigured"):
        copy = tmp_path / f"copy-{how}"
        shutil.copytree(first, copy)
        expected = _damage(copy, how, second)
        for name in ("postgresql", "sqlite"):
            with pytest.raises(SnapshotError) as exc:
                load_snapshot(cfg, name, copy, options=SMALL)
            assert expected in str(exc.value), str(exc.value)
            assert "nothing was loaded" in str(exc.value)
    # nothing was written: no SQLite file, no table in the PostgreSQL target
    assert not (tmp_path / "target.sqlite").exists()
    assert pg.cluster.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'", target_dbs[0]) == [(0,)]
    # the folder export was given (holding the export's own folder) is pointed at, not called incomplete
    with pytest.raises(SnapshotError, match=f"holds 1: {first.name}"):
        load_snapshot(cfg, "sqlite", tmp_path / "a", options=SMALL)
    # the intact folder loads
    assert load_snapshot(cfg, "sqlite", first, options=SMALL).rows["public.items"] == 800
