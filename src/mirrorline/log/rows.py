"""The row layout of the change log: the contract between capture, the log, compile and the interchange formats.

Every change is one row. Segments are Parquet files with exactly this schema, readable by Spark in parallel and by
pyarrow. Values are PostgreSQL's text representation; ``new`` holds the sent columns of the new image (absent: not
sent, i.e. unchanged TOAST, named in ``unchanged``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from mirrorline.model import Change, Op
from mirrorline.position import Position

ARROW_SCHEMA = pa.schema(
    [
        pa.field("lsn", pa.int64(), nullable=False),  # commit LSN of the transaction
        pa.field("seq", pa.int64(), nullable=False),  # index of the change inside its transaction
        pa.field("ts", pa.int64(), nullable=False),  # commit timestamp, microseconds since the epoch (UTC)
        pa.field("xid", pa.int64(), nullable=False),
        pa.field("table", pa.string(), nullable=False),  # "schema.name"
        pa.field("op", pa.string(), nullable=False),  # I, U, D or T
        pa.field("key", pa.list_(pa.string()), nullable=False),
        pa.field("old_key", pa.list_(pa.string()), nullable=True),
        pa.field("new", pa.map_(pa.string(), pa.string()), nullable=True),
        pa.field("unchanged", pa.list_(pa.string()), nullable=False),
        pa.field("schema_version", pa.int32(), nullable=False),
    ]
)

# The same layout as a Spark DDL string (pyspark is imported only where Spark runs).
SPARK_DDL = (
    "lsn BIGINT NOT NULL, seq BIGINT NOT NULL, ts BIGINT NOT NULL, xid BIGINT NOT NULL, `table` STRING NOT NULL, "
    "op STRING NOT NULL, key ARRAY<STRING> NOT NULL, old_key ARRAY<STRING>, new MAP<STRING, STRING>, "
    "unchanged ARRAY<STRING> NOT NULL, schema_version INT NOT NULL"
)


def change_to_row(c: Change) -> dict[str, Any]:
    return {
        "lsn": c.pos.lsn,
        "seq": c.pos.seq,
        "ts": c.commit_ts,
        "xid": c.xid,
        "table": c.table,
        "op": c.op.value,
        "key": list(c.key),
        "old_key": list(c.old_key) if c.old_key is not None else None,
        "new": list(c.new.items()) if c.new is not None else None,
        "unchanged": sorted(c.unchanged),
        "schema_version": c.schema_version,
    }


def row_to_change(r: dict[str, Any]) -> Change:
    new = r["new"]
    if new is not None and not isinstance(new, dict):
        new = dict(new)
    old_key = r["old_key"]
    return Change(
        pos=Position(r["lsn"], r["seq"]),
        commit_ts=r["ts"],
        xid=r["xid"],
        table=r["table"],
        op=Op(r["op"]),
        key=tuple(r["key"]),
        new=new,
        unchanged=frozenset(r["unchanged"] or ()),
        old_key=tuple(old_key) if old_key is not None else None,
        schema_version=r["schema_version"],
    )


def changes_to_table(changes: Iterable[Change]) -> pa.Table:
    """Changes -> an Arrow table in the log layout."""
    return pa.Table.from_pylist([change_to_row(c) for c in changes], schema=ARROW_SCHEMA)


def table_to_changes(table: pa.Table) -> Iterator[Change]:
    for r in table.to_pylist():
        yield row_to_change(r)
