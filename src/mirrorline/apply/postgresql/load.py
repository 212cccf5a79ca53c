"""A snapshot's chunks loaded into a PostgreSQL target straight from Spark tasks: each task's ``COPY ... TO STDOUT``
from the source is piped into ``COPY ... FROM STDIN`` here (no file, no Python-side parsing), and the chunk is recorded
in ``mirrorline_snapshot_chunks`` in the same transaction as its rows, so a task that Spark runs twice cannot load its
rows twice. Between two PostgreSQL servers the rows travel in COPY's binary format when every column has exactly the
source column's built-in type (its binary form is then the same on both), as text otherwise."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

import psycopg2

from mirrorline.apply.chunks import ChunkLoader, ChunkSink
from mirrorline.apply.session import Session
from mirrorline.model import TableSchema, quote_ident

if TYPE_CHECKING:
    from mirrorline.apply.engine import SqlTarget

CHUNKS_TABLE = "mirrorline_snapshot_chunks"
BUFFER = 1 << 20


def copy_in_sql(target_table: str, columns: Sequence[str], fmt: str = "text") -> str:
    """``COPY target (columns) FROM STDIN``; ``target_table`` already quoted (the target dialect's name)."""
    cols = ", ".join(quote_ident(c) for c in columns)
    return f"COPY {target_table} ({cols}) FROM STDIN" + ("" if fmt == "text" else f" WITH (FORMAT {fmt})")


class PgChunkLoader(ChunkLoader):
    sink = "mirrorline.apply.postgresql.load:PgChunkSink"

    def __init__(self, target: SqlTarget) -> None:
        self.target = target
        self.chunks = target.dialect.own(CHUNKS_TABLE)

    def formats(self, schemas: Mapping[str, TableSchema]) -> dict[str, str]:
        out = {t: "text" for t in schemas}
        s = self.target.session()
        try:
            for t, ts in schemas.items():
                got = dict(
                    s.query(
                        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
                        (self.target.dialect.table(t),),
                    )
                )
                if all(0 < c.type_oid < 10000 and got.get(c.name) == c.type_name for c in ts.columns):
                    out[t] = "binary"
        finally:
            s.close()
        return out

    def prepare(self, s: Session) -> None:
        s.execute(
            f"CREATE TABLE IF NOT EXISTS {self.chunks} (load_id TEXT NOT NULL, chunk INTEGER NOT NULL, "
            f"{quote_ident('rows')} BIGINT NOT NULL, PRIMARY KEY (load_id, chunk))"
        )

    def spec(self, ts: TableSchema, fmt: str, load_id: str, chunk: int) -> dict[str, Any]:
        return {
            "dsn": self.target.location,
            "copy_in": copy_in_sql(self.target.dialect.table(ts.table), ts.column_names, fmt),
            "chunks": self.chunks,
            "load_id": load_id,
            "chunk": chunk,
        }

    def forget(self, s: Session, load_id: str) -> None:
        s.execute(f"DELETE FROM {self.chunks} WHERE load_id = %s", (load_id,))


class PgChunkSink(ChunkSink):
    """spec: dsn, copy_in, chunks (the target's table of loaded chunks, quoted), load_id, chunk."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.conn = psycopg2.connect(spec["dsn"], application_name="mirrorline snapshot")
        self.cur = self.conn.cursor()

    def begin(self) -> int | None:
        sp = self.spec
        self.cur.execute("SET synchronous_commit = off")
        self.cur.execute(
            f"INSERT INTO {sp['chunks']} (load_id, chunk, rows) VALUES (%s, %s, 0) ON CONFLICT DO NOTHING",
            (sp["load_id"], sp["chunk"]),
        )
        if self.cur.rowcount == 1:
            return None
        self.conn.rollback()  # loaded by an earlier attempt of the task, and committed: it passed the check
        self.cur.execute(
            f"SELECT rows FROM {sp['chunks']} WHERE load_id = %s AND chunk = %s", (sp["load_id"], sp["chunk"])
        )
        return int(self.cur.fetchone()[0])

    def copy_in(self, stream: BinaryIO) -> int:
        self.cur.copy_expert(self.spec["copy_in"], stream, size=BUFFER)
        return int(self.cur.rowcount)

    def commit(self, rows: int) -> None:
        sp = self.spec
        self.cur.execute(
            f"UPDATE {sp['chunks']} SET rows = %s WHERE load_id = %s AND chunk = %s", (rows, sp["load_id"], sp["chunk"])
        )
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

    def close(self) -> None:
        self.conn.close()
