"""Shared by the end-to-end and crash tests: configurations and canonical row comparison across engines."""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import configs

from mirrorline.apply import target_class
from mirrorline.workload import COLUMNS, TABLES

BOOLEAN_COLUMNS = {("public.accounts", "active")}


def config_text(
    source_dsn: str,
    log: Path,
    targets: Mapping[str, tuple[str, str] | configs.Settings],
    *,
    max_changes: int = 1_000_000,
    latency: str = "100ms",
    threads: int = 1,
    tables: Mapping[str, configs.Settings] | None = None,
) -> str:
    """The workload's configuration (every table of ``mirrorline.workload.TABLES``, or ``tables``: name ->
    settings); ``targets``: name -> (url, mode), or the target's settings."""
    return configs.text(
        source={"dsn": source_dsn, "slot": "mirrorline"},
        log={"path": log, "segment_changes": 500, "segment_seconds": "200ms"},
        apply={"latency": latency, "max_changes": max_changes, "threads": threads},
        tables={t: {} for t in TABLES} if tables is None else tables,
        targets={n: {"url": t[0], "mode": t[1]} if isinstance(t, tuple) else t for n, t in targets.items()},
    )


def target_url(kind: str, tmp_path: Path, pg_cluster: Any, name: str) -> str:
    if kind == "postgresql":
        pg_cluster.create_database(name)
        return str(pg_cluster.url(name))
    suffix = {"sqlite": ".db", "duckdb": ".duckdb", "delta": ".lake", "iceberg": ".ice"}[kind]
    return f"{kind}:///{tmp_path / (name + suffix)}"


def _canon(table: str, col: str, v: Any) -> str | None:
    if v is None:
        return None
    if (table, col) in BOOLEAN_COLUMNS:
        return "true" if v in (True, 1, "t", "true") else "false"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dt.date | dt.datetime):
        return v.isoformat()
    if isinstance(v, decimal.Decimal | int):
        return str(v)
    return str(v)


def target_rows(kind: str, url: str, table: str) -> list[tuple[Any, ...]]:
    """A workload table's rows at a target (:func:`oracle.read`), each value as text, sorted."""
    import oracle

    raw = oracle.read(kind, oracle.location(url), table, list(COLUMNS[table]), pg_text=True)
    assert raw is not None, f"{kind} target {url}: no table {table}"
    return sorted((tuple(_canon(table, c, v) for c, v in zip(COLUMNS[table], r, strict=True)) for r in raw), key=repr)


def delta_parquet_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    """A Delta table's rows read by DuckDB from the Parquet files its current version lists (not through deltalake's
    reader, not through mirrorline), canonical as :func:`target_rows`."""
    import duckdb
    from deltalake import DeltaTable

    cols = COLUMNS[table]
    folder = Path(url.split(":///", 1)[1]) / target_class("delta").dialect.names(table)[1]
    files = [u.removeprefix("file://") for u in DeltaTable(str(folder)).file_uris()]
    con = duckdb.connect()
    try:
        sel = ", ".join(f'"{c}"' for c in cols)
        raw = con.execute(f"SELECT {sel} FROM read_parquet(?)", [files]).fetchall() if files else []
    finally:
        con.close()
    return sorted((tuple(_canon(table, c, v) for c, v in zip(cols, r, strict=True)) for r in raw), key=repr)


def assert_same(source_dsn: str, kind: str, url: str) -> None:
    """Every workload table at the target holds exactly the source's rows (tests/support/oracle.py, the one reader)."""
    import oracle

    for table in TABLES:
        oracle.assert_same(source_dsn, kind, url, table)


def capture_and_apply(conf: Any, spark: Any) -> None:
    """Capture what the source committed, then bring every target up to it (a pipeline of its own)."""
    from mirrorline.capture.session import Capture
    from mirrorline.pipeline import Applier

    Capture(conf, once=True).run()
    applier = Applier(conf, spark=spark)
    try:
        applier.catch_up()
    finally:
        applier.close()
