"""The log-layout lever, measured on a real unit: what the fold's least work costs in each layout.

``bench/apply.py --layouts`` calls :func:`layout_floors` on the update-heavy workload's captured log (a copy). The
unit's changes are read from the log, rewritten in each candidate layout, and a *bare fold* is timed on each: Spark
groups the changes by key, keeps each key's last image and first op, and brings the net rows to the driver through
Arrow. The bare fold does the same shuffle, sort and transfer as the real one (:mod:`mirrorline.compile.spark`) but
none of its rules (validity, replaces, unchanged columns, TRUNCATE epochs): a floor for a compile in that layout, not
a compile. Compare it with ``bench/apply``'s ``mirrorline_jit_warm_compile_s``, the real compile of the same unit in
today's layout (with the unit's statistics, planning, the rules, and the E rows): on this machine it has been about
1.1 s above ``layout_fold_map_shuffle_s``; in a separate profile about 0.2 s of that was the rules themselves.

Layouts (the changes' other columns, lsn, seq and op, are the same in all):

- ``map``: today's log, each image a ``map<string,string>`` (column name to PostgreSQL's text);
- ``text``: one string column per table column, still PostgreSQL's text (no type mapping in the log);
- ``typed``: one column per table column in its Spark type.

Each is timed two ways: ``shuffle``, files in position order as the log writes them (Spark shuffles the changes by
key, as the fold does today), and ``bucketed``: the same rows written as one file per hash bucket of the key and
declared to Spark as a bucketed table, so that the grouping needs no shuffle (the log's writer would have to split
each segment by key bucket; key changes, whose D belongs to the old key's bucket, would still need the shuffle).

Each figure is the median of three JIT-warm runs after one discarded run.

Read the bare fold as a floor, not a forecast. In a separate experiment on this workload's log, the real
compile (:func:`mirrorline.compile.spark.compile_changes`, net rows to the driver) with its grouping extended by the
bucket column and run over the key-bucketed files took 2.34 s against 2.67 s over the log's segments, medians of 6:
the bare fold gains about 0.9 s from the buckets, the real compile about 0.3 s. Where the rest goes is not yet
settled: the rules themselves cost about 0.1 to 0.2 s (the fold cut after each step), the remainder is the sort by
key and position, the order check, the explode of the net rows and planning.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BUCKETS = 4
LAYOUTS = ("map", "text", "typed")


def _unit(log_path: Path) -> pa.Table:
    from mirrorline.log.reader import ChangeLog

    log = ChangeLog(str(log_path))
    return pa.concat_tables(log.read_arrow(None, log.durable(), batch_rows=65_536))


def _layout(unit: pa.Table, layout: str, columns: dict[str, pa.DataType], key: str) -> pa.Table:
    """The unit's changes (one table) in ``layout``, with the key as a column ``k`` and its bucket as ``b``."""
    from mirrorline.log.columns import image_columns

    names = list(columns)
    base = {"lsn": unit["lsn"], "seq": unit["seq"], "op": unit["op"]}
    keys = pc.list_element(unit["key"], 0)
    bucket = pd.util.hash_array(keys.to_numpy(zero_copy_only=False).astype(object)) % BUCKETS
    base["b"] = pa.array(bucket.astype(np.int32))
    if layout == "map":
        return pa.table({**base, "k": keys, "new": unit["new"], "unchanged": unit["unchanged"]})
    cols = image_columns(unit["new"], names)
    if layout == "typed":
        cols = {c: pc.cast(cols[c], t) for c, t in columns.items()}
    k = cols[key] if layout == "typed" else keys
    return pa.table({**base, "k": k, **{c: cols[c] for c in names if c != key}, "unchanged": unit["unchanged"]})


def _ddl(schema: pa.Schema) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return ", ".join(f"`{f.name}` {from_arrow_type(f.type).simpleString()}" for f in schema)


def _bare_fold(df: Any, values: list[str], shuffle: bool) -> pa.Table:
    from pyspark.sql import functions as F

    ops = df.select("b", "k", F.struct("lsn", "seq", "op", *values).alias("o"))
    if shuffle:
        ops = ops.repartition(BUCKETS, "b")
    grouped = (
        ops.sortWithinPartitions("b", "k", "o.lsn", "o.seq")
        .groupBy("b", "k")
        .agg(F.collect_list("o").alias("ops"))
        .select("k", F.element_at("ops", 1).op.alias("first_op"), F.element_at("ops", -1).alias("last"))
    )
    return grouped.select(
        "k", "first_op", *[F.col("last")[c].alias(c) for c in ("lsn", "seq", "op", *values)]
    ).toArrow()


def layout_floors(
    spark: Any, log_path: Path, work: Path, columns: dict[str, pa.DataType], key: str, net_rows: int
) -> dict[str, float]:
    """Seconds of the bare fold of the log's changes (one table whose columns and Arrow types are ``columns``, with
    the single-column primary key ``key``) per layout and way, e.g. ``text_bucketed``."""
    unit = _unit(log_path)
    conf = "spark.sql.execution.useObjectHashAggregateExec"
    before = spark.conf.get(conf)
    spark.conf.set(conf, "false")  # as the fold plans it: a streaming sort aggregate
    out: dict[str, float] = {}
    try:
        for layout in LAYOUTS:
            table = _layout(unit, layout, columns, key)
            values = [c for c in table.column_names if c not in ("lsn", "seq", "op", "b", "k")]
            plain, buckets = work / f"{layout}_plain", work / f"{layout}_buckets"
            for d in (plain, buckets):
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
            pq.write_table(table, plain / "part-0.parquet", row_group_size=65_536)
            for b in range(BUCKETS):  # Spark reads a file's bucket from the end of its name
                part = table.filter(pc.equal(table["b"], b))
                pq.write_table(part, buckets / f"part-0_{b:05d}.c000.parquet", row_group_size=65_536)
            name = f"layout_floor_{layout}"
            spark.sql(f"DROP TABLE IF EXISTS {name}")
            spark.sql(
                f"CREATE TABLE {name} ({_ddl(table.schema)}) USING parquet CLUSTERED BY (b) INTO {BUCKETS} "
                f"BUCKETS LOCATION '{buckets}'"
            )
            frames = {"shuffle": spark.read.parquet(str(plain)), "bucketed": spark.table(name)}
            for way, df in frames.items():
                times = []
                for _ in range(4):
                    t0 = time.monotonic()
                    got = _bare_fold(df, values, shuffle=way == "shuffle")
                    times.append(time.monotonic() - t0)
                    if got.num_rows != net_rows:
                        raise RuntimeError(f"{layout} {way}: bare fold gave {got.num_rows} rows, expected {net_rows}")
                out[f"{layout}_{way}"] = round(statistics.median(times[1:]), 3)
            spark.sql(f"DROP TABLE IF EXISTS {name}")  # external: its files stay until removed below
            shutil.rmtree(plain, ignore_errors=True)
            shutil.rmtree(buckets, ignore_errors=True)
    finally:
        spark.conf.set(conf, before)
    return out
