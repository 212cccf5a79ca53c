"""PostgreSQL target. Worktables are loaded with COPY (CSV, written by pyarrow).

Units of up to ``parallel_rows`` net rows (default 1,000,000; the changes count when the net rows' is not known) go
through the driver: TEMP worktables, COPY from the driver's Arrow rows, and net inserts COPYed straight into the table
(bench/apply.py, update-heavy, 200,000 net inserts, JIT-warm: applied in 1.5 s through Spark tasks and a worktable,
1.3 s so).
Larger units do not funnel through one Python process: the driver creates UNLOGGED worktables with unit-unique names and
commits them, Spark tasks (``mapInArrow`` over the unit's net rows) each open a connection and COPY their rows in, then
the driver's transaction runs the set-based statements and the position, and drops the worktables. The same job scales
out on a cluster. Loaded row counts come back from the tasks and are checked against what the statements touch, so a
task that ran twice cannot insert twice.
"""

from __future__ import annotations

import contextlib
import io
import select
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from mirrorline import limits
from mirrorline.apply import rows as work_rows
from mirrorline.apply import types as type_map
from mirrorline.apply.engine import Target, TargetRead, check_unknown_types
from mirrorline.apply.session import Session
from mirrorline.apply.sql import OWN_INDEX, STATE_TABLE, Dialect
from mirrorline.apply.stage import Stager, generic_flatten, pick
from mirrorline.apply.state import parse as parse_state
from mirrorline.config import redact_dsn
from mirrorline.errors import TargetError, TransientTargetError
from mirrorline.model import Column, TableSchema, quote_ident

if TYPE_CHECKING:
    from mirrorline.compile.batch import NetBatch

_DATA_CLASSES = ("22", "23", "P0")  # data exception, integrity constraint, raised by a target trigger
_CSV = pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
WORK_PREFIX = "mirrorline_w_"


class PostgresDialect(Dialect):
    name = "postgresql"
    default_schema = "public"
    param = "%s"
    ordered_inserts = True  # rows in key order meet the key's index page by page
    parallel_load = True
    row_id = "ctid"

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        """PostgreSQL holds its own types; whether the target database has a user-defined type is checked against it.
        Text types are assigned without an explicit cast so that a too-long value is an error, not a truncation."""
        b = type_map.base_type(col.type_name)
        if b in type_map.TEXT_TYPES:
            return type_map.TypeInfo(col.type_name, col.type_name, "text")
        return type_map.TypeInfo(col.type_name, col.type_name, "cast")

    def text_param(self) -> str:
        return "CAST(%s AS text)"

    def key_operands(self, target: str, text: str, info: type_map.TypeInfo, table: str, col: Column) -> tuple[str, str]:
        """A type without ``=`` (json, xml, the geometric types: part of a bag table's key) is compared as its text,
        which PostgreSQL writes the same way at the source and here."""
        if col.has_equality:
            return super().key_operands(target, text, info, table, col)
        return f"CAST({target} AS text)", text

    def truncate(self, table: str) -> str:
        return f"TRUNCATE {self.table(table)}"


POSTGRESQL = PostgresDialect()


def to_csv(data: pa.Table) -> io.BytesIO:
    """Arrow rows as CSV for ``COPY ... (FORMAT csv)``: NULL unquoted and empty, every value quoted."""
    buf = io.BytesIO()
    pacsv.write_csv(data, buf, _CSV)
    buf.seek(0)
    return buf


class _CsvChunks(io.RawIOBase):
    """A stream of the chunks' CSV (:func:`to_csv`), each made when COPY has read the one before: a chunk still
    being produced is waited for; an error producing one is raised to COPY's reader (the COPY fails)."""

    def __init__(self, chunks: Iterable[pa.Table]) -> None:
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
    cur.copy_expert(copy_csv_sql(name, columns), to_csv(data), size=1 << 20)


class PgSession(Session):
    dialect = POSTGRESQL
    db_errors = (psycopg2.Error,)

    def __init__(self, dsn: str) -> None:
        self.conn = connect(dsn)
        self.cur = self.conn.cursor()

    def begin(self) -> None:
        if self.conn.status != psycopg2.extensions.STATUS_READY:
            self.conn.rollback()

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        self.conn.rollback()

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

    def insert_rows(self, table: str, columns: Sequence[str], data: Iterable[pa.Table]) -> int:
        """One COPY, fed each chunk's CSV as the chunk comes. An error making a chunk fails the COPY (psycopg2
        reports it as a cancelled statement) and is raised as itself."""
        stream = _CsvChunks(data)
        try:
            self.cur.copy_expert(copy_csv_sql(self.dialect.table(table), columns), stream, size=1 << 20)
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


class PostgresTarget(Target):
    kind = "postgresql"
    direct_inserts = True  # COPY parses text with the column's input function, exactly as CAST(text AS type)
    dialect = POSTGRESQL

    def __init__(self, *args: Any, parallel_rows: int = limits.PARALLEL_ROWS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parallel_rows = parallel_rows  # units with at least this many net rows load worktables from Spark tasks
        self._lock_conn: Any = None  # the applier lock's connection, kept open between units

    def connect(self) -> Session:
        return PgSession(self.location)

    # the applier lock: an advisory lock (LOCK_CLASS, hashtext of the state table), on a connection of its own that
    # stays open between units (one round trip to take it, one to let it go)
    LOCK_CLASS = 0x6D6C  # "ml"

    def try_lock(self) -> Any:
        from mirrorline.apply.lock import holder_text

        for attempt in (1, 2):  # (a kept connection the server closed meanwhile: once more on a new one)
            conn = self._lock_conn
            fresh = conn is None or conn.closed
            if fresh:
                conn = self._lock_conn = connect(self.location)
                conn.autocommit = True
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT set_config('application_name', %s, false), pg_try_advisory_lock(%s, hashtext(%s))",
                        (f"mirrorline applier: {holder_text()}"[:63], self.LOCK_CLASS, self.dialect.own(STATE_TABLE)),
                    )
                    got = cur.fetchone()[1]
            except psycopg2.Error:
                self._drop_lock_conn()
                if fresh or attempt == 2:
                    raise
                continue
            return conn if got else None
        return None

    def unlock(self, handle: Any) -> None:
        try:
            with handle.cursor() as cur:
                cur.execute(
                    "SELECT pg_advisory_unlock(%s, hashtext(%s))", (self.LOCK_CLASS, self.dialect.own(STATE_TABLE))
                )
        except psycopg2.Error:
            self._drop_lock_conn()  # (the session's advisory lock goes with it)

    def _drop_lock_conn(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()

    def close(self) -> None:
        self._drop_lock_conn()
        super().close()

    def lock_holder(self) -> str:
        conn = connect(self.location)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objsubid = 2 "
                    "AND l.objid = (hashtext(%s)::bigint & 4294967295)::text::oid AND l.database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())",
                    (self.LOCK_CLASS, self.dialect.own(STATE_TABLE)),
                )
                row = cur.fetchone()
        finally:
            conn.close()
        return f"backend pid {row[0]}, {row[1] or 'no application name'}" if row else "a process that just let go"

    def check_types(self, session: Session, schemas: Any) -> None:
        schemas = list(schemas)
        super().check_types(session, schemas)

        def known(type_name: str) -> bool:
            return session.query("SELECT to_regtype(%s) IS NOT NULL", (type_name,))[0][0] is True

        check_unknown_types(self.dialect, schemas, known)

    @contextlib.contextmanager
    def consistent_read(self) -> Iterator[TargetRead]:
        """A REPEATABLE READ, READ ONLY transaction of its own, in the canonical session settings (``TimeZone =
        UTC``): PostgreSQL prints every value in canonical text itself
        (:func:`mirrorline.verify.canonical.select_text`), read through a server-side cursor."""
        from mirrorline.snapshot.source import SESSION_SETTINGS

        conn = connect(self.location)
        try:
            with conn.cursor() as cur:
                for stmt in (*SESSION_SETTINGS, "SET TimeZone = 'UTC'"):
                    cur.execute(stmt)
                conn.commit()
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield _PgRead(self, conn)
        finally:
            with contextlib.suppress(Exception):
                conn.rollback()
            conn.close()

    def stager(self, batch: NetBatch, schemas: Mapping[str, TableSchema], tables: list[str]) -> Stager:
        rows = batch.net_rows if batch.net_rows is not None else batch.changes
        if not batch.on_driver and (rows >= self.parallel_rows > 0 or self.parallel_rows == 0):
            return SparkCopyStager(self.location, batch, schemas, tables)
        return super().stager(batch, schemas, tables)


class _PgRead(TargetRead):
    def __init__(self, target: PostgresTarget, conn: Any) -> None:
        self.target, self.conn = target, conn
        d = target.dialect
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s) IS NOT NULL", (d.own(STATE_TABLE),))
            found = cur.fetchone()[0]
            rows = []
            if found:
                cur.execute(d.read_state())
                rows = cur.fetchall()
        self.position = parse_state(rows).live  # (a table stopped alone is behind it: verify does not compare it)

    def columns(self, table: str) -> list[str] | None:
        with self.conn.cursor() as cur:
            cur.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped "
                "ORDER BY attnum",
                (self.target.dialect.table(table),),
            )
            have = [r[0] for r in cur.fetchall()]
        return have or None

    def rows(self, ts: TableSchema) -> Iterator[list[Sequence[str | None]]]:
        from mirrorline.verify.canonical import select_text

        cols = ", ".join(select_text(quote_ident(c.name), c.type_name) for c in ts.columns)
        with self.conn.cursor(name="mirrorline_verify_t") as cur:
            cur.itersize = 10_000
            cur.execute(f"SELECT {cols} FROM {self.target.dialect.table(ts.table)}")
            while batch := cur.fetchmany(10_000):
                yield batch


class SparkCopyStager(Stager):
    """Worktables loaded by Spark tasks in parallel (see the module's docstring)."""

    def __init__(self, dsn: str, batch: NetBatch, schemas: Mapping[str, TableSchema], tables: list[str]) -> None:
        self.dsn = dsn
        unit = uuid.uuid4().hex[:12]
        self.plan: dict[tuple[str, str], str] = {}
        for i, t in enumerate(tables):
            for kind in work_rows.KINDS:
                self.plan[(t, kind)] = f'"public".{quote_ident(f"{WORK_PREFIX}{unit}_{i}_{kind.lower()}")}'
        self.dropped: set[str] = set()
        conn = connect(dsn)
        try:
            with conn.cursor() as cur:
                for (t, kind), name in self.plan.items():
                    cur.execute(POSTGRESQL.create_worktable(name, work_rows.work_columns(schemas[t], kind), "unlogged"))
            conn.commit()
        finally:
            conn.close()
        self.counts: dict[tuple[str, str], int] = {}
        try:
            load = _task_loader(dsn, {k: (v, schemas[k[0]]) for k, v in self.plan.items()})
            flat = generic_flatten(batch.frame(), schemas, tables)
            out = flat.mapInArrow(load, "table STRING, kind STRING, n BIGINT")
            for row in out.collect():  # a row per task and (table, kind): summed here, no shuffle for it
                key = (row[0], row[1])
                self.counts[key] = self.counts.get(key, 0) + int(row[2])
        except Exception as e:
            self.close()
            raise TargetError(f"loading worktables from Spark tasks failed: {str(e).strip()[:500]}") from e

    def stage(self, s: Session, ts: TableSchema, kind: str) -> tuple[str, int] | None:
        n = self.counts.get((ts.table, kind), 0)
        return (self.plan[(ts.table, kind)], n) if n else None

    def finish(self, s: Session, table: str) -> None:
        for kind in work_rows.KINDS:
            s.execute(POSTGRESQL.drop_table(self.plan[(table, kind)]))

    def close(self) -> None:
        conn = connect(self.dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                for name in self.plan.values():
                    cur.execute(POSTGRESQL.drop_table(name))
        finally:
            conn.close()


def _task_loader(dsn: str, plan: dict[tuple[str, str], tuple[str, TableSchema]]) -> Any:
    """The function each Spark task runs over its flattened net rows (:func:`generic_flatten`): COPY each
    (table, kind) group into its worktable, commit at the end of the partition, report the row counts."""

    def load(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts: dict[tuple[str, str], int] = {}
        conn = None
        try:
            for b in batches:
                if b.num_rows == 0:
                    continue
                if conn is None:
                    conn = psycopg2.connect(dsn)
                flat = pa.Table.from_batches([b])
                with conn.cursor() as cur:
                    for t in pc.unique(flat["table"]).to_pylist():
                        rows = work_rows.select(flat, t)
                        for kind in work_rows.KINDS:
                            if (t, kind) not in plan:
                                continue
                            name, ts = plan[(t, kind)]
                            part = pick(rows, ts, kind)
                            if part.num_rows:
                                copy_in(cur, name, part.column_names, part)
                                counts[(t, kind)] = counts.get((t, kind), 0) + part.num_rows
            if conn is not None:
                conn.commit()
        finally:
            if conn is not None:
                conn.close()
        yield pa.RecordBatch.from_pylist(
            [{"table": t, "kind": k, "n": n} for (t, k), n in counts.items()],
            schema=pa.schema([("table", pa.string()), ("kind", pa.string()), ("n", pa.int64())]),
        )

    return load
