"""The SQL kinds' engine (DESIGN §6), the one implementation of :class:`~mirrorline.apply.target.Target` that
PostgreSQL, SQLite and DuckDB share: a compiled unit (:class:`NetBatch`) applied exactly once with set-based
statements, the target's applied position written in the same transaction. A kind gives its dialect (SQL text,
types) and sessions; it may replace the stager (how worktables are loaded) and the type check.

Per table, in the unit's first-seen order: the images of the inserts whose columns were not sent (a key-changing
update of TOASTed values) completed from the target's rows at their ``moved_from`` (read first: those rows are about
to be deleted; a missing one is an :class:`ApplyError`), TRUNCATE if truncated, then the net deletes (join-delete),
updates (join-update of only the columns not marked unchanged; "mirror" mode: delete + insert, unchanged columns kept
from the existing row), inserts (insert-select), each from a bulk-loaded worktable.

- threads = 1: the whole unit is one transaction, with every table's position and the unit end.
- threads = N > 1: tables dealt round-robin (first-seen order) to N connections; each table is one transaction with
  its own position; the unit end is written once every table is done.
- A bulk failure rolls back the transaction and re-applies the unit's changes one by one in log order to find the
  first that fails: stop with :class:`ApplyError` naming it, or (``on_error = "reject"``) record it in
  ``mirrorline_rejects`` and apply the rest, the position advanced (:mod:`mirrorline.apply.serial`).

SQL text is generated in ``apply/sql.py``, worktables staged in ``apply/stage.py``, the failure path in
``apply/serial.py``; the checks that make a unit apply once are the interface's (:meth:`Target.apply`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from mirrorline.apply import history
from mirrorline.apply import rows as work_rows
from mirrorline.apply.canonical import native_text
from mirrorline.apply.history import HistoryShape
from mirrorline.apply.reshape import as_rebuild, plan, stop
from mirrorline.apply.serial import reapply
from mirrorline.apply.session import Session
from mirrorline.apply.sql import Dialect, key_col, parse_mask
from mirrorline.apply.state import AppliedState, write_shape
from mirrorline.apply.state import ensure as ensure_state
from mirrorline.apply.state import read as read_state
from mirrorline.apply.state import write as write_state
from mirrorline.apply.state import write_missing as write_missing_state
from mirrorline.apply.target import Ahead, ApplyResult, NotAhead, Target, TargetRead, UnitWork, deal
from mirrorline.apply.types import cannot_hold
from mirrorline.errors import ApplyError, TransientTargetError, first_line
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import Position

if TYPE_CHECKING:
    import pyarrow as pa

    from mirrorline.compile.batch import NetBatch
    from mirrorline.compile.history import Frames

_images = itertools.count(1)

log = logging.getLogger(__name__)


class _SessionRead(TargetRead):
    """A read transaction on one of the target's sessions; values turned into canonical text from the engine's
    own types."""

    def __init__(self, target: Target, s: Session) -> None:
        self.target, self.s = target, s
        s.begin_read()
        self.position = read_state(s).live  # (a table stopped alone is behind it: verify does not compare it)

    def columns(self, table: str) -> list[str] | None:
        return self.s.table_columns(table)

    def rows(self, ts: TableSchema) -> Iterator[list[Sequence[str | None]]]:
        d = self.target.dialect
        convs = [native_text(c.type_name) for c in ts.columns]
        cols = ", ".join(d.read_expr(quote_ident(c.name), d.type_info(ts.table, c)) for c in ts.columns)
        where = self.target.current_only(ts)
        for batch in self.s.fetch(f"SELECT {cols} FROM {self.target.dialect.table(ts.table)}{where}"):
            yield [[f(v) for f, v in zip(convs, row, strict=True)] for row in batch]


class _Mismatch(Exception):
    """A set-based statement touched a different number of rows than the worktable holds."""

    def __init__(self, table: str, kind: str, expected: int, got: int) -> None:
        what = {"D": "deleted", "U": "updated", "I": "inserted"}[kind]
        super().__init__(f"{table}: {what} {got} rows, expected {expected}")
        self.table = table


class SqlTarget(Target):
    """A target written by SQL transactions: worktables, set-based statements, lanes, the serial failure path."""

    def check_types(self, session: Session, schemas: Iterable[TableSchema]) -> None:
        """Raise TargetError (table, column, type) for a column type the target cannot hold."""
        for s in schemas:
            for c in s.columns:
                self.dialect.type_info(s.table, c)

    @contextlib.contextmanager
    def consistent_read(self) -> Iterator[TargetRead]:
        """A read of the target as of one moment (see :class:`TargetRead`), ended (rolled back) with the block."""
        s = self.session()
        try:
            yield _SessionRead(self, s)
        finally:
            with contextlib.suppress(Exception):
                s.rollback()
            s.close()

    # -- schema ----------------------------------------------------------------------------------------------------
    def ensure_schema(self, schemas: Iterable[TableSchema]) -> list[str]:
        """Create missing tables and columns from ``schemas`` (a snapshot's, read from the source's catalog), and
        record each as the shape its table has at the target; every type is checked before anything is created.
        Returns what was done, one line each."""
        schemas = list(schemas)
        done: list[str] = []
        with self.transaction() as s:
            self.check_types(s, schemas)
            ensure_state(s)
            for ts in schemas:
                have = s.table_columns(ts.table)
                if have is None:
                    for stmt in self.dialect.create_table(self.shape(ts)):
                        s.execute(stmt)
                    done.append(f"created {ts.table}")
                    self._lossy_note(ts)
                else:
                    for c in ts.columns:
                        if c.name not in have:
                            s.execute(self.dialect.add_column(ts.table, c))
                            done.append(f"added {ts.table}.{c.name}")
                # the shape loaded, by content: the baseline the next schema change is followed from
                write_shape(s, ts, 0)
        return done

    def loaded(self, s: Session, schemas: Iterable[TableSchema], position: Position) -> None:
        at = history.pg_time(int(time.time() * 1_000_000)) or ""
        for ts in schemas:
            hs = self.shape(ts)
            if isinstance(hs, HistoryShape) and hs.versions:
                s.execute(self.dialect.open_versions(hs, position.lsn, at))

    def recreate(self, schemas: Iterable[TableSchema]) -> None:
        """Drop these tables where they exist and create them again from ``schemas`` (the source's catalog), their
        followed schema version forgotten: a table reloaded whole (``snapshot --table``), for example after a schema
        change the target did not follow."""
        with self.transaction() as s:
            ensure_state(s)
            for ts in schemas:
                if s.table_columns(ts.table) is not None:
                    s.execute(self.dialect.drop_table(self.dialect.table(ts.table)))
                for stmt in self.dialect.create_table(self.shape(ts)):
                    s.execute(stmt)
                write_shape(s, ts, 0)

    def follow_schema(self, schemas: Sequence[TableSchema], state: AppliedState) -> list[str]:
        """Before a unit: create missing tables, and make each table's shape at the target follow the unit's logged
        schema from the version it followed (:mod:`mirrorline.apply.reshape`), recording the version, in one
        transaction. A change it does not follow raises :class:`~mirrorline.apply.reshape.SchemaChangeStop` with
        nothing changed. Returns what was done, one line each."""
        with self.transaction() as s:
            done, changed, rebuilt = self._follow(s, schemas, state)
        for line in changed:
            log.info("target %s: schema change committed: %s", self.name, line)
        self._index_again(rebuilt)
        return done

    def _follow(
        self, s: Session, schemas: Sequence[TableSchema], state: AppliedState
    ) -> tuple[list[str], list[str], dict[str, list[tuple[str, str]]]]:
        """:meth:`follow_schema` inside the caller's transaction: what was done, the schema changes among it, and
        the tables built again with the indexes others had made on them (to make again once it commits)."""
        done: list[str] = []
        changed: list[str] = []
        rebuilt: dict[str, list[tuple[str, str]]] = {}
        self.check_types(s, schemas)
        columns = s.tables_columns([ts.table for ts in schemas])  # (a change to one table leaves the others' alone)
        for ts in schemas:
            have = columns[ts.table]
            recorded = state.shapes.get(ts.table)
            if have is None:
                for stmt in self.dialect.create_table(self.shape(ts)):
                    s.execute(stmt)
                done.append(f"created {ts.table}")
                self._lossy_note(ts)
            else:
                # (a table kept with its history: both shapes with its columns, which every step keeps)
                found = self._followed(ts.table, recorded, state)
                old, new = (self.shape(found) if found is not None else None), self.shape(ts)
                keep, follow = self.needs.table_policy(ts.table)
                kept = self.needs.history(ts.table)
                keep = keep or (kept is not None and kept[0] == "versions")  # (a version keeps its values)
                steps = plan(
                    old,
                    new,
                    have,
                    target=self.name,
                    keep_dropped=keep,
                    follow=follow,
                    rebuild=self.dialect.rebuilds_to_alter,
                )
                if kept is not None and any(st.kind == "rekey" for st in steps):
                    what = "; ".join(st.describe() for st in steps)
                    raise stop(ts, self.name, f"{what}, which the versions of its rows at the target do not have")
                made = [self.dialect.reshape(ts.table, step, new) for step in steps]
                if old is not None and any(m is None for m in made):  # (a type this kind alters only so)
                    steps = [as_rebuild(old, new, steps, have)]
                    made = [self.dialect.reshape(ts.table, steps[0], new)]
                if any(st.kind in ("rebuild", "rekey") for st in steps):
                    rebuilt[ts.table] = s.user_indexes(ts.table)
                for step, stmts in zip(steps, made, strict=True):
                    if stmts is None:
                        raise stop(ts, self.name, f"{step.describe()}, which a {self.kind} target cannot make in place")
                    log.debug("target %s: schema change open: %s: %s", self.name, ts.table, step.describe())
                    try:
                        for stmt in stmts:
                            s.execute(stmt)
                    except Exception as e:
                        if not s.is_data_error(e):
                            raise
                        what = f"{step.describe()}, and the target's rows do not fit it: {s.error_text(e)}"
                        raise stop(ts, self.name, what) from e
                    done.append(f"{ts.table}: {step.describe()}")
                    changed.append(done[-1])
            if recorded != ts.version or not _same_shape(state.shape_docs.get(ts.table), ts):
                ensure_state(s)  # (the state table exists after the first unit: not asked every unit)
                write_shape(s, ts, ts.version)
        return done, changed, rebuilt

    def _index_again(self, rebuilt: Mapping[str, Sequence[tuple[str, str]]]) -> None:
        """Make again, each in a transaction of its own, the indexes others had made on tables a schema change
        built again; one whose columns went (dropped, renamed) or no longer fit is said in a warning."""
        for table, indexes in rebuilt.items():
            for name, stmt in indexes:
                try:
                    with self.transaction() as s:
                        s.execute(stmt)
                except Exception as e:
                    log.warning(
                        "target %s: %s was built again for a schema change; its index %s could not be made again "
                        "(%s): make it again as fits the new columns",
                        self.name,
                        table,
                        name,
                        first_line(e),
                    )

    # -- ahead of the commit ---------------------------------------------------------------------------------------
    def ahead(self, start: Position, wait: float) -> Ahead:
        """A streamed transaction applied ahead of its commit in one of this target's transactions
        (:class:`~mirrorline.apply.target.Ahead`)."""
        return _SqlAhead(self, start, wait)

    # -- apply -----------------------------------------------------------------------------------------------------
    def write_unit(self, u: UnitWork, tables: list[str], todo: list[str], by_lanes: bool = True) -> None:
        """Write the unit's tables ``todo`` (``tables``: all of the unit's, in first-seen order) and their positions:
        one transaction (threads = 1) or a transaction per table on ``threads`` lanes (``by_lanes``). The one step a
        kind whose tables are not written by SQL transactions replaces (Delta: a commit per table, then the unit's
        end); :meth:`apply` has checked the positions and followed the schema before it."""
        if self.threads == 1 or not by_lanes:
            s = self.session()
            try:
                self._apply_scope(s, u, todo, unit=True)
            finally:
                s.close()
        else:
            self._apply_lanes(u, tables, todo)

    def _apply_lanes(self, u: UnitWork, tables: list[str], todo: list[str]) -> None:
        """``threads > 1``: the tables dealt to lanes, each table its own transaction and position."""
        s = self.session()
        try:
            s.begin()  # register every table of the unit first, so that the min over tables is a safe position
            write_missing_state(s, {t: u.state.unit_end for t in todo})
            s.commit()
            lanes = [[t for t in lane if t in todo] for lane in deal(tables, self.threads)]

            def run_lane(lane: list[str]) -> None:
                ls = self.session()
                try:
                    for t in lane:
                        self._apply_scope(ls, u, [t], unit=False)
                finally:
                    ls.close()

            with ThreadPoolExecutor(self.threads, thread_name_prefix=f"apply-{self.name}") as ex:
                futures = [ex.submit(run_lane, lane) for lane in lanes if lane]
                errors = [e for e in (f.exception() for f in futures) if e is not None]
            if errors:
                raise errors[0]
            s.begin()
            write_state(s, [], u.batch.end, unit=True)
            s.commit()
        finally:
            s.close()

    def _apply_scope(self, s: Session, u: UnitWork, tables: list[str], unit: bool) -> None:
        """One transaction: the tables' bulk statements and positions; on a bulk failure, the failure path."""
        batch, result = u.batch, u.result
        counts: dict[str, dict[str, int]] = {}
        try:
            s.begin()
            log.debug("target %s: transaction open: unit %s..%s, %s", self.name, batch.start, batch.end, tables)
            for t in tables:
                counts[t] = self._bulk_table(s, u, u.schemas[t])
            u.record(s, tables, unit)
            t0 = time.monotonic()
            s.commit()
            log.debug("target %s: transaction committed: unit %s..%s", self.name, batch.start, batch.end)
            result.timed("commit", t0)
        except Exception as e:
            with contextlib.suppress(Exception):
                s.rollback()
            log.debug("target %s: transaction rolled back: unit %s..%s", self.name, batch.start, batch.end)
            # a bulk statement that failed before every row was read (so before the batch settled itself): a unit
            # its route compiled wrongly is compiled again (NetBatch.verify raises it), not taken to the failure path
            batch.verify()
            if not (isinstance(e, _Mismatch) or s.is_data_error(e)):
                if not isinstance(e, s.db_errors):
                    raise
                raise TransientTargetError(
                    f"target {self.name}: applying {', '.join(tables)} for the unit up to {batch.end} failed: "
                    f"{s.error_text(e)}",
                    hint="nothing was applied; check the target and run again",
                    target=self.name,
                    position=str(batch.end),
                ) from e
            # (a table kept with its history has no change-by-change path: it is written whole after the others'
            # changes, so that what fails there is named as its own)
            kept = [t for t in tables if t in u.schemas and isinstance(self.shape(u.schemas[t]), HistoryShape)]
            if u.changes is None:
                raise ApplyError(
                    f"target {self.name}: the bulk apply of {', '.join(tables)} failed: {s.error_text(e)}",
                    hint="the unit's changes were not given, so the failing change could not be found",
                    target=self.name,
                    position=str(batch.end),
                    db_message=s.error_text(e),
                ) from e
            whole = functools.partial(self._history_whole, u=u, tables=kept) if kept else None
            serial = [t for t in tables if t not in kept]
            result.rejects += reapply(self, s, u, tables, unit, whole, serial)
            result.serial.extend(serial)
        for t in tables:
            if t in counts:
                result.rows[t] = counts[t]
        result.applied.extend(tables)

    def _bulk_table(self, s: Session, u: UnitWork, ts: TableSchema) -> dict[str, int]:
        """One table's net rows by set-based statements, inside the scope's transaction: its row counts."""
        hs = self.shape(ts)
        if isinstance(hs, HistoryShape):
            return self._history_table(s, u, hs)
        d, stager, batch, result = self.dialect, u.stager, u.batch, u.result
        counts = {"D": 0, "U": 0, "I": 0}
        t0 = time.monotonic()
        # net inserts go straight into the table by the bulk path (seed 000) where the engine's bulk path converts
        # as the worktable's casts would; else, and when some must be completed from the target's rows, through a
        # worktable staged first: their moved_from rows are read before the deletes
        direct = None
        if self.spec.direct_inserts:  # net inserts straight into the table (Session.insert_rows)
            direct = stager.direct(ts)
        inserts = stager.stage(s, ts, "I") if direct is None else None
        t0 = result.timed("stage", t0)
        images = self._moved_images(s, ts, inserts[0]) if inserts else []
        if images:
            t0 = result.timed("moved", t0)
        if ts.table in batch.truncated:
            s.execute(d.truncate(ts.table))
            t0 = result.timed("truncate", t0)
        staged = stager.stage(s, ts, "D")
        t0 = result.timed("stage", t0)
        if staged:
            name, n = staged
            s.before_joins(ts, n)
            got = s.dml(d.bag_delete(ts, name) if ts.bag else d.join_delete(ts, name))
            # (where the actions drop D, every delete is a replace's: the row may be there, or not)
            if got != n and not (got < n and self.needs.keeps_deleted(ts.table)):
                raise _Mismatch(ts.table, "D", n, got)
            counts["D"] = n
            t0 = result.timed("delete", t0)
        staged = stager.stage(s, ts, "U")
        t0 = result.timed("stage", t0)
        if staged:
            name, n = staged
            s.before_joins(ts, n)
            self._bulk_updates(s, ts, name, n)
            counts["U"] = n
            t0 = result.timed("update", t0)
        if inserts:
            counts["I"] = self._insert_staged(s, ts, *inserts, images)
            t0 = result.timed("insert", t0)
        elif direct is not None:
            chunks = _Counted(direct)
            if chunks.any():  # loaded as they come: an inserts-only unit's rows are still being read
                got = s.insert_rows(ts, chunks)
                if got != chunks.rows:
                    raise _Mismatch(ts.table, "I", chunks.rows, got)
                counts["I"] = got
                t0 = result.timed("insert", t0)
        stager.finish(s, ts.table)
        result.timed("stage", t0)
        return counts

    def _history_whole(self, s: Session, *, u: UnitWork, tables: list[str]) -> None:
        """The failure path's writes of the tables kept with their history (:func:`reapply`'s ``whole``): each by
        its set-based statements; one the target refuses stops, named."""
        for t in tables:
            try:
                self._bulk_table(s, u, u.schemas[t])
            except Exception as e:
                if not (isinstance(e, _Mismatch) or s.is_data_error(e)):
                    raise
                raise ApplyError(
                    f"target {self.name}: writing the versions of {t} for the unit up to {u.batch.end} failed: "
                    f"{e if isinstance(e, _Mismatch) else s.error_text(e)}",
                    hint="nothing of the unit was applied; if the table's current rows at the target are not the "
                    "source's, reload it (snapshot --table) once the cause is found",
                    target=self.name,
                    table=t,
                    position=str(u.batch.end),
                ) from e

    def _history_table(self, s: Session, u: UnitWork, hs: HistoryShape) -> dict[str, int]:
        """A table kept with its history (:mod:`mirrorline.apply.history`), from the unit's versions: the unsent
        columns of the rows to write read from the current ones; in versions, the current versions of the keys the
        unit changed ended (soft deletes: the rows only the target holds marked deleted); a TRUNCATE's end of every
        current row; then (soft deletes: the keys written again deleted) the new rows inserted. Counts: U = rows
        ended or marked, D = rows written again, I = rows inserted."""
        d, result = self.dialect, u.result
        frames = u.batch.history.get(hs.table) if hs.versions else None
        if frames is not None:
            return self._versions_table(s, u, hs, frames)
        h = history.unit_versions(u.batch, u.changes, hs.table)
        t0 = time.monotonic()
        counts = {"D": 0, "U": 0, "I": 0}
        names: list[str] = []
        if hs.versions:
            ends, again, new = history.closes_rows(h, hs), None, history.versions_rows(h, hs)
            set_cols = [hs.end_lsn, hs.end_at, hs.deleted]
        else:
            ends, again, new = history.soft_rows(h, hs)
            set_cols = [hs.deleted, hs.deleted_lsn, hs.deleted_at]
        try:
            inserts = self._history_stage(s, hs, "I", new, names)
            closes = self._history_stage(s, hs, "U", ends, names)
            deletes = self._history_stage(s, hs, "D", again, names) if again is not None else None
            t0 = result.timed("stage", t0)
            images = self._moved_images(s, hs, inserts[0]) if inserts else []
            if closes:
                name, n = closes
                got = s.dml(d.join_update(hs, name, set_cols, None))
                if got != n:
                    raise _Mismatch(hs.table, "U", n, got)
                counts["U"] = n
                t0 = result.timed("update", t0)
            if h.truncated is not None:
                counts["U"] += s.dml(d.close_open(hs, h.truncated[0], history.pg_time(h.truncated[1]) or ""))
                t0 = result.timed("truncate", t0)
            if deletes:  # (a key the unit inserted first may not be there)
                counts["D"] = s.dml(d.join_delete(hs, deletes[0]))
                t0 = result.timed("delete", t0)
            if inserts:
                counts["I"] = self._insert_staged(s, hs, *inserts, images)
                t0 = result.timed("insert", t0)
        finally:
            for name in names:
                s.drop_worktable(name)
        result.timed("stage", t0)
        return counts

    def _versions_table(self, s: Session, u: UnitWork, hs: HistoryShape, frames: Frames) -> dict[str, int]:
        """:meth:`_history_table` from the versions compile derived set-based (:class:`Frames`): worktables straight
        from its columns, and the new versions straight into the table where none takes a column from another."""
        d, result = self.dialect, u.result
        t0 = time.monotonic()
        counts = {"D": 0, "U": 0, "I": 0}
        names: list[str] = []
        work, closes = work_rows.versions_work(frames, hs), work_rows.closes_work(frames, hs)
        direct = work_rows.direct_inserts(work, hs) if self.spec.direct_inserts else None
        try:
            inserts = None
            if direct is None and work.num_rows:
                name = f"mirrorline_h{next(_images)}_i"
                s.load(name, work.column_names, work)
                names.append(name)
                inserts = name, work.num_rows
            if closes.num_rows:
                name = f"mirrorline_h{next(_images)}_u"
                s.load(name, closes.column_names, closes)
                names.append(name)
            t0 = result.timed("stage", t0)
            images = self._moved_images(s, hs, inserts[0]) if inserts else []
            if closes.num_rows:
                got = s.dml(d.join_update(hs, names[-1], [hs.end_lsn, hs.end_at, hs.deleted], None))
                if got != closes.num_rows:
                    raise _Mismatch(hs.table, "U", closes.num_rows, got)
                counts["U"] = got
                t0 = result.timed("update", t0)
            if direct is not None and direct.num_rows:
                got = s.insert_rows(hs, [direct])
                if got != direct.num_rows:
                    raise _Mismatch(hs.table, "I", direct.num_rows, got)
                counts["I"] = got
                t0 = result.timed("insert", t0)
            elif inserts:
                counts["I"] = self._insert_staged(s, hs, *inserts, images)
                t0 = result.timed("insert", t0)
        finally:
            for name in names:
                s.drop_worktable(name)
        result.timed("stage", t0)
        return counts

    def _history_stage(
        self, s: Session, hs: HistoryShape, kind: str, net: pa.Table, names: list[str]
    ) -> tuple[str, int] | None:
        if not net.num_rows:
            return None
        name = f"mirrorline_h{next(_images)}_{kind.lower()}"
        s.load(name, work_rows.work_columns(hs, kind), work_rows.flatten(net, hs, kind))
        names.append(name)
        return name, net.num_rows

    def _insert_staged(self, s: Session, ts: TableSchema, work: str, n: int, images: list[str]) -> int:
        """Insert the worktable's ``n`` rows (those sending every column, then the completed ``images``, dropped);
        a count other than ``n`` is a mismatch."""
        d = self.dialect
        if images:
            got = s.dml(d.insert_select(ts, work, ts.column_names, [""], key_order=True))
            for image in images:
                got += s.dml(d.insert_typed(ts, image, list(ts.column_names)))
                s.execute(d.drop_table(image))
        else:
            got = s.dml(d.insert_select(ts, work, ts.column_names, key_order=True))
        if got != n:
            raise _Mismatch(ts.table, "I", n, got)
        return n

    def _moved_images(self, s: Session, ts: TableSchema, work: str) -> list[str]:
        """For the inserts marking columns unchanged: typed temp tables of their full images, those columns read from
        the target's rows at ``moved_from`` (one statement per distinct set of columns). A missing row (or no
        ``moved_from``) is an ApplyError: the value cannot be had, and a NULL would lose it silently."""
        d = self.dialect
        if not s.query(d.has_masks(work)):
            return []
        groups: dict[frozenset[str], tuple[list[str], int]] = {}
        for raw, cnt in s.query(d.mask_counts(work)):
            kept = parse_mask(raw)
            if kept:
                masks, total = groups.get(kept, ([], 0))
                groups[kept] = ([*masks, raw], total + int(cnt))
        images: list[str] = []
        try:
            for kept, (raw_masks, cnt) in groups.items():
                image = f"mirrorline_image_{next(_images)}"
                s.execute(d.moved_image(ts, work, image, kept, raw_masks))
                images.append(image)
                if int(s.query(d.count(image))[0][0]) != cnt:
                    raise self._moved_error(ts, s.query(d.moved_missing(ts, work, raw_masks))[0], kept)
        except BaseException:
            for image in images:
                with contextlib.suppress(Exception):
                    s.execute(d.drop_table(image))
            raise
        return images

    def _bulk_updates(self, s: Session, ts: TableSchema, work: str, n: int) -> None:
        d = self.dialect
        groups: dict[frozenset[str], tuple[list[str], int]] = {}
        for raw, cnt in s.query(d.mask_counts(work)):
            kept = parse_mask(raw)
            masks, total = groups.get(kept, ([], 0))
            groups[kept] = ([*masks, raw], total + int(cnt))
        value_cols = work_rows.value_columns(ts)
        key_src = {k: key_col(i) for i, k in enumerate(ts.key)}
        touched = 0
        for kept, (raw_masks, cnt) in groups.items():
            flt = raw_masks if len(groups) > 1 else None
            if self.mode == "update":
                set_cols = [c for c in value_cols if c not in kept]
                if set_cols:
                    touched += s.dml(d.join_update(ts, work, set_cols, flt))
                else:  # every column unchanged: nothing to write, but the rows must be there
                    touched += int(s.query(d.count_matches(ts, work, flt))[0][0])
            elif not kept:  # mirror: delete + insert of the full image (an update of a missing row inserts it)
                s.dml(d.join_delete(ts, work, flt))
                s.dml(d.insert_select(ts, work, ts.column_names, flt, src=key_src, key_order=True))
                touched += cnt
            else:  # mirror with unchanged columns: take them from the existing row before deleting it
                image = f"mirrorline_image_{next(_images)}"
                s.execute(d.mirror_image(ts, work, image, value_cols, kept, raw_masks))
                found = int(s.query(d.count(image))[0][0])
                if found != cnt:
                    raise _Mismatch(ts.table, "U", cnt, found)
                s.dml(d.join_delete(ts, work, raw_masks))
                s.dml(d.insert_typed(ts, image, list(ts.key) + value_cols))
                s.execute(d.drop_table(image))
                touched += cnt
        if touched != n:
            raise _Mismatch(ts.table, "U", n, touched)


class _Counted:
    """Chunks of rows passed on as they come (empty ones left out), counting the rows."""

    def __init__(self, chunks: Iterator[pa.Table]) -> None:
        self._chunks = chunks
        self._first: pa.Table | None = None
        self.rows = 0

    def any(self) -> bool:
        """Is there a row at all? (Reads up to the first chunk with rows.)"""
        for c in self._chunks:
            if c.num_rows:
                self._first = c
                return True
        return False

    def __iter__(self) -> Iterator[pa.Table]:
        if self._first is not None:
            first, self._first = self._first, None
            self.rows += first.num_rows
            yield first
        for c in self._chunks:
            if c.num_rows:
                self.rows += c.num_rows
                yield c


def _same_shape(a: TableSchema | None, b: TableSchema) -> bool:
    """Do two records of a table's shape describe the same table (its columns, types, key)?"""
    return a is not None and a.columns == b.columns and a.key == b.key and a.bag == b.bag and a.resync == b.resync


def check_unknown_types(dialect: Dialect, schemas: Iterable[TableSchema], known: Callable[[str], bool]) -> None:
    """For a target that resolves type names itself (PostgreSQL): every column's type must exist there."""
    for s in schemas:
        for c in s.columns:
            if dialect.type_info(s.table, c).conv == "cast" and not known(c.type_name):
                raise cannot_hold(dialect.name, s.table, c.name, c.type_name)


class _SqlAhead(Ahead):
    """:class:`~mirrorline.apply.target.Ahead` for the SQL kinds: one session, one transaction from the first part to
    :meth:`finish`; each part's tables followed (created, their logged version recorded) and written by the unit's
    own set-based statements inside it. What the unit's failure path would do (a row that does not fit) ends it
    instead: the transaction is then applied after its commit, where that path runs."""

    def __init__(self, target: SqlTarget, start: Position, wait: float) -> None:
        self.target = target
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(target.exclusive(wait))
        self._session: Session | None = None
        try:
            state = target.applied_positions()
            if state.held:
                raise NotAhead(f"target {target.name} has a table held")
            if state.live < start:
                raise NotAhead(f"target {target.name} has not applied the log up to {start}")
            self.state = state
            self.tables: list[str] = []
            self.result = ApplyResult(target.name, start, start)
            s = self._session = target.session()
            target._prepare(s)
            s.begin()
        except BaseException:
            self.abandon()
            raise

    def part(self, batch: NetBatch, schemas: Mapping[str, TableSchema]) -> None:
        s = self._session
        if s is None:
            raise NotAhead(f"target {self.target.name}: the transaction applied ahead was abandoned")
        target, result = self.target, self.result
        tables = list(batch.tables) + [t for t in batch.truncated if t not in batch.tables]
        try:
            new = [schemas[t] for t in tables if t not in self.tables]
            if new:
                done, changed, rebuilt = target._follow(s, new, self.state)
                if changed or rebuilt:
                    raise NotAhead(f"target {target.name}: {changed[0] if changed else 'a table built again'}")
                for line in done:
                    log.info("target %s: %s (ahead of the commit)", target.name, line)
                self.tables += [ts.table for ts in new]
            u = UnitWork(batch, schemas, None, self.state, target.stager(batch, schemas, tables), result)
            try:
                for t in tables:
                    counts = target._bulk_table(s, u, schemas[t])
                    have = result.rows.setdefault(t, {"D": 0, "U": 0, "I": 0})
                    for k, n in counts.items():
                        have[k] += n
            finally:
                u.stager.close()
            batch.verify()
        except NotAhead:
            self.abandon()
            raise
        except Exception as e:
            self.abandon()
            raise NotAhead(f"target {target.name}: {first_line(e)}") from e
        log.debug("target %s: a part of %d changes applied ahead of its commit", target.name, batch.changes)

    def finish(self, end: Position) -> ApplyResult:
        s = self._session
        if s is None:
            raise NotAhead(f"target {self.target.name}: the transaction applied ahead was abandoned")
        try:
            write_state(s, self.tables, end, unit=True)
            t0 = time.monotonic()
            s.commit()
            self.result.timed("commit", t0)
        except Exception as e:
            self.abandon()
            raise NotAhead(f"target {self.target.name}: committing failed: {first_line(e)}") from e
        self._session = None
        s.close()
        self._stack.close()
        self.result.end = end
        self.result.applied = list(self.tables)
        return self.result

    def abandon(self) -> None:
        s, self._session = self._session, None
        if s is not None:
            with contextlib.suppress(Exception):
                s.rollback()
            s.close()
        self._stack.close()
