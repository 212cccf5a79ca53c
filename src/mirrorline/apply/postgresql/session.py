"""A PostgreSQL target's session (psycopg2) and the COPY of Arrow rows as CSV."""

from __future__ import annotations

import io
import select
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2
import pyarrow as pa
import pyarrow.csv as pacsv

from mirrorline.apply.postgresql.dialect import POSTGRESQL
from mirrorline.apply.session import Session
from mirrorline.apply.sql import OWN_INDEX
from mirrorline.config import redact_dsn
from mirrorline.errors import TransientTargetError
from mirrorline.limits import slice_rows
from mirrorline.model import TableSchema, quote_ident

if TYPE_CHECKING:
    pass

_DATA_CLASSES = ("22", "23", "P0")  # data exception, integrity constraint, raised by a target trigger
_CSV = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
# A worktable row's share of a hash join's memory (a text key and its row, about 100 bytes of text): a worktable's
# join gets work_mem for its rows, up to JOIN_MEM_MAX, so that the join of a large unit is not split into batches
# on disk (bench/bigtxn's UPDATE shows the apply's seconds).
JOIN_ROW_BYTES = 200
JOIN_MEM_MAX = 256 << 20
# From this many worktable rows the unit's joins by key are merge joins along the key's index, not hash joins: a
# hash join updates (or deletes) the target's rows in the worktable's order, a random page each; a merge join in
# the index's order, page after page. 1M updates of a 1M-row table: 3.9 s against 7.5-8.2 s, 500k deletes 0.66 s
# against 1.2 s (bench/apply --workloads distinct_keys shows the apply's seconds). Below it the planner probes the
# index row by row either way.
MERGE_MIN_ROWS = 10_000
# whether a btree index of the table leads with exactly the key's columns (in any order): what a merge join reads
_KEY_INDEX = (
    "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_am am ON am.oid = c.relam WHERE i.indrelid = to_regclass(%s) AND i.indisvalid AND i.indpred IS NULL "
    "AND am.amname = 'btree' AND i.indnkeyatts >= %s AND (SELECT count(*) FROM pg_attribute a "
    "WHERE a.attrelid = i.indrelid AND a.attnum = ANY ((i.indkey::int2[])[0:%s]) AND a.attname = ANY (%s)) = %s)"
)


def to_csv(data: pa.Table | pa.RecordBatch) -> io.BytesIO:
    """Arrow rows as CSV for ``COPY ... (FORMAT csv)``: NULL unquoted and empty, every value quoted."""
    buf = io.BytesIO()
    pacsv.write_csv(data, buf, _CSV)
    buf.seek(0)
    return buf


class _CsvChunks(io.RawIOBase):
    """A stream of the chunks' CSV (:func:`to_csv`), each made when COPY has read the one before: a chunk still
    being produced is waited for; an error producing one is raised to COPY's reader (the COPY fails)."""

    def __init__(self, chunks: Iterable[pa.Table | pa.RecordBatch]) -> None:
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")
        self._pos = 0
        self.error: BaseException | None = None  # what making a chunk raised (psycopg2 does not pass it on)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while self._pos >= len(self._buf):
            try:
                chunk = next(self._chunks, None)
                if chunk is None:
                    return b""
                self._buf, self._pos = to_csv(chunk).getbuffer(), 0
            except BaseException as e:
                self.error = e
                raise
        end = len(self._buf) if size is None or size < 0 else self._pos + size
        out = bytes(self._buf[self._pos : end])
        self._pos += len(out)
        return out


def connect(dsn: str) -> Any:
    try:
        return psycopg2.connect(dsn)
    except psycopg2.OperationalError as e:
        raise TransientTargetError(
            f"cannot connect to PostgreSQL target {redact_dsn(dsn)}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else e}"
        ) from None


def copy_csv_sql(name: str, columns: Sequence[str]) -> str:
    """``COPY name (columns) FROM STDIN`` of CSV; ``name`` already quoted."""
    return f"COPY {name} ({', '.join(quote_ident(c) for c in columns)}) FROM STDIN WITH (FORMAT csv)"


def copy_in(cur: Any, name: str, columns: Sequence[str], data: pa.Table) -> None:
    """One COPY of ``data`` into ``name``, its CSV made a slice at a time as COPY reads it."""
    stream = _CsvChunks(data.to_batches(max_chunksize=slice_rows(data.nbytes, data.num_rows)))
    try:
        cur.copy_expert(copy_csv_sql(name, columns), stream, size=1 << 20)
    except psycopg2.Error:
        if stream.error is not None:
            raise stream.error from None
        raise


class PgSession(Session):
    dialect = POSTGRESQL
    db_errors = (psycopg2.Error,)

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)
        self.cur = self.conn.cursor()
        self.cur.execute("SET jit = off")  # apply's joins gain nothing from JIT and would pay its compile per unit
        # the target's rows are in memory while a unit applies: an index probe per worktable row costs about what a
        # page read in order does, so a worktable much smaller than its table is joined through the key's index, not
        # by a scan of the whole table per part of a transaction applied ahead (bench/bigtxn --tables narrow --shapes
        # update); a large one is merged along that index (:meth:`before_joins`)
        self.cur.execute("SET random_page_cost = 1.1")
        self.conn.commit()
        self._merging = False  # this transaction's joins told to merge (enable_hashjoin off, :meth:`before_joins`)

    def before_joins(self, ts: TableSchema, rows: int) -> None:
        """A large worktable joined by a key the target's table has a btree index on is merge-joined (hash joins
        off for the rest of the transaction, or until a table that is not); anything else is left to the
        planner. A key compared by ``IS NOT DISTINCT FROM`` (it may hold NULLs) or as text cannot be merged."""
        n = len(ts.key)
        merge = (
            rows >= MERGE_MIN_ROWS
            and not ts.bag
            and n > 0
            and all(not ts.column(k).nullable and ts.column(k).has_equality for k in ts.key)
            and bool(self.query(_KEY_INDEX, (self.dialect.table(ts.table), n, n - 1, list(ts.key), n))[0][0])
        )
        if merge != self._merging:
            self.cur.execute("SET LOCAL enable_hashjoin TO " + ("off" if merge else "DEFAULT"))
            self._merging = merge

    def fit_join(self, rows: int) -> None:
        """Give this transaction's joins the memory a worktable of ``rows`` rows needs (never less than the
        server's setting; back to it at the transaction's end)."""
        need = min(rows * JOIN_ROW_BYTES, JOIN_MEM_MAX) >> 10
        if need > 4096:  # PostgreSQL's default work_mem, 4MB
            self.cur.execute(
                "SELECT set_config('work_mem', CASE WHEN pg_size_bytes(current_setting('work_mem')) < %s "
                "THEN %s ELSE current_setting('work_mem') END, true)",
                (need << 10, f"{need}kB"),
            )

    def begin(self) -> None:
        if self.conn.status != psycopg2.extensions.STATUS_READY:
            self.conn.rollback()
        self._merging = False

    def commit(self) -> None:
        self.conn.commit()
        self._merging = False

    def rollback(self) -> None:
        self.conn.rollback()
        self._merging = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.cur.execute(sql, tuple(params) if params else None)

    def dml(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.cur.execute(sql, tuple(params) if params else None)
        return int(self.cur.rowcount)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self.cur.execute(sql, tuple(params) if params else None)
        return list(self.cur.fetchall())

    def load(self, name: str, columns: Sequence[str], data: pa.Table) -> None:
        self.execute(self.dialect.create_worktable(name, columns))
        copy_in(self.cur, name, columns, data)
        self.fit_join(data.num_rows)

    def insert_rows(self, ts: TableSchema, data: Iterable[pa.Table]) -> int:
        """One COPY, fed each chunk's CSV as the chunk comes. An error making a chunk fails the COPY (psycopg2
        reports it as a cancelled statement) and is raised as itself."""
        stream = _CsvChunks(data)
        try:
            self.cur.copy_expert(copy_csv_sql(self.dialect.table(ts.table), ts.column_names), stream, size=1 << 20)
        except psycopg2.Error:
            if stream.error is not None:
                raise stream.error from None
            raise
        return int(self.cur.rowcount)

    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """COPY the file as it is: PostgreSQL parses its CSV itself."""
        with open(path, "rb") as f:
            if header:
                f.readline()
            self.cur.copy_expert(copy_csv_sql(self.dialect.table(ts.table), ts.column_names), f, size=1 << 20)
        return int(self.cur.rowcount)

    def table_columns(self, table: str) -> list[str] | None:
        rows = self.query(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (self.dialect.table(table),),
        )
        return [r[0] for r in rows] or None

    def tables_columns(self, tables: Sequence[str]) -> dict[str, list[str] | None]:
        """One catalog query (one round trip) for all of ``tables``."""
        found: dict[str, list[str]] = {}
        if tables:
            rows = self.query(
                "SELECT t.i, a.attname FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i) JOIN pg_attribute a "
                "ON a.attrelid = to_regclass(t.name) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY t.i, a.attnum",
                ([self.dialect.table(t) for t in tables],),
            )
            for i, column in rows:
                found.setdefault(tables[int(i) - 1], []).append(column)
        return {t: found.get(t) for t in tables}

    def user_indexes(self, table: str) -> list[tuple[str, str]]:
        rows = self.query(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass(%s) "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)",
            (self.dialect.table(table),),
        )
        return [(n, q) for n, q in rows if not n.startswith(OWN_INDEX)]

    def is_data_error(self, exc: BaseException) -> bool:
        code = getattr(exc, "pgcode", None)
        return isinstance(exc, psycopg2.Error) and bool(code) and str(code)[:2] in _DATA_CLASSES

    def error_text(self, exc: BaseException) -> str:
        diag = getattr(exc, "diag", None)
        primary = getattr(diag, "message_primary", None) if diag else None
        return str(primary) if primary else super().error_text(exc)

    def reusable(self) -> bool:
        if self.conn.closed or self.conn.get_transaction_status() != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            return False
        try:  # an idle connection has nothing to read, unless the server ended it (a FATAL message, then EOF)
            readable, _, _ = select.select([self.conn.fileno()], [], [], 0)
        except (OSError, ValueError, psycopg2.Error):
            return False
        return not readable

    def reset(self) -> bool:
        if self.conn.closed:
            return False
        if self.conn.get_transaction_status() in (
            psycopg2.extensions.TRANSACTION_STATUS_INTRANS,
            psycopg2.extensions.TRANSACTION_STATUS_INERROR,
        ):
            self.conn.rollback()
        return self.reusable()

    def disconnect(self) -> None:
        self.conn.close()
