"""The applier: each step forms the next unit of work for the targets at the same position, compiles it once
(:class:`~mirrorline.compile.compiler.Compiler`) and applies it to each of them (DESIGN §5, §6). Targets at the same
position share one compiled unit; a unit is cut short at the next target's position so that a target behind catches
up to the others and shares with them from then on. A target that fails stops alone (and a table a target refuses
stops alone at it), tried again with a growing delay. With several targets configured, compiled units are also kept
in the log (compile/store.py) so that separate ``apply --target`` processes reuse them rather than compile again.
Where a unit ends and when it closes: :mod:`mirrorline.pipeline.plan`.

One module of about 940 lines: forming a unit, applying it to the targets at one position and keeping each
failure to the target or table it belongs to are one loop that must see every step; what stands alone is in
``plan.py`` (where a unit ends) and ``targets.py`` (stops, upkeep).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mirrorline import limits, sparkenv, stopped
from mirrorline.compile.warmup import NotStarted
from mirrorline.config import Config
from mirrorline.errors import ConfigError, MirrorlineError, Unverified, first_line
from mirrorline.model import Change, TableSchema
from mirrorline.pipeline import plan
from mirrorline.pipeline.targets import RETRY_FIRST, RETRY_MOST, Stop, Stops, Upkeep, failing_table, loading
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from mirrorline.apply import AppliedState, ApplyResult, Target
    from mirrorline.compile.batch import NetBatch
    from mirrorline.compile.warmup import WarmUp
    from mirrorline.log.reader import ChangeLog

log = logging.getLogger(__name__)


@dataclass
class UnitReport:
    """What one step did: a unit applied to one or more targets."""

    start: Position
    end: Position
    changes: int
    targets: list[str]
    compiled: bool  # False when a stored unit was reused
    compile_seconds: float
    apply_seconds: dict[str, float]
    results: dict[str, ApplyResult] = field(default_factory=dict)
    table: str | None = None  # a unit of this table alone, stopped at the target and catching up on its own


class Applier:
    """Applies the change log to the configured targets (all, or the ones named). A target that fails stops alone
    (:meth:`failed`); the others go on, and it is tried again with a growing delay."""

    overlap = True  # compile the next unit while the targets apply this one
    catch_up_changes = limits.CATCH_UP_CHANGES
    # follow() warms the large-unit route up (compile/warmup.py: warm_large) once, in the background, when no unit
    # has been applied for this many seconds and no large transaction is arriving (a local Spark only; 0: never).
    # A warm-up beside a transaction being streamed in slows that unit 2-3x on two cores (bench/bigtxn, UPDATE).
    idle_warm_up = 10.0
    idle_shrink = 5.0  # seconds between looks, when idle, at the JVM's heap (sparkenv.shrink: a grown heap collected)
    retry = True  # a stopped target is tried again (after its delay); catch_up() does not
    lock_wait = 30.0  # seconds a unit waits for another process (verify, apply) to let go of its target

    def __init__(
        self,
        config: Config,
        target_names: list[str] | None = None,
        *,
        spark: Any = None,
        open_targets: bool = True,
        warm_up: WarmUp | None = None,
        later: Sequence[str] = (),
        given: Mapping[str, Target] | None = None,
        bags: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """``later``: targets this process loads and then adds (:meth:`admit`) while the others apply. ``given``:
        targets the caller opened (and closes; given :func:`~mirrorline.pipeline.targets.schema_needs`), applied to
        instead of opening them. ``bags``: the tables without a key the small units' plan is built for (what
        ``warm_up`` warmed; default :func:`known_bags`)."""
        from mirrorline.log.reader import ChangeLog

        if not config.targets:
            raise ConfigError(
                str(config.file),
                "targets",
                "no target is configured",
                hint='add one, e.g. [targets.cache] url = "sqlite:///cache.db"',
            )
        names = target_names or list(config.targets)
        for n in names:
            if n not in config.targets:
                raise ConfigError(
                    str(config.file),
                    f"targets.{n}",
                    "no such target",
                    hint=f"configured targets: {', '.join(config.targets)}",
                )
        from mirrorline.log.retention import needs_reload, reload_reason

        self.log: ChangeLog = ChangeLog(config.log.path)
        reload = needs_reload(self.log)
        left_behind = [n for n in names if n in reload]
        if left_behind and (target_names is not None or len(left_behind) == len(names)):
            n = left_behind[0]
            raise MirrorlineError(
                f"target {n} needs a reload: {reload_reason(reload[n])}",
                hint=f"mirrorline snapshot --target {n}",
                target=n,
            )
        names = [n for n in names if n not in reload]
        for n in left_behind:
            log.error("target %s needs a reload (mirrorline snapshot --target %s): not applied", n, n)
        self.config = config
        self.names = names
        if spark is None:
            from mirrorline import sparkenv

            sparkenv.configure(config.spark)  # for the session this pipeline makes
        self._spark = spark
        self._warm_up = warm_up  # the first compile waits for it (see mirrorline.compile.warmup)
        self.actions = config.actions
        self.targets: dict[str, Target] = {}
        self._given = set(given or ())
        self.targets.update(given or {})
        if open_targets and not given:
            for n in names:
                self.targets[n] = self._open(n)
        self._pending_since: dict[Position, float] = {}  # an open unit's start -> when it closes (monotonic)
        from mirrorline.compile.store import UnitStore

        self._store = UnitStore(config.log.path)  # stored units are always reused ...
        # ... and saved when a target that another process applies (``apply --target``) may need them
        self._save_units = any(n not in names and n not in later for n in config.targets)
        self._ahead: tuple[NetBatch, float] | None = None  # the next unit, compiled while this one applied
        self._stopped = {n for n in stopped.read(config.log.path) if n in self.names}  # stop records to clear
        self._upkeep = Upkeep()
        from mirrorline.compile.compiler import Compiler

        self.compiler = Compiler(
            self.log,
            tables=list(config.tables),
            actions=self.actions,
            spark=lambda: self.spark,
            schemas_of=self._schemas,
            bags=known_bags(config) if bags is None else bags,
            keep_on_driver=not self._save_units,
        )
        self._admitted: list[str] = []  # loaded targets to add at the next unit (admit)
        self._paused: list[tuple[str, threading.Event]] = []  # targets to take out at the next unit (pause)
        self._admit_lock = threading.Lock()
        self._joining: set[str] = set()  # added targets still catching up with the others
        self._turn = False
        self._large_warm_up: threading.Thread | None = None  # see idle_warm_up
        self.on_message: Callable[[str], None] = lambda m: log.info("%s", m)  # what run prints (runner sets it)
        # targets stopped by an error (DESIGN §6: a failure stops only itself): name -> when to try again
        # (monotonic), the delay after that, and the error; the others go on meanwhile
        self._failed: Stops[str] = Stops()
        # tables stopped alone at a target (held in its state, apply/state.py), by (target, table): when to try
        # each again; one held before this process started is tried at its first step
        self._held: Stops[tuple[str, str]] = Stops()
        self._held_turn = False  # a held table's unit was the last step: a live unit goes first now

    @property
    def small_unit(self) -> int:
        """The small route's largest unit (see mirrorline/limits.py), also the unit size of a small backlog."""
        return self.compiler.small_unit

    @small_unit.setter
    def small_unit(self, changes: int) -> None:
        self.compiler.small_unit = changes

    def start_warm_up(self) -> None:
        """Warm Spark up in the background now; the first compile waits for it."""
        self._warm_up = self.compiler.warm_up()

    def _warmed(self) -> None:
        if self._warm_up is not None:
            self._warm_up.wait()
            self._warm_up = None

    @property
    def spark(self) -> Any:
        if self._spark is None:
            from mirrorline.sparkenv import get_spark

            self._spark = get_spark()
        return self._spark

    def close(self) -> None:
        self._upkeep.join()
        if self._large_warm_up is not None and self._large_warm_up.ident is not None:
            self._large_warm_up.join()  # (a few seconds at most)
        if self._ahead is not None:
            self._ahead[0].release()
            self._ahead = None
        for n, t in self.targets.items():
            if n not in self._given:
                t.close()

    # -- positions ---------------------------------------------------------------------------------------------

    def configure(self, config: Config) -> None:
        """Go on with ``config`` (``run`` reloaded it): its targets and tables from the next unit on. Units compiled
        for the tables of before (the next one, compiled ahead; those stored for other processes) are dropped."""
        tables_changed = set(config.tables) != set(self.config.tables)
        self.config = config
        self.actions = config.actions
        self.compiler.configure(list(config.tables), self.actions, known_bags(config))
        if tables_changed:
            if self._ahead is not None:
                self._ahead[0].release()
                self._ahead = None
            self._store.prune(Position(1 << 62, 1 << 62))

    def pause(self, name: str) -> threading.Event:
        """Take ``name`` out of the pipeline at its next step (from another thread: ``run`` loads a table added to
        it); the event is set once it is out. :meth:`admit` adds it again."""
        out = threading.Event()
        with self._admit_lock:
            self._paused.append((name, out))
        return out

    def admit(self, name: str) -> None:
        """Add a target that was loaded while this pipeline applied to the others (``run`` loads new targets beside
        the live ones, DESIGN §7). It applies from the next unit on, catching up from where its load left it; while
        it does, its units and the others' take turns, so that the others stay live."""
        with self._admit_lock:
            self._admitted.append(name)

    def _take_admitted(self) -> None:
        with self._admit_lock:
            paused, self._paused = self._paused, []
        for name, out in paused:
            self.remove(name)
            out.set()
        with self._admit_lock:
            names, self._admitted = self._admitted, []
        for n in names:
            if n not in self.targets:
                self.targets[n] = self._open(n)
                self.names.append(n)
                self._joining.add(n)
                log.info("target %s loaded: it catches up with the others", n)

    def remove(self, name: str) -> None:
        """Stop applying to ``name`` (removed from the configuration while this pipeline runs)."""
        target = self.targets.pop(name, None)
        if name in self.names:
            self.names.remove(name)
        self._joining.discard(name)
        self._failed.pop(name, None)
        for key in [k for k in self._held if k[0] == name]:
            del self._held[key]
        if target is not None:
            target.close()

    def positions(self) -> dict[str, Position]:
        """Each target's applied position (every change up to it is applied); a target that cannot be read now is
        left out (it is stopped, and retried: :meth:`_fail`)."""
        return {n: st.position for n, st in self._states(list(self.targets)).items()}

    def _states(self, names: list[str]) -> dict[str, AppliedState]:
        """The applied state of each of ``names`` that can be read; one that cannot is stopped (:meth:`_fail`), and
        one another process holds now (``verify`` reading it, :class:`~mirrorline.apply.lock.TargetBusy`) waits."""
        from mirrorline.apply.lock import TargetBusy

        out = {}
        for n in names:
            try:
                out[n] = self.targets[n].applied_positions()
            except TargetBusy as e:
                log.debug("%s: it is applied once that process lets go", e)
            except Exception as e:
                self._fail(n, e, None)
        return out

    # -- failures ----------------------------------------------------------------------------------------------

    retry_first, retry_max = RETRY_FIRST, RETRY_MOST  # seconds before a stopped target is tried again, doubling

    def failed(self) -> dict[str, MirrorlineError | Exception]:
        """The targets stopped by an error now, with the error."""
        return self._failed.errors()

    def held(self) -> dict[tuple[str, str], MirrorlineError | Exception]:
        """The tables stopped alone at a target now, by (target, table), with the error."""
        return self._held.errors()

    def _fail(self, name: str, error: Exception, position: Position | None) -> None:
        """``name`` failed (applying the unit ending at ``position``, or being read): it stops alone, recorded for
        ``status``, and is tried again after a delay that doubles with each failure."""
        delay = self._failed.stop(name, error, time.monotonic(), self.retry_first, self.retry_max).delay
        stopped.record(self.config.log.path, name, error, str(position) if position is not None else "")
        self._stopped.add(name)
        self._joining.discard(name)
        text = first_line(error)
        log.error("target %s stopped: %s (the other targets go on; trying it again in %.0f s)", name, text, delay)

    def _ready(self) -> list[str]:
        """The targets to apply to now: not stopped, or stopped and due to be tried again (then they catch up with
        the others, taking turns with them)."""
        now = time.monotonic()
        out = []
        for n in self.targets:
            f = self._failed.get(n)
            if f is None:
                out.append(n)
            elif f.due(now, self.retry):
                if not f.trying:  # (due until it fails again, or applies)
                    log.info("target %s: trying it again", n)
                    f.trying = True
                    self._joining.add(n)
                out.append(n)
        return out

    def _recovered(self, name: str) -> None:
        """``name`` applied (or has nothing to apply): no longer stopped."""
        if self._failed.pop(name, None) is not None:
            log.info("target %s applies again", name)
        if name in self._stopped:
            stopped.clear(self.config.log.path, name)
            self._stopped.discard(name)

    @staticmethod
    def _bounds(state: AppliedState) -> list[Position]:
        """Positions a unit for this target must end at rather than straddle: per-table positions beyond the
        target's position (a table snapshotted into a live target, or a unit interrupted under threads > 1)."""
        return sorted({p for t, p in state.tables.items() if p > state.live and t not in state.held})

    # -- tables stopped alone ----------------------------------------------------------------------------------

    def _hold(self, name: str, table: str, error: Exception) -> None:
        """Stop ``table`` alone at target ``name`` (its other tables go on): held in the target's state, so that a
        restart keeps it stopped, and tried again after a delay that doubles with each failure."""
        target = self.targets[name]
        with target.exclusive(self.lock_wait):
            at = target.hold(table, error)
        delay = self._held.stop((name, table), error, time.monotonic(), self.retry_first, self.retry_max).delay
        text = first_line(error)
        text = text.removeprefix(f"target {name}: ")
        log.error(
            "target %s: table %s stopped at %s: %s (the target's other tables go on; trying it again in %.0f s)",
            name,
            table,
            at,
            text,
            delay,
        )

    def _held_due(self, states: dict[str, AppliedState]) -> list[tuple[str, str]]:
        """The held tables to try now: due (their delay passed, or held before this process started)."""
        now = time.monotonic()
        out = []
        for n, st in states.items():
            for t in st.held:
                f = self._held.get((n, t))
                if f is None:  # held by an earlier process: tried once now
                    reason = st.holds.get(t, {})
                    why = reason.get("error") or "stopped"
                    from mirrorline.apply.reshape import ResyncStop

                    kind = ResyncStop if reason.get("kind") == ResyncStop.__name__ else MirrorlineError
                    err = kind(
                        f"{why} (table {t} at target {n}, stopped since {reason.get('since', '?')})",
                        hint=f"fix the target's table, or reload it: mirrorline snapshot --target {n} --table {t}",
                        target=n,
                        table=t,
                    )
                    f = self._held[(n, t)] = Stop(0.0, 0.0, err)
                if f.due(now, self.retry):
                    out.append((n, t))
        return out

    def _held_unit(self, states: dict[str, AppliedState], limit: Position) -> UnitReport | None:
        """One unit of a held table that is due, from its own position towards the target's other tables; the
        table's hold ends once it reaches them. None: no held table is due (or none had anything to apply)."""
        from mirrorline.apply.target import TargetMoved

        for n, t in self._held_due(states):
            st = states[n]
            start, end_cap = st.table(t), min(st.live, limit)
            target = self.targets[n]
            f = self._held[(n, t)]
            if loading(target, t):  # a snapshot loads it now (snapshot --table, or run's reload): it ends the hold
                f.retry_at = time.monotonic() + self.retry_first
                continue
            if start >= st.live:  # nothing left to catch up
                try:
                    with target.exclusive(self.lock_wait):
                        target.release(t)
                except Exception as e:
                    self._fail(n, e, None)
                    return None
                self._held.pop((n, t), None)
                log.info("target %s: table %s applies again", n, t)
                continue
            if start >= end_cap:
                continue
            u = self._next_unit(start, end_cap)
            n_changes = u.changes
            end = u.end if u.end is not None and not u.empty and n_changes > 0 else end_cap
            if not f.trying:
                log.info("target %s: trying table %s again, from %s", n, t, start)
                f.trying = True
            batch, compiled, seconds = self._compile(start, end, False, empty=n_changes == 0)
            report = UnitReport(
                start, end, batch.changes if n_changes < 0 else n_changes, [n], compiled, seconds, {}, table=t
            )
            schemas = self._schemas(batch.tables + [x for x in batch.truncated if x not in batch.tables], end, start)
            changes = functools.partial(self._changes, batch.start, batch.end)
            t0 = time.monotonic()
            try:
                try:
                    with target.exclusive(self.lock_wait):
                        report.results[n] = target.apply(batch, schemas, changes, table=t)
                except Unverified as e:
                    batch = self.compiler.again(batch, e)
                    with target.exclusive(self.lock_wait):
                        report.results[n] = target.apply(batch, schemas, changes, table=t)
                report.apply_seconds[n] = time.monotonic() - t0
            except TargetMoved as e:  # another process moved the table meanwhile: formed again at the next step
                log.info("%s", e)
                return None
            except Exception as e:
                batch.verify()
                try:
                    if failing_table(self.config.targets[n], e, batch) != t:
                        raise
                    self._hold(n, t, e)
                except Exception as e2:  # (not the table's, or its hold could not be written: the target's)
                    self._fail(n, e2, batch.end)
                return None
            finally:
                batch.release()
            f.retry_at, f.delay = 0.0, 0.0  # it applies: due again at once, taking turns with the live units
            self._registered(n)
            if end >= st.live:
                self._held.pop((n, t), None)
                log.info("target %s: table %s caught up with the other tables: it applies again", n, t)
            else:
                log.info("unit %s..%s (%d changes) applied to table %s at %s", start, end, report.changes, t, n)
            report.targets = [n]
            return report
        return None

    # -- one unit ----------------------------------------------------------------------------------------------

    def step(
        self, *, upto: Position | None = None, wait_latency: bool = False, covered: bool = False
    ) -> UnitReport | None:
        """Apply one unit to the targets furthest behind. ``upto``: never past this position (default: the log's
        end). ``wait_latency``: leave a unit open until it is full or its first change waited ``latency`` (see
        :meth:`closes_at`).
        ``covered``: the log is known to hold every change up to ``upto`` (capture has passed it), so the targets
        move to ``upto`` itself even where it lies beyond the log's last change."""
        if self._admitted or self._paused:
            self._take_admitted()
        durable = self.log.durable()
        if covered and upto is not None:
            limit = upto
        elif durable is None:
            return None
        else:
            limit = min(durable, upto) if upto is not None else durable
        states = self._states(self._ready())
        positions = {n: st.live for n, st in states.items()}
        behind = {n: p for n, p in positions.items() if p < limit}
        for key in [k for k in self._held if k[0] in states and k[1] not in states[k[0]].held]:
            del self._held[key]  # released (reloaded by a snapshot, or by this process)
        if not (self._held_turn and behind) and any(st.held for st in states.values()):
            held = self._held_unit(states, limit)
            if held is not None:
                self._held_turn = True
                return held
        self._held_turn = False
        for n in [n for n in self._failed if n in positions and n not in behind]:
            self._recovered(n)  # readable again, and nothing to apply
        if self._joining:  # an added target that reached the others is one of them
            others = [p for n, p in positions.items() if n not in self._joining]
            self._joining = {n for n in self._joining if others and positions[n] < min(others)}
        if not behind:
            self._pending_since.clear()
            return None
        starts = [min(behind.values())]
        live = [p for n, p in behind.items() if n not in self._joining]
        if self._joining & set(behind) and live and min(live) != starts[0]:
            self._turn = not self._turn  # the targets catching up and the others take turns
            starts = [min(live), starts[0]] if self._turn else [starts[0], min(live)]
        for start in starts:
            try:
                report = self._unit_at(start, behind, positions, states, limit, wait_latency)
            except Exception as e:
                if not self._passed_meanwhile(start, [n for n, p in behind.items() if p == start]):
                    raise
                log.info(
                    "another process applied past %s and its retention removed the log's segments there while this "
                    "unit was read (%s): the next step forms the unit from the targets' new positions",
                    start,
                    e,
                )
                return None
            if report is not None:
                return report
        return None

    def _passed_meanwhile(self, start: Position, group: list[str]) -> bool:
        """Whether the log's retention has removed what follows ``start`` because every target that was at
        ``start`` has applied past it since (another process applied them: ``verify``, ``apply --once``), so that a
        unit from ``start`` failing to read its segments is no fault of the log."""
        retained = self.log.retained()
        if retained is None or retained.after <= start:
            return False
        states = self._states(group)
        return len(states) == len(group) and all(st.position >= retained.after for st in states.values())

    def _unit_at(
        self,
        start: Position,
        behind: dict[str, Position],
        positions: dict[str, Position],
        states: dict[str, AppliedState],
        limit: Position,
        wait_latency: bool,
    ) -> UnitReport | None:
        """One unit from ``start`` to the targets there (None: it waits for its latency)."""
        group = sorted(n for n, p in behind.items() if p == start)
        # end at the next target's position (the one behind joins it), and at per-table positions
        caps = [p for p in positions.values() if start < p < limit]
        caps += [b for n in group for b in self._bounds(states[n]) if start < b < limit]
        end_cap = min([limit, *caps])
        stored = self._store.starting_at(start)
        if stored is not None and stored[1] <= end_cap:
            end, n_changes = stored[1], -1
        else:
            u = self._next_unit(start, end_cap)
            if u.end is None or u.empty or u.changes == 0:
                end, n_changes = end_cap, 0  # nothing to apply before the cap: the unit just moves the position
            else:
                end, n_changes = u.end, u.changes
            # a unit is open while it reaches the log's end and is not full: then it waits for the latency
            if wait_latency and n_changes > 0 and not u.full and end >= limit:
                closes = self._pending_since.get(start)
                if closes is None:
                    closes = self._pending_since[start] = self.closes_at(start)
                if time.monotonic() < closes:
                    return None
        self._pending_since.pop(start, None)
        ahead = self._ahead
        self._ahead = None
        if ahead is not None and ahead[0].start == start and ahead[0].end <= end_cap:
            batch, compile_seconds = ahead  # compiled while the previous unit was applied
            end, n_changes, compiled = batch.end, batch.changes, True
        else:
            if ahead is not None:
                ahead[0].release()
            batch, compiled, compile_seconds = self._compile(
                start, end, stored is not None and stored[1] == end, empty=n_changes == 0
            )
        report = UnitReport(
            start, end, batch.changes if n_changes < 0 else n_changes, group, compiled, compile_seconds, {}
        )
        schemas = self._schemas(batch.tables + [t for t in batch.truncated if t not in batch.tables], end, start)
        next_unit = len(group) == len(positions) and not any(self._bounds(states[n]) for n in group) and end < limit
        try:
            try:
                self._apply_group(batch, schemas, group, report, next_unit)
            except Unverified as e:  # nothing of it was committed: the general path compiles it, or names its error
                t0 = time.monotonic()
                batch = self.compiler.again(batch, e)
                report.compile_seconds += time.monotonic() - t0
                self._apply_group(batch, schemas, group, report, next_unit)
        finally:
            batch.release()
        report.targets = [n for n in group if n in report.apply_seconds]
        if report.targets:
            log.info("unit %s..%s (%d changes) applied to %s", start, end, report.changes, ", ".join(report.targets))
        return report

    def closes_at(self, start: Position) -> float:
        """When the open unit after ``start`` closes (``time.monotonic()``): :func:`plan.closes_at` of its first
        change's commit time."""
        try:
            ts = self.log.first_ts_after(start)
        except MirrorlineError:  # (retention or a damaged segment: the unit's own reading will say what is wrong)
            ts = None
        return plan.closes_at(ts, self.config.apply.latency, time.monotonic(), time.time())

    def _apply_group(
        self, batch: NetBatch, schemas: dict[str, TableSchema], group: list[str], report: UnitReport, next_unit: bool
    ) -> None:
        """Apply the unit to every target of the group, each in a thread of its own (each target's position is
        committed with its data, so they need not wait for each other). With ``next_unit``, the next unit is
        compiled meanwhile (see :meth:`compile_next`)."""
        changes = functools.partial(self._changes, batch.start, batch.end)

        def apply_one(n: str) -> None:
            from mirrorline.apply.target import TargetMoved

            t0 = time.monotonic()
            held: set[str] = set()
            while True:
                try:
                    with self.targets[n].exclusive(self.lock_wait):  # one applier per target (apply/lock.py)
                        report.results[n] = self.targets[n].apply(batch, schemas, changes)
                    report.apply_seconds[n] = time.monotonic() - t0
                    self._registered(n)
                except TargetMoved as e:  # another process applied meanwhile: the next step forms the unit again
                    log.info("%s", e)
                    return
                except Exception as e:  # a table stops alone, or this target does, tried again later ...
                    batch.verify()  # ... unless the unit's compile failed (NetBatch.verify raises it): not theirs
                    table = failing_table(self.config.targets[n], e, batch)
                    if table is not None and table not in held:
                        try:
                            self._hold(n, table, e)
                        except Exception as e2:
                            self._fail(n, e2, batch.end)
                            return
                        held.add(table)
                        continue  # the unit again, without that table
                    self._fail(n, e, batch.end)
                    return
                self._recovered(n)
                return

        if len(group) == 1 and not next_unit:
            apply_one(group[0])
            return
        with ThreadPoolExecutor(len(group), thread_name_prefix="mirrorline-apply") as pool:
            futures = [pool.submit(apply_one, n) for n in group]
            if next_unit:
                try:
                    self.compile_next(batch.end, futures)
                except Exception as e:  # the next step compiles that unit again, and reports its error
                    log.debug("compiling ahead failed: %s", e)
            errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            if self._ahead is not None:
                self._ahead[0].release()
                self._ahead = None
            raise errors[0]

    def _next_unit(self, start: Position, upto: Position) -> plan.Unit:
        """The unit after ``start``, at most to ``upto`` (:func:`plan.next_unit`)."""
        sizes = plan.Sizes(self.config.apply.max_changes, self.small_unit, self.catch_up_changes)
        return plan.next_unit(self.log, start, upto, sizes, list(self.config.tables))

    ahead_poll = 0.1  # seconds between looks at the log while waiting for the next unit to fill

    def compile_next(self, start: Position, applying: list[Future[None]] | None = None) -> NetBatch | None:
        """Compile the unit after ``start`` while the targets apply this one (``applying``), as soon as it is full:
        its size reached, or the log holds more after it (the targets are behind). Kept for the next :meth:`step`,
        which uses it if it still fits. If the targets finish first, the unit is left open: compiled now, it would
        be cut short of what arrives meanwhile (measured under pgbench: a small unit after every large one); the
        next step compiles it. Without ``applying``, compiles only a unit that is full already. Returns the unit
        compiled, or None."""
        if not self.overlap:
            return None
        seen: Position | None = None
        while True:
            durable = self.log.durable()
            if (
                durable != seen and durable is not None and durable > start and self._store.starting_at(start) is None
            ):  # look at the unit again only when the log grew
                seen = durable
                u = self._next_unit(start, durable)
                end = u.end
                if end is not None and not u.empty and (u.full or end < durable):
                    break
            if not applying or all(f.done() for f in applying):
                return None
            wait_futures(applying, timeout=self.ahead_poll)
        log.info("compiling the next unit %s..%s while this one applies", start, end)
        batch, _compiled, seconds = self._compile(start, end, False)
        self._ahead = (batch, seconds)
        log.info("compiled the next unit %s..%s ahead in %.2fs", start, end, seconds)
        return batch

    def _compile(
        self, start: Position, end: Position, stored: bool, empty: bool = False
    ) -> tuple[NetBatch, bool, float]:
        from mirrorline.compile.store import Damaged

        t0 = time.monotonic()
        if stored:
            try:
                return self._store.load(self.spark, start, end), False, time.monotonic() - t0
            except Damaged as e:
                log.warning("%s", e)
        if empty:  # a unit that only moves the position: no Spark job
            from mirrorline.compile.batch import NET_ARROW, NetBatch

            return NetBatch(start=start, end=end, tables=[], rows=NET_ARROW.empty_table()), False, 0.0
        warming: WarmUp | NotStarted | None = None
        if self._warm_up is not None and not self._warm_up.done():
            warming = self._warm_up
        else:
            self._warm_up = None
            if self._spark is None and not sparkenv.started():  # a unit the driver route takes needs no Spark
                warming = NotStarted()
        batch = self.compiler.compile(start, end, warming=warming)
        if self._save_units:
            batch = self._store.save(self.spark, self.compiler.verified(batch))
        return batch, True, time.monotonic() - t0

    def compile_ahead(self, on_unit: Callable[[NetBatch], None] | None = None) -> int:
        """The compile stage alone: compile and store the units that the targets will apply next, up to the log's
        end, without applying them. Returns how many units were compiled."""
        durable = self.log.durable()
        if durable is None:
            return 0
        done = 0
        for start in sorted({st.live for st in self._states(list(self.targets)).values()}):
            while start < durable:
                stored = self._store.starting_at(start)
                if stored is not None:
                    start = stored[1]
                    continue
                end, n = self.log.advance(start, self.config.apply.max_changes, durable)
                end, _ = plan.cut_at_schema_change(self.log, start, end, n, list(self.config.tables))
                if end is None or end <= start:
                    break
                self._warmed()
                batch = self._store.save(self.spark, self.compiler.verified(self.compiler.compile(start, end)))
                if on_unit:
                    on_unit(batch)
                batch.release()
                done += 1
                start = end
        return done

    def _changes(self, start: Position, end: Position) -> Iterator[Change]:
        from mirrorline.compile.reference import kept_changes

        configured = self.config.tables
        yield from kept_changes(
            (c for c in self.log.read(start, end) if not configured or c.table in configured), self.actions or None
        )

    def _open(self, name: str) -> Target:
        """Target ``name`` opened, given what following schema changes needs."""
        from mirrorline.apply import open_target
        from mirrorline.pipeline.targets import schema_needs

        return open_target(
            self.config.targets[name], threads=self.config.apply.threads, needs=schema_needs(self.config, self.log)
        )

    def _schemas(
        self, tables: list[str], end: Position, start: Position | None = None, missing_ok: bool = False
    ) -> dict[str, TableSchema]:
        """Each table's logged schema for the unit ``(start, end]``: the version its changes carry (units are cut
        where it changes), else the one in force at ``end``. ``missing_ok``: a table the log has no schema of is
        left out (else an error)."""
        versions: dict[str, int] = {}
        if start is not None and end > start and self.log.changing_schemas():
            versions = self.log.unit_versions(start, end, tables)[2]
        out: dict[str, TableSchema] = {}
        for t in tables:
            s = self.log.schemas.get(t, versions[t]) if t in versions else self.log.schema_at(t, end)
            if s is None and missing_ok:
                continue
            if s is None:
                raise MirrorlineError(
                    f"the change log has no schema for {t}",
                    hint="the log is damaged or was imported without [tables] columns",
                    table=t,
                )
            out[t] = s
        return out

    def _registered(self, name: str) -> None:
        from mirrorline.log.retention import set_applied

        set_applied(self.log, name, self.targets[name].applied_positions().position)

    def prune(self) -> None:
        """Drop compiled units and log segments every registered target has passed (export folders not loaded within
        the log's ``export_expiry`` no longer count). Units: every configured target counts, those other processes
        apply (``apply --target``, or one this process waits for while ``verify`` holds it) by the position they
        registered, so that no unit another process is about to read is removed."""
        from mirrorline.log.retention import expire_exports, readers, retain

        positions = list(self.positions().values())
        if positions:
            positions += [
                r.applied for n, r in readers(self.log).items() if n in self.config.targets and r.applied is not None
            ]
            self._store.prune(min(positions))
        expire_exports(self.log, self.config.log.export_expiry)
        retain(self.log, max_age=self.config.log.max_age, max_size=self.config.log.max_size)
        self._drop_reloads()

    def _drop_reloads(self) -> None:
        """Stop applying to the targets the log cannot bring up to date (they need a reload: the log's cap, a lost
        slot); the others go on."""
        from mirrorline.log.retention import needs_reload, reload_reason

        for n, record in needs_reload(self.log).items():
            target = self.targets.pop(n, None)
            if target is not None:
                self.names.remove(n)
                self._joining.discard(n)
                target.close()
                log.error("target %s needs a reload (%s): mirrorline snapshot --target %s", n, reload_reason(record), n)

    # -- loops -------------------------------------------------------------------------------------------------

    def catch_up(
        self,
        upto: Position | None = None,
        on_unit: Callable[[UnitReport], None] | None = None,
        covered: bool = False,
        progress: Any = None,
        held_ok: bool = False,
    ) -> list[UnitReport]:
        """Apply until every target has reached ``upto`` (default: the log's end now); ``covered``: see
        :meth:`step`. ``progress``: a stream that is a terminal gets a progress bar (tqdm) over the log's changes
        from the targets' lowest position to ``upto``. A target or a table that fails stops alone; once the others
        are done, the first such error is raised (``held_ok``: not a table stopped alone, which the caller reads
        from the target's state)."""
        target = upto if upto is not None else (self.log.durable() or ZERO)
        reports = []
        bar = self._catch_up_bar(target, progress)
        # every target is tried (one stopped before may have been fixed); one that fails stops for the rest of it
        for f in [*self._failed.values(), *self._held.values()]:
            f.retry_at = 0.0
        retry, self.retry = self.retry, False
        try:
            while True:
                r = self.step(upto=target, covered=covered and upto is not None)
                if r is None:
                    break
                reports.append(r)
                if bar is not None:
                    bar.update(max(r.changes, 0))
                if on_unit:
                    on_unit(r)
        finally:
            self.retry = retry
            if bar is not None:
                bar.close()
        self.prune()
        if self._failed:  # the others have caught up: now the first stopped target's error
            raise next(iter(self._failed.values())).error
        if self._held and not held_ok:  # ... or the first table stopped alone
            raise next(iter(self._held.values())).error
        return reports

    def _catch_up_bar(self, target: Position, stream: Any) -> Any:
        if stream is None or not getattr(stream, "isatty", lambda: False)():
            return None
        positions = self.positions()
        start = min(positions.values()) if positions else target
        if start >= target:
            return None
        from tqdm import tqdm

        total = self.log.count(start, target)
        return tqdm(total=total, desc="catching up", unit="change", file=stream, dynamic_ncols=True, leave=False)

    def follow(
        self,
        stop: threading.Event,
        on_unit: Callable[[UnitReport], None] | None = None,
        poll: float = 0.05,
        until: Callable[[], bool] | None = None,
        tick: Callable[[], None] | None = None,
    ) -> None:
        """Apply continuously until ``stop`` is set (or ``until()`` holds), closing units by latency or size.
        ``tick``: called before each step (``run``'s reload of its configuration)."""
        last_prune = last_unit = last_shrink = time.monotonic()
        while not stop.is_set():
            if tick is not None:
                tick()
            r = self.step(wait_latency=True)
            if r is not None:
                last_unit = time.monotonic()
                if on_unit:
                    on_unit(r)
                continue
            if until is not None and until():
                return
            if time.monotonic() - last_prune > 30:
                self.prune()
                last_prune = time.monotonic()
            if time.monotonic() - last_shrink > self.idle_shrink:
                self._shrink()
                last_shrink = time.monotonic()
            self.upkeep()
            if self.log.receiving():  # a large transaction arriving: its unit is next, and it is not idle time
                last_unit = time.monotonic()
            elif time.monotonic() - last_unit >= self.idle_warm_up > 0:
                self.warm_large_when_idle()
            stop.wait(poll)

    def _shrink(self) -> None:
        """Give back the JVM heap that Spark's work since the last idle moment left unused (sparkenv.shrink)."""
        try:
            freed = sparkenv.shrink()
        except Exception as e:  # (the JVM gone: the next unit that needs it says so)
            log.debug("shrinking the JVM's heap failed: %s", e)
            return
        if freed:
            log.debug("idle: the JVM gave back %d MB of heap", freed >> 20)

    def warm_large_when_idle(self) -> None:
        """Warm the route of large units of inserts and updates up (:func:`~mirrorline.compile.warmup.warm_large`)
        in a thread of its own and a scheduler pool of its own, once per pipeline, on a local Spark: the first large
        unit of a later backlog then runs code the JIT has compiled (``bench/apply.py``'s first large unit). A
        failure is only logged: that unit meets the same cause and reports it properly."""
        if self._large_warm_up is not None:
            return
        if not str(self.spark.sparkContext.master).startswith("local"):  # (its scratch files are the driver's)
            self._large_warm_up = threading.Thread()  # not started: never
            return

        def main() -> None:
            try:
                self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "warm-up")
                self.on_message(f"Spark warmed up for large units in {self.compiler.warm_idle():.2f}s (idle)")
                self._shrink()
            except Exception as e:
                log.warning("warming up for large units failed (the first large unit will run cold): %s", e)

        self._large_warm_up = threading.Thread(target=main, name="mirrorline-warm-up-large", daemon=True)
        self._large_warm_up.start()

    def upkeep(self) -> None:
        """Start the storage upkeep of each target whose ``compact_every`` has passed (:class:`Upkeep`)."""
        self._upkeep.due(self.targets, self.config)


def known_bags(config: Config, conn: Any = None) -> dict[str, tuple[str, ...]]:
    """The configured tables the log knows as tables without a key (their latest schema), with their columns: what
    the pipeline's small-unit plan is built for, so that the warm-up builds that same plan. ``conn``: a connection
    to the source, whose catalog tells the tables the log does not know yet (a new log: their first changes would
    otherwise make the first units build a plan of their own, seconds on a loaded machine: bench/live)."""
    from mirrorline.log.reader import ChangeLog

    out: dict[str, tuple[str, ...]] = {}
    changelog = ChangeLog(config.log.path)
    known: set[str] = set()
    if changelog.layout.exists():
        changelog.schemas.refresh()
        for t in config.tables:
            s = changelog.schemas.latest(t)
            if s is not None:
                known.add(t)
                if s.bag:
                    out[t] = s.key
    if conn is not None and set(config.tables) - known:
        from mirrorline.capture.source import describe_tables
        from mirrorline.snapshot.plan import is_bag, table_key

        try:
            described = describe_tables(conn, config, replicated=known)
        except Exception as e:  # (capture says what is wrong with a table or the source: here only a plan built later)
            log.debug("the source's tables not described for the warm-up: %s", e)
            described = {}
        for t, st in described.items():
            if t not in known:
                how = (st.columns, st.replica_identity, st.primary_key, st.identity, config.table(t).key)
                if is_bag(*how):
                    out[t] = table_key(*how)
    return out


def catch_up_target(
    config: Config,
    name: str,
    upto: Position | None = None,
    *,
    target: Target | None = None,
    on_unit: Callable[[UnitReport], None] | None = None,
    held_ok: bool = False,
) -> Position:
    """Apply the log's changes of the configured tables to target ``name`` after its applied position, up to
    ``upto`` (default: everything the log holds now); returns the applied position: what a loaded target does to
    catch up, and what ``verify`` does to bring a target to the exact position it compares at. The same units as
    :meth:`Applier.catch_up` (never straddling a per-table applied position above the unit's start, so that a table
    snapshotted into a live target skips the changes its snapshot holds), compile routes, stored units and failure
    path. An ``upto`` given is one the log is known to hold every change up to (the caller made sure capture passed
    it): the target's position becomes ``upto`` itself, beyond the log's last change if need be. ``target``: that
    target already open (left open). ``held_ok``: a table stopped alone at the target (:mod:`mirrorline.apply.state`)
    is not an error: the other tables reach ``upto``."""
    applier = Applier(config, [name], given={name: target} if target is not None else None)
    try:
        applier.catch_up(upto, on_unit=on_unit, covered=upto is not None, held_ok=held_ok)
        return applier.targets[name].applied_positions().position
    finally:
        applier.close()
