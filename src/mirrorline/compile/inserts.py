"""Units that only insert: net rows without a fold (issue 11).

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

What it saves (bench/apply.py, 1M inserts): the general path's shuffle, fold and Parquet round trip (about 5 s)
become a scan of the keys beside a read of the rows, 0.73 s JIT-warm (1.0 s when Spark flattened the images and
brought them back through Arrow, the images crossing from the JVM to Python; the first such unit after start-up
1.9 s against 3.6 s), and apply gets flat text columns with no map to look into.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.compile.batch import POSITION_COLUMNS, Inserts, NetBatch
from mirrorline.compile.reference import ALL_ACTIONS, Actions
from mirrorline.compile.small import unit_rows
from mirrorline.errors import LogError
from mirrorline.log.columns import image_columns
from mirrorline.log.stats import Stats
from mirrorline.model import TableSchema
from mirrorline.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

MAX_ROWS = 4_000_000  # larger units take the general path: these rows are held in the driver's memory
_HASH = "_ml_hash"


def qualifies(stats: Stats, actions: Actions | None = None, max_rows: int = MAX_ROWS) -> bool:
    """Does the unit with these statistics (of the tables it replicates) hold nothing but inserts, few enough to
    bring to the driver? A table whose actions drop its inserts holds nothing."""
    if not stats or sum(s.count for s in stats.values()) > max_rows:
        return False
    kept = sum(s.count for t, s in stats.items() if _keeps_inserts(actions, t))
    return kept > 0 and all(set(s.first) <= {"I"} and not s.truncates and not s.key_changes for s in stats.values())


def _keeps_inserts(actions: Actions | None, table: str) -> bool:
    acts = (actions or {}).get(table)
    return "I" in (frozenset(a.upper() for a in acts) if acts is not None else ALL_ACTIONS)


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
) -> NetBatch | None:
    """Compile ``(start, end]`` of ``changes`` (log layout; :func:`qualifies` holds for ``stats``, its statistics),
    the tables' schemas at ``end`` given; ``images``: the same rows read on the driver
    (:meth:`~mirrorline.log.ChangeLog.read_arrow`), whose images become the net rows once Spark has found every
    (table, key) once. None when a (table, key) hash repeats: compile the unit the general way."""
    from mirrorline.log.spark import range_filter

    tables = {t: schemas[t] for t in stats if _keeps_inserts(actions, t)}
    order = [t for _, t in sorted((stats[t].first["I"], t) for t in tables)]
    cond = range_filter(start, end)
    # Spark's job and the driver's read of the same rows run side by side
    with ThreadPoolExecutor(1, thread_name_prefix="mirrorline-inserts") as pool:
        job = pool.submit(_hashes(changes.where(cond) if cond is not None else changes, tables).toArrow)
        try:
            rows = unit_rows(tables, iter(images))
        except BaseException:
            job.exception()  # the job ends first; this error, not the job's, is the one to report
            raise
        hashes = job.result()
    assert isinstance(hashes, pa.Table)
    h = np.sort(hashes.column(_HASH).to_numpy())
    if len(h) > 1 and bool((h[1:] == h[:-1]).any()):
        return None
    if rows.num_rows != len(h):
        raise LogError(
            f"the change log's rows of {start}..{end} read {rows.num_rows} inserts on the driver and {len(h)} on Spark",
            hint="the log changed while it was read: check that only one capture writes to it",
            start=str(start),
            end=str(end),
        )
    out: dict[str, Inserts] = {}
    for t in order:
        s = tables[t]
        part = rows.filter(pc.equal(rows["table"], t)) if len(tables) > 1 else rows
        cols: dict[str, Any] = image_columns(part["new"], s.column_names)
        cols.update({POSITION_COLUMNS[0]: part["lsn"], POSITION_COLUMNS[1]: part["seq"]})
        out[t] = Inserts(pa.table(cols), tuple(s.key))
    return NetBatch(start=start, end=end, tables=order, inserts=out, changes=sum(stats[t].count for t in stats))
