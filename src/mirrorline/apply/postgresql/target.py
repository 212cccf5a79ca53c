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
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline import limits
from mirrorline.apply import rows as work_rows
from mirrorline.apply.canonical import SESSION_SETTINGS, select_text
from mirrorline.apply.engine import SqlTarget, check_unknown_types
from mirrorline.apply.lock import holder_text
from mirrorline.apply.postgresql.dialect import POSTGRESQL
from mirrorline.apply.postgresql.session import PgSession, connect, copy_in
from mirrorline.apply.session import Session
from mirrorline.apply.sql import STATE_TABLE
from mirrorline.apply.stage import Stager, generic_flatten, pick
from mirrorline.apply.state import parse as parse_state
from mirrorline.apply.target import TargetRead
from mirrorline.errors import TargetError
from mirrorline.model import TableSchema, quote_ident

if TYPE_CHECKING:
    from mirrorline.compile.batch import NetBatch

WORK_PREFIX = "mirrorline_w_"


class PostgresTarget(SqlTarget):
    kind = "postgresql"
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
        (:func:`mirrorline.apply.canonical.select_text`), read through a server-side cursor."""
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
        cols = ", ".join(select_text(quote_ident(c.name), c.type_name) for c in ts.columns)
        with self.conn.cursor(name="mirrorline_verify_t") as cur:
            cur.itersize = 10_000
            cur.execute(f"SELECT {cols} FROM {self.target.dialect.table(ts.table)}{self.target.current_only(ts)}")
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
        if n and isinstance(s, PgSession):
            s.fit_join(n)
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
