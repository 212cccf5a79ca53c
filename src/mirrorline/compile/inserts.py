"""Units that only insert: net rows without a fold.

Catching up a bulk load or an append-only table gives units in which every table has only inserts: the log's
statistics of the unit (segment footers) show no update, delete, TRUNCATE or key change for any of its tables. Under
the rules (:mod:`mirrorline.compile.reference`) the fold of each key is then its one insert, unless a key is inserted
twice, which is an invalid sequence (I cannot follow I). So such a unit compiles on Spark as one narrow job with no
shuffle: a 64-bit hash of each row's (table, key), the only column brought back through Arrow, whose values the driver
checks are distinct (a sort of 8 bytes a row). Meanwhile the driver reads the same rows from the log
(:meth:`~mirrorline.log.ChangeLog.read_arrow`) and turns each insert's image into the table's columns as text
(:func:`~mirrorline.log.columns.image_columns`, the form apply's worktables take), beside its position
(:class:`~mirrorline.compile.batch.Inserts`). When two hashes are equal (a key inserted twice, or, rarely, two keys
with one hash) the unit is compiled by the general path instead, which names the invalid sequence or folds the
collision correctly.

Neither the job nor the read is waited for: the unit goes to apply at once, each table's rows a
:class:`~mirrorline.compile.batch.Feed` of the batches read so far, and the check (hashes distinct, as many rows
read as Spark saw) is the batch's :meth:`~mirrorline.compile.batch.NetBatch.verify`, which reading a table's rows to
their end waits for (so before apply commits them) and apply's failure path asks first;
:class:`~mirrorline.errors.Unverified` sends the unit, rolled back, to the general path. On PostgreSQL one COPY
per table takes the batches as they are read, so the read, the job and the load overlap. ``bench/apply.py``
(insert-only: 1M inserts) measures the route against PostgreSQL's own logical replication and plain COPY.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline import limits
from mirrorline.compile.batch import POSITION_COLUMNS, Feed, Inserts, NetBatch
from mirrorline.compile.reference import Actions, actions_of
from mirrorline.compile.small import unit_rows
from mirrorline.errors import LogError, Unverified
from mirrorline.log.columns import image_columns
from mirrorline.log.stats import Stats
from mirrorline.model import TableSchema
from mirrorline.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

T = TypeVar("T")

MAX_ROWS = limits.INSERTS_MAX_ROWS
_HASH = "_ml_hash"


def qualifies(stats: Stats, actions: Actions | None = None, max_rows: int = MAX_ROWS) -> bool:
    """Does the unit with these statistics (of the tables it replicates) hold nothing but inserts, few enough to
    bring to the driver? A table whose actions drop its inserts holds nothing."""
    if not stats or sum(s.count for s in stats.values()) > max_rows:
        return False
    kept = sum(s.count for t, s in stats.items() if _keeps_inserts(actions, t))
    return kept > 0 and all(set(s.first) <= {"I"} and not s.truncates and not s.key_changes for s in stats.values())


def _keeps_inserts(actions: Actions | None, table: str) -> bool:
    return "I" in actions_of(actions, table)


def _hashes(changes: DataFrame, schemas: Mapping[str, TableSchema]) -> DataFrame:
    """A 64-bit hash of each row's (table, key): of (table, key, position) for a table without a key, whose rows
    are told apart by their positions (it may hold an image twice)."""
    from pyspark.sql import functions as F

    bags = [t for t, s in schemas.items() if s.bag]
    h = F.xxhash64("table", "key")
    if bags:
        h = F.when(F.col("table").isin(bags), F.xxhash64("table", "key", "lsn", "seq")).otherwise(h)
    return changes.where(F.col("table").isin(list(schemas))).select(h.alias(_HASH))


def compile_inserts(
    changes: DataFrame,
    stats: Stats,
    schemas: Mapping[str, TableSchema],
    start: Position,
    end: Position,
    images: Iterable[pa.Table],
    actions: Actions | None = None,
) -> NetBatch:
    """Compile the unit ``(start, end]`` whose changes are ``changes`` (log layout, those of the unit only, as
    :func:`~mirrorline.log.spark.read_spark` gives them, so that the plan holds no literal of the unit's and its
    generated code serves every unit; :func:`qualifies` holds for ``stats``, their statistics), the tables' schemas
    at ``end`` given; ``images``: the same rows read on the driver
    (:meth:`~mirrorline.log.ChangeLog.read_arrow`), whose images become the net rows once Spark has found every
    (table, key) once.

    Returns at once, while Spark's job and the driver's read run in the background: each table's rows are a
    :class:`~mirrorline.compile.batch.Feed` that apply loads as they come, and the batch's
    :meth:`~mirrorline.compile.batch.NetBatch.verify` waits for both and raises
    :class:`~mirrorline.errors.Unverified` when a (table, key) hash repeats (compile the unit the general way),
    the driver's read error if it failed, or a :class:`LogError` when the two read different rows."""
    tables = {t: schemas[t] for t in stats if _keeps_inserts(actions, t)}
    order = [t for _, t in sorted((stats[t].first["I"], t) for t in tables)]
    hashes = _hashes(changes, tables)  # (a plan error: no thread yet)
    job = background(hashes.toArrow, "mirrorline-inserts")

    def check(read: int) -> None:
        hashes = job.result()
        assert isinstance(hashes, pa.Table)
        h = np.sort(hashes.column(_HASH).to_numpy())
        if len(h) > 1 and bool((h[1:] == h[:-1]).any()):
            raise Unverified(
                f"unit {start}..{end}: a key is inserted twice (or two keys share a hash)",
                hint="the unit is compiled the general way",
                start=str(start),
                end=str(end),
            )
        if read != len(h):
            raise LogError(
                f"the change log's rows of {start}..{end} read {read} inserts on the driver and {len(h)} on Spark",
                hint="the log changed while it was read: check that only one capture writes to it",
                start=str(start),
                end=str(end),
            )

    return streamed(
        start, end, {t: tables[t] for t in order}, images, check, sum(stats[t].count for t in stats), also=[job]
    )


def streamed(
    start: Position,
    end: Position,
    tables: Mapping[str, TableSchema],
    images: Iterable[pa.Table],
    check: Callable[[int], None],
    changes: int,
    net_rows: int | None = None,
    also: Iterable[Future[Any]] = (),
) -> NetBatch:
    """The unit ``(start, end]`` whose net rows are all inserts of ``tables`` (in this order), given to apply at
    once while the driver reads their images (``images``, the log layout) in the background: each table's rows a
    :class:`~mirrorline.compile.batch.Feed` read as they come. The batch's check (which reading a table's rows to
    their end waits for) raises the read's error, else ``check(rows read)``'s; ``also``: background work the route
    left running, that releasing the batch waits for."""
    budget = limits.FEED_BYTES // max(len(tables), 1)  # what the unit holds in memory, whatever its tables
    feeds = {t: Feed(inserts_layout(s), budget) for t, s in tables.items()}
    reader = background(lambda: read_into(tables, feeds, images), f"mirrorline-read-{start}")
    waits = [reader, *also]

    def verify() -> None:
        reader.result()  # the driver's read error, if any, is the one to report
        check(sum(f.rows() for f in feeds.values()))

    def settle() -> None:
        wait_futures(waits)

    return NetBatch(
        start=start,
        end=end,
        tables=list(tables),
        inserts={t: Inserts(None, tuple(s.key), feeds[t]) for t, s in tables.items()},
        changes=changes,
        net_rows=net_rows,
        check=verify,
        settle=settle,
    )


def inserts_layout(s: TableSchema) -> pa.Schema:
    """An :class:`Inserts` table's columns for ``s``: its columns as text, then the position."""
    return pa.schema([(c, pa.string()) for c in s.column_names] + [(c, pa.int64()) for c in POSITION_COLUMNS])


def read_into(tables: Mapping[str, TableSchema], feeds: Mapping[str, Feed], images: Iterable[pa.Table]) -> None:
    """Each batch of rows read on the driver (of the log layout: ``table``, ``new``, ``lsn`` and ``seq`` at least),
    its images as the tables' columns, into the tables' feeds (closed at the end, with the error if the read
    fails)."""
    error: BaseException | None = None
    try:
        for batch in images:
            rows = unit_rows(tables, iter([batch]))
            for t, s in tables.items():
                part = rows.filter(pc.equal(rows["table"], t)) if len(tables) > 1 else rows
                if part.num_rows:
                    cols: dict[str, Any] = image_columns(part["new"], s.column_names)
                    cols.update({POSITION_COLUMNS[0]: part["lsn"], POSITION_COLUMNS[1]: part["seq"]})
                    feeds[t].put(pa.table(cols).cast(feeds[t].schema))
    except BaseException as e:
        error = e
        raise
    finally:
        for f in feeds.values():
            f.close(error)


def background(fn: Callable[[], T], name: str) -> Future[T]:
    """``fn()`` in a thread of its own (a daemon: a process that stops does not wait for it)."""
    fut: Future[T] = Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn())
        except BaseException as e:
            fut.set_exception(e)

    threading.Thread(target=run, name=name, daemon=True).start()
    return fut
