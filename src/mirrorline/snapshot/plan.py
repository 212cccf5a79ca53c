"""What a snapshot reads, as pure data and SQL text: the consistent position, each table's schema and key, chunks by
``ctid`` block ranges, the COPY statements and the chunk file names.

Positions (DESIGN §2, §7). A slot created with an exported snapshot reports its *consistent point* ``P``: the snapshot
sees exactly the transactions whose commit record starts before ``P``, and decoding from the slot delivers exactly
those whose commit LSN is ``>= P``. A change's position is ``(commit_lsn, seq)``, so the snapshot holds every change
at or before ``(P - 1, SEQ_MAX)`` and none after it: that is the applied position a loaded target gets
(:func:`consistent_position`). Every change the log holds after it (commit LSN ``>= P``) is still to be applied, and
none before it is applied twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote

from mirrorline.model import Column, TableSchema, default_key, quote_ident, quote_table
from mirrorline.position import SEQ_MAX, Position

CHUNK_RE = re.compile(r"^(\d{4})-(\d{6})-(.+)\.csv$")
HEADER_PREFIX = "#mirrorline-chunk"


def consistent_position(consistent_lsn: int) -> Position:
    """The last position before any change whose commit LSN is ``consistent_lsn`` or later (see the module doc)."""
    if consistent_lsn <= 0:
        raise ValueError(f"not a consistent point: {consistent_lsn}")
    return Position(consistent_lsn - 1, SEQ_MAX)


def point_of(position: Position) -> int:
    """The consistent point (an LSN) a position from :func:`consistent_position` stands for."""
    return position.lsn + 1 if position.seq == SEQ_MAX else position.lsn


def table_key(
    columns: Sequence[Column],
    replica_identity: str,
    primary_key: Sequence[str],
    identity: Sequence[str],
    configured: Sequence[str] = (),
) -> tuple[str, ...]:
    """The key the log uses for a table (the same rule as capture's Relation handling): the configured key, else the
    replica identity columns, else (REPLICA IDENTITY FULL or no identity) the primary key, else every column (a
    bag of rows: :func:`is_bag`)."""
    if configured:
        return tuple(configured)
    names = [c.name for c in columns]
    if replica_identity == "f" or not identity:
        pk = tuple(primary_key) if primary_key and all(k in names for k in primary_key) else ()
        return default_key(columns, pk)
    return tuple(identity)


def is_bag(
    columns: Sequence[Column],
    replica_identity: str,
    primary_key: Sequence[str],
    identity: Sequence[str],
    configured: Sequence[str] = (),
) -> bool:
    """Is the table a bag of rows (no configured key, no identity index, no primary key): :attr:`TableSchema.bag`."""
    if configured or (replica_identity != "f" and identity):
        return False
    names = [c.name for c in columns]
    return not (primary_key and all(k in names for k in primary_key))


@dataclass(frozen=True)
class TableStat:
    """A configured table as the snapshot found it: schema, kind and size."""

    schema: TableSchema
    relkind: str  # "r" table, "p" partitioned table
    blocks: int  # pages of the heap when planned (the last chunk is open-ended anyway)
    rows: int  # the planner's estimate (progress only)
    sequence: int = -1
    index: int = 0  # place in load order
    row_filter: str | None = None  # only the rows for which this is true (the table's ``where``)

    @property
    def table(self) -> str:
        return self.schema.table


@dataclass(frozen=True)
class Chunk:
    """One slice of one table: heap blocks ``[first, stop)``; ``None`` means unbounded on that side."""

    table: str
    table_index: int  # the table's place in load order
    number: int  # the chunk's place inside its table
    first: int | None
    stop: int | None
    row_filter: str | None = None  # the table's ``where``: only its rows

    def where(self) -> str:
        parts = [f"({self.row_filter})"] if self.row_filter is not None else []
        if self.first is not None:
            parts.append(f"ctid >= '({self.first},0)'::tid")
        if self.stop is not None:
            parts.append(f"ctid < '({self.stop},0)'::tid")
        return " AND ".join(parts)

    @property
    def file_name(self) -> str:
        return chunk_file_name(self.table_index, self.number, self.table)


def chunk_file_name(table_index: int, number: int, table: str) -> str:
    """Sorting these names gives the load order: tables in load order, then chunks in order."""
    return f"{table_index:04d}-{number:06d}-{quote(table, safe='')}.csv"


def parse_chunk_file_name(name: str) -> tuple[int, int, str] | None:
    m = CHUNK_RE.match(name)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), unquote(m.group(3))


def plan_chunks(tables: Iterable[TableStat], chunk_blocks: int, min_chunks: int = 1) -> list[Chunk]:
    """Block-range chunks per table, in load order. A table gets ``ceil(blocks / chunk_blocks)`` chunks (at least
    ``min_chunks`` when it has that many blocks); the first chunk starts at the beginning and the last is open-ended,
    so rows in blocks added after planning are still read (the snapshot decides what is visible). A partitioned
    table is one chunk (ctid ranges do not span partitions)."""
    out: list[Chunk] = []
    for t in sorted(tables, key=lambda s: s.index):
        if t.relkind == "p" or t.blocks <= 1:
            out.append(Chunk(t.table, t.index, 0, None, None, t.row_filter))
            continue
        n = max(-(-t.blocks // max(chunk_blocks, 1)), min(min_chunks, t.blocks))
        step = -(-t.blocks // n)
        bounds = list(range(0, t.blocks, step))
        for i, b in enumerate(bounds):
            first = None if i == 0 else b
            stop = None if i == len(bounds) - 1 else bounds[i + 1]
            out.append(Chunk(t.table, t.index, i, first, stop, t.row_filter))
    return out


def select_sql(schema: TableSchema, chunk: Chunk | None = None) -> str:
    cols = ", ".join(quote_ident(c.name) for c in schema.columns)
    where = chunk.where() if chunk is not None else ""
    return f"SELECT {cols} FROM {quote_table(schema.table)}" + (f" WHERE {where}" if where else "")


def copy_out_sql(schema: TableSchema, chunk: Chunk | None = None, fmt: str = "text") -> str:
    """``COPY (SELECT the columns FROM the table WHERE the chunk's blocks) TO STDOUT``; ``fmt`` text, csv or
    binary."""
    opts = "" if fmt == "text" else f" WITH (FORMAT {fmt})"
    return f"COPY ({select_sql(schema, chunk)}) TO STDOUT{opts}"


def chunk_header(export_id: str, chunk: Chunk) -> str:
    """The first line of a chunk file: which export, table and chunk it belongs to (no quotes: it is skipped as one
    CSV row)."""
    return f"{HEADER_PREFIX} export={export_id} table={quote(chunk.table, safe='')} chunk={chunk.number}\n"


def parse_chunk_header(line: str) -> dict[str, str] | None:
    if not line.startswith(HEADER_PREFIX + " "):
        return None
    out = {}
    for part in line[len(HEADER_PREFIX) :].split():
        k, _, v = part.partition("=")
        out[k] = unquote(v)
    return out if {"export", "table", "chunk"} <= out.keys() else None
