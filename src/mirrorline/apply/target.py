"""What a target kind is (DESIGN §6): :class:`Target`, the interface every kind implements and the one the rest of
mirrorline uses, and the values a unit's apply passes around (:class:`UnitWork`, :class:`ApplyResult`).

A kind gives, as one folder under ``apply/`` and a row of :data:`mirrorline.apply.kinds.KINDS`:

- :meth:`Target.connect`: a session on the target's state store, where mirrorline keeps its own tables (positions,
  tables held, snapshot state, rejects): the database itself, or a file beside the tables (Delta);
- :meth:`Target.write_unit`: a compiled unit's tables written with their positions (exactly once: the positions go
  in the same transaction, or after the tables' own commits that carry them);
- :meth:`Target.follow_schema`, :meth:`Target.ensure_schema`, :meth:`Target.recreate`: the tables' shapes;
- :meth:`Target.consistent_read`: its rows as of one moment, for ``verify``;
- optional: a loader of a snapshot's chunks from Spark tasks (named by the kind's row), :meth:`Target.maintain` and
  :meth:`Target.describe` (a kind with files to keep), :meth:`Target.lock_file` or the lock hooks (a server kind).

What is the same for every kind lives here: the applier lock, the state store's sessions, the applied positions,
the checks that make a unit apply once (:meth:`Target.apply`), tables held. The SQL kinds (PostgreSQL, SQLite,
DuckDB) share one implementation of the rest, :class:`mirrorline.apply.engine.SqlTarget`; Delta writes its tables
with delta-rs. What a target needs from the pipeline comes to its constructor (:class:`Needs`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirrorline import limits
from mirrorline.apply import lock
from mirrorline.apply import state as applied
from mirrorline.apply.chunks import ChunkLoader
from mirrorline.apply.history import HistoryShape, mode_columns
from mirrorline.apply.history import shape as history_shape
from mirrorline.apply.kinds import KINDS
from mirrorline.apply.kinds import load as load_kind_class
from mirrorline.apply.session import Session
from mirrorline.apply.sql import STATE_TABLE, Dialect
from mirrorline.apply.stage import ArrowStager, Stager
from mirrorline.apply.state import AppliedState
from mirrorline.apply.state import parse as parse_state
from mirrorline.apply.state import write as write_state
from mirrorline.apply.types import lossy_note
from mirrorline.errors import ApplyError, TargetError, first_line
from mirrorline.model import Change, TableSchema
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.compile.batch import NetBatch

ChangeSource = Callable[[], Iterable[Change]] | Sequence[Change] | None

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Needs:
    """What a target needs from the pipeline, given to it when it is made. To follow a schema change: a table's
    logged schema by version, the one in force at a position, and each table's policy ``(keep dropped columns,
    follow schema changes)``; without them (a target opened outside a pipeline) a table's shape is what the target
    recorded, and changes are followed. ``keeps_deleted``: the tables whose actions drop D (DESIGN §5), where the
    target keeps rows the source deleted, so that an insert replaces a row that may be there. ``history``: the tables
    kept with their history (history mode), with the mode and the prefix of its columns."""

    schema_version: Callable[[str, int], TableSchema] | None = None
    schema_at: Callable[[str, Position], TableSchema | None] | None = None
    table_policy: Callable[[str], tuple[bool, bool]] = lambda table: (False, True)
    keeps_deleted: Callable[[str], bool] = lambda table: False
    # the tables kept with their history (history mode, apply/history.py): (mode, prefix of its columns); None: not
    history: Callable[[str], tuple[str, str] | None] = lambda table: None


class TargetRead(ABC):
    """One consistent view of a target, for ``verify``: its applied position and its tables' rows, every value in
    the canonical text form (:mod:`mirrorline.apply.canonical`), all as of one moment."""

    position: Position

    @abstractmethod
    def columns(self, table: str) -> list[str] | None:
        """The columns of the target's table for source table ``table`` (None: no such table)."""

    @abstractmethod
    def rows(self, ts: TableSchema) -> Iterator[list[Sequence[str | None]]]:
        """``ts``'s rows, its columns in order, in batches."""


@dataclass
class UnitWork:
    """One unit being applied to this target: what every step of it reads."""

    batch: NetBatch
    schemas: Mapping[str, TableSchema]
    changes: ChangeSource  # the unit's changes after per-table actions, for the failure path
    state: AppliedState  # the target's positions before the unit
    stager: Stager
    result: ApplyResult
    held: str | None = None  # the unit applies this held table alone, from its own position

    def record(self, s: Session, tables: Sequence[str], unit: bool) -> None:
        """Write the positions the unit reached, in the caller's transaction: ``tables``' and (``unit``) the unit
        end every table has reached; a held table's hold moves instead (ended once it reaches the other tables)."""
        if self.held is None:
            write_state(s, tables, self.batch.end, unit)
        else:
            applied.move_hold(s, self.held, self.batch.end, release=self.batch.end >= self.state.live)


@dataclass
class ApplyResult:
    target: str
    start: Position
    end: Position
    applied: list[str] = field(default_factory=list)  # tables applied by this call
    skipped: list[str] = field(default_factory=list)  # tables that already had the unit
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {"D": n, "U": n, "I": n}
    rejects: int = 0
    serial: list[str] = field(default_factory=list)  # tables that went through the failure path
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds: stage (fetch + load worktables), delete, ...

    def timed(self, phase: str, since: float) -> float:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - since
        return now

    @property
    def noop(self) -> bool:
        return not self.applied


def deal(tables: Sequence[str], threads: int) -> list[list[str]]:
    """Tables dealt round-robin to ``threads`` lanes in first-seen order (003: TABLE1, TABLE3 -> 0; TABLE2 -> 1)."""
    lanes: list[list[str]] = [[] for _ in range(max(threads, 1))]
    for i, t in enumerate(tables):
        lanes[i % len(lanes)].append(t)
    return lanes


class NotAhead(Exception):
    """A streamed transaction cannot be applied ahead of its commit (the reason is the text): what was applied of it
    is rolled back, and the transaction is applied after its commit as any other."""


class Ahead(ABC):
    """One streamed transaction applied to one target before the source commits it: a target transaction kept open
    across the transaction's parts, each part's net changes applied in turn (the folds of consecutive parts applied
    in order are the fold of the whole applied), committed with the transaction's end as the target's position
    once the source commits it. The target's applier lock is held from :meth:`Target.ahead` to :meth:`finish` or
    :meth:`abandon`. Any method may raise :class:`NotAhead`, everything of it rolled back by then."""

    @abstractmethod
    def part(self, batch: NetBatch, schemas: Mapping[str, TableSchema]) -> None:
        """Apply the next part's net changes (``schemas``: its tables' logged schemas), uncommitted."""

    @abstractmethod
    def finish(self, end: Position) -> ApplyResult:
        """Commit what the parts applied, with ``end`` (the transaction's last change) as the position of the target
        and of every table it changed."""

    @abstractmethod
    def abandon(self) -> None:
        """Roll back what the parts applied and let go of the target (the transaction aborted, or is applied after
        its commit instead)."""


class TargetMoved(TargetError):
    """The target moved past a unit's start (another process applied) before the unit: nothing applied; the unit is
    formed again from where the target is."""


class Target(ABC):
    """A target: the interface every kind implements (see the module's docstring) and what is the same for all."""

    kind: str  # its name in the registry of kinds (:data:`mirrorline.apply.kinds.KINDS`), which holds what it can do
    dialect: Dialect  # the kind's names for mirrorline's own tables, and how it holds each source type

    def __init__(
        self,
        name: str,
        location: str,
        *,
        mode: str = "update",
        on_error: str = "stop",
        threads: int = 1,
        driver_rows: int = limits.DRIVER_ROWS,
        state_prefix: str | None = None,
        needs: Needs | None = None,
        open_wait: float | None = None,
    ) -> None:
        if state_prefix is not None:  # this target's own tables: named with its prefix (its sessions use it too)
            self.dialect = type(self).dialect.with_prefix(state_prefix)
        if mode not in ("update", "mirror"):
            raise ValueError(f"mode must be update or mirror, not {mode!r}")
        if on_error not in ("stop", "reject"):
            raise ValueError(f"on_error must be stop or reject, not {on_error!r}")
        self.name, self.location, self.mode, self.on_error = name, location, mode, on_error
        self.threads = max(threads, 1)
        self.driver_rows = driver_rows  # units with more changes than this load table by table (or from Spark)
        self._ready = False
        self._idle: list[Session] = []  # connections kept open between units (the page cache, no new backend)
        self._idle_lock = threading.Lock()
        self.needs = needs or Needs()
        self.spec = KINDS[self.kind]  # what the kind can do
        # seconds a connection waits while another process holds the database (None: the kind's)
        self.open_wait = self.spec.open_wait if open_wait is None else open_wait

    # -- one applier at a time (mirrorline.apply.lock) ------------------------------------------------------------
    def exclusive(self, wait: float) -> contextlib.AbstractContextManager[None]:
        """Hold this target's applier lock for a block (waiting up to ``wait`` seconds for another process)."""
        return lock.exclusive(self, wait)

    def lock_file(self) -> lock.FileLock:
        """A file kind's lock: a file beside its database."""
        return lock.FileLock(Path(self.location + ".mirrorline-lock"))

    def lock_key(self) -> str:
        return f"{self.kind}:{self.location}:{self.dialect.own(STATE_TABLE)}"

    def try_lock(self) -> Any:
        return self.lock_file().try_lock(self.name)

    def unlock(self, handle: Any) -> None:
        lock.FileLock.unlock(handle)

    def lock_holder(self) -> str:
        return self.lock_file().holder()

    # -- the state store: mirrorline's own tables ------------------------------------------------------------------
    @abstractmethod
    def connect(self) -> Session:
        """A new session on the target's state store (for the SQL kinds, the database itself)."""

    def session(self) -> Session:
        """A connection: one an earlier use left idle when there is one, else a new one. ``close()`` it when done:
        it is kept for the next use (up to one per apply thread) when it is still idle and healthy."""
        while True:
            with self._idle_lock:
                s = self._idle.pop() if self._idle else None
            if s is None:
                s = self.connect()
                s.dialect = self.dialect
                s.release = self._release
                return s
            if self._healthy(s):
                return s
            with contextlib.suppress(Exception):
                s.disconnect()

    @staticmethod
    def _healthy(s: Session) -> bool:
        try:
            return s.reusable()
        except Exception:
            return False

    def _release(self, s: Session) -> None:
        try:
            keep = s.reset()
        except Exception:
            keep = False
        if keep:
            with self._idle_lock:
                if len(self._idle) < self.threads + 1:
                    self._idle.append(s)
                    return
        s.disconnect()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside a transaction: committed when the block ends, rolled back when it raises; the session
        goes back to the target either way. mirrorline's own tables exist by then."""
        s = self.session()
        try:
            self._prepare(s)
            s.begin()
            yield s
            s.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                s.rollback()
            raise
        finally:
            s.close()

    def _prepare(self, session: Session) -> None:
        if self._ready:
            return
        session.begin()
        session.execute(self.dialect.create_state())
        session.execute(self.dialect.create_rejects())
        session.commit()
        self._ready = True

    def applied_positions(self) -> AppliedState:
        s = self.session()
        try:
            self._prepare(s)
            return parse_state(s.query(self.dialect.read_state()))
        finally:
            s.close()

    def applied_position(self) -> Position:
        return self.applied_positions().position

    def hold(self, table: str, error: BaseException) -> Position:
        """Stop ``table`` alone at this target (it failed with ``error``): held at the position it has applied up
        to, left out of the target's units from now on. Returns that position."""
        text = first_line(error)
        state = self.applied_positions()  # (the caller holds the target's lock: nothing moves meanwhile)
        at = state.table(table)
        with self.transaction() as s:
            applied.hold(s, table, at, text, type(error).__name__, state.holds.get(table, {}).get("since"))
        return at

    def release(self, table: str) -> None:
        """End ``table``'s hold: it has nothing left to catch up (or was loaded again)."""
        with self.transaction() as s:
            applied.release(s, table)

    def ahead(self, start: Position, wait: float) -> Ahead | None:
        """A streamed transaction applied ahead of its commit, the log's end being ``start`` (see :class:`Ahead`),
        the applier lock waited for up to ``wait`` seconds; None where the kind applies a transaction only after its
        commit. Raises :class:`NotAhead` where the target has not applied the log up to ``start`` (a snapshot may
        have left it beyond: a position the transaction, not committed yet, comes after), or holds a table."""
        return None

    # -- the kind's own --------------------------------------------------------------------------------------------
    @abstractmethod
    def write_unit(self, u: UnitWork, tables: list[str], todo: list[str], by_lanes: bool = True) -> None:
        """Write the unit's tables ``todo`` (``tables``: all of the unit's, in first-seen order) with their positions
        (:meth:`UnitWork.record`), exactly once; ``by_lanes``: the kind may write tables side by side (``threads``).
        :meth:`apply` has checked the positions and followed the schema before it."""

    @abstractmethod
    def follow_schema(self, schemas: Sequence[TableSchema], state: AppliedState) -> list[str]:
        """Before a unit: create missing tables, and make each table's shape at the target follow the unit's logged
        schema from the shape it has (:mod:`mirrorline.apply.reshape`), recording it. A change the kind does not
        follow raises :class:`~mirrorline.apply.reshape.SchemaChangeStop` with nothing changed. Returns what was
        done, one line each."""

    @abstractmethod
    def ensure_schema(self, schemas: Iterable[TableSchema]) -> list[str]:
        """Create missing tables and columns from ``schemas`` (a snapshot's, read from the source's catalog), and
        record each as the shape its table has at the target. Returns what was done, one line each."""

    @abstractmethod
    def recreate(self, schemas: Iterable[TableSchema]) -> None:
        """Make these tables again, empty, from ``schemas``: a table reloaded whole (``snapshot --table``)."""

    @abstractmethod
    def consistent_read(self) -> contextlib.AbstractContextManager[TargetRead]:
        """A read of the target as of one moment (see :class:`TargetRead`), ended with the block."""

    def chunk_loader(self) -> ChunkLoader | None:
        """How a snapshot's chunks reach this target from the Spark tasks that read them, each task committing its
        own (the kind's :attr:`~mirrorline.apply.kinds.Kind.chunk_loader`, made with this target); None: the tasks
        stage chunk files and the driver loads them in one transaction (:meth:`Session.load_chunk`)."""
        if not self.spec.chunk_loader:
            return None
        loader: ChunkLoader = load_kind_class(self.spec.chunk_loader)(self)
        return loader

    def stager(self, batch: NetBatch, schemas: Mapping[str, TableSchema], tables: list[str]) -> Stager:
        """How this unit's worktables get loaded; engines with a parallel path override it for large units."""
        whole = batch.on_driver or 0 < batch.changes <= self.driver_rows or batch.changes == 0
        return ArrowStager(batch, whole=whole)

    def maintain(self, *, retention_hours: int = 168) -> dict[str, Any]:
        """Upkeep of the target's storage (a Delta target compacts small files and removes the files no version
        younger than ``retention_hours`` reads); nothing for a database, which keeps its own."""
        return {}

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per table, what ``status`` shows beyond the positions (a Delta table's version and file count); nothing
        for a database."""
        return {}

    def close(self) -> None:
        """Release what the target keeps open between units: its idle connections."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for s in idle:
            with contextlib.suppress(Exception):
                s.disconnect()

    def loaded(self, s: Session, schemas: Iterable[TableSchema], position: Position) -> None:
        """A snapshot's rows of ``schemas`` were loaded (in ``s``'s transaction, before it commits): the tables kept
        in versions open a version per row at the snapshot's ``position``. Nothing for the others."""
        return None

    def shape(self, ts: TableSchema) -> TableSchema:
        """``ts`` as this target holds its table: with the version columns where the table is kept in versions
        (:mod:`mirrorline.apply.history`), else as it is."""
        kept = self.needs.history(ts.table)
        return ts if kept is None or isinstance(ts, HistoryShape) else history_shape(ts, *kept)

    def current_only(self, ts: TableSchema) -> str:
        """What a SELECT of ``ts``'s rows appends to read the source's rows as they are now: `` WHERE`` the row is
        current, for a table kept with its history; else nothing."""
        hs = self.shape(ts)
        return f" WHERE {hs.current}" if isinstance(hs, HistoryShape) else ""

    def _followed(self, table: str, recorded: int | None, state: AppliedState) -> TableSchema | None:
        """The shape the target's table has: as recorded with it, by content (what the snapshot loaded, or the
        version it last followed); else (a state written without it) the logged version recorded, else the version
        in force at its applied position."""
        doc = state.shape_docs.get(table)
        if doc is not None:
            return doc
        if recorded and self.needs.schema_version is not None:
            return self.needs.schema_version(table, recorded)
        if self.needs.schema_at is not None:
            return self.needs.schema_at(table, state.table(table))
        return None

    def _lossy_note(self, ts: TableSchema) -> None:
        """Say once, when a table is created, which of its columns hold some values otherwise (README, "Types")."""
        own = {c.name for c in mode_columns(ts.mode, ts.prefix)} if isinstance(ts, HistoryShape) else set()
        note = lossy_note((c.name, self.dialect.type_info(ts.table, c)) for c in ts.columns if c.name not in own)
        if note:
            log.warning("target %s: %s: %s", self.name, ts.table, note)

    def _moved_error(self, ts: TableSchema, row: Sequence[Any], kept: frozenset[str]) -> ApplyError:
        """The error of an insert whose unsent columns had no row to be taken from (``row``: its key, its
        ``moved_from`` and its position)."""
        nk = len(ts.key)
        key, moved = list(row[:nk]), list(row[nk : 2 * nk])
        pos = Position(int(row[2 * nk]), int(row[2 * nk + 1]))
        cols = ", ".join(sorted(kept))
        if all(v is None for v in moved):
            what = "names no row to take them from"
        else:
            what = f"takes them from the row with key {moved}, which is not at the target"
        return ApplyError(
            f"target {self.name}: insert on {ts.table} key {key} at {pos}: the columns {cols} were not sent (a "
            f"key-changing update of unchanged TOASTed values) and the net change {what}",
            hint="the target lost that row or was changed by hand: restore it, or re-snapshot the table",
            target=self.name,
            table=ts.table,
            key=key,
            moved_from=moved,
            position=str(pos),
            columns=sorted(kept),
        )

    # -- apply -----------------------------------------------------------------------------------------------------
    def apply(
        self,
        batch: NetBatch,
        schemas: Mapping[str, TableSchema],
        changes: ChangeSource = None,
        table: str | None = None,
    ) -> ApplyResult:
        """Apply one unit exactly once. ``schemas``: each table's logged schema (the version in force at the unit's
        end). ``changes``: the unit's changes in log order (after per-table actions), for the failure path.
        ``table``: a held table, the unit applied to it alone from its own position (see :meth:`hold`)."""
        t0 = time.monotonic()
        result = ApplyResult(self.name, batch.start, batch.end)
        state = self.applied_positions()
        tables = list(batch.tables) + [t for t in batch.truncated if t not in batch.tables]
        if table is not None:
            return self._apply_held(batch, schemas, changes, table, state, result, tables, t0)
        if state.unit_end >= batch.end:
            result.skipped = tables
            return result
        if batch.start > state.live:
            raise TargetError(
                f"target {self.name}: the unit starts at {batch.start} but the target has applied only up to "
                f"{state.live}; applying it would skip the changes in between",
                hint="apply the units from the target's applied position",
                target=self.name,
                position=str(state.live),
            )
        if state.unit_end > batch.start:
            raise TargetMoved(
                f"target {self.name}: it is at {state.position}, inside the unit {batch.start}..{batch.end} (another "
                "applier moved it after the unit was formed): applying the unit would apply changes twice",
                hint="form the unit again from the target's position",
                target=self.name,
            )
        todo = [t for t in tables if state.table(t) < batch.end and t not in state.held]
        inside = [t for t in todo if batch.start < state.table(t)]
        if inside:
            raise TargetError(
                f"target {self.name}: {', '.join(inside)} already applied up to {state.table(inside[0])}, inside the "
                f"unit {batch.start}..{batch.end}; applying the unit would apply those changes twice",
                hint="re-form the interrupted unit with the same end (see applied_positions())",
                target=self.name,
            )
        result.skipped = [t for t in tables if t not in todo]
        missing = [t for t in todo if t not in schemas]
        if missing:
            raise TargetError(
                f"target {self.name}: no logged schema for {', '.join(missing)}",
                hint="the log must record a table's schema before its changes",
                target=self.name,
            )
        self.follow_schema([schemas[t] for t in todo], state)
        u = UnitWork(batch, schemas, changes, state, self.stager(batch, schemas, todo), result)
        try:
            self.write_unit(u, tables, todo)
        finally:
            u.stager.close()
        result.seconds = time.monotonic() - t0
        return result

    def _apply_held(
        self,
        batch: NetBatch,
        schemas: Mapping[str, TableSchema],
        changes: ChangeSource,
        table: str,
        state: AppliedState,
        result: ApplyResult,
        tables: list[str],
        t0: float,
    ) -> ApplyResult:
        """The unit applied to the held ``table`` alone, from the table's own position; its hold moves to the unit's
        end, or ends once the table has reached the target's other tables."""
        at = state.table(table)
        if table not in state.held or at >= batch.end:
            result.skipped = tables
            return result
        if at != batch.start:
            raise TargetMoved(
                f"target {self.name}: the held table {table} is at {at}, not at the unit's start {batch.start}",
                hint="form the unit again from the table's position",
                target=self.name,
                table=table,
            )
        result.skipped = [t for t in tables if t != table]
        todo = [table] if table in tables else []
        missing = [t for t in todo if t not in schemas]
        if missing:
            raise TargetError(
                f"target {self.name}: no logged schema for {table}",
                hint="the log must record a table's schema before its changes",
                target=self.name,
                table=table,
            )
        self.follow_schema([schemas[t] for t in todo], state)
        u = UnitWork(batch, schemas, changes, state, self.stager(batch, schemas, todo), result, held=table)
        try:
            self.write_unit(u, todo, todo, by_lanes=False)
        finally:
            u.stager.close()
        result.seconds = time.monotonic() - t0
        return result
