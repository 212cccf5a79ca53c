"""The applier: each step forms the next unit of work for the targets at the same position, compiles it once
and applies it to each of them (DESIGN §5, §6). Targets at the same position share one compiled unit; a unit is cut
short at the next target's position so that a target behind catches up to the others and shares with them from then
on. A target that fails stops alone (and a table a target refuses stops alone at it), tried again with a growing
delay. With several targets configured, compiled units are also kept in the log (compile/store.py) so that separate
``apply --target`` processes reuse them rather than compile again.

Around the loop: :mod:`~mirrorline.pipeline.plan` (where a unit ends and when it closes),
:mod:`~mirrorline.pipeline.units` (forming, compiling, compiling ahead), :mod:`~mirrorline.pipeline.roster` (each
target's phase, and the one failure handler), :mod:`~mirrorline.pipeline.held` (tables stopped alone, catching up),
:mod:`~mirrorline.pipeline.targets` (upkeep).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mirrorline import sparkenv, stopped
from mirrorline.apply import open_target
from mirrorline.apply.lock import TargetBusy
from mirrorline.apply.target import TargetMoved
from mirrorline.config import Config
from mirrorline.errors import ConfigError, MirrorlineError, Unverified
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import expire_exports, needs_reload, readers, reload_reason, retain, set_applied
from mirrorline.model import TableSchema
from mirrorline.pipeline import held
from mirrorline.pipeline.roster import Phase, Roster
from mirrorline.pipeline.targets import Upkeep, schema_needs
from mirrorline.pipeline.units import UnitReport, Units, known_bags
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from mirrorline.apply import AppliedState, Target
    from mirrorline.compile.batch import NetBatch
    from mirrorline.compile.warmup import WarmUp
    from mirrorline.pipeline.ahead import AheadApplier

log = logging.getLogger(__name__)


class Applier:
    """Applies the change log to the configured targets (all, or the ones named). A target that fails stops alone
    (:meth:`failed`); the others go on, and it is tried again with a growing delay."""

    # follow() warms the large-unit route up (compile/warmup.py: warm_large) once, in the background, when no unit
    # has been applied for this many seconds and no large transaction is arriving (a local Spark only; 0: never).
    # A warm-up beside a transaction being streamed in slows that unit 2-3x on two cores (bench/bigtxn, UPDATE).
    idle_warm_up = 10.0
    idle_shrink = 5.0  # seconds between looks, when idle, at the JVM's heap (sparkenv.shrink: a grown heap collected)
    retry = True  # a stopped target is tried again (after its delay); catch_up() does not

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
        """``open_targets`` False: the targets are not opened (units are only formed and compiled). ``later``: targets
        this process loads and then adds (:meth:`admit`) while the others apply. ``given``:
        targets the caller opened (and closes; given :func:`~mirrorline.pipeline.targets.schema_needs`), applied to
        instead of opening them. ``bags``: the tables without a key the small units' plan is built for (what
        ``warm_up`` warmed; default :func:`known_bags`)."""
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
        if spark is None:
            sparkenv.configure(config.spark)  # for the session this pipeline makes
        self.roster = Roster(config, names, dict(given or {}))
        if open_targets and not given:
            for n in names:
                self.roster.add(n, self._open(n))
        self.roster.recorded(set(stopped.read(config.log.path)))  # stop records to clear once they apply
        self._pending_since: dict[Position, float] = {}  # an open unit's start -> when it closes (monotonic)
        self.units = Units(
            self.log,
            config,
            spark=spark,
            warm_up=warm_up,
            bags=known_bags(config) if bags is None else bags,
            # units are stored where a target that another process applies (``apply --target``) may need them
            save=any(n not in names and n not in later for n in config.targets),
        )
        self.compiler = self.units.compiler
        self._upkeep = Upkeep()
        # the threads a unit's targets apply in, kept between units (a pool made per unit started a thread per
        # target and unit: bench/live --phases r300, CPU per 1,000 changes); made again, larger, for a larger group
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._pool_lock = threading.Lock()
        self._turn = False
        self.on_message: Callable[[str], None] = lambda m: log.info("%s", m)  # what run prints (runner sets it)
        self._held_turn = False  # a held table's unit was the last step: a live unit goes first now
        self.ahead: AheadApplier | None = None  # streamed transactions applied ahead of their commit (run)

    @property
    def targets(self) -> dict[str, Target]:
        """The targets applied to, by name."""
        return self.roster.targets

    @property
    def names(self) -> list[str]:
        """The names of the targets this pipeline applies to (opened or not)."""
        return self.roster.names

    @property
    def small_unit(self) -> int:
        """The small route's largest unit (see mirrorline/limits.py), also the unit size of a small backlog."""
        return self.compiler.small_unit

    @small_unit.setter
    def small_unit(self, changes: int) -> None:
        self.compiler.small_unit = changes

    @property
    def catch_up_changes(self) -> int:
        return self.units.catch_up_changes

    @catch_up_changes.setter
    def catch_up_changes(self, changes: int) -> None:
        self.units.catch_up_changes = changes

    @property
    def lock_wait(self) -> float:
        """Seconds a unit waits for another process (verify, apply) to let go of its target."""
        return self.roster.lock_wait

    @property
    def retry_first(self) -> float:
        """Seconds before a stopped target or table is tried again, doubling up to :attr:`retry_max`."""
        return self.roster.failed.first

    @retry_first.setter
    def retry_first(self, seconds: float) -> None:
        self.roster.failed.first = self.roster.held.first = seconds

    @property
    def retry_max(self) -> float:
        return self.roster.failed.most

    @retry_max.setter
    def retry_max(self, seconds: float) -> None:
        self.roster.failed.most = self.roster.held.most = seconds

    def start_warm_up(self) -> None:
        """Warm Spark up in the background now; the first compile waits for it."""
        self.units.start_warm_up()

    @property
    def spark(self) -> Any:
        return self.units.spark

    def close(self) -> None:
        self._upkeep.join()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        self.units.close()
        self.roster.close()

    def _workers(self, n: int) -> ThreadPoolExecutor:
        """The apply threads, at least ``n`` of them."""
        with self._pool_lock:
            if self._pool is None or self._pool_size < n:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)  # (its threads idle: the last group's futures were waited for)
                self._pool, self._pool_size = ThreadPoolExecutor(n, thread_name_prefix="mirrorline-apply"), n
            return self._pool

    # -- the roster --------------------------------------------------------------------------------------------

    def configure(self, config: Config) -> None:
        """Go on with ``config`` (``run`` reloaded it): its targets and tables from the next unit on. Units compiled
        for the tables of before (the next one, compiled ahead; those stored for other processes) are dropped."""
        if self.ahead is not None:
            self.ahead.leave("the configuration was reloaded")
        self.config = self.roster.config = config
        self.units.configure(config, known_bags(config))

    def loading(self, name: str) -> None:
        """``run`` loads ``name`` beside the others now (its phase until :meth:`admit`)."""
        self.roster.loading(name)

    def pause(self, name: str) -> threading.Event:
        """Take ``name`` out of the pipeline at its next step (from another thread: ``run`` loads a table added to
        it); the event is set once it is out. :meth:`admit` adds it again."""
        return self.roster.pause(name)

    def admit(self, name: str) -> None:
        """Add a target that was loaded while this pipeline applied to the others (``run`` loads new targets beside
        the live ones, DESIGN §7). It applies from the next unit on, catching up from where its load left it; while
        it does, its units and the others' take turns, so that the others stay live."""
        self.roster.admit(name)

    def remove(self, name: str) -> None:
        """Stop applying to ``name`` (removed from the configuration while this pipeline runs)."""
        if self.ahead is not None:
            self.ahead.leave(f"target {name} was removed")
        self.roster.remove(name)

    def phases(self) -> dict[str, Phase]:
        """Each target's phase now (:class:`~mirrorline.pipeline.roster.Phase`)."""
        return self.roster.phases()

    def failed(self) -> dict[str, MirrorlineError | Exception]:
        """The targets stopped by an error now, with the error."""
        return self.roster.failed.errors()

    def held(self) -> dict[tuple[str, str], MirrorlineError | Exception]:
        """The tables stopped alone at a target now, by (target, table), with the error."""
        return self.roster.held.errors()

    def positions(self) -> dict[str, Position]:
        """Each target's applied position (every change up to it is applied); a target that cannot be read now is
        left out (it is stopped, and retried)."""
        return {n: st.position for n, st in self._states(list(self.targets)).items()}

    def _states(self, names: list[str]) -> dict[str, AppliedState]:
        """The applied state of each of ``names`` that can be read; one that cannot is stopped, and one another
        process holds now (``verify`` reading it, :class:`~mirrorline.apply.lock.TargetBusy`) waits."""

        out = {}
        for n in names:
            try:
                out[n] = self.targets[n].applied_positions()
            except TargetBusy as e:
                log.debug("%s: it is applied once that process lets go", e)
            except Exception as e:
                self.roster.fail(n, e, None)
        return out

    @staticmethod
    def _bounds(state: AppliedState) -> list[Position]:
        """Positions a unit for this target must end at rather than straddle: per-table positions beyond the
        target's position (a table snapshotted into a live target, or a unit interrupted under threads > 1)."""
        return sorted({p for t, p in state.tables.items() if p > state.live and t not in state.held})

    # -- one unit ----------------------------------------------------------------------------------------------

    def step(
        self, *, upto: Position | None = None, wait_latency: bool = False, covered: bool = False
    ) -> UnitReport | None:
        """Apply one unit to the targets furthest behind. ``upto``: never past this position (default: the log's
        end). ``wait_latency``: leave a unit open until it is full or its first change waited ``latency`` (see
        :meth:`closes_at`).
        ``covered``: the log is known to hold every change up to ``upto`` (capture has passed it), so the targets
        move to ``upto`` itself even where it lies beyond the log's last change."""
        if self.roster.requested():
            if self.ahead is not None:
                self.ahead.leave("a target is paused or added")
            self.roster.take_requests(self._open)
        durable = self.log.durable()
        if self.ahead is not None and durable is not None:
            report = self.ahead.settle(durable)  # a transaction applied ahead: committed, or rolled back
            if report is not None:
                return report
        if covered and upto is not None:
            limit = upto
        elif durable is None:
            return None
        else:
            limit = min(durable, upto) if upto is not None else durable
        states = self._states(self.roster.ready(time.monotonic(), self.retry))
        positions = {n: st.live for n, st in states.items()}
        behind = {n: p for n, p in positions.items() if p < limit}
        held.released(self.roster, states)
        if not (self._held_turn and behind) and any(st.held for st in states.values()):
            report = held.unit(self.roster, self.units, states, limit, self.retry)
            if report is not None:
                self.registered(report.targets[0])
                self._held_turn = True
                return report
        self._held_turn = False
        for n in [n for n in self.roster.failed if n in positions and n not in behind]:
            self.roster.recovered(n)  # readable again, and nothing to apply
        self.roster.joined(positions)  # an added target that reached the others is one of them
        if not behind:
            self._pending_since.clear()
            return None
        starts = [min(behind.values())]
        joining = self.roster.joining()
        live = [p for n, p in behind.items() if n not in joining]
        if joining & set(behind) and live and min(live) != starts[0]:
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
        stored = self.units.store.starting_at(start)
        if stored is not None and stored[1] <= end_cap:
            end, n_changes = stored[1], -1
        else:
            u = self.units.next_unit(start, end_cap)
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
        ahead = self.units.take_ahead(start, end_cap)
        if ahead is not None:
            batch, compile_seconds = ahead  # compiled while the previous unit was applied
            end, n_changes, compiled = batch.end, batch.changes, True
        else:
            batch, compiled, compile_seconds = self.units.compile(
                start, end, stored is not None and stored[1] == end, empty=n_changes == 0
            )
        report = UnitReport(
            start, end, batch.changes if n_changes < 0 else n_changes, group, compiled, compile_seconds, {}
        )
        schemas = self.units.unit_schemas(batch)
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
        """When the open unit after ``start`` closes (:meth:`Units.closes_at`)."""
        return self.units.closes_at(start)

    def _apply_group(
        self, batch: NetBatch, schemas: dict[str, TableSchema], group: list[str], report: UnitReport, next_unit: bool
    ) -> None:
        """Apply the unit to every target of the group, each in a thread of its own (each target's position is
        committed with its data, so they need not wait for each other). With ``next_unit``, the next unit is
        compiled meanwhile (see :meth:`compile_next`)."""
        changes = functools.partial(self.units.changes, batch.start, batch.end)

        def apply_one(n: str) -> None:

            t0 = time.monotonic()
            spared: set[str] = set()
            while True:
                try:
                    with self.targets[n].exclusive(self.lock_wait):  # one applier per target (apply/lock.py)
                        report.results[n] = self.targets[n].apply(batch, schemas, changes)
                    report.apply_seconds[n] = time.monotonic() - t0
                    self.registered(n)
                except TargetMoved as e:  # another process applied meanwhile: the next step forms the unit again
                    log.info("%s", e)
                    return
                except Exception as e:  # a table stops alone (the unit again, without it), or this target does
                    table = self.roster.failure(n, e, batch, spared=spared)
                    if table is None:
                        return
                    spared.add(table)
                    continue
                self.roster.recovered(n)
                return

        if len(group) == 1 and not next_unit:
            apply_one(group[0])
            return
        pool = self._workers(len(group))
        futures = [pool.submit(apply_one, n) for n in group]
        try:
            if next_unit:
                try:
                    self.units.compile_next(batch.end, futures)
                except Exception as e:  # the next step compiles that unit again, and reports its error
                    log.debug("compiling ahead failed: %s", e)
        finally:
            errors = [e for e in (f.exception() for f in futures) if e is not None]  # (every target done first)
        if errors:
            self.units.drop_ahead()
            raise errors[0]

    def compile_next(self, start: Position, applying: list[Any] | None = None) -> NetBatch | None:
        """The unit after ``start`` compiled ahead (:meth:`Units.compile_next`)."""
        return self.units.compile_next(start, applying)

    def compile_ahead(self, on_unit: Callable[[NetBatch], None] | None = None) -> int:
        """The compile stage alone: compile and store the units that the targets will apply next, up to the log's
        end, without applying them. Returns how many units were compiled."""
        starts = [st.live for st in self._states(list(self.targets)).values()]
        return self.units.compile_stored(starts, on_unit)

    def _open(self, name: str) -> Target:
        """Target ``name`` opened, given what following schema changes needs."""
        return open_target(
            self.config.targets[name],
            threads=self.config.apply.threads,
            needs=schema_needs(self.config, self.log, name),
        )

    def registered(self, name: str) -> None:
        """Tell the log's reader registry where ``name`` has applied up to (retention keeps what it needs)."""

        set_applied(self.log, name, self.targets[name].applied_positions().position)

    def prune(self) -> None:
        """Drop compiled units and log segments every registered target has passed (export folders not loaded within
        the log's ``export_expiry`` no longer count). Units: every configured target counts, those other processes
        apply (``apply --target``, or one this process waits for while ``verify`` holds it) by the position they
        registered, so that no unit another process is about to read is removed."""

        positions = list(self.positions().values())
        if positions:
            positions += [
                r.applied for n, r in readers(self.log).items() if n in self.config.targets and r.applied is not None
            ]
            self.units.store.prune(min(positions))
        expire_exports(self.log, self.config.log.export_expiry)
        retain(self.log, max_age=self.config.log.max_age, max_size=self.config.log.max_size)
        self._drop_reloads()

    def _drop_reloads(self) -> None:
        """Stop applying to the targets the log cannot bring up to date (they need a reload: the log's cap, a lost
        slot); the others go on."""
        for n, record in needs_reload(self.log).items():
            if self.roster.remove(n) is not None:
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
        self.roster.failed.all_due()
        self.roster.held.all_due()
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
        failed, held_first = self.roster.failed.first_error(), self.roster.held.first_error()
        if failed is not None:  # the others have caught up: now the first stopped target's error
            raise failed
        if held_first is not None and not held_ok:  # ... or the first table stopped alone
            raise held_first
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
                self.units.shrink()
                last_shrink = time.monotonic()
            self.upkeep()
            if self.log.receiving():  # a large transaction arriving: its unit is next, and it is not idle time
                last_unit = time.monotonic()
            elif time.monotonic() - last_unit >= self.idle_warm_up > 0:
                self.units.warm_large_when_idle(self.on_message)
            stop.wait(poll)

    def upkeep(self) -> None:
        """Start the storage upkeep of each target whose ``compact_every`` has passed (:class:`Upkeep`)."""
        self._upkeep.due(self.targets, self.config)


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
