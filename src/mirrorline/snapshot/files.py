"""Snapshots through files (DESIGN §7, "manual file based transfer"): export the configured tables at a consistent
point into a snapshot folder (:mod:`mirrorline.snapshot.folder`), and load such a folder into a target.

An export is registered with the log as a reader at its position, so the log keeps what a target loaded from it will
need; a load checks the whole folder first (and that the log still holds what follows it), loads it in one
transaction, and then releases the export's hold on the log.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from mirrorline.apply import open_target
from mirrorline.config import Config, redact_dsn
from mirrorline.errors import LogError, SnapshotError
from mirrorline.log import source as log_source
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import set_applied, unregister
from mirrorline.snapshot import state as snapstate
from mirrorline.snapshot.folder import ChunkEntry, Manifest, check_folder, make_folder, write_manifest
from mirrorline.snapshot.jobs import (
    Rewritten,
    attempts,
    check_rewritten,
    chunk_blocks,
    file_specs,
    parallelism,
    retrying,
    run_tasks,
    spark_poll,
)
from mirrorline.snapshot.load import BulkLoader
from mirrorline.snapshot.plan import plan_chunks
from mirrorline.snapshot.progress import Progress
from mirrorline.snapshot.run import Options, SnapshotResult, register_reader, tables_at, target_config
from mirrorline.snapshot.source import consistent_point, current_wal_lsn, require_source
from mirrorline.snapshot.tasks import write_chunk

log = logging.getLogger("mirrorline.snapshot")


def export_snapshot(config: Config, directory: str | Path, *, options: Options | None = None) -> SnapshotResult:
    """``snapshot export DIR``: a new uniquely named folder in DIR with the chunk files, the manifest and the end
    marker. The export is registered with the log as a reader at its position (``export-<folder name>``), so the
    log keeps what a target loaded from it will need; loading it releases that."""
    opts = options or Options()
    require_source(config)
    assert config.source is not None
    folder = make_folder(directory)
    export_id = uuid.uuid4().hex
    t0 = time.monotonic()
    try:
        for attempt in attempts(f"export to {folder}"):
            try:
                with consistent_point(config) as cp:
                    stats = tables_at(config, cp, None)
                    register_reader(config.log.path, f"export-{folder.name}", cp.position)
                    chunks = plan_chunks(stats.values(), chunk_blocks(opts.chunk_mb), parallelism())
                    specs = file_specs(config, cp, stats, chunks, folder, export_id)
                    group = f"mirrorline-export-{export_id}-{attempt}"
                    est = sum(s.rows for s in stats.values())
                    prog = Progress(
                        f"export {folder.name}",
                        len(chunks),
                        est,
                        every=opts.progress_every,
                        poll=spark_poll(group, est, len(chunks)),
                    )
                    with prog if opts.progress else nullcontext():
                        results = run_tasks(write_chunk, specs, group, f"export to {folder}")
                        prog.rows = sum(int(r["rows"]) for r in results)
                        prog.exact = True
                    check_rewritten(results)
                    end_lsn = current_wal_lsn(config.source.dsn)
                break
            except Rewritten as e:
                retrying(e, f"export to {folder}", attempt)
                for p in folder.iterdir():
                    p.unlink()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    entries = sorted(
        (
            ChunkEntry(r["file"], r["table"], int(r["chunk"]), int(r["rows"]), int(r["bytes"]), r["sha256"])
            for r in results
        ),
        key=lambda e: e.file,
    )
    manifest = Manifest(
        export_id,
        snapstate.now(),
        {"dsn": redact_dsn(config.source.dsn), "slot": config.source.slot, **_source_identity(config)},
        cp.lsn,
        cp.position,
        end_lsn,
        [s.schema for s in stats.values()],
        entries,
    )
    write_manifest(folder, manifest)
    res = SnapshotResult(
        None, cp.lsn, cp.position, manifest.rows(), time.monotonic() - t0, cp.slot, not cp.temporary, folder, export_id
    )
    log.info("%s", res.summary())
    return res


def _source_identity(config: Config) -> dict[str, str]:
    """The source the log records (its system identifier and database: ``log/source.py``), for a manifest."""
    ident = log_source.read(config.log.path)
    return {"system_identifier": ident.system_identifier, "database": ident.database} if ident else {}


def _check_belongs(config: Config, manifest: Manifest, f: Path) -> None:
    """An export loads only into a target of the configuration and log it was made for: its tables are configured
    ones, and its source is the log's (when both are known)."""
    extra = [t.table for t in manifest.tables if t.table not in config.tables]
    if extra:
        raise SnapshotError(
            f"snapshot folder {f} holds tables this configuration does not replicate: {', '.join(extra)}; nothing "
            "was loaded",
            hint="configure them, or export again with this configuration",
            path=str(f),
        )
    mine, theirs = _source_identity(config), manifest.source
    for key in ("system_identifier", "database"):
        if mine.get(key) and theirs.get(key) and mine[key] != theirs[key]:
            raise SnapshotError(
                f"snapshot folder {f} was exported from another source ({key} {theirs[key]}) than the one this "
                f"log captures ({mine[key]}); nothing was loaded",
                hint="load an export made with this configuration",
                path=str(f),
            )


def load_snapshot(config: Config, name: str, folder: str | Path, *, options: Options | None = None) -> SnapshotResult:
    """``snapshot load --target NAME DIR``: check the folder whole (and that the log still holds what follows it),
    then load it into the target in one transaction; the target then continues from the log at its position."""
    opts = options or Options()
    tcfg = target_config(config, name)
    f = Path(folder)
    manifest = check_folder(f)
    _check_belongs(config, manifest, f)
    cl = ChangeLog(config.log.path)
    if cl.layout.exists():
        try:
            cl.select(manifest.position)
        except LogError as e:
            raise SnapshotError(
                f"cannot load {f}: the change log no longer holds the changes after its position "
                f"{manifest.position} ({e.message})",
                hint="export a new snapshot and load that one",
                path=str(f),
            ) from None
    t0 = time.monotonic()
    target = open_target(tcfg)
    try:
        target.ensure_schema(manifest.tables)
        loader = BulkLoader(target)
        schemas = {t.table: t for t in manifest.tables}
        expected = manifest.rows()
        rows = {t: 0 for t in schemas}
        ok = False
        try:
            loader.begin(manifest.tables)
            with (
                Progress(
                    f"load {f.name} into {name}",
                    len(manifest.chunks),
                    sum(expected.values()),
                    every=opts.progress_every,
                )
                if opts.progress
                else nullcontext() as prog
            ):
                for c in manifest.chunks:
                    n = loader.load(schemas[c.table], f / c.file)
                    if n != c.rows:
                        raise SnapshotError(
                            f"snapshot folder {f}: chunk {c.file} holds {n} rows, the manifest says "
                            f"{c.rows}; nothing was loaded",
                            path=str(f),
                        )
                    rows[c.table] += n
                    if prog is not None:
                        prog.update(rows=n, chunks=1, table=c.table)
            loader.finish(rows, manifest.position, manifest.end_lsn, manifest.export_id, whole=True)
            ok = True
        finally:
            if not ok:
                loader.abort()
    finally:
        target.close()
    set_applied(cl, name, manifest.position)
    unregister(cl, f"export-{f.name}")
    res = SnapshotResult(
        name, manifest.consistent_lsn, manifest.position, rows, time.monotonic() - t0, "", False, f, manifest.export_id
    )
    log.info("%s", res.summary())
    return res
