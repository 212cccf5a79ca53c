"""Units that only insert: net rows without a fold (issue 11).

Catching up a bulk load or an append-only table gives units in which every table has only inserts: the log's
statistics of the unit (segment footers) show no update, delete, TRUNCATE or key change for any of its tables. Under
the rules (:mod:`mirrorline.compile.reference`) the fold of each key is then its one insert, unless a key is inserted
twice, which is an invalid sequence (I cannot follow I). So such a unit compiles on Spark as one narrow job with no
shuffle: the unit's log rows, each insert's image flattened by Spark into the table's columns as text (``new['col']``,
the form apply's worktables take) beside its position and a 64-bit hash of (table, key), brought back to the driver
through Arrow (:class:`~mirrorline.compile.batch.Inserts`). The driver checks that the hashes are distinct (a sort of
8 bytes a row). When two are equal (a key inserted twice, or, rarely, two keys with one hash) the unit is compiled by
the general path instead, which names the invalid sequence or folds the collision correctly.

What it saves (bench/apply.py, 1M inserts, JIT-warm): the general path's shuffle, fold and Parquet round trip (about
5 s) become one scan to Arrow (about 1.2 s), and apply gets flat text columns with no map to look into.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.compile.batch import POSITION_COLUMNS, Inserts, NetBatch
from mirrorline.compile.reference import ALL_ACTIONS, Actions
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


def _flat(changes: DataFrame, schemas: Mapping[str, TableSchema]) -> DataFrame:
    """The rows as ``table``, the hash, the position, and ``g0, g1, ...``: the table's columns in its order (a
    narrower table leaves the last ones null)."""
    from pyspark.sql import functions as F

    names = {t: list(s.column_names) for t, s in schemas.items()}
    width = max((len(c) for c in names.values()), default=0)
    cols = []
    for j in range(width):
        parts = [(t, F.col("new")[c[j]]) for t, c in names.items() if j < len(c)]
        expr = parts[0][1]
        if len(names) > 1:
            expr = F.when(F.col("table") == parts[0][0], parts[0][1])
            for t, v in parts[1:]:
                expr = expr.when(F.col("table") == t, v)
        cols.append(expr.alias(f"g{j}"))
    # a table without a key may hold an image twice: its rows are told apart by their positions
    bags = [t for t, s in schemas.items() if s.bag]
    h = F.xxhash64("table", "key")
    if bags:
        h = F.when(F.col("table").isin(bags), F.xxhash64("table", "key", "lsn", "seq")).otherwise(h)
    return changes.where(F.col("table").isin(list(names))).select(
        "table",
        h.alias(_HASH),
        F.col("lsn").alias(POSITION_COLUMNS[0]),
        F.col("seq").alias(POSITION_COLUMNS[1]),
        *cols,
    )


def compile_inserts(
    changes: DataFrame,
    stats: Stats,
    schemas: Mapping[str, TableSchema],
    start: Position,
    end: Position,
    actions: Actions | None = None,
) -> NetBatch | None:
    """Compile ``(start, end]`` of ``changes`` (log layout; :func:`qualifies` holds for ``stats``, its statistics),
    the tables' schemas at ``end`` given. None when a (table, key) hash repeats: compile the unit the general way."""
    from mirrorline.log.spark import range_filter

    tables = {t: schemas[t] for t in stats if _keeps_inserts(actions, t)}
    order = [t for _, t in sorted((stats[t].first["I"], t) for t in tables)]
    cond = range_filter(start, end)
    rows = _flat(changes.where(cond) if cond is not None else changes, tables).toArrow()
    assert isinstance(rows, pa.Table)
    h = np.sort(rows.column(_HASH).to_numpy())
    if len(h) > 1 and bool((h[1:] == h[:-1]).any()):
        return None
    out: dict[str, Inserts] = {}
    for t in order:
        s = tables[t]
        part = rows.filter(pc.equal(rows["table"], t)) if len(tables) > 1 else rows
        cols = {c: part[f"g{j}"] for j, c in enumerate(s.column_names)}
        cols.update({p: part[p] for p in POSITION_COLUMNS})
        out[t] = Inserts(pa.table(cols), tuple(s.key))
    return NetBatch(start=start, end=end, tables=order, inserts=out, changes=sum(stats[t].count for t in stats))
