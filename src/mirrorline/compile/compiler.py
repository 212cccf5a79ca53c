"""Compiling one unit of the change log: the route a unit takes, chosen in one place (DESIGN §5).

:class:`Compiler` is compile's entry point: ``Compiler.compile(start, end)`` reads the unit's statistics (the log's
segment footers, no Spark job), asks each route in :data:`ROUTES` in turn whether it takes the unit, and returns the
:class:`~mirrorline.compile.batch.NetBatch` of the first that does. Every route gives the same net rows (the rules
of :mod:`mirrorline.compile.reference`); they differ in what they cost:

=========  ==========================================================  ===============================================
route      takes a unit that ...                                       how (module)
=========  ==========================================================  ===============================================
driver     holds at most ``limits.FOLD_UNIT`` changes, while Spark     the rules' own fold in plain Python on the
           starts and warms up, or is not started at all               driver (``compile/driver.py``)
small      holds at most ``limits.SMALL_UNIT`` changes, no TRUNCATE,   a plan prepared once, run on the unit's rows
           no key change leaving columns unsent                        sent from the driver (``compile/small.py``)
inserts    only inserts, at most ``limits.INSERTS_MAX_ROWS``           images read on the driver while Spark checks
                                                                       that no key repeats (``compile/inserts.py``)
distinct   is mostly streamed transactions or changes about as many    no fold: the changes read on the driver, declined
           keys as changes (the log's key sketches), at most           when a key repeats (``compile/distinct.py``)
           ``limits.DRIVER_UNIT`` changes, no TRUNCATE or key change,
           every table keyed and replicating every kind
updates    only inserts and updates of keyed tables replicating        Spark finds each key's last position, the driver
           every kind, at most ``limits.DRIVER_UNIT`` changes          reads its image (``compile/updates.py``)
general    any                                                         the fold on Spark (``compile/spark.py``)
=========  ==========================================================  ===============================================

A route may leave a check running (inserts, updates): the batch settles it itself when its rows are read to their
end (:class:`~mirrorline.compile.batch.Feed`) and apply asks it before it commits anything; a check that fails with
:class:`~mirrorline.errors.Unverified` means the unit must take the general route (:meth:`Compiler.again`).

A route on Spark waits for Spark's warm-up when it takes a unit before the warm-up ended (the driver route does
not). A route also warms itself up (``warm``): the small route's plan at start, in the background
(:meth:`Compiler.warm_up`); the updates route's JVM code once the pipeline is idle (:meth:`Compiler.warm_idle`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from mirrorline import limits
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.compile.distinct import compile_distinct
from mirrorline.compile.driver import fold_unit
from mirrorline.compile.history import frames as history_frames
from mirrorline.compile.inserts import compile_inserts
from mirrorline.compile.reference import ALL_ACTIONS, Actions, actions_of, normalised
from mirrorline.compile.small import shared, unit_rows
from mirrorline.compile.spark import compile_changes
from mirrorline.compile.updates import compile_updates
from mirrorline.compile.warmup import WarmUp, warm_large, warm_small
from mirrorline.errors import MirrorlineError, Unverified
from mirrorline.log.segments import ROW_GROUP_ROWS
from mirrorline.log.spark import read_spark
from mirrorline.log.stats import Stats, table_stats
from mirrorline.model import TableSchema
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.compile.warmup import NotStarted, WarmUp
    from mirrorline.log.reader import ChangeLog

log = logging.getLogger(__name__)

Bags = Mapping[str, tuple[str, ...]]


class SchemasOf(Protocol):
    """The logged schemas of ``tables`` for the unit ``(start, end]`` (the version their changes carry);
    ``missing_ok``: a table the log has no schema of is left out (else an error)."""

    def __call__(
        self, tables: list[str], end: Position, start: Position | None = None, missing_ok: bool = False
    ) -> Mapping[str, TableSchema]: ...


@dataclass
class Span:
    """One unit ``(start, end]`` to compile, as a route sees it: its tables' statistics, the pipeline's settings,
    and the reads a route may make (each made only by the route that needs it)."""

    log: ChangeLog
    start: Position
    end: Position
    stats: Stats  # of the configured tables with a change in the unit
    tables: Collection[str]  # the configured tables (empty: every table)
    actions: Actions  # the tables replicating only some kinds of change (normalised: see reference.normalised)
    bags: Bags  # the tables without a key the pipeline has seen, with their columns
    get_spark: Callable[[], Any]  # the session (made on first use: a route on the driver never asks for it)
    schemas_of: SchemasOf
    keep_on_driver: bool = True  # may the net rows stay in the driver's memory (not when units are stored)
    small_unit: int = limits.SMALL_UNIT  # the small route's largest unit
    driver_unit: int = limits.DRIVER_UNIT  # the largest unit whose net rows come to the driver through Arrow
    warm: bool = True  # Spark is warm (else it is starting or warming up: a route on the driver may take the unit)

    @cached_property
    def spark(self) -> Any:
        return self.get_spark()

    @property
    def changes(self) -> int:
        return sum(s.count for s in self.stats.values())

    def schemas(self) -> Mapping[str, TableSchema]:
        """The unit's tables' schemas (the version their changes carry)."""
        return self.schemas_of(sorted(self.stats), self.end, self.start)

    @cached_property
    def frame(self) -> Any:
        """The unit's changes as a DataFrame (the unit's rows only: no route filters them again)."""
        from pyspark.sql import functions as F

        frame = read_spark(self.log, self.start, self.end, spark=self.spark)
        if self.tables:
            frame = frame.where(F.col("table").isin(list(self.tables)))
        return frame

    def rows(self, batch_rows: int | None = None) -> Iterator[pa.Table]:
        """The unit's changes read on the driver, in batches (the log layout)."""
        if batch_rows is None:
            return self.log.read_arrow(self.start, self.end)
        return self.log.read_arrow(self.start, self.end, batch_rows=batch_rows)


class Route(Protocol):
    """One way to compile a unit. ``compile`` may still decline (None) once it has looked at the rows. ``spark``:
    the route needs Spark (a unit it takes waits for the warm-up)."""

    name: str
    spark: bool

    def qualifies(self, span: Span) -> bool: ...

    def compile(self, span: Span) -> NetBatch | None: ...

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:
        """Build and run what the route runs, on a synthetic unit; returns the seconds it took."""
        ...


class OnDriver:
    name = "driver"
    spark = False

    def qualifies(self, span: Span) -> bool:
        return not span.warm and span.changes <= limits.FOLD_UNIT

    def compile(self, span: Span) -> NetBatch:

        return fold_unit(span.log, span.start, span.end, span.tables, span.actions, span.bags, span.changes)

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:
        return 0.0


class Small:
    name = "small"
    spark = True

    def qualifies(self, span: Span) -> bool:
        from mirrorline.compile.small import qualifies

        return qualifies(span.stats, span.small_unit)

    def compile(self, span: Span) -> NetBatch:

        rows = unit_rows(span.tables, span.rows())
        return shared(span.spark, span.actions or None, span.bags).compile(rows, span.stats, span.start, span.end)

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:

        return warm_small(spark, actions or None, (False,), dict(bags) or None)


class InsertsOnly:
    name = "inserts"
    spark = True

    def qualifies(self, span: Span) -> bool:
        from mirrorline.compile.inserts import qualifies

        return qualifies(span.stats, span.actions or None)

    def compile(self, span: Span) -> NetBatch:

        return compile_inserts(
            span.frame,
            span.stats,
            span.schemas(),
            span.start,
            span.end,
            span.rows(batch_rows=ROW_GROUP_ROWS),
            span.actions or None,
        )

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:
        return 0.0  # its Spark job is a hash aggregate the general route's warm-up builds; its read is the driver's


class Distinct:
    name = "distinct"
    spark = False

    def qualifies(self, span: Span) -> bool:
        from mirrorline.compile.distinct import qualifies

        def streamed() -> int:
            return sum(seg.count for seg in span.log.select(span.start, span.end) if seg.stream)

        return qualifies(
            span.stats, span.bags, streamed, span.small_unit, span.driver_unit, span.keep_on_driver, span.actions
        )

    def compile(self, span: Span) -> NetBatch | None:

        batch = compile_distinct(span.rows(), span.stats, span.start, span.end, span.tables)
        if batch is None:
            log.info("unit %s..%s: a key has more than one change; folding it", span.start, span.end)
        return batch

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:
        return 0.0  # no Spark


class InsertsAndUpdates:
    name = "updates"
    spark = True

    def qualifies(self, span: Span) -> bool:
        from mirrorline.compile.updates import qualifies

        return span.changes <= span.driver_unit and qualifies(span.stats, span.actions or None, span.bags)

    def compile(self, span: Span) -> NetBatch | None:

        batch = compile_updates(
            span.frame,
            span.stats,
            span.start,
            span.end,
            lambda at: span.log.iter_at(at, ["table", "key", "new"]),
            span.schemas(),
        )
        if batch is None:
            log.info(
                "unit %s..%s: not compiled as inserts and updates (a key's changes are not an insert then updates, "
                "or do not fit that route); compiling it the general way",
                span.start,
                span.end,
            )
        return batch

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:

        return warm_large(spark)


class General:
    name = "general"
    spark = True

    def qualifies(self, span: Span) -> bool:
        return True

    def compile(self, span: Span) -> NetBatch:

        return compile_changes(
            span.frame,
            actions=span.actions or None,
            start=span.start,
            end=span.end,
            stats=span.stats,
            bags=dict(span.bags),
            to_driver=span.keep_on_driver and span.changes <= span.driver_unit,
            in_range=True,
        )

    def warm(self, spark: Any, actions: Actions, bags: Bags) -> float:
        from mirrorline.compile.warmup import warm_up

        return warm_up(spark)


DRIVER, SMALL, INSERTS, DISTINCT = OnDriver(), Small(), InsertsOnly(), Distinct()
UPDATES, GENERAL = InsertsAndUpdates(), General()
ROUTES: tuple[Route, ...] = (DRIVER, SMALL, INSERTS, DISTINCT, UPDATES, GENERAL)  # asked in this order; the last any


class Compiler:
    """Compiles units of one pipeline's log: its configured tables (empty: all), their actions, the tables without
    a key it has seen. ``spark``: gives the session (made on first use). ``schemas_of``: the unit's tables' schemas,
    as the pipeline reads them from the log."""

    def __init__(
        self,
        log: ChangeLog,
        *,
        tables: Collection[str],
        actions: Actions,
        spark: Callable[[], Any],
        schemas_of: SchemasOf,
        bags: Bags | None = None,
        keep_on_driver: bool = True,
        routes: tuple[Route, ...] = ROUTES,
    ) -> None:
        self.log = log
        self.tables = tables
        self.actions = normalised(actions)
        self._spark = spark
        self._schemas_of = schemas_of
        self._bags: dict[str, tuple[str, ...]] = dict(bags or {})
        self.keep_on_driver = keep_on_driver
        self.routes = routes
        self.last_route: str | None = None  # the route the last unit took (for logs and tests)
        self.versions: Callable[[str], bool] = lambda table: False  # a table some target keeps in versions
        self.small_unit = limits.SMALL_UNIT
        self.driver_unit = limits.DRIVER_UNIT

    def configure(self, tables: Collection[str], actions: Actions, bags: Bags) -> None:
        """Compile for these tables and actions from the next unit on (a configuration reloaded); ``bags`` adds to
        the tables without a key seen so far."""
        self.tables = tables
        self.actions = normalised(actions)
        self._bags.update(bags)

    def span(self, start: Position, end: Position, warm: bool = True) -> Span:
        """The unit ``(start, end]`` as the routes see it (``warm``: Spark is warm)."""
        stats = self.log.stats(start, end)
        if self.tables:
            stats = {t: s for t, s in stats.items() if t in self.tables}
        return Span(
            log=self.log,
            start=start,
            end=end,
            stats=stats,
            tables=self.tables,
            actions=self.actions,
            bags=self.bags(sorted(stats), end, start),
            get_spark=self._spark,
            schemas_of=self._schemas_of,
            keep_on_driver=self.keep_on_driver,
            small_unit=self.small_unit,
            driver_unit=self.driver_unit,
            warm=warm,
        )

    def compile(
        self,
        start: Position,
        end: Position,
        *,
        general: bool = False,
        warming: WarmUp | NotStarted | None = None,
    ) -> NetBatch:
        """Compile ``(start, end]`` by the first route that takes it (``general``: the general route only). A batch
        whose route left a check running comes back before the check ends (see the module's docstring).
        ``warming``: Spark's warm-up, still running (or Spark not started at all): a route on the driver may take the
        unit meanwhile, one on Spark waits for it first."""
        span = self.span(start, end, warm=warming is None)
        # (the versions of tables kept so, beside the route: DuckDB on the driver while the route runs on Spark)
        versions = _Background(self._history, span) if any(self.versions(t) for t in span.stats) else None
        try:
            for route in self.routes if not general else (GENERAL,):
                if route.qualifies(span):
                    if route.spark and warming is not None:
                        warming.wait()
                        warming = None
                    batch = route.compile(span)
                    if batch is not None:
                        self.last_route = route.name
                        if versions is not None:
                            batch.history.update(versions.result())
                        return batch
        finally:
            if versions is not None:
                versions.join()
        raise MirrorlineError(f"unit {start}..{end}: no compile route took it", start=str(start), end=str(end))

    def _history(self, span: Span) -> dict[str, Any]:
        """The versions of the unit's tables some target keeps in versions, set-based (compile/history.py): one read
        of the unit's changes on the driver. A table it does not take is left out (apply derives it)."""
        tables = [t for t in span.stats if self.versions(t)]
        parts = list(span.rows())
        if not tables or not parts:
            return {}
        rows = pa.concat_tables(parts)
        schemas = span.schemas()
        out: dict[str, Any] = {}
        for t in tables:
            ts = schemas.get(t)
            if ts is None or ts.bag:
                continue
            got = history_frames(rows, t, ts.column_names, len(ts.key))
            if got is not None:
                out[t] = got
        return out

    def compile_part(self, rows: pa.Table, start: Position, end: Position) -> NetBatch | None:
        """A part of a streamed transaction not yet committed (``rows``: its changes in log order, the log layout),
        compiled to apply ahead of its commit: by the distinct route where no key repeats, else by the small route's
        plan (on Spark, whatever its size); None where neither takes it (a TRUNCATE, a key change leaving columns
        unsent, a table replicating some kinds of change only where a key repeats). ``start``/``end``: the part's
        bounds as apply reports them."""
        rows = unit_rows(self.tables, [rows])
        stats = table_stats(rows, sketch=False)  # (the route is chosen by the exact check, not by an estimate)
        if not stats:
            return NetBatch(start=start, end=end, tables=[], rows=NET_ARROW.empty_table(), changes=0)
        acts = self.actions
        if all(
            not st.truncates and not st.key_changes and t not in self._bags and actions_of(acts, t) == ALL_ACTIONS
            for t, st in stats.items()
        ):
            batch = compile_distinct([rows], stats, start, end, self.tables)
            if batch is not None:
                self.last_route = DISTINCT.name
                return batch
        if any(st.truncates or st.moves for st in stats.values()):
            return None
        self.last_route = SMALL.name
        return shared(self._spark(), self.actions or None, self._bags).compile(rows, stats, start, end)

    def again(self, batch: NetBatch, why: Unverified) -> NetBatch:
        """The unit of ``batch``, whose route's check failed (``why``), compiled the general way; ``batch``
        released."""
        log.info("unit %s..%s: %s; compiling it the general way", batch.start, batch.end, why)
        batch.release()
        return self.compile(batch.start, batch.end, general=True)

    def verified(self, batch: NetBatch) -> NetBatch:
        """``batch`` once its route's check holds, else the unit compiled the general way: for a unit stored for
        later, where no apply checks it before it is used."""
        try:
            batch.verify()
        except Unverified as e:
            return self.again(batch, e)
        except BaseException:
            batch.release()
            raise
        return batch

    def bags(self, tables: list[str], end: Position, start: Position) -> dict[str, tuple[str, ...]]:
        """The tables without a key seen so far, with their columns (every unit's plan gets them all, so that the
        small units' plan stays the same while they do not change): for the unit's ``tables``, the schema their
        changes carry (a unit cut at a schema change may end inside the transaction whose changes carry the new
        version, which the version in force at its end would be)."""
        for t, s in self._schemas_of(tables, end, start, missing_ok=True).items():
            if s.bag:
                self._bags[t] = s.key
            else:
                self._bags.pop(t, None)
        return dict(self._bags)

    def warm_up(self, on_ready: Callable[[str], None] | None = None) -> WarmUp:
        """The small route warmed up in the background now (the first unit waits for it)."""
        return warm_up(self._spark, self.actions, self._bags, on_ready)

    def warm_idle(self) -> float:
        """Warm the route of large units of inserts and updates up (its JVM code at a catch-up's size)."""
        return UPDATES.warm(self._spark(), self.actions, self._bags)


def warm_up(
    spark: Callable[[], Any], actions: Actions, bags: Bags, on_ready: Callable[[str], None] | None = None
) -> WarmUp:
    """The small route of a pipeline with these ``actions`` and tables without a key warmed up in the background
    now, the session made by ``spark()`` there (:class:`~mirrorline.compile.warmup.WarmUp`)."""

    acts = normalised(actions)
    return WarmUp(spark, lambda session: SMALL.warm(session, acts, bags), on_ready=on_ready)


class _Background:
    """``make(*args)`` in a thread of its own; :meth:`result` waits for it and raises what it raised."""

    def __init__(self, make: Callable[..., Any], *args: Any) -> None:
        self._out: list[Any] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._out.append(make(*args))
            except BaseException as e:
                self._error.append(e)

        self._thread = threading.Thread(target=run, name="compile-versions", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._out[0]
