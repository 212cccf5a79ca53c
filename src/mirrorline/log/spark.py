"""The Spark reader: the log between two positions as a DataFrame in the log row layout (SPARK_DDL), read in
parallel. Whole segments are pruned by their metadata; only boundary rows are filtered by ``(lsn, seq)``. A
committed stream's parts get the commit's lsn and ts as literals."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mirrorline.log.reader import ChangeLog
from mirrorline.log.rows import ARROW_SCHEMA, SPARK_DDL
from mirrorline.position import Position
from mirrorline.sparkenv import get_spark

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


def range_filter(after: Position | None, upto: Position | None) -> Column | None:
    """The rows of ``(after, upto]`` as a predicate Parquet can push down (None: no bound)."""
    from pyspark.sql import functions as F

    lsn, seq = F.col("lsn"), F.col("seq")
    cond = None
    if after is not None:
        cond = (lsn > F.lit(after.lsn)) | ((lsn == F.lit(after.lsn)) & (seq > F.lit(after.seq)))
    if upto is not None:
        c2 = (lsn < F.lit(upto.lsn)) | ((lsn == F.lit(upto.lsn)) & (seq <= F.lit(upto.seq)))
        cond = c2 if cond is None else cond & c2
    return cond


def read_spark(
    log: ChangeLog, after: Position | None = None, upto: Position | None = None, spark: SparkSession | None = None
) -> DataFrame:
    """The changes of ``(after, upto]`` as a DataFrame with the log layout (unordered: order by lsn, seq)."""
    from pyspark.sql import functions as F

    if spark is None:
        spark = get_spark()
    segs = log.select(after, upto)  # checks retention and the segments' footers before Spark reads anything
    files = [str(s.path) for s in segs if not s.stream]
    frames: list[DataFrame] = []
    if files:
        frames.append(spark.read.schema(SPARK_DDL).parquet(*files))
    for s in segs:
        if s.stream and s.count:
            df = spark.read.schema(SPARK_DDL).parquet(*[str(s.path / p) for p in s.parts])
            df = df.withColumn("lsn", F.lit(s.first.lsn).cast("bigint"))
            df = df.withColumn("ts", F.lit(s.min_ts).cast("bigint"))
            frames.append(df.select(*ARROW_SCHEMA.names))
    if not frames:
        return spark.createDataFrame([], SPARK_DDL)
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    needs_filter = any((after is not None and s.first <= after) or (upto is not None and s.last > upto) for s in segs)
    cond = range_filter(after, upto) if needs_filter else None
    return df.where(cond) if cond is not None else df
