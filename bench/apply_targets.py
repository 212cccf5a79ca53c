"""Benchmark: apply one compiled unit (200,000 net updates + 200,000 net inserts, built on Spark) to each target,
against the anchors measured in the same run: a plain COPY of the same 400,000 rows into an empty PostgreSQL table,
for the Delta target a plain ``write_deltalake`` of the same rows, typed, into a new Delta table, and for the Iceberg
target a plain pyiceberg ``append`` of them into a new Iceberg table of the same embedded catalog (the physical
limits of the formats).

Each target starts with the 200,000 rows the updates hit (loaded by an apply of inserts, timed as "seed"). Figures:
seconds per target and mode (median over --reps fresh targets), ratio to the COPY anchor, and where time goes: the
Spark -> driver Arrow collect of the net rows, and each apply's phases (stage = fetch + load worktables, update,
insert, commit).

Prints ONE JSON line; progress goes to stderr.
    .venv/bin/python bench/apply_targets.py [--rows 200000] [--reps 1] [--kinds postgresql,sqlite,duckdb,delta,iceberg]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mirrorline.apply import target_class
from mirrorline.apply.postgresql import to_csv
from mirrorline.compile.batch import NetBatch
from mirrorline.model import Column, TableSchema
from mirrorline.pgcluster import PgCluster
from mirrorline.position import Position
from mirrorline.sparkenv import get_spark

SCHEMA = TableSchema(
    "public.items",
    (
        Column("id", "bigint", nullable=False),
        Column("name", "text"),
        Column("qty", "integer"),
        Column("price", "numeric(12,2)"),
        Column("at", "timestamp with time zone"),
    ),
    key=("id",),
)
SCHEMAS = {SCHEMA.table: SCHEMA}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def net_frame(spark: Any, kind: str, lo: int, hi: int, tag: str) -> Any:
    """Net rows of one kind for ids [lo, hi), generated on Spark."""
    return spark.range(lo, hi).selectExpr(
        "'public.items' AS `table`",
        f"'{kind}' AS kind",
        "array(CAST(id AS STRING)) AS key",
        f"map('id', CAST(id AS STRING), 'name', concat('{tag}', id), 'qty', CAST(id % 1000 AS STRING), "
        "'price', CAST(CAST(id / 7.0 AS DECIMAL(12,2)) AS STRING), 'at', '2024-05-06 07:08:09.123+00') AS new",
        "CAST(array() AS ARRAY<STRING>) AS unchanged",
        "CAST(256 AS BIGINT) AS lsn",
        "id AS seq",
        "CAST(NULL AS ARRAY<STRING>) AS moved_from",
    )


def unit(spark: Any, start: int, end: int, frames: list[Any], changes: int) -> NetBatch:
    df = frames[0]
    for f in frames[1:]:
        df = df.unionByName(f)
    df = df.cache()
    df.count()
    return NetBatch(start=Position(start), end=Position(end), tables=["public.items"], net=df, changes=changes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--kinds", default="postgresql,sqlite,duckdb,delta,iceberg", help="the target kinds to apply to")
    args = ap.parse_args()
    kinds = set(args.kinds.split(","))
    n = args.rows
    spark = get_spark()
    seed = unit(spark, 0, 1, [net_frame(spark, "I", 0, n, "seed")], n)
    work = unit(spark, 1, 2, [net_frame(spark, "U", 0, n, "upd"), net_frame(spark, "I", n, 2 * n, "ins")], 2 * n)
    out: dict[str, Any] = {"bench": "apply_targets", "updates": n, "inserts": n, "reps": args.reps}

    t0 = time.monotonic()
    arrow = work.net.toArrow()
    out["spark_to_arrow_s"] = round(time.monotonic() - t0, 3)
    from mirrorline.apply import rows as R

    t0 = time.monotonic()
    flat = R.flatten(R.select(arrow, "public.items", "I"), SCHEMA, "I")
    out["flatten_inserts_s"] = round(time.monotonic() - t0, 3)

    with PgCluster() as pg, tempfile.TemporaryDirectory() as tmp:
        # the anchor: COPY the same 2n rows (text CSV from Arrow, as apply loads them) into an empty typed table
        import psycopg2
        import pyarrow as pa

        upd = R.flatten(R.select(arrow, "public.items", "U"), SCHEMA, "I")
        rows = pa.concat_tables([upd, flat]).select(list(SCHEMA.column_names))
        copy_s = []
        for rep in range(max(args.reps, 1)):
            db = f"anchor{rep}"
            pg.create_database(db)
            conn = psycopg2.connect(pg.dsn(db))
            with conn.cursor() as cur:
                cur.execute(
                    "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty integer, price numeric(12,2), "
                    "at timestamptz)"
                )
                conn.commit()
                t0 = time.monotonic()
                cur.copy_expert("COPY items FROM STDIN WITH (FORMAT csv)", to_csv(rows))
                conn.commit()
                copy_s.append(time.monotonic() - t0)
            conn.close()
        anchor = statistics.median(copy_s)
        out["pg_copy_anchor_s"] = round(anchor, 3)
        log(f"anchor COPY of {2 * n} rows: {anchor:.2f}s")

        configs: list[tuple[str, str, str, dict[str, Any]]] = [
            ("postgresql", "update", "postgresql_driver", {"parallel_rows": 10**12}),
            ("postgresql", "update", "postgresql_spark_copy", {"parallel_rows": 1}),
            ("postgresql", "mirror", "postgresql_mirror", {"parallel_rows": 10**12}),
            ("sqlite", "update", "sqlite", {}),
            ("sqlite", "mirror", "sqlite_mirror", {}),
            ("duckdb", "update", "duckdb", {}),
            ("duckdb", "mirror", "duckdb_mirror", {}),
            ("delta", "update", "delta", {}),
            ("delta", "mirror", "delta_mirror", {}),
            ("iceberg", "update", "iceberg", {}),
            ("iceberg", "mirror", "iceberg_mirror", {}),
        ]
        configs = [c for c in configs if c[0] in kinds]
        # the Delta anchor: a plain write_deltalake of the same 2n rows, already typed, into a new Delta table
        from deltalake import write_deltalake

        from mirrorline.apply.delta import DELTA
        from mirrorline.apply.lake.dialect import duck_connection
        from mirrorline.apply.lake.session import typed

        con = duck_connection()
        typed_rows = typed(con, rows, SCHEMA, list(SCHEMA.column_names), DELTA)
        con.close()
        writes = []
        for rep in range(max(args.reps, 1)):
            t0 = time.monotonic()
            write_deltalake(str(Path(tmp) / f"anchor{rep}.delta"), typed_rows)
            writes.append(time.monotonic() - t0)
        delta_anchor = statistics.median(writes)
        out["delta_write_anchor_s"] = round(delta_anchor, 3)
        log(f"anchor write_deltalake of {2 * n} rows: {delta_anchor:.2f}s")
        # the Iceberg anchor: a plain pyiceberg append of the same 2n rows, typed, into a new table (embedded catalog)
        from pyiceberg.catalog.sql import SqlCatalog

        from mirrorline.apply.iceberg import ICEBERG

        con = duck_connection()
        ice_rows = typed(con, rows, SCHEMA, list(SCHEMA.column_names), ICEBERG)
        con.close()
        cat = SqlCatalog("anchor", uri=f"sqlite:///{tmp}/anchor.sqlite", warehouse=(Path(tmp) / "wh").as_uri())
        cat.create_namespace("public")
        appends = []
        for rep in range(max(args.reps, 1)):
            table = cat.create_table(("public", f"anchor{rep}"), ICEBERG.arrow_schema(SCHEMA))
            t0 = time.monotonic()
            table.append(ice_rows)
            appends.append(time.monotonic() - t0)
        ice_anchor = statistics.median(appends)
        out["iceberg_append_anchor_s"] = round(ice_anchor, 3)
        log(f"anchor pyiceberg append of {2 * n} rows: {ice_anchor:.2f}s")
        for kind, mode, label, opts in configs:
            seeds, applies = [], []
            for rep in range(max(args.reps, 1)):
                if kind == "postgresql":
                    db = f"{label}{rep}"
                    pg.create_database(db)
                    location = pg.dsn(db)
                else:
                    location = str(Path(tmp) / f"{label}{rep}.{kind}")
                t = target_class(kind)("bench", location, mode=mode, **opts)
                t0 = time.monotonic()
                t.apply(seed, SCHEMAS)
                seeds.append(time.monotonic() - t0)
                t0 = time.monotonic()
                res = t.apply(work, SCHEMAS)
                applies.append(time.monotonic() - t0)
                assert res.rows["public.items"] == {"D": 0, "U": n, "I": n}, res.rows
                t.close()
                out[f"{label}_phases"] = {k: round(v, 2) for k, v in res.phases.items()}
            a = statistics.median(applies)
            out[f"{label}_s"] = round(a, 3)
            out[f"{label}_seed_s"] = round(statistics.median(seeds), 3)
            out[f"{label}_vs_copy"] = round(a / anchor, 2)
            if kind == "delta":
                out[f"{label}_vs_write_deltalake"] = round(a / delta_anchor, 2)
            if kind == "iceberg":
                out[f"{label}_vs_pyiceberg_append"] = round(a / ice_anchor, 2)
            log(f"{label}: apply {a:.2f}s ({a / anchor:.1f}x COPY), seed {statistics.median(seeds):.2f}s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
