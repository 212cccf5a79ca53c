"""What the table formats (Delta, Iceberg) share of a target: mirrorline's own state in ``_mirrorline.sqlite`` beside
the tables, each table's net rows of a unit checked against its current rows and committed as one commit of its
format with the unit's end, tables side by side in lanes, the failing net changes stopped at or set aside, and the
consistent read of ``verify``. A format implements the few methods marked abstract here: how a table is opened,
read, written and dated (its position), and its schema changes."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply import history
from mirrorline.apply import rows as work_rows
from mirrorline.apply import types as type_map
from mirrorline.apply.canonical import native_text
from mirrorline.apply.history import HistoryShape
from mirrorline.apply.lake.dialect import COMMIT_ATTEMPTS, LOCK_FILE, OP_COL, Conflict, LakeDialect, duck_connection
from mirrorline.apply.lake.plan import BagPlan, Plan
from mirrorline.apply.lake.session import Failure, LakeRead, LakeSession
from mirrorline.apply.lock import FileLock
from mirrorline.apply.reshape import Step, as_rebuild, plan, stop
from mirrorline.apply.session import Session
from mirrorline.apply.sql import lit
from mirrorline.apply.state import AppliedState, write_shape
from mirrorline.apply.state import ensure as ensure_state
from mirrorline.apply.state import now as now_stamp
from mirrorline.apply.state import parse as parse_state
from mirrorline.apply.target import Target, TargetRead, UnitWork, deal
from mirrorline.errors import ApplyError, TransientTargetError, first_line
from mirrorline.model import Column, Key, TableSchema, quote_ident
from mirrorline.position import Position

log = logging.getLogger(__name__)


class LakeTarget(Target):
    """A target whose tables are tables of a format in a folder (see the module's docstring)."""

    dialect: LakeDialect

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
        return LakeSession(self)

    def _lock(self, table: str) -> threading.Lock:
        """Held by this process's commits to one table (apply, a load, a compaction): they wait for each other
        rather than conflict."""
        with self._locks_lock:
            return self._locks.setdefault(table, threading.Lock())

    # -- the format's own --------------------------------------------------------------------------------------------
    @abstractmethod
    def open_table(self, table: str) -> Any:
        """Source table ``table``'s table at the target, as the format's handle (None: there is none)."""

    @abstractmethod
    def table_positions(self) -> dict[str, Position]:
        """Each table's position as its own last commit by this target carries it (ZERO: none yet)."""

    @abstractmethod
    def table_position(self, handle: Any) -> Position:
        """What the table's last commit by this target applied (ZERO: none yet)."""

    @abstractmethod
    def columns_of(self, handle: Any) -> list[str]:
        """The table's columns, in order."""

    @abstractmethod
    def current_rows(self, handle: Any, ts: TableSchema, rows: dict[str, pa.Table]) -> Any:
        """The table's current rows as DuckDB reads them (a dataset, an Arrow table), for the checks of a unit whose
        worktable rows are ``rows`` (by kind: a format may read only the rows of their keys)."""

    @abstractmethod
    def commit_rows(
        self, handle: Any, ts: TableSchema, src: pa.Table, plan: Plan, truncated: bool, position: Position
    ) -> None:
        """Commit the planned rows ``src`` (:meth:`Plan.source`) as one commit carrying ``position``: ``truncated``,
        in place of every row the table holds."""

    @abstractmethod
    def write(self, table: str, parts: Sequence[pa.Table], position: Position, overwrite: bool) -> None:
        """Add ``parts`` to the table's rows, or replace them (``overwrite``), in one commit carrying ``position``
        (a snapshot's load)."""

    @abstractmethod
    def as_of(self, table: str, handle: Any, position: Position) -> Any:
        """The table as of its last commit at or before ``position`` (it is ahead of the target's position)."""

    @abstractmethod
    def batches(self, handle: Any, columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The table's rows, ``columns`` of them, a batch at a time."""

    @abstractmethod
    def ensure_schema(self, schemas: Iterable[TableSchema], record: bool = True) -> list[str]:
        """Create missing tables and add missing columns, and, with ``record``, record each as the shape its table
        has (what a snapshot loaded)."""

    @abstractmethod
    def reshape(self, ts: TableSchema, step: Step) -> str:
        """Take the table to ``step``'s shape (a rebuild) in one commit that keeps its position; what was done."""

    @abstractmethod
    def _writing(self, table: str, end: Position, redo: bool = True) -> contextlib.AbstractContextManager[None]:
        """A write's failure as mirrorline's error (a constraint the rows break is the data's, anything else the
        target's); ``redo``: a commit that lost to another raises :class:`Conflict` for the caller to redo."""

    # -- schema ----------------------------------------------------------------------------------------------------
    def follow_schema(self, schemas: Sequence[TableSchema], state: AppliedState) -> list[str]:
        """Before a unit: each table taken from the shape it has (recorded with the target's state) to the unit's.
        Columns added without a value for the existing rows are added (:meth:`ensure_schema`); any other change is
        one rebuild step the format makes in one commit that keeps the table's position (:meth:`reshape`). The shape
        is recorded after the table's commit: a crash in between makes the change again, which finds it made."""
        done: list[str] = []
        for ts in schemas:
            recorded = state.shapes.get(ts.table)
            shape = self._followed(ts.table, recorded, state)
            handle = self.open_table(ts.table)
            if handle is None or shape is None:
                done += self.ensure_schema([ts], record=False)
            else:
                keep, follow = self.needs.table_policy(ts.table)
                kept = self.needs.history(ts.table)
                keep = keep or (kept is not None and kept[0] == "versions")  # (a version keeps its values)
                have = self.columns_of(handle)
                old, new = self.shape(shape), self.shape(ts)  # (kept with its history: with its columns)
                steps = plan(old, new, have, target=self.name, keep_dropped=keep, follow=follow, rebuild=True)
                if kept is not None and any(st.kind == "rekey" for st in steps):
                    what = "; ".join(st.describe() for st in steps)
                    raise stop(ts, self.name, f"{what}, which the versions of its rows at the target do not have")
                if any(st.kind != "add" or st.column.missing_value is not None for st in steps):
                    step = steps[0] if steps[0].kind == "rebuild" else as_rebuild(old, new, steps, have)
                    done.append(f"{ts.table}: {self.reshape(new, step)}")
                    log.info("target %s: schema change committed: %s", self.name, done[-1])
                elif steps:
                    done += self.ensure_schema([ts], record=False)
            if recorded != ts.version or shape != ts:
                with self.transaction() as s:
                    ensure_state(s)
                    write_shape(s, ts, ts.version)
        return done

    def rebuilt_rows(self, ts: TableSchema, step: Step, data: pa.Table) -> pa.Table:
        """The table's rows ``data`` in ``step``'s shape: each column from the one it was, converted to its new type;
        a new column set to the value existing rows hold (or NULL). Values the new type cannot hold stop the table."""
        assert step.shape is not None
        sources = dict(step.sources)
        want = self.dialect.arrow_schema(step.shape)
        cols = []
        con = duck_connection()
        try:
            for c, f in zip(step.shape.columns, want, strict=True):
                src = sources.get(c.name)
                if src is not None:
                    try:
                        cols.append(data[src].cast(f.type))
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                        what = f"{step.describe()}, and the table's values do not fit it: {first_line(e)}"
                        raise stop(ts, self.name, what) from e
                elif c.missing_value is not None:
                    one = con.execute(f"SELECT {self.dialect.convert(lit(c.missing_value), ts, c)}").fetchone()
                    cols.append(pa.array([one[0] if one else None] * data.num_rows, f.type))
                else:
                    cols.append(pa.nulls(data.num_rows, f.type))
        finally:
            con.close()
        return pa.table(cols, schema=want)

    def loaded(self, s: Session, schemas: Iterable[TableSchema], position: Position) -> None:
        assert isinstance(s, LakeSession)
        at = int(time.time() * 1_000_000)
        for ts in schemas:
            hs = self.shape(ts)
            if isinstance(hs, HistoryShape):
                s.rework(
                    ts.table,
                    functools.partial(
                        history.loaded_rows, hs=hs, schema=self.dialect.arrow_schema(hs), lsn=position.lsn, at_us=at
                    ),
                )

    # -- state -----------------------------------------------------------------------------------------------------
    def applied_positions(self) -> AppliedState:
        s = self.session()
        try:
            self._prepare(s)
            base = parse_state(s.query(self.dialect.read_state()))
        finally:
            s.close()
        tables = dict(base.tables)
        for table, pos in self.table_positions().items():
            tables[table] = max(tables.get(table, pos), pos)
        return dataclasses.replace(base, tables=tables)

    @contextlib.contextmanager
    def consistent_read(self) -> Iterator[TargetRead]:
        """The target's applied position and each table as of it (:class:`LakeRead`)."""
        yield LakeRead(self)

    # -- writes ----------------------------------------------------------------------------------------------------
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

    def _apply_retried(self, u: UnitWork, ts: TableSchema) -> tuple[dict[str, int], list[Failure]]:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return self._apply_table(u, ts)
            except Conflict as e:  # a compaction (or another writer) committed first: read it and redo
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

    def _apply_table(self, u: UnitWork, ts: TableSchema) -> tuple[dict[str, int], list[Failure]]:
        """One table's net rows as one commit: checked against its current rows, typed, then committed by the
        format (:meth:`commit_rows`). A table kept with its history: the rows of its history (:meth:`_history`)."""
        t0 = time.monotonic()
        handle = self.open_table(ts.table)
        assert handle is not None
        hs = self.shape(ts)
        if isinstance(hs, HistoryShape):
            ts, rows, truncated = self._history(u, hs, handle)
        else:
            rows, truncated = {k: u.stager.rows(ts, k) for k in ("D", "U", "I")}, ts.table in u.batch.truncated
        u.result.timed("stage", t0)
        return self._apply_rows(u, ts, handle, rows, truncated)

    def _history(
        self, u: UnitWork, hs: HistoryShape, handle: Any
    ) -> tuple[TableSchema, dict[str, pa.Table | None], bool]:
        """A table kept with its history: the unit's rows of it (:func:`~mirrorline.apply.history.keyed_rows`) as
        net rows of the table keyed by its primary key, the current versions they name read from the table."""
        h = history.unit_versions(u.batch, u.changes, hs.table)
        need = [c.key for c in h.closes] + [v.source for v in h.versions if v.source is not None] if hs.versions else []
        starts, current = self._current(handle, hs, need, every=h.truncated is not None)
        pk = history.keyed_shape(hs, self._kept_columns(hs, self.columns_of(handle)))
        net = history.keyed_rows(h, hs, starts, current, pk)
        rows = {k: work_rows.flatten(work_rows.select(net, hs.table, k), pk, k) for k in ("D", "U", "I")}
        return pk, dict(rows), False

    def _kept_columns(self, hs: HistoryShape, have: Sequence[str]) -> list[Column]:
        """The table's columns the source dropped and the target keeps (``have``: the table's), as the log's
        earlier schemas of the table define them: rows written keep (or leave NULL) their values."""
        out: list[Column] = []
        missing = [c for c in have if c not in hs.column_names]
        for v in range(hs.version - 1, 0, -1):
            if not missing or self.needs.schema_version is None:
                break
            try:
                earlier = self.needs.schema_version(hs.table, v)
            except Exception:  # (a version the log no longer holds)
                break
            for c in earlier.columns:
                if c.name in missing:
                    out.append(c)
                    missing.remove(c.name)
        return out

    def _current(
        self, handle: Any, hs: HistoryShape, need: list[Key], every: bool
    ) -> tuple[dict[Key, int], list[Key] | None]:
        """The start of the current version of each key in ``need`` (versions); with ``every``, the keys of every
        current row too (as text, as apply's rows carry them)."""
        if not need and not every:
            return {}, None
        cols = list(hs.key) + ([hs.start_lsn, hs.end_lsn] if hs.versions else [hs.deleted])
        parts = list(self.batches(handle, cols))
        if not parts:
            return {}, [] if every else None
        data = pa.Table.from_batches(parts)
        keys = [hs.column(k) for k in hs.key]
        start = quote_ident(hs.start_lsn) if hs.versions else "NULL"
        con = duck_connection()
        try:
            con.register("cur", data)
            starts: dict[Key, int] = {}
            if need:
                con.register(
                    "need",
                    pa.table({f"k{i}": [k[i] for k in need] for i in range(len(keys))} | {"i": range(len(need))}),
                )
                match = " AND ".join(
                    f"c.{quote_ident(c.name)} IS NOT DISTINCT FROM {self.dialect.convert(f'n.k{i}', hs, c)}"
                    for i, c in enumerate(keys)
                )
                for i, st in con.sql(
                    f"SELECT n.i, c.{start} FROM need n JOIN cur c ON {match} WHERE c.{hs.current}"
                ).fetchall():
                    starts[need[i]] = int(st)
            current: list[Key] | None = None
            if every:
                infos = [self.dialect.type_info(hs.table, c) for c in keys]
                sel = ", ".join(
                    type_map.duck_text(quote_ident(c.name), i.target_type in self.dialect.zoned)
                    if i.conv == "time"
                    else quote_ident(c.name)
                    for c, i in zip(keys, infos, strict=True)
                )
                convs = [native_text(c.type_name) for c in keys]
                current = []
                for row in con.sql(f"SELECT {sel}, {start} FROM cur WHERE {hs.current}").fetchall():
                    k = tuple(f(v) for f, v in zip(convs, row[:-1], strict=True))
                    current.append(k)
                    if row[-1] is not None:
                        starts.setdefault(k, int(row[-1]))
        finally:
            con.close()
        return starts, current

    def _apply_rows(
        self, u: UnitWork, ts: TableSchema, handle: Any, rows: dict[str, pa.Table | None], truncated: bool
    ) -> tuple[dict[str, int], list[Failure]]:
        batch, result = u.batch, u.result
        t0 = time.monotonic()
        con = duck_connection()
        try:
            for k, r in rows.items():
                assert r is not None
                con.register(f"w_{k.lower()}", r.append_column("_ml_row", pa.array(range(r.num_rows), pa.int64())))
            con.register("tgt", self.current_rows(handle, ts, rows))
            plan = (BagPlan if ts.bag else Plan)(self, ts, truncated)
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
        with self._lock(ts.table), self._writing(ts.table, batch.end):
            self.commit_rows(handle, ts, src, plan, truncated, batch.end)
        result.timed("commit", t0)
        return counts, failures

    @staticmethod
    def _locate(u: UnitWork, ts: TableSchema, failures: list[Failure]) -> None:
        """Give each failing net change the position and kind of the last change folded into it, when the unit's
        changes are at hand (an insert's position travels with it)."""
        wanted: dict[tuple[str | None, ...], Failure] = {
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

    def _failure_error(self, ts: TableSchema, f: Failure) -> ApplyError:
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

    def _reject(self, ts: TableSchema, failures: list[Failure], start: Position, end: Position) -> None:
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
