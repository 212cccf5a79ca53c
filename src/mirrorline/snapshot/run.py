"""Snapshots over the wire into a target (DESIGN §7), and the reconciliation of targets with the configuration at
start (a new target, or a table added to the configuration, is loaded this way).

Over the wire: a consistent point (:mod:`mirrorline.snapshot.source`), the configured tables described under its
snapshot, chunks read in parallel by Spark tasks each importing the snapshot. A target whose kind loads chunks from
the tasks (``Target.chunk_loader``: PostgreSQL, COPY piped into COPY) gets each chunk straight into its table from the
task that read it, so the load scales out with the tasks; the other kinds get chunk files staged by the tasks and
bulk-loaded by the driver in one transaction as they arrive. Either way the target's applied
position becomes the snapshot's consistent position and the target continues from the log there. The target is
registered with the log as a reader at that position first, so retention keeps what it will need.

Over the wire and export (:mod:`mirrorline.snapshot.files`) share the tables' description at the consistent point
(:func:`tables_at`), the registration with the log and the options; the Spark jobs of chunk tasks and the retry when a
table is rewritten under the snapshot are :mod:`mirrorline.snapshot.jobs`'. What one Spark task does with one chunk
is in ``snapshot/tasks.py``; a kind's load straight from the tasks in its folder under ``apply/``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mirrorline.apply import open_target
from mirrorline.apply.chunks import ChunkLoader
from mirrorline.apply.target import Target
from mirrorline.config import Config, TargetConfig
from mirrorline.errors import ConfigError, SnapshotError
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import clear_reload, readers, set_applied
from mirrorline.position import Position, format_lsn
from mirrorline.snapshot import state as snapstate
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
from mirrorline.snapshot.load import BulkLoader, finish_loading, mark_loading
from mirrorline.snapshot.plan import Chunk, TableStat, copy_out_sql, plan_chunks
from mirrorline.snapshot.progress import Progress
from mirrorline.snapshot.source import (
    ConsistentPoint,
    consistent_point,
    current_wal_lsn,
    sized_tables,
    snapshot_connection,
)
from mirrorline.snapshot.tasks import pipe_chunk, write_chunk

log = logging.getLogger("mirrorline.snapshot")

DEFAULT_CHUNK_MB = 128
STAGED_CHUNK_MB = 16  # chunks staged as files for a SQLite / DuckDB target are at most this large


@dataclass
class SnapshotResult:
    target: str | None
    consistent_lsn: int
    position: Position
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    slot: str = ""
    created_slot: bool = False  # the main slot was created by this snapshot: the log starts at its point
    folder: Path | None = None
    export_id: str | None = None

    def summary(self) -> str:
        what = f"target {self.target}" if self.target else f"folder {self.folder}"
        total = sum(self.rows.values())
        return (
            f"snapshot into {what}: {len(self.rows)} table(s), {total:,} rows in {self.seconds:.1f} s at "
            f"consistent point {format_lsn(self.consistent_lsn)} (applied position {self.position})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "consistent_lsn": format_lsn(self.consistent_lsn),
            "position": str(self.position),
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "slot": self.slot,
            "created_slot": self.created_slot,
            "folder": str(self.folder) if self.folder else None,
            "export": self.export_id,
        }


@dataclass
class Options:
    chunk_mb: float = DEFAULT_CHUNK_MB  # size of a chunk (heap megabytes)
    progress: bool = True
    progress_every: float = 2.0
    staging: Path | None = None  # where SQLite/DuckDB wire snapshots stage chunk files (default: under the log)


def target_config(config: Config, name: str) -> TargetConfig:
    t = config.targets.get(name)
    if t is None:
        known = ", ".join(sorted(config.targets)) or "none"
        raise ConfigError(str(config.file), f"targets.{name}", f"no such target (configured: {known})")
    return t


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{uuid.uuid4().hex[:6]}"


def register_reader(log_root: Path, name: str, position: Position) -> None:
    """Register ``name`` with the log at ``position`` unless it is registered already (then its own, earlier,
    position keeps what it needs)."""
    cl = ChangeLog(log_root)
    if name not in readers(cl):
        set_applied(cl, name, position)


def tables_at(
    config: Config, cp: ConsistentPoint, only: set[str] | None, keyless_ok: bool = False
) -> dict[str, TableStat]:
    """The configured tables (or ``only`` these) as the source holds them at the consistent point: schema, size.
    ``keyless_ok``: a table that lost its replica identity is described as a bag of rows (``verify``)."""
    assert config.source is not None
    conn = snapshot_connection(config.source.dsn, cp.snapshot)
    try:
        stats = sized_tables(conn, config, keyless_ok)
    finally:
        conn.close()
    if only is not None:
        unknown = only - set(stats)
        if unknown:
            raise ConfigError(str(config.file), "tables", f"not configured: {', '.join(sorted(unknown))}")
        stats = {k: v for k, v in stats.items() if k in only}
    for name, mark in cp.resync.items():  # what the table as loaded here has caught up with
        if name in stats:
            stats[name] = replace(stats[name], schema=replace(stats[name].schema, resync=mark))
    return stats


# ------------------------------------------------------------------------------------------------------ over the wire


def _groups(chunks: Sequence[Chunk], stats: dict[str, TableStat]) -> list[list[Chunk]]:
    """Chunks grouped by the tables' sequence: groups load one after the other, in order."""
    out: dict[int, list[Chunk]] = {}
    for c in chunks:
        out.setdefault(max(stats[c.table].sequence, -1), []).append(c)
    return [out[k] for k in sorted(out)]


def snapshot_target(
    config: Config, name: str, *, tables: Iterable[str] | None = None, options: Options | None = None
) -> SnapshotResult:
    """``snapshot --target NAME``: load the configured tables (or just ``tables``, for a table added to the
    configuration) into the target at a consistent point."""
    opts = options or Options()
    tcfg = target_config(config, name)
    target = open_target(tcfg)
    only = set(tables) if tables is not None else None
    t0 = time.monotonic()
    try:
        for attempt in attempts(f"snapshot of {name}"):
            try:
                with consistent_point(config) as cp:
                    stats = tables_at(config, cp, only)
                    schemas = [s.schema for s in stats.values()]
                    if only is not None:  # a table reloaded whole takes the source's shape of now
                        for ts in schemas:
                            if tcfg.history_of(ts.table) is not None:
                                log.warning(
                                    "target %s: %s is kept with its history: reloaded, its history starts again "
                                    "at the snapshot (the versions before it are dropped)",
                                    name,
                                    ts.table,
                                )
                        target.recreate(schemas)
                    target.ensure_schema(schemas)
                    register_reader(config.log.path, name, cp.position)
                    whole = only is None
                    loader = target.chunk_loader()
                    if loader is not None:
                        chunks = plan_chunks(stats.values(), chunk_blocks(opts.chunk_mb), parallelism())
                        rows = _wire_direct(config, target, loader, cp, stats, chunks, whole, opts)
                    else:  # smaller chunks: the driver starts loading as soon as the first one is there
                        chunks = plan_chunks(
                            stats.values(), chunk_blocks(min(opts.chunk_mb, STAGED_CHUNK_MB)), parallelism()
                        )
                        rows = _wire_staged(config, target, cp, stats, chunks, whole, opts)
                break
            except Rewritten as e:
                retrying(e, f"snapshot of {name}", attempt)
    finally:
        target.close()
    if only is None:
        cl = ChangeLog(config.log.path)
        set_applied(cl, name, cp.position)
        clear_reload(cl, name)
    res = SnapshotResult(name, cp.lsn, cp.position, rows, time.monotonic() - t0, cp.slot, not cp.temporary)
    log.info("%s", res.summary())
    return res


def _wire_direct(
    config: Config,
    target: Target,
    loader: ChunkLoader,
    cp: ConsistentPoint,
    stats: dict[str, TableStat],
    chunks: list[Chunk],
    whole: bool,
    opts: Options,
) -> dict[str, int]:
    """A kind that loads chunks from the tasks (PostgreSQL): each task pipes its chunk into the target and commits
    it; the positions and state commit once every chunk is in."""
    assert config.source is not None
    schemas = [s.schema for s in stats.values()]
    load_id = uuid.uuid4().hex
    with target.transaction() as s:
        loader.prepare(s)
    mark_loading(target, schemas, cp.position, "wire", truncate=True)
    group = f"mirrorline-snapshot-{load_id}"
    rows = {t: 0 for t in stats}
    fmt = loader.formats({t: st.schema for t, st in stats.items()})
    est = sum(s.rows for s in stats.values())
    prog = Progress(
        f"snapshot {target.name}",
        len(chunks),
        est,
        every=opts.progress_every,
        poll=spark_poll(group, est, len(chunks)),
    )
    with prog if opts.progress else nullcontext():
        for i, grp in enumerate(_groups(chunks, stats)):
            specs = [
                {
                    "source_dsn": config.source.dsn,
                    "snapshot": cp.snapshot,
                    "table": c.table,
                    "copy_out": copy_out_sql(stats[c.table].schema, c, fmt[c.table]),
                    "chunk_id": chunks.index(c),
                    "sink": loader.sink,
                    "sink_spec": loader.spec(stats[c.table].schema, fmt[c.table], load_id, chunks.index(c)),
                }
                for c in grp
            ]
            results = run_tasks(pipe_chunk, specs, group, f"snapshot of {target.name} (group {i + 1})")
            try:
                check_rewritten(results)
            except Rewritten:  # its rows go with the next load's truncation
                with target.transaction() as s:
                    loader.forget(s, load_id)
                raise
            for r in results:
                rows[r["table"]] += int(r["rows"])
        prog.rows = sum(rows.values())
        prog.exact = True
    end_lsn = current_wal_lsn(config.source.dsn)
    finish_loading(
        target,
        rows,
        cp.position,
        end_lsn,
        "wire",
        whole,
        lambda s: loader.forget(s, load_id),
        [st.schema for st in stats.values()],
    )
    return rows


def _wire_staged(
    config: Config,
    target: Target,
    cp: ConsistentPoint,
    stats: dict[str, TableStat],
    chunks: list[Chunk],
    whole: bool,
    opts: Options,
) -> dict[str, int]:
    """SQLite / DuckDB: Spark tasks stage chunk files; the driver loads them in order as they arrive, in one
    transaction with the positions."""
    assert config.source is not None
    staging = (opts.staging or config.log.path / "snapshot-staging") / _stamp()
    staging.mkdir(parents=True, exist_ok=True)
    group = f"mirrorline-snapshot-{staging.name}"
    specs = file_specs(config, cp, stats, chunks, staging, staging.name)
    done: list[dict[str, Any]] = []
    failed: list[BaseException] = []

    def job() -> None:
        try:
            done.extend(run_tasks(write_chunk, specs, group, f"snapshot of {target.name}"))
        except BaseException as e:
            failed.append(e)

    runner = threading.Thread(target=job, name="snapshot-tasks", daemon=True)
    runner.start()
    loader = BulkLoader(target)
    rows = {t: 0 for t in stats}
    est = sum(s.rows for s in stats.values())
    ok = False
    try:
        loader.begin([s.schema for s in stats.values()])
        with (
            Progress(f"snapshot {target.name}", len(chunks), est, every=opts.progress_every)
            if opts.progress
            else nullcontext() as prog
        ):
            for c in chunks:
                path = staging / c.file_name
                while not path.exists():
                    if failed:
                        raise failed[0]
                    if not runner.is_alive() and not path.exists():
                        raise SnapshotError(f"snapshot of {target.name}: chunk {c.file_name} was not written")
                    time.sleep(0.02)
                n = loader.load(stats[c.table].schema, path)
                path.unlink()
                rows[c.table] += n
                if prog is not None:
                    prog.update(rows=n, chunks=1, table=c.table)
        runner.join()
        if failed:
            raise failed[0]
        check_rewritten(done)
        end_lsn = current_wal_lsn(config.source.dsn)
        loader.finish(rows, cp.position, end_lsn, "wire", whole)
        ok = True
    finally:
        if not ok:
            loader.abort()
            from mirrorline.sparkenv import get_spark

            get_spark().sparkContext.cancelJobGroup(group)
            runner.join(timeout=60)
        shutil.rmtree(staging, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------------------------------ reconcile


@dataclass
class TargetReconcile:
    """What :func:`reconcile_targets` did for one target."""

    target: str
    loaded: list[str] = field(default_factory=list)  # tables snapshotted into it now
    whole: bool = False  # the target was loaded entirely (it was new, or its load had been interrupted)
    removed: list[str] = field(default_factory=list)  # tables no longer configured: left as they are
    result: SnapshotResult | None = None

    def summary(self) -> str:
        parts = []
        if self.loaded:
            parts.append(("loaded (whole target) " if self.whole else "snapshotted ") + ", ".join(self.loaded))
        if self.removed:
            parts.append("no longer replicated (left as they are): " + ", ".join(self.removed))
        return f"target {self.target}: " + ("; ".join(parts) if parts else "every table loaded")


def missing_tables(config: Config, target: Target) -> tuple[list[str], list[str], bool]:
    """(configured tables the target has not loaded, loaded tables no longer configured, target is new)."""
    s = target.session()
    try:
        snaps = snapstate.read(s)
    finally:
        s.close()
    configured = [t.name for t in config.tables_in_load_order()]
    loaded = {t for t, r in snaps.items() if r.state == "loaded"}
    missing = [t for t in configured if t not in loaded]
    removed = sorted(t for t, r in snaps.items() if t not in config.tables and r.state != "removed")
    return missing, removed, not loaded


def needs_load(config: Config, name: str) -> bool:
    """Has the target configured tables it has not loaded (a new target, or a table added to the configuration)?"""
    target = open_target(target_config(config, name))
    try:
        return bool(missing_tables(config, target)[0])
    finally:
        target.close()


def _mark_removed(target: Target, tables: Sequence[str]) -> None:
    with target.transaction() as s:
        snaps = snapstate.read(s)
        snapstate.write(
            s,
            [
                snapstate.TableSnapshot(
                    t, "removed", snaps[t].position, snaps[t].end_lsn, snaps[t].rows, snaps[t].origin, snapstate.now()
                )
                for t in tables
                if t in snaps
            ],
        )


def reconcile_targets(
    config: Config, targets: Iterable[str] | None = None, *, options: Options | None = None
) -> list[TargetReconcile]:
    """Called at every start: a new target (or one whose load was interrupted) is loaded whole; a table added to
    the configuration is snapshotted into each target that lacks it, at a consistent point that becomes its
    per-table applied position (its changes after that point then come from the log, the earlier ones are in the
    snapshot); a table removed from the configuration is left in the target as it is, and marked so that adding
    it again loads it again."""
    out = []
    for name in list(targets) if targets is not None else sorted(config.targets):
        tcfg = target_config(config, name)
        target = open_target(tcfg)
        try:
            missing, removed, new = missing_tables(config, target)
            if removed:
                _mark_removed(target, removed)
        finally:
            target.close()
        rec = TargetReconcile(name, removed=removed)
        if missing:
            rec.whole = new
            rec.result = snapshot_target(config, name, tables=None if new else missing, options=options)
            rec.loaded = list(rec.result.rows)
        out.append(rec)
    return out
