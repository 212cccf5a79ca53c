"""Small units on Spark at live speed: one plan built once, run for every unit.

Compiling a unit of a few thousand changes with :func:`mirrorline.compile.spark.compile_changes` costs about a
second on a warm JVM, almost none of it folding: building the plan (hundreds of Py4J calls), analysing and
optimising it, two stages around a shuffle, and a Parquet round trip of the result. A live replica applies such a
unit every latency period, so that cost is its lag. Here the same fold (:func:`~mirrorline.compile.spark._plan`, the
same expressions) runs with three differences:

- **The plan is built and optimised once** per shape of unit (with or without key-changing updates; the tables'
  ``actions`` are fixed per pipeline) and run again for every unit. Its input is a one-row range mapped by a Python
  task that reads the unit's rows from an Arrow file named by a Spark *local property* set just before the job, so
  the plan itself never changes. AQE is off for it (an adaptive plan keeps its materialised stages between runs),
  in a Spark session of its own (``newSession``: the same context, its own SQL configuration), so that no unit
  sets and restores the configuration the large units' plans run with.
- **No shuffle**: the rows arrive in one partition, which already satisfies the grouping, so the job is one stage.
- **The net rows come back through Arrow** (:attr:`NetBatch.rows`): apply reads them from the driver's memory.

A unit qualifies when it holds at most ``max_changes`` changes (default :data:`SMALL_UNIT`), no TRUNCATE and no
key change that leaves columns unsent (those take the general path, whose handoff resolution needs joins). The
result is the general path's, row for row: the tests compile every named case and generated histories both ways.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from mirrorline import limits, scratch
from mirrorline.compile.batch import NET_ARROW, NetBatch
from mirrorline.compile.reference import Actions, Bags
from mirrorline.compile.spark import _acts, _meta_from_stats, _plan, _TableMeta, error_of
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.rows import ARROW_SCHEMA, SPARK_DDL
from mirrorline.log.stats import Stats
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SMALL_UNIT = limits.SMALL_UNIT
UNIT_PROPERTY = "mirrorline.unit"  # the local property naming the Arrow file of the unit being compiled
# the small plans' session: no adaptive execution (it would keep stages between runs), the sort-based aggregate
_CONFS = {"spark.sql.adaptive.enabled": "false", "spark.sql.execution.useObjectHashAggregateExec": "false"}


def _freeze_once() -> None:
    """In a Python worker of Spark: the objects it holds once its modules are imported (pyarrow's, pandas',
    pyspark's) moved out of the cyclic garbage collector's sight (``gc.freeze``). PySpark's daemon runs a full
    ``gc.collect()`` after every task of a reused worker, which walked all of them: 10 of the 17 ms of CPU the worker
    spent per small unit (bench/live --phases r300, ``cpu_s.mirrorline_other``). What the worker makes afterwards is
    collected as before; frozen objects are still freed when nothing refers to them."""
    import gc

    if not gc.get_freeze_count():
        gc.collect()
        gc.freeze()


def _read_unit(_batches: Iterator[Any]) -> Iterator[Any]:
    """In the Python task: the rows of the unit named by the job's local property."""
    from pyspark import TaskContext

    _freeze_once()
    for _ in _batches:  # the input read to its end, so that Spark reuses this Python worker for the next unit
        pass

    ctx = TaskContext.get()
    path = ctx.getLocalProperty(UNIT_PROPERTY) if ctx is not None else None
    if not path:
        raise RuntimeError(f"no {UNIT_PROPERTY} local property: the small-unit plan ran outside SmallUnits.compile")
    with pa.memory_map(path) as source:
        yield from pa.ipc.open_file(source).read_all().to_batches()


def qualifies(stats: Stats, max_changes: int = SMALL_UNIT) -> bool:
    """Can the unit with these statistics take the small path?"""
    return (
        sum(s.count for s in stats.values()) <= max_changes
        and not any(s.truncates for s in stats.values())
        and not any(s.moves for s in stats.values())
    )


def _earliest_error(rows: pa.Table) -> InvalidSequenceError:
    """The earliest of the unit's E rows, ordered as the general path orders them."""
    return error_of(
        min(
            rows.to_pylist(),
            key=lambda r: (r["err"]["second_lsn"], r["err"]["second_seq"], r["err"]["second_sub"], r["table"]),
        )
    )


class SmallUnits:
    """Compiles small units for one pipeline (its ``actions`` and tables without a key fixed), reusing one plan per
    shape."""

    def __init__(self, spark: Any, actions: Actions | None = None, bags: Bags | None = None) -> None:
        self._spark = spark
        self._session: Any = None  # made with the first plan
        self.actions = actions
        self.bags = bags
        self._plans: dict[bool, DataFrame] = {}
        self._lock = threading.Lock()  # one unit at a time: the local property is the context's

    @property
    def spark(self) -> Any:
        """The small plans' Spark session: the pipeline's context, a SQL configuration of its own."""
        if self._session is None:
            self._session = self._spark.newSession()
            for k, v in _CONFS.items():
                self._session.conf.set(k, v)
        return self._session

    def _plan(self, key_changes: bool) -> DataFrame:

        plan = self._plans.get(key_changes)
        if plan is None:
            source = self.spark.range(0, 1, 1, 1).mapInArrow(_read_unit, SPARK_DDL)
            meta = [_TableMeta("", 0, None, ZERO, [], int(key_changes), 0)]
            plan = _plan(source, self.actions, None, None, meta=meta, single=True, bags=self.bags).net_all
            self._plans[key_changes] = plan
        return plan

    def compile(self, rows: pa.Table, stats: Stats, start: Position, end: Position) -> NetBatch:
        """Compile ``rows`` (the unit's changes, log layout, of the pipeline's tables) whose statistics are
        ``stats``; the unit is ``(start, end]``. Raises :class:`InvalidSequenceError` for the earliest invalid
        sequence, like the general path."""

        if any(s.truncates or s.moves for s in stats.values()):
            raise ValueError(
                "a unit with a TRUNCATE or a key change leaving columns unsent takes the general path (compile_changes)"
            )
        meta = _meta_from_stats(stats, _acts(self.actions))
        tables = [t for _, t in sorted((m.first, m.table) for m in meta if m.first is not None)]
        changes = sum(m.n for m in meta)
        with self._lock:
            out = self._run(rows, any(m.key_changes for m in meta))
        is_err = pc.equal(out["kind"], "E")
        if pc.any(is_err).as_py():
            raise _earliest_error(out.filter(is_err))
        net = out.select(NET_ARROW.names)
        return NetBatch(start=start, end=end, tables=tables, rows=net, changes=changes)

    def _run(self, rows: pa.Table, key_changes: bool) -> pa.Table:
        plan = self._plan(key_changes)
        work = scratch.mkdtemp("unit-")
        path = os.path.join(work, "rows.arrow")
        sc = self.spark.sparkContext
        try:
            with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, ARROW_SCHEMA) as w:
                w.write_table(rows.cast(ARROW_SCHEMA))
            sc.setLocalProperty(UNIT_PROPERTY, path)
            out = plan.toArrow()
        finally:
            sc.setLocalProperty(UNIT_PROPERTY, None)
            shutil.rmtree(work, ignore_errors=True)
        assert isinstance(out, pa.Table)
        return out


_shared: dict[tuple[Any, ...], SmallUnits] = {}
_shared_lock = threading.Lock()


def shared(spark: Any, actions: Actions | None = None, bags: Bags | None = None) -> SmallUnits:
    """The process's SmallUnits for this session, these actions and these tables without a key: the warm-up builds
    the plans the pipeline then uses."""
    key = (
        id(spark),
        tuple(sorted((t, "".join(sorted(a))) for t, a in (actions or {}).items())),
        tuple(sorted((t, tuple(c)) for t, c in (bags or {}).items())),
    )
    with _shared_lock:
        if key not in _shared:
            _shared[key] = SmallUnits(spark, actions, bags or None)
        return _shared[key]


def unit_rows(tables: Collection[str] | None, batches: Iterable[pa.Table]) -> pa.Table:
    """The unit's rows read on the driver (``ChangeLog.read_arrow``), restricted to the configured tables (copied
    only when some rows are of other tables: filtering copies every column, the images too)."""
    parts = list(batches)
    t = pa.concat_tables(parts) if parts else ARROW_SCHEMA.empty_table()
    if tables:
        keep = pc.is_in(t["table"], pa.array(list(tables), pa.string()))
        if not pc.all(keep).as_py():
            t = t.filter(keep)
    return t
