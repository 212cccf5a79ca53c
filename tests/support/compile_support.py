"""Helpers for the compile tests over the Spark route (no tests here): changes into a DataFrame in the log row layout,
a batch's net rows back as a reference :class:`~mirrorline.compile.reference.NetResult`, every invalid sequence of a
unit at once, and the "mirror" form of net rows."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from mirrorline.compile.batch import NetBatch
from mirrorline.compile.reference import Actions, Bags, NetResult, from_rows
from mirrorline.compile.spark import _errors, _plan, _sort_aggregate
from mirrorline.errors import InvalidSequenceError
from mirrorline.log.rows import SPARK_DDL, changes_to_table
from mirrorline.position import Position

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def find_invalid(
    changes: DataFrame,
    *,
    actions: Actions | None = None,
    start: Position | None = None,
    end: Position | None = None,
    limit: int = 100,
    bags: Bags | None = None,
) -> list[InvalidSequenceError]:
    """Every invalid op sequence of the unit (the earliest of each key, at most ``limit``), earliest first, from the
    general route's plan (compiling stops at the first)."""
    plan = _plan(changes, actions, start, end, bags=bags)
    with _sort_aggregate(changes.sparkSession):
        return _errors(plan.net_all, limit)


def collect_result(batch: NetBatch, bags: Bags | None = None) -> NetResult:
    """The whole batch on the driver as a reference NetResult (small units only)."""
    rows = batch.arrow()
    if rows is not None:
        return from_rows(batch.tables, batch.truncated, rows.to_pylist(), bags)
    return from_rows(batch.tables, batch.truncated, (r.asDict() for r in batch.frame().collect()), bags)


def mirror(net: DataFrame) -> DataFrame:
    """The "mirror" form of a net DataFrame (DESIGN §6, 003_adea54c4fb31f98f.txt): each update becomes a delete and
    an insert of its image. An update that still marks columns unchanged cannot be a plain insert: the I row keeps
    them in ``unchanged`` with ``moved_from`` = its own key, read from the target's row before the deletes."""
    from pyspark.sql import functions as F

    kinds = F.when(F.col("kind") == "U", F.array(F.lit("D"), F.lit("I"))).otherwise(F.array(F.col("kind")))
    out = net.select("*", F.explode(kinds).alias("_k"))
    return out.select(
        "table",
        F.col("_k").alias("kind"),
        "key",
        F.when(F.col("_k") == "D", F.lit(None)).otherwise(F.col("new")).alias("new"),
        F.when(F.col("_k") == "D", F.array().cast("array<string>")).otherwise(F.col("unchanged")).alias("unchanged"),
        "lsn",
        "seq",
        F.when((F.col("kind") == "U") & (F.col("_k") == "I") & (F.size("unchanged") > 0), F.col("key"))
        .otherwise(F.col("moved_from"))
        .alias("moved_from"),
    )


def changes_frame(spark: Any, changes: Collection[Any]) -> DataFrame:
    """Changes (:class:`mirrorline.model.Change`) -> a DataFrame in the log row layout (small inputs)."""
    return spark.createDataFrame(changes_to_table(changes), schema=SPARK_DDL)
