"""Forming and compiling the applier's units (DESIGN §5): where the unit after a position ends
(:mod:`mirrorline.pipeline.plan`), its net changes compiled once for every target at that position
(:class:`~mirrorline.compile.compiler.Compiler`) or read back from the units other processes stored
(compile/store.py), the next unit compiled while the targets apply this one, and what a unit's apply reads beside
its net changes (the tables' logged schemas, the unit's changes for the failure path).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mirrorline import limits, sparkenv
from mirrorline.capture.source import describe_tables
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.compile.compiler import Compiler
from mirrorline.compile.reference import kept_changes
from mirrorline.compile.store import Damaged, UnitStore
from mirrorline.compile.warmup import NotStarted
from mirrorline.config import Config
from mirrorline.errors import MirrorlineError
from mirrorline.log.reader import ChangeLog
from mirrorline.model import Change, TableSchema
from mirrorline.pipeline import plan
from mirrorline.position import Position
from mirrorline.snapshot.plan import is_bag, table_key

if TYPE_CHECKING:
    from mirrorline.apply import ApplyResult
    from mirrorline.compile.warmup import WarmUp
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


class Units:
    """The units of one applier: formed from the log, compiled (or reused), one compiled ahead."""

    overlap = True  # compile the next unit while the targets apply this one
    ahead_poll = 0.1  # seconds between looks at the log while waiting for the next unit to fill
    catch_up_changes = limits.CATCH_UP_CHANGES

    def __init__(
        self,
        changelog: ChangeLog,
        config: Config,
        *,
        spark: Any,
        warm_up: WarmUp | None,
        bags: Mapping[str, tuple[str, ...]],
        save: bool,
    ) -> None:
        """``save``: store compiled units in the log, for a target another process applies (``apply --target``)."""
        self.log = changelog
        self.config = config
        self._spark = spark
        self._warm_up = warm_up  # the first compile waits for it (see mirrorline.compile.warmup)
        self.store = UnitStore(config.log.path)  # stored units are always reused ...
        self.save = save  # ... and saved when another process may need them
        self._ahead: tuple[NetBatch, float] | None = None  # the next unit, compiled while this one applied
        self._large_warm_up: threading.Thread | None = None  # (warm_large_when_idle)
        self.compiler = Compiler(
            changelog,
            tables=list(config.tables),
            actions=config.actions,
            spark=lambda: self.spark,
            schemas_of=self.schemas,
            bags=bags,
            keep_on_driver=not save,
        )
        self.compiler.versions = config.in_versions

    @property
    def spark(self) -> Any:
        if self._spark is None:
            self._spark = sparkenv.get_spark()
        return self._spark

    @property
    def spark_started(self) -> bool:
        return self._spark is not None

    def start_warm_up(self) -> None:
        """Warm Spark up in the background now; the first compile waits for it."""
        self._warm_up = self.compiler.warm_up()

    def warmed(self) -> None:
        if self._warm_up is not None:
            self._warm_up.wait()
            self._warm_up = None

    def configure(self, config: Config, bags: Mapping[str, tuple[str, ...]]) -> None:
        """Go on with ``config``: units compiled for the tables of before (ahead; stored) are dropped."""
        tables_changed = set(config.tables) != set(self.config.tables)
        self.config = config
        self.compiler.configure(list(config.tables), config.actions, bags)
        self.compiler.versions = config.in_versions
        if tables_changed:
            self.drop_ahead()
            self.store.prune(Position(1 << 62, 1 << 62))

    def close(self) -> None:
        if self._large_warm_up is not None and self._large_warm_up.ident is not None:
            self._large_warm_up.join()  # (a few seconds at most)
        self.drop_ahead()

    def shrink(self) -> None:
        """Give back the JVM heap that Spark's work since the last idle moment left unused (sparkenv.shrink)."""
        try:
            freed = sparkenv.shrink()
        except Exception as e:  # (the JVM gone: the next unit that needs it says so)
            log.debug("shrinking the JVM's heap failed: %s", e)
            return
        if freed:
            log.debug("idle: the JVM gave back %d MB of heap", freed >> 20)

    def warm_large_when_idle(self, on_message: Callable[[str], None]) -> None:
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
                on_message(f"Spark warmed up for large units in {self.compiler.warm_idle():.2f}s (idle)")
                self.shrink()
            except Exception as e:
                log.warning("warming up for large units failed (the first large unit will run cold): %s", e)

        self._large_warm_up = threading.Thread(target=main, name="mirrorline-warm-up-large", daemon=True)
        self._large_warm_up.start()

    # -- forming -----------------------------------------------------------------------------------------------

    def next_unit(self, start: Position, upto: Position) -> plan.Unit:
        """The unit after ``start``, at most to ``upto`` (:func:`plan.next_unit`)."""
        sizes = plan.Sizes(self.config.apply.max_changes, self.compiler.small_unit, self.catch_up_changes)
        return plan.next_unit(self.log, start, upto, sizes, list(self.config.tables))

    def closes_at(self, start: Position) -> float:
        """When the open unit after ``start`` closes (``time.monotonic()``): :func:`plan.closes_at` of its first
        change's commit time."""
        try:
            ts = self.log.first_ts_after(start)
        except MirrorlineError:  # (retention or a damaged segment: the unit's own reading will say what is wrong)
            ts = None
        return plan.closes_at(ts, self.config.apply.latency, time.monotonic(), time.time())

    # -- compiling ---------------------------------------------------------------------------------------------

    def compile(
        self, start: Position, end: Position, stored: bool, empty: bool = False
    ) -> tuple[NetBatch, bool, float]:
        """The unit ``(start, end]`` compiled (``stored``: read back from the store if it can be), whether it was
        compiled, and the seconds it took. ``empty``: a unit that only moves the position (no Spark job)."""
        t0 = time.monotonic()
        if stored:
            try:
                return self.store.load(self.spark, start, end), False, time.monotonic() - t0
            except Damaged as e:
                log.warning("%s", e)
        if empty:
            return NetBatch(start=start, end=end, tables=[], rows=NET_ARROW.empty_table()), False, 0.0
        warming: WarmUp | NotStarted | None = None
        if self._warm_up is not None and not self._warm_up.done():
            warming = self._warm_up
        else:
            self._warm_up = None
            if self._spark is None and not sparkenv.started():  # a unit the driver route takes needs no Spark
                warming = NotStarted()
        batch = self.compiler.compile(start, end, warming=warming)
        if self.save:
            batch = self.store.save(self.spark, self.compiler.verified(batch))
        return batch, True, time.monotonic() - t0

    def take_ahead(self, start: Position, end_cap: Position) -> tuple[NetBatch, float] | None:
        """The unit compiled ahead, if it starts at ``start`` and ends by ``end_cap`` (else it is dropped)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0].start == start and ahead[0].end <= end_cap:
            return ahead
        if ahead is not None:
            ahead[0].release()
        return None

    def drop_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead[0].release()
            self._ahead = None

    def compile_next(self, start: Position, applying: list[Future[None]] | None = None) -> NetBatch | None:
        """Compile the unit after ``start`` while the targets apply this one (``applying``), as soon as it is full:
        its size reached, or the log holds more after it (the targets are behind). Kept for the next step, which
        uses it if it still fits (:meth:`take_ahead`). If the targets finish first, the unit is left open: compiled
        now, it would be cut short of what arrives meanwhile (measured under pgbench: a small unit after every large
        one); the next step compiles it. Without ``applying``, compiles only a unit that is full already. Returns the
        unit compiled, or None."""
        if not self.overlap:
            return None
        seen: Position | None = None
        while True:
            durable = self.log.durable()
            if (
                durable != seen and durable is not None and durable > start and self.store.starting_at(start) is None
            ):  # look at the unit again only when the log grew
                seen = durable
                u = self.next_unit(start, durable)
                end = u.end
                if end is not None and not u.empty and (u.full or end < durable):
                    break
            if not applying or all(f.done() for f in applying):
                return None
            wait_futures(applying, timeout=self.ahead_poll)
        log.info("compiling the next unit %s..%s while this one applies", start, end)
        batch, _compiled, seconds = self.compile(start, end, False)
        self._ahead = (batch, seconds)
        log.info("compiled the next unit %s..%s ahead in %.2fs", start, end, seconds)
        return batch

    def compile_stored(self, starts: list[Position], on_unit: Callable[[NetBatch], None] | None = None) -> int:
        """The compile stage alone: compile and store the units after each of ``starts`` (the targets' positions),
        up to the log's end, without applying them. Returns how many units were compiled."""
        durable = self.log.durable()
        if durable is None:
            return 0
        done = 0
        for start in sorted(set(starts)):
            while start < durable:
                stored = self.store.starting_at(start)
                if stored is not None:
                    start = stored[1]
                    continue
                end, n = self.log.advance(start, self.config.apply.max_changes, durable)
                end, _ = plan.cut_at_schema_change(self.log, start, end, n, list(self.config.tables))
                if end is None or end <= start:
                    break
                self.warmed()
                batch = self.store.save(self.spark, self.compiler.verified(self.compiler.compile(start, end)))
                if on_unit:
                    on_unit(batch)
                batch.release()
                done += 1
                start = end
        return done

    # -- what an apply reads -----------------------------------------------------------------------------------

    def changes(self, start: Position, end: Position) -> Iterator[Change]:
        """The unit's changes of the configured tables after ``actions``: the failure path's input."""
        configured = self.config.tables
        yield from kept_changes(
            (c for c in self.log.read(start, end) if not configured or c.table in configured),
            self.config.actions or None,
        )

    def unit_schemas(self, batch: NetBatch) -> dict[str, TableSchema]:
        """The logged schemas of the tables ``batch`` applies (its truncated tables included)."""
        return self.schemas(
            batch.tables + [t for t in batch.truncated if t not in batch.tables], batch.end, batch.start
        )

    def schemas(
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


def known_bags(config: Config, conn: Any = None) -> dict[str, tuple[str, ...]]:
    """The configured tables the log knows as tables without a key (their latest schema), with their columns: what
    the pipeline's small-unit plan is built for, so that the warm-up builds that same plan. ``conn``: a connection
    to the source, whose catalog tells the tables the log does not know yet (a new log: their first changes would
    otherwise make the first units build a plan of their own, seconds on a loaded machine: bench/live)."""
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
