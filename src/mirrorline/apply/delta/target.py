"""The Delta target: units applied one Delta commit per table (:mod:`mirrorline.apply.delta.plan`), its position in
the commits and in ``_mirrorline.sqlite``, schema changes, snapshots loaded from chunks, compaction and cleanup (the
package's docstring says how)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply.delta.dialect import (
    COMMIT_ATTEMPTS,
    DELTA,
    LOCK_FILE,
    OP_COL,
    _Conflict,
    _fit,
    _open,
    _table_of,
    commit_properties,
    duck_connection,
    table_position,
)
from mirrorline.apply.delta.plan import _BagPlan, _Plan
from mirrorline.apply.delta.session import DeltaSession, _DeltaRead, _Failure
from mirrorline.apply.lock import FileLock
from mirrorline.apply.reshape import Step, as_rebuild, plan, stop
from mirrorline.apply.session import Session
from mirrorline.apply.sql import lit
from mirrorline.apply.state import AppliedState, write_shape
from mirrorline.apply.state import ensure as ensure_state
from mirrorline.apply.state import now as now_stamp
from mirrorline.apply.state import parse as parse_state
from mirrorline.apply.target import Target, TargetRead, UnitWork, deal
from mirrorline.errors import ApplyError, TargetError, TransientTargetError, first_line
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)


class DeltaTarget(Target):
    kind = "delta"
    dialect = DELTA

    def __init__(self, name: str, location: str, **kwargs: Any) -> None:
        kwargs.pop("parallel_rows", None)
        super().__init__(name, location, **kwargs)
        self.root = Path(location)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def lock_file(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(self.root / LOCK_FILE)

    def connect(self) -> Session:
        return DeltaSession(self)

    def _lock(self, table: str) -> threading.Lock:
        """Held by this process's commits to one Delta table (apply, a load, a compaction): they wait for each other
        rather than conflict."""
        with self._locks_lock:
            return self._locks.setdefault(table, threading.Lock())

    def path(self, table: str) -> Path:
        return self.dialect.table_dir(self.root, table)

    def delta_table(self, table: str) -> DeltaTable | None:
        return _open(self.path(table))

    def tables(self) -> dict[str, DeltaTable]:
        """The Delta tables under the target's folder, by folder name."""
        out = {}
        if self.root.is_dir():
            for p in sorted(self.root.iterdir()):
                dt = _open(p) if p.is_dir() else None
                if dt is not None:
                    out[p.name] = dt
        return out

    # -- state -----------------------------------------------------------------------------------------------------
    def applied_positions(self) -> AppliedState:
        s = self.session()
        try:
            self._prepare(s)
            base = parse_state(s.query(self.dialect.read_state()))
        finally:
            s.close()
        tables = dict(base.tables)
        for folder, dt in self.tables().items():
            table = _table_of(folder)
            tables[table] = max(tables.get(table, ZERO), table_position(dt, self.name))
        return dataclasses.replace(base, tables=tables)

    @contextlib.contextmanager
    def consistent_read(self) -> Iterator[TargetRead]:
        """The target's applied position and each table as of it: its current version, or (a table whose commit of
        a later unit landed before the unit end) the version of its last commit at or before the position."""
        yield _DeltaRead(self)

    # -- schema ----------------------------------------------------------------------------------------------------
    def follow_schema(self, schemas: Sequence[TableSchema], state: AppliedState) -> list[str]:
        """Before a unit: each table's Delta schema taken from the shape it has (recorded with the target's state)
        to the unit's. Columns added without a value for the existing rows are added to the table's schema; any
        other change (drop, rename, type, key, an added column whose existing rows hold a default) rewrites the table
        in one commit that keeps its position. The shape is recorded after the table's commit: a crash in between
        makes the rewrite again, which finds it made."""
        done: list[str] = []
        for ts in schemas:
            recorded = state.shapes.get(ts.table)
            shape = self._followed(ts.table, recorded, state)
            dt = self.delta_table(ts.table)
            if dt is None or shape is None:
                done += self.ensure_schema([ts], record=False)
            else:
                keep, follow = self.needs.table_policy(ts.table)
                have = [f.name for f in dt.schema().fields]
                steps = plan(shape, ts, have, target=self.name, keep_dropped=keep, follow=follow, rebuild=True)
                if any(st.kind != "add" or st.column.missing_value is not None for st in steps):
                    step = steps[0] if steps[0].kind == "rebuild" else as_rebuild(shape, ts, steps, have)
                    self._rewrite(ts, step)
                    done.append(f"{ts.table}: {step.describe()}")
                    log.info("target %s: schema change committed: %s", self.name, done[-1])
                elif steps:
                    done += self.ensure_schema([ts], record=False)
            if recorded != ts.version or shape != ts:
                with self.transaction() as s:
                    ensure_state(s)
                    write_shape(s, ts, ts.version)
        return done

    def _rewrite(self, ts: TableSchema, step: Step) -> None:
        """Write the table again as ``step`` (a rebuild) says: its columns renamed, dropped, converted to their new
        types, new ones filled with the value existing rows hold; one commit, the table's position kept."""
        from deltalake import write_deltalake

        assert step.shape is not None
        sources = dict(step.sources)
        want = self.dialect.arrow_schema(step.shape)
        with self._lock(ts.table):
            dt = self.delta_table(ts.table)
            assert dt is not None
            data = dt.to_pyarrow_table()
            cols = []
            con = duck_connection()
            try:
                for c, f in zip(step.shape.columns, want, strict=True):
                    src = sources.get(c.name)
                    if src is not None:
                        try:
                            cols.append(data[src].cast(f.type))
                        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                            raise stop(
                                ts,
                                self.name,
                                f"{step.describe()}, and the table's values do not fit it: {first_line(e)}",
                            ) from e
                    elif c.missing_value is not None:
                        one = con.execute(f"SELECT {self.dialect.convert(lit(c.missing_value), ts, c)}").fetchone()
                        value = one[0] if one else None
                        cols.append(pa.array([value] * data.num_rows, f.type))
                    else:
                        cols.append(pa.nulls(data.num_rows, f.type))
            finally:
                con.close()
            props = commit_properties(self.name, table_position(dt, self.name))
            with self._writing(ts.table, table_position(dt, self.name), redo=False):
                write_deltalake(
                    dt, pa.table(cols, schema=want), mode="overwrite", schema_mode="overwrite", commit_properties=props
                )

    def recreate(self, schemas: Iterable[TableSchema]) -> None:
        self.ensure_schema(schemas)

    def ensure_schema(self, schemas: Iterable[TableSchema], record: bool = True) -> list[str]:
        """Create missing tables and add missing columns (a snapshot's shape, or a unit's columns added), and, with
        ``record``, record each as the shape its table has (what a snapshot loaded)."""
        from deltalake import DeltaTable
        from deltalake.schema import Field

        schemas = list(schemas)
        for ts in schemas:
            for c in ts.columns:
                self.dialect.type_info(ts.table, c)
        done: list[str] = []
        for ts in schemas:
            path = self.path(ts.table)
            want = self.dialect.arrow_schema(ts)
            with self._writing(ts.table, ZERO, redo=False):
                self.root.mkdir(parents=True, exist_ok=True)
                dt = _open(path)
                if dt is None:
                    DeltaTable.create(str(path), want, name=ts.table)
                    done.append(f"created {ts.table}")
                    self._lossy_note(ts)
                    continue
                have = {f.name for f in dt.schema().fields}
                new = [f for f in want if f.name not in have]
                if new:
                    dt.alter.add_columns([Field.from_arrow(f) for f in new])
                    done.extend(f"added {ts.table}.{f.name}" for f in new)
        if record:
            with self.transaction() as s:
                ensure_state(s)
                for ts in schemas:
                    write_shape(s, ts, 0)
        return done

    # -- writes ----------------------------------------------------------------------------------------------------
    def write(self, table: str, parts: Sequence[pa.Table], position: Position, overwrite: bool) -> None:
        """Add ``parts`` to the table's rows, or replace them (``overwrite``), in one commit carrying ``position``
        (a snapshot's load)."""
        from deltalake import write_deltalake

        dt = self.delta_table(table)
        if dt is None:
            raise TargetError(f"target {self.name}: no Delta table for {table} at {self.path(table)}", target=self.name)
        schema = pa.schema(dt.schema().to_arrow())
        data = pa.concat_tables([_fit(p, schema) for p in parts]) if parts else schema.empty_table()
        props = commit_properties(self.name, position)
        with self._lock(table), self._writing(table, position):
            if overwrite:
                write_deltalake(dt, data, mode="overwrite", commit_properties=props)
            else:
                write_deltalake(dt, data, mode="append", commit_properties=props)

    def write_unit(self, u: UnitWork, tables: list[str], todo: list[str], by_lanes: bool = True) -> None:
        """Each table in one Delta commit with the unit's end (``threads`` > 1: tables dealt to that many lanes
        applied side by side), then the unit end in the state file once every table is done."""
        lanes = [lane for lane in ([t for t in lane if t in todo] for lane in deal(tables, self.threads)) if lane]
        done = threading.Lock()

        def run_lane(lane: list[str]) -> None:
            for t in lane:
                counts, failed = self._apply_retried(u, u.schemas[t])
                with done:
                    u.result.rows[t] = counts
                    u.result.applied.append(t)
                    u.result.rejects += len(failed)

        if len(lanes) <= 1:
            for lane in lanes:
                run_lane(lane)
        else:
            with ThreadPoolExecutor(len(lanes), thread_name_prefix=f"apply-{self.name}") as ex:
                futures = [ex.submit(run_lane, lane) for lane in lanes]
                errors = [e for e in (f.exception() for f in futures) if e is not None]
            if errors:
                raise errors[0]
        with self.transaction() as s:
            u.record(s, [], unit=True)

    def _apply_retried(self, u: UnitWork, ts: TableSchema) -> tuple[dict[str, int], list[_Failure]]:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return self._apply_table(u, ts)
            except _Conflict as e:  # a compaction (or another writer) committed first: read it and redo
                if attempt == COMMIT_ATTEMPTS:
                    raise TransientTargetError(
                        f"target {self.name}: {ts.table}'s commit of the unit up to {u.batch.end} lost to other "
                        f"writers {attempt} times: {e}",
                        hint="nothing of the unit was committed to this table; is another program writing it?",
                        target=self.name,
                        table=ts.table,
                    ) from e
                log.info(
                    "target %s: %s changed under the unit's commit (%s); applying it again", self.name, ts.table, e
                )
        raise AssertionError("unreachable")

    def _apply_table(self, u: UnitWork, ts: TableSchema) -> tuple[dict[str, int], list[_Failure]]:
        """One table's net rows as one Delta commit: checked, typed, then merged (appended when they are all
        inserts, written over the table when the unit truncated it)."""
        from deltalake import write_deltalake

        batch, result = u.batch, u.result
        t0 = time.monotonic()
        rows = {k: u.stager.rows(ts, k) for k in ("D", "U", "I")}
        dt = self.delta_table(ts.table)
        assert dt is not None
        t0 = result.timed("stage", t0)
        con = duck_connection()
        try:
            for k, r in rows.items():
                assert r is not None
                con.register(f"w_{k.lower()}", r.append_column("_ml_row", pa.array(range(r.num_rows), pa.int64())))
            con.register("tgt", dt.to_pyarrow_dataset())
            truncated = ts.table in batch.truncated
            plan = (_BagPlan if ts.bag else _Plan)(self, ts, truncated)
            try:
                plan.check(con)
                src = plan.source(con) if not plan.failures or self.on_error == "reject" else None
            except duckdb.Error:  # a value that does not convert: set aside the rows holding one, then as above
                if not plan.bad_values(con):
                    raise
                plan.check(con)
                src = plan.source(con) if self.on_error == "reject" else None
            failures = plan.failures
            t0 = result.timed("check", t0)
            if failures:
                self._locate(u, ts, failures)
                if self.on_error == "stop":
                    raise self._failure_error(ts, failures[0])
                self._reject(ts, failures, batch.start, batch.end)
            assert src is not None
        finally:
            con.close()
        ops = src[OP_COL]
        counts = {
            "D": int(pc.sum(pc.is_in(ops, pa.array(["D", "R"]))).as_py() or 0),
            "U": int(pc.sum(pc.equal(ops, "U")).as_py() or 0),
            "I": int(pc.sum(pc.is_in(ops, pa.array(["I", "R"]))).as_py() or 0),
        }
        props = commit_properties(self.name, batch.end)
        schema = pa.schema(dt.schema().to_arrow())
        with self._lock(ts.table), self._writing(ts.table, batch.end):
            if truncated:
                keep = src.filter(pc.invert(pc.equal(ops, "D")))
                write_deltalake(dt, _fit(keep, schema), mode="overwrite", commit_properties=props)
            elif src.num_rows == 0 or pc.all(pc.equal(ops, "I")).as_py():  # inserts only, none there (checked)
                write_deltalake(dt, _fit(src, schema), mode="append", commit_properties=props)
            else:
                plan.merge(dt, src, props)
        result.timed("commit", t0)
        return counts, failures

    @contextlib.contextmanager
    def _writing(self, table: str, end: Position, redo: bool = True) -> Iterator[None]:
        """A Delta write's failure as mirrorline's error: a table constraint (CHECK, NOT NULL) the rows break is
        the data's (ApplyError), anything else the target's (nothing was committed either way)."""
        from deltalake.exceptions import CommitFailedError, DeltaError

        try:
            yield
        except CommitFailedError as e:
            if redo:  # the caller applies again on the new version
                raise _Conflict(first_line(e)) from e
            raise TransientTargetError(
                f"target {self.name}: another writer committed to the Delta table {table} first: {first_line(e)}",
                hint="nothing was committed; run again",
                target=self.name,
                table=table,
            ) from e
        except (DeltaError, OSError, pa.ArrowException) as e:
            msg = first_line(e)
            ctx: dict[str, Any] = {"target": self.name, "table": table, "position": str(end)}
            if "violat" in msg.lower() or "failed validation" in msg.lower():
                raise ApplyError(
                    f"target {self.name}: the unit up to {end} breaks a constraint of the Delta table {table}: {msg}",
                    hint="drop or change the constraint at the target (or fix the row at the source) and run again",
                    db_message=msg,
                    **ctx,
                ) from e
            cls = TransientTargetError if isinstance(e, OSError) else TargetError
            raise cls(
                f"target {self.name}: writing the Delta table {table} failed: {msg}",
                hint="nothing was committed to this table; check the target folder and run again",
                **ctx,
            ) from e

    @staticmethod
    def _locate(u: UnitWork, ts: TableSchema, failures: list[_Failure]) -> None:
        """Give each failing net change the position and kind of the last change folded into it, when the unit's
        changes are at hand (an insert's position travels with it)."""
        wanted: dict[tuple[str | None, ...], _Failure] = {
            tuple(None if v is None else str(v) for v in f.key): f for f in failures if not f.position
        }
        if not wanted or u.changes is None:
            return
        src = u.changes() if callable(u.changes) else u.changes
        after = u.state.table(ts.table)
        for c in src:
            if c.table != ts.table or not after < c.pos <= u.batch.end:
                continue
            for key in (c.key, c.old_key):
                f = wanted.get(key) if key is not None else None
                if f is not None:
                    f.position, f.op = str(c.pos), c.op.value

    def _failure_error(self, ts: TableSchema, f: _Failure) -> ApplyError:
        if f.error is not None:
            return f.error
        what = {"D": "delete", "U": "update", "I": "insert", "M": "insert"}[f.op or f.kind]
        where = f"at {f.position}" if f.position else "(its position unknown: the unit's changes were not given)"
        return ApplyError(
            f"target {self.name}: {what} on {ts.table} key {f.key} {where} failed: {f.what}",
            hint='fix the target (or the row) and run again; or set on_error = "reject" to set failing changes aside',
            target=self.name,
            table=ts.table,
            key=f.key,
            position=f.position or None,
            op=f.op or f.kind,
            db_message=f.what,
        )

    def _reject(self, ts: TableSchema, failures: list[_Failure], start: Position, end: Position) -> None:
        """The unit's rejects of the table, written before its commit (again, identically, if the unit is applied
        again after a crash)."""
        stamp = now_stamp()
        with self.transaction() as s:
            s.execute(
                f"DELETE FROM {self.dialect.own('mirrorline_rejects')} WHERE {quote_ident('table')} = ? "
                "AND (lsn > ? OR (lsn = ? AND seq > ?)) AND (lsn < ? OR (lsn = ? AND seq <= ?))",
                (ts.table, start.lsn, start.lsn, start.seq, end.lsn, end.lsn, end.seq),
            )
            for f in failures:
                pos = Position.parse(f.position) if f.position else end
                s.execute(
                    self.dialect.insert_reject(),
                    (
                        pos.lsn,
                        pos.seq,
                        str(pos),
                        ts.table,
                        json.dumps(f.key, default=str),
                        f.kind,
                        json.dumps(f.image, default=str) if f.image is not None else None,
                        f.what,
                        stamp,
                    ),
                )

    # -- upkeep ----------------------------------------------------------------------------------------------------
    def maintain(self, *, retention_hours: int = 168, compact: bool = True, vacuum: bool = True) -> dict[str, Any]:
        """Compact each table's small files (one commit per table, no data change) and remove files no version
        younger than ``retention_hours`` reads. Apply waits only for the commit of each table's compaction."""

        out: dict[str, Any] = {}
        for folder, dt in self.tables().items():
            out[folder] = self._maintain_table(folder, dt, retention_hours, compact, vacuum)
        return out

    def _maintain_table(
        self, folder: str, dt: DeltaTable, retention_hours: int, compact: bool, vacuum: bool
    ) -> dict[str, Any]:
        """One table's upkeep; a commit that meets a unit's is left for the next round, any other failure is the
        target's error (nothing is lost: a compaction changes no rows)."""
        from deltalake.exceptions import CommitFailedError

        entry: dict[str, Any] = {}
        with self._writing(_table_of(folder), ZERO, redo=False):
            if compact:
                try:
                    with self._lock(_table_of(folder)):
                        dt.update_incremental()
                        m = dt.optimize.compact()
                    entry["compacted"] = {"removed": m.get("numFilesRemoved", 0), "added": m.get("numFilesAdded", 0)}
                except CommitFailedError as e:  # a unit committed first: compact at the next round
                    entry["compacted"] = {"skipped": first_line(e)}
            if vacuum:
                try:
                    with self._lock(_table_of(folder)):
                        dt.update_incremental()
                    removed = dt.vacuum(
                        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
                    )
                    entry["vacuumed"] = len(removed)
                except CommitFailedError as e:
                    entry["vacuumed"] = {"skipped": first_line(e)}
        return entry

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per table: its Delta version, file count and the position its last commit applied."""
        out = {}
        for folder, dt in self.tables().items():
            out[folder] = {
                "version": dt.version(),
                "files": len(dt.file_uris()),
                "position": str(table_position(dt, self.name)),
            }
        return out
