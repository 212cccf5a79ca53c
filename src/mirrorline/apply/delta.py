"""Delta Lake target: one Delta table per replicated table under the target's folder, written with delta-rs (the
``deltalake`` package: no JVM, no jars).

- A table's folder is its name at the target (``public.orders`` -> ``orders``, ``sales.orders`` -> ``sales.orders``).
- Each unit's net changes of a table are **one Delta commit**: a MERGE (deletes; updates of only the columns that
  were sent; inserts; in ``mirror`` mode an update of a missing row inserts it), or, for a table the unit truncates,
  an overwrite. The commit carries the target's position: Delta's application transaction (``txn``) with app id =
  the target's name and version = the position's LSN, a second one ``<name>.seq`` with its sequence, and
  ``mirrorline.position`` in the commit's metadata. The table's position is read back from its ``txn`` versions
  (they survive checkpoints): a table whose last commit holds the unit is skipped after a crash (exactly once per
  table). Tables are separate Delta tables: a reader may see one table a unit ahead of another.
- mirrorline's own state (the unit end every table has reached, the snapshot state, rejects) lives beside them in
  ``_mirrorline.sqlite``, the same tables as on a SQLite target (:mod:`mirrorline.apply.state`). A table's own
  position is the later of its Delta ``txn`` and that file's.
- Values arrive as PostgreSQL's text and are converted by DuckDB's casts (in memory) into the Arrow types of the
  table (:meth:`DeltaDialect.type_info`). The checks a database's constraints make elsewhere (the row to delete or
  update exists, the key to insert does not) are made before the commit, against the table's current version: a
  failing net change stops the unit with nothing written, or (``on_error = "reject"``) is set aside in
  ``mirrorline_rejects`` as one row per net change (its key, kind and image, and the position of its last change).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply import types as type_map
from mirrorline.apply.chunks import read_chunk
from mirrorline.apply.engine import Target, TargetRead, _Unit, deal
from mirrorline.apply.lock import FileLock
from mirrorline.apply.reshape import Step, as_rebuild, plan, stop
from mirrorline.apply.session import Session
from mirrorline.apply.sql import MASK_COL, MASK_SEP, key_col, lit, moved_col, parse_mask
from mirrorline.apply.sqlite import SqliteDialect, SqliteSession
from mirrorline.apply.state import AppliedState, write_shape
from mirrorline.apply.state import ensure as ensure_state
from mirrorline.apply.state import now as now_stamp
from mirrorline.apply.state import parse as parse_state
from mirrorline.apply.state import read as read_state
from mirrorline.errors import ApplyError, TargetError, TransientTargetError, first_line
from mirrorline.model import Column, TableSchema, quote_ident, split_table_name
from mirrorline.position import ZERO, Position

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

STATE_FILE = "_mirrorline.sqlite"
LOCK_FILE = "_mirrorline.lock"  # the applier lock (mirrorline.apply.lock)
COMMIT_ATTEMPTS = 5  # a table's commit of a unit, redone when a concurrent commit (a compaction) won
OP_COL, GROUP_COL = "_ml_op", "_ml_group"

# Delta type -> (DuckDB type its text is cast to, Arrow type written)
_TYPES: dict[str, tuple[str, pa.DataType]] = {
    "short": ("SMALLINT", pa.int16()),
    "integer": ("INTEGER", pa.int32()),
    "long": ("BIGINT", pa.int64()),
    "float": ("REAL", pa.float32()),
    "double": ("DOUBLE", pa.float64()),
    "boolean": ("BOOLEAN", pa.bool_()),
    "date": ("DATE", pa.date32()),
    "timestamp_ntz": ("TIMESTAMP", pa.timestamp("us")),
    "timestamp": ("TIMESTAMPTZ", pa.timestamp("us", tz="UTC")),
    "binary": ("BLOB", pa.binary()),
    "string": ("VARCHAR", pa.string()),
}
_INTS = {"smallint": "short", "integer": "integer", "bigint": "long", "oid": "long"}
_FLOATS = {"real": "float", "double precision": "double"}
_TIMES = {
    "date": "date",
    "timestamp without time zone": "timestamp_ntz",
    "timestamp": "timestamp_ntz",
    "timestamp with time zone": "timestamp",
    "timestamptz": "timestamp",
}
_STRING_TYPES = {"uuid", "json", "jsonb", "time", "time without time zone"}


class DeltaDialect(SqliteDialect):
    """The type mapping of the Delta target. mirrorline's own tables are SQLite's (``_mirrorline.sqlite``)."""

    name = "delta"

    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        b = type_map.base_type(col.type_name)
        if b.endswith("[]") or b in type_map.TEXT_TYPES or b in type_map.AS_TEXT_TYPES or b in _STRING_TYPES:
            return type_map.TypeInfo(col.type_name, "string", "text")
        if b in _INTS:
            return type_map.TypeInfo(col.type_name, _INTS[b], "cast")
        if b in _FLOATS:
            return type_map.TypeInfo(col.type_name, _FLOATS[b], "cast")
        if b == "boolean":
            return type_map.TypeInfo(col.type_name, "boolean", "cast")
        if b == "bytea":
            return type_map.TypeInfo(col.type_name, "binary", "bytea")
        if b == "numeric":
            ps = type_map.decimal(col.type_name)
            if ps is not None:  # Delta's decimals have no NaN
                return type_map.TypeInfo(col.type_name, f"decimal({ps[0]},{ps[1]})", "cast", type_map.NAN)
            return type_map.TypeInfo(col.type_name, "string", "text")
        if b in _TIMES:  # Delta's dates and timestamps: years 1 to 9999
            return type_map.TypeInfo(col.type_name, _TIMES[b], "time", type_map.OUTSIDE_1_9999)
        return type_map.TypeInfo(col.type_name, "string", "text")  # every other type as PostgreSQL's text of it

    def arrow_type(self, info: type_map.TypeInfo) -> pa.DataType:
        t = info.target_type
        if t.startswith("decimal("):
            p, s = (int(x) for x in t[len("decimal(") : -1].split(","))
            return pa.decimal128(p, s)
        return _TYPES[t][1]

    def arrow_schema(self, ts: TableSchema) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, self.arrow_type(self.type_info(ts.table, c)), nullable=True) for c in ts.columns]
        )

    def convert(self, expr: str, ts: TableSchema, col: Column) -> str:
        """DuckDB SQL turning the text ``expr`` into the column's value (an error names table, column and value)."""
        info = self.type_info(ts.table, col)
        if info.conv == "text":
            return expr
        where = lit(f"{ts.table}.{col.name}: ")
        if info.conv == "bytea":
            bad = f"error({where} || 'not a bytea value: ' || {expr})"
            return f"CASE WHEN starts_with({expr}, '\\x') THEN unhex(substr({expr}, 3)) ELSE {bad} END"
        decimal = info.target_type.startswith("decimal(")
        duck = info.target_type.upper() if decimal else _TYPES[info.target_type][0]
        text = type_map.duck_temporal(expr) if info.conv == "time" else expr
        return type_map.lossy_sql(expr, info.lossy, f"CAST({text} AS {duck})")

    def bad_value(self, expr: str, info: type_map.TypeInfo) -> str | None:
        """DuckDB SQL true for a text ``expr`` that :meth:`convert` refuses (None: every text converts)."""
        if info.conv == "text":
            return None
        if info.conv == "bytea":
            return f"({expr} IS NOT NULL AND NOT regexp_full_match({expr}, '\\\\x([0-9a-fA-F]{{2}})*'))"
        decimal = info.target_type.startswith("decimal(")
        duck = info.target_type.upper() if decimal else _TYPES[info.target_type][0]
        text = type_map.duck_temporal(expr) if info.conv == "time" else expr
        bad = f"({expr} IS NOT NULL AND TRY_CAST({text} AS {duck}) IS NULL)"
        cond = type_map.LOSSY[info.lossy].null_if if info.lossy else None
        if cond:
            return f"({bad} AND NOT {cond.format(expr)})"
        return bad

    def table_dir(self, root: Path, table: str) -> Path:
        """``public.orders`` -> ``orders``; ``sales.orders`` (and a public name holding a dot) -> ``schema.name``.
        A name never leaves the folder or meets mirrorline's own files: ``/``, ``\\``, ``%``, ``~`` and a leading dot
        (``..``) are written ``~XX`` (their code in hex), and so is a dot in the schema and a name that is one of this
        folder's own files."""
        schema, name = split_table_name(table)
        if schema == "public" and "." not in name:
            return root / _folder_part(name)
        return root / f"{_folder_part(schema).replace('.', '~2E')}.{_folder_part(name)}"


DELTA = DeltaDialect()


def commit_properties(target: str, position: Position) -> Any:
    """A commit carrying the target's position: two application transactions and the commit's metadata."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(
        custom_metadata={"mirrorline.target": target, "mirrorline.position": str(position)},
        app_transactions=[Transaction(target, position.lsn), Transaction(f"{target}.seq", position.seq)],
    )


def table_position(dt: DeltaTable, target: str) -> Position:
    """What the table's last commit by ``target`` applied (ZERO: none yet)."""
    lsn = dt.transaction_version(target)
    if lsn is None:
        return ZERO
    return Position(int(lsn), int(dt.transaction_version(f"{target}.seq") or 0))


def _open(path: Path) -> DeltaTable | None:
    """The Delta table in ``path`` (None: there is none); one whose log cannot be read is a TargetError."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        return DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None
    except (DeltaError, OSError) as e:
        raise TargetError(
            f"cannot read the Delta table in {path}: {first_line(e)}",
            hint="repair the table (or move the folder away and snapshot the table again)",
            path=str(path),
        ) from e


def duck_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    return con


class DeltaSession(SqliteSession):
    """A transaction on ``_mirrorline.sqlite`` plus the Delta writes of a snapshot's load: the tables emptied
    (:meth:`truncate`) are overwritten at :meth:`commit`, each in one Delta commit with the position the transaction
    gave it, before the state file commits (a crash in between leaves the load ``loading``: it is loaded again)."""

    dialect = DELTA
    db_errors: tuple[type[BaseException], ...] = (*SqliteSession.db_errors, duckdb.Error, OSError)

    def __init__(self, target: DeltaTarget) -> None:
        try:
            target.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TargetError(
                f"target {target.name}: cannot use {target.root} as the Delta target's folder: {e.strerror or e}",
                hint="point the target's url at a folder (delta:///relative/path or delta:////absolute/path)",
                target=target.name,
            ) from e
        super().__init__(str(target.root / STATE_FILE))
        self.target = target
        self._pending: dict[str, list[pa.Table]] = {}
        self._emptied: set[str] = set()
        self._con: duckdb.DuckDBPyConnection | None = None

    def begin(self) -> None:
        self._pending, self._emptied = {}, set()
        super().begin()

    def rollback(self) -> None:
        self._pending, self._emptied = {}, set()
        super().rollback()

    def truncate(self, table: str) -> None:
        self._pending[table] = []
        self._emptied.add(table)

    def load_chunk(self, ts: TableSchema, path: str | Path, header: bool = True) -> int:
        """The chunk's rows converted, kept until :meth:`commit` writes them (added to the table's rows, or in
        place of them when it was emptied in this transaction)."""
        self._pending.setdefault(ts.table, [])
        if self._con is None:
            self._con = duck_connection()
        n = 0
        for batch in read_chunk(path, ts.column_names, header):
            data = pa.Table.from_batches([batch]).rename_columns(list(ts.column_names))
            self._pending[ts.table].append(typed(self._con, data, ts, list(ts.column_names)))
            n += batch.num_rows
        return n

    def commit(self) -> None:
        if self._pending:
            state = read_state(self)  # as this transaction set it
            for table, parts in self._pending.items():
                position = state.table(table)
                self.target.write(table, parts, position, overwrite=table in self._emptied)
            self._pending, self._emptied = {}, set()
        super().commit()

    def table_columns(self, table: str) -> list[str] | None:
        dt = _open(self.dialect.table_dir(self.target.root, table))
        if dt is not None:
            return [f.name for f in dt.schema().fields]
        return super().table_columns(table)

    def is_data_error(self, exc: BaseException) -> bool:
        if isinstance(exc, duckdb.ConversionException | duckdb.InvalidInputException | duckdb.OutOfRangeException):
            return True
        return super().is_data_error(exc)

    def disconnect(self) -> None:
        if self._con is not None:
            self._con.close()
        super().disconnect()


def typed(con: duckdb.DuckDBPyConnection, data: pa.Table, ts: TableSchema, columns: Sequence[str]) -> pa.Table:
    """Text rows holding ``columns`` of ``ts`` -> the Delta table's Arrow types (every column of ``ts``, missing
    ones null)."""
    view = "mirrorline_text"
    con.register(view, data)
    try:
        have = set(columns)
        exprs = [
            (DELTA.convert(quote_ident(c.name), ts, c) if c.name in have else "NULL") + f" AS {quote_ident(c.name)}"
            for c in ts.columns
        ]
        out = con.sql(f"SELECT {', '.join(exprs)} FROM {view}").to_arrow_table()
    finally:
        con.unregister(view)
    return out.cast(DELTA.arrow_schema(ts))


@dataclass
class _Failure:
    kind: str  # D, U, I, M (the row to take unsent columns from)
    key: list[Any]
    position: str
    what: str
    image: dict[str, Any] | None
    error: ApplyError | None = None  # the error to stop with, when it is not the generic one
    op: str = ""  # the kind of the last change folded into the net change, when known (I, U, D)


class _DeltaRead(TargetRead):
    def __init__(self, target: DeltaTarget) -> None:
        self.target = target
        self.position = target.applied_positions().live  # (a table stopped alone is behind it: not compared)
        self._tables: dict[str, DeltaTable | None] = {}

    def _table(self, table: str) -> DeltaTable | None:
        if table not in self._tables:
            dt = _open(DELTA.table_dir(self.target.root, table))
            if dt is not None and table_position(dt, self.target.name) > self.position:
                self._as_of(table, dt)
            self._tables[table] = dt
        return self._tables[table]

    def _as_of(self, table: str, dt: DeltaTable) -> None:
        """A table one unit ahead of the target's position (its commit landed, the unit end not yet): read the
        version of its last commit at or before the position (later commits of others, such as a compaction,
        change no rows)."""
        name = self.target.name
        for commit in dt.history():
            pos = commit.get("mirrorline.position")
            if commit.get("mirrorline.target") == name and pos and Position.parse(pos) <= self.position:
                dt.load_as_version(int(commit["version"]))
                return
            if commit.get("operation") in ("CREATE TABLE", "CREATE OR REPLACE TABLE"):
                dt.load_as_version(int(commit["version"]))
                return
        raise TargetError(
            f"target {name}: {table} is ahead of the target's position {self.position} and its history no longer "
            "holds the version at that position",
            hint="run mirrorline again so that the target's position catches up with its tables, then verify",
            target=name,
            table=table,
        )

    def columns(self, table: str) -> list[str] | None:
        dt = self._table(table)
        return None if dt is None else [f.name for f in dt.schema().fields]

    def rows(self, ts: TableSchema) -> Iterator[list[Sequence[str | None]]]:
        from mirrorline.verify.canonical import native_text

        dt = self._table(ts.table)
        assert dt is not None
        convs = [native_text(c.type_name) for c in ts.columns]
        infos = [DELTA.type_info(ts.table, c) for c in ts.columns]
        # dates and timestamps as DuckDB's text of them: Python's have no year before 1 AD
        sel = ", ".join(
            type_map.duck_text(quote_ident(c.name), i.target_type == "timestamp")
            if i.conv == "time"
            else quote_ident(c.name)
            for c, i in zip(ts.columns, infos, strict=True)
        )
        con = duck_connection()
        try:
            for batch in dt.to_pyarrow_dataset().to_batches(columns=list(ts.column_names), batch_size=10_000):
                con.register("mirrorline_rows", batch)
                data = con.sql(f"SELECT {sel} FROM mirrorline_rows").to_arrow_table()
                con.unregister("mirrorline_rows")
                cols = [data.column(i).to_pylist() for i in range(data.num_columns)]
                yield [[f(v) for f, v in zip(convs, row, strict=True)] for row in zip(*cols, strict=True)]
        finally:
            con.close()


class DeltaTarget(Target):
    kind = "delta"
    dialect = DELTA

    def __init__(self, name: str, location: str, **kwargs: Any) -> None:
        kwargs.pop("parallel_rows", None)
        super().__init__(name, location, **kwargs)
        self.root = Path(location)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def lock_file(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(self.root / LOCK_FILE)

    def connect(self) -> Session:
        return DeltaSession(self)

    def _lock(self, table: str) -> threading.Lock:
        """Held by this process's commits to one Delta table (apply, a load, a compaction): they wait for each other
        rather than conflict."""
        with self._locks_lock:
            return self._locks.setdefault(table, threading.Lock())

    def path(self, table: str) -> Path:
        return self.dialect.table_dir(self.root, table)

    def delta_table(self, table: str) -> DeltaTable | None:
        return _open(self.path(table))

    def tables(self) -> dict[str, DeltaTable]:
        """The Delta tables under the target's folder, by folder name."""
        out = {}
        if self.root.is_dir():
            for p in sorted(self.root.iterdir()):
                dt = _open(p) if p.is_dir() else None
                if dt is not None:
                    out[p.name] = dt
        return out

    # -- state -----------------------------------------------------------------------------------------------------
    def applied_positions(self) -> AppliedState:
        s = self.session()
        try:
            self._prepare(s)
            base = parse_state(s.query(self.dialect.read_state()))
        finally:
            s.close()
        tables = dict(base.tables)
        for folder, dt in self.tables().items():
            table = _table_of(folder)
            tables[table] = max(tables.get(table, ZERO), table_position(dt, self.name))
        return dataclasses.replace(base, tables=tables)

    @contextlib.contextmanager
    def consistent_read(self) -> Iterator[TargetRead]:
        """The target's applied position and each table as of it: its current version, or (a table whose commit of
        a later unit landed before the unit end) the version of its last commit at or before the position."""
        yield _DeltaRead(self)

    # -- schema ----------------------------------------------------------------------------------------------------
    def follow_schema(self, schemas: Sequence[TableSchema], state: AppliedState) -> list[str]:
        """Before a unit: each table's Delta schema taken from the shape it has (recorded with the target's state)
        to the unit's. Columns added without a value for the existing rows are added to the table's schema; any
        other change (drop, rename, type, key, an added column whose existing rows hold a default) rewrites the table
        in one commit that keeps its position. The shape is recorded after the table's commit: a crash in between
        makes the rewrite again, which finds it made."""
        done: list[str] = []
        for ts in schemas:
            recorded = state.shapes.get(ts.table)
            shape = state.shape_docs.get(ts.table)
            if shape is None and recorded and self.schema_version is not None:
                shape = self.schema_version(ts.table, recorded)
            if shape is None and self.schema_at is not None:
                shape = self.schema_at(ts.table, state.table(ts.table))
            dt = self.delta_table(ts.table)
            if dt is None or shape is None:
                done += self.ensure_schema([ts], record=False)
            else:
                keep, follow = self.table_policy(ts.table)
                have = [f.name for f in dt.schema().fields]
                steps = plan(shape, ts, have, target=self.name, keep_dropped=keep, follow=follow, rebuild=True)
                if any(st.kind != "add" or st.column.missing_value is not None for st in steps):
                    step = steps[0] if steps[0].kind == "rebuild" else as_rebuild(shape, ts, steps, have)
                    self._rewrite(ts, step)
                    done.append(f"{ts.table}: {step.describe()}")
                    log.info("target %s: schema change committed: %s", self.name, done[-1])
                elif steps:
                    done += self.ensure_schema([ts], record=False)
            if recorded != ts.version or shape != ts:
                with self.transaction() as s:
                    ensure_state(s)
                    write_shape(s, ts, ts.version)
        return done

    def _rewrite(self, ts: TableSchema, step: Step) -> None:
        """Write the table again as ``step`` (a rebuild) says: its columns renamed, dropped, converted to their new
        types, new ones filled with the value existing rows hold; one commit, the table's position kept."""
        from deltalake import write_deltalake

        assert step.shape is not None
        sources = dict(step.sources)
        want = self.dialect.arrow_schema(step.shape)
        with self._lock(ts.table):
            dt = self.delta_table(ts.table)
            assert dt is not None
            data = dt.to_pyarrow_table()
            cols = []
            con = duck_connection()
            try:
                for c, f in zip(step.shape.columns, want, strict=True):
                    src = sources.get(c.name)
                    if src is not None:
                        try:
                            cols.append(data[src].cast(f.type))
                        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                            raise stop(
                                ts,
                                self.name,
                                f"{step.describe()}, and the table's values do not fit it: {first_line(e)}",
                            ) from e
                    elif c.missing_value is not None:
                        one = con.execute(f"SELECT {self.dialect.convert(lit(c.missing_value), ts, c)}").fetchone()
                        value = one[0] if one else None
                        cols.append(pa.array([value] * data.num_rows, f.type))
                    else:
                        cols.append(pa.nulls(data.num_rows, f.type))
            finally:
                con.close()
            props = commit_properties(self.name, table_position(dt, self.name))
            with self._writing(ts.table, table_position(dt, self.name), redo=False):
                write_deltalake(
                    dt, pa.table(cols, schema=want), mode="overwrite", schema_mode="overwrite", commit_properties=props
                )

    def recreate(self, schemas: Iterable[TableSchema]) -> None:
        self.ensure_schema(schemas)

    def ensure_schema(self, schemas: Iterable[TableSchema], record: bool = True) -> list[str]:
        """Create missing tables and add missing columns (a snapshot's shape, or a unit's columns added), and, with
        ``record``, record each as the shape its table has (what a snapshot loaded)."""
        from deltalake import DeltaTable
        from deltalake.schema import Field

        schemas = list(schemas)
        for ts in schemas:
            for c in ts.columns:
                self.dialect.type_info(ts.table, c)
        done: list[str] = []
        for ts in schemas:
            path = self.path(ts.table)
            want = self.dialect.arrow_schema(ts)
            with self._writing(ts.table, ZERO, redo=False):
                self.root.mkdir(parents=True, exist_ok=True)
                dt = _open(path)
                if dt is None:
                    DeltaTable.create(str(path), want, name=ts.table)
                    done.append(f"created {ts.table}")
                    self._lossy_note(ts)
                    continue
                have = {f.name for f in dt.schema().fields}
                new = [f for f in want if f.name not in have]
                if new:
                    dt.alter.add_columns([Field.from_arrow(f) for f in new])
                    done.extend(f"added {ts.table}.{f.name}" for f in new)
        if record:
            with self.transaction() as s:
                ensure_state(s)
                for ts in schemas:
                    write_shape(s, ts, 0)
        return done

    # -- writes ----------------------------------------------------------------------------------------------------
    def write(self, table: str, parts: Sequence[pa.Table], position: Position, overwrite: bool) -> None:
        """Add ``parts`` to the table's rows, or replace them (``overwrite``), in one commit carrying ``position``
        (a snapshot's load)."""
        from deltalake import write_deltalake

        dt = self.delta_table(table)
        if dt is None:
            raise TargetError(f"target {self.name}: no Delta table for {table} at {self.path(table)}", target=self.name)
        schema = pa.schema(dt.schema().to_arrow())
        data = pa.concat_tables([_fit(p, schema) for p in parts]) if parts else schema.empty_table()
        props = commit_properties(self.name, position)
        with self._lock(table), self._writing(table, position):
            if overwrite:
                write_deltalake(dt, data, mode="overwrite", commit_properties=props)
            else:
                write_deltalake(dt, data, mode="append", commit_properties=props)

    def _apply_unit(self, u: _Unit, tables: list[str], todo: list[str], by_lanes: bool = True) -> None:
        """Each table in one Delta commit with the unit's end (``threads`` > 1: tables dealt to that many lanes
        applied side by side), then the unit end in the state file once every table is done."""
        lanes = [lane for lane in ([t for t in lane if t in todo] for lane in deal(tables, self.threads)) if lane]
        done = threading.Lock()

        def run_lane(lane: list[str]) -> None:
            for t in lane:
                counts, failed = self._apply_retried(u, u.schemas[t])
                with done:
                    u.result.rows[t] = counts
                    u.result.applied.append(t)
                    u.result.rejects += len(failed)

        if len(lanes) <= 1:
            for lane in lanes:
                run_lane(lane)
        else:
            with ThreadPoolExecutor(len(lanes), thread_name_prefix=f"apply-{self.name}") as ex:
                futures = [ex.submit(run_lane, lane) for lane in lanes]
                errors = [e for e in (f.exception() for f in futures) if e is not None]
            if errors:
                raise errors[0]
        with self.transaction() as s:
            u.record(s, [], unit=True)

    def _apply_retried(self, u: _Unit, ts: TableSchema) -> tuple[dict[str, int], list[_Failure]]:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return self._apply_table(u, ts)
            except _Conflict as e:  # a compaction (or another writer) committed first: read it and redo
                if attempt == COMMIT_ATTEMPTS:
                    raise TransientTargetError(
                        f"target {self.name}: {ts.table}'s commit of the unit up to {u.batch.end} lost to other "
                        f"writers {attempt} times: {e}",
                        hint="nothing of the unit was committed to this table; is another program writing it?",
                        target=self.name,
                        table=ts.table,
                    ) from e
                log.info(
                    "target %s: %s changed under the unit's commit (%s); applying it again", self.name, ts.table, e
                )
        raise AssertionError("unreachable")

    def _apply_table(self, u: _Unit, ts: TableSchema) -> tuple[dict[str, int], list[_Failure]]:
        """One table's net rows as one Delta commit: checked, typed, then merged (appended when they are all
        inserts, written over the table when the unit truncated it)."""
        from deltalake import write_deltalake

        batch, result = u.batch, u.result
        t0 = time.monotonic()
        rows = {k: u.stager.rows(ts, k) for k in ("D", "U", "I")}
        dt = self.delta_table(ts.table)
        assert dt is not None
        t0 = result.timed("stage", t0)
        con = duck_connection()
        try:
            for k, r in rows.items():
                assert r is not None
                con.register(f"w_{k.lower()}", r.append_column("_ml_row", pa.array(range(r.num_rows), pa.int64())))
            con.register("tgt", dt.to_pyarrow_dataset())
            truncated = ts.table in batch.truncated
            plan = (_BagPlan if ts.bag else _Plan)(self, ts, truncated)
            try:
                plan.check(con)
                src = plan.source(con) if not plan.failures or self.on_error == "reject" else None
            except duckdb.Error:  # a value that does not convert: set aside the rows holding one, then as above
                if not plan.bad_values(con):
                    raise
                plan.check(con)
                src = plan.source(con) if self.on_error == "reject" else None
            failures = plan.failures
            t0 = result.timed("check", t0)
            if failures:
                self._locate(u, ts, failures)
                if self.on_error == "stop":
                    raise self._failure_error(ts, failures[0])
                self._reject(ts, failures, batch.start, batch.end)
            assert src is not None
        finally:
            con.close()
        ops = src[OP_COL]
        counts = {
            "D": int(pc.sum(pc.is_in(ops, pa.array(["D", "R"]))).as_py() or 0),
            "U": int(pc.sum(pc.equal(ops, "U")).as_py() or 0),
            "I": int(pc.sum(pc.is_in(ops, pa.array(["I", "R"]))).as_py() or 0),
        }
        props = commit_properties(self.name, batch.end)
        schema = pa.schema(dt.schema().to_arrow())
        with self._lock(ts.table), self._writing(ts.table, batch.end):
            if truncated:
                keep = src.filter(pc.invert(pc.equal(ops, "D")))
                write_deltalake(dt, _fit(keep, schema), mode="overwrite", commit_properties=props)
            elif src.num_rows == 0 or pc.all(pc.equal(ops, "I")).as_py():  # inserts only, none there (checked)
                write_deltalake(dt, _fit(src, schema), mode="append", commit_properties=props)
            else:
                plan.merge(dt, src, props)
        result.timed("commit", t0)
        return counts, failures

    @contextlib.contextmanager
    def _writing(self, table: str, end: Position, redo: bool = True) -> Iterator[None]:
        """A Delta write's failure as mirrorline's error: a table constraint (CHECK, NOT NULL) the rows break is
        the data's (ApplyError), anything else the target's (nothing was committed either way)."""
        from deltalake.exceptions import CommitFailedError, DeltaError

        try:
            yield
        except CommitFailedError as e:
            if redo:  # the caller applies again on the new version
                raise _Conflict(first_line(e)) from e
            raise TransientTargetError(
                f"target {self.name}: another writer committed to the Delta table {table} first: {first_line(e)}",
                hint="nothing was committed; run again",
                target=self.name,
                table=table,
            ) from e
        except (DeltaError, OSError, pa.ArrowException) as e:
            msg = first_line(e)
            ctx: dict[str, Any] = {"target": self.name, "table": table, "position": str(end)}
            if "violat" in msg.lower() or "failed validation" in msg.lower():
                raise ApplyError(
                    f"target {self.name}: the unit up to {end} breaks a constraint of the Delta table {table}: {msg}",
                    hint="drop or change the constraint at the target (or fix the row at the source) and run again",
                    db_message=msg,
                    **ctx,
                ) from e
            cls = TransientTargetError if isinstance(e, OSError) else TargetError
            raise cls(
                f"target {self.name}: writing the Delta table {table} failed: {msg}",
                hint="nothing was committed to this table; check the target folder and run again",
                **ctx,
            ) from e

    @staticmethod
    def _locate(u: _Unit, ts: TableSchema, failures: list[_Failure]) -> None:
        """Give each failing net change the position and kind of the last change folded into it, when the unit's
        changes are at hand (an insert's position travels with it)."""
        wanted: dict[tuple[str | None, ...], _Failure] = {
            tuple(None if v is None else str(v) for v in f.key): f for f in failures if not f.position
        }
        if not wanted or u.changes is None:
            return
        src = u.changes() if callable(u.changes) else u.changes
        after = u.state.table(ts.table)
        for c in src:
            if c.table != ts.table or not after < c.pos <= u.batch.end:
                continue
            for key in (c.key, c.old_key):
                f = wanted.get(key) if key is not None else None
                if f is not None:
                    f.position, f.op = str(c.pos), c.op.value

    def _failure_error(self, ts: TableSchema, f: _Failure) -> ApplyError:
        if f.error is not None:
            return f.error
        what = {"D": "delete", "U": "update", "I": "insert", "M": "insert"}[f.op or f.kind]
        where = f"at {f.position}" if f.position else "(its position unknown: the unit's changes were not given)"
        return ApplyError(
            f"target {self.name}: {what} on {ts.table} key {f.key} {where} failed: {f.what}",
            hint='fix the target (or the row) and run again; or set on_error = "reject" to set failing changes aside',
            target=self.name,
            table=ts.table,
            key=f.key,
            position=f.position or None,
            op=f.op or f.kind,
            db_message=f.what,
        )

    def _reject(self, ts: TableSchema, failures: list[_Failure], start: Position, end: Position) -> None:
        """The unit's rejects of the table, written before its commit (again, identically, if the unit is applied
        again after a crash)."""
        stamp = now_stamp()
        with self.transaction() as s:
            s.execute(
                f"DELETE FROM {self.dialect.own('mirrorline_rejects')} WHERE {quote_ident('table')} = ? "
                "AND (lsn > ? OR (lsn = ? AND seq > ?)) AND (lsn < ? OR (lsn = ? AND seq <= ?))",
                (ts.table, start.lsn, start.lsn, start.seq, end.lsn, end.lsn, end.seq),
            )
            for f in failures:
                pos = Position.parse(f.position) if f.position else end
                s.execute(
                    self.dialect.insert_reject(),
                    (
                        pos.lsn,
                        pos.seq,
                        str(pos),
                        ts.table,
                        json.dumps(f.key, default=str),
                        f.kind,
                        json.dumps(f.image, default=str) if f.image is not None else None,
                        f.what,
                        stamp,
                    ),
                )

    # -- upkeep ----------------------------------------------------------------------------------------------------
    def maintain(self, *, retention_hours: int = 168, compact: bool = True, vacuum: bool = True) -> dict[str, Any]:
        """Compact each table's small files (one commit per table, no data change) and remove files no version
        younger than ``retention_hours`` reads. Apply waits only for the commit of each table's compaction."""

        out: dict[str, Any] = {}
        for folder, dt in self.tables().items():
            out[folder] = self._maintain_table(folder, dt, retention_hours, compact, vacuum)
        return out

    def _maintain_table(
        self, folder: str, dt: DeltaTable, retention_hours: int, compact: bool, vacuum: bool
    ) -> dict[str, Any]:
        """One table's upkeep; a commit that meets a unit's is left for the next round, any other failure is the
        target's error (nothing is lost: a compaction changes no rows)."""
        from deltalake.exceptions import CommitFailedError

        entry: dict[str, Any] = {}
        with self._writing(_table_of(folder), ZERO, redo=False):
            if compact:
                try:
                    with self._lock(_table_of(folder)):
                        dt.update_incremental()
                        m = dt.optimize.compact()
                    entry["compacted"] = {"removed": m.get("numFilesRemoved", 0), "added": m.get("numFilesAdded", 0)}
                except CommitFailedError as e:  # a unit committed first: compact at the next round
                    entry["compacted"] = {"skipped": first_line(e)}
            if vacuum:
                try:
                    with self._lock(_table_of(folder)):
                        dt.update_incremental()
                    removed = dt.vacuum(
                        retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
                    )
                    entry["vacuumed"] = len(removed)
                except CommitFailedError as e:
                    entry["vacuumed"] = {"skipped": first_line(e)}
        return entry

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per table: its Delta version, file count and the position its last commit applied."""
        out = {}
        for folder, dt in self.tables().items():
            out[folder] = {
                "version": dt.version(),
                "files": len(dt.file_uris()),
                "position": str(table_position(dt, self.name)),
            }
        return out


class _Plan:
    """One table's net rows of a unit against its current version: the checks, then the MERGE's source (every
    column typed, ``_ml_op`` D / U / I / R (a delete and an insert of one key: the row replaced), ``_ml_group`` the
    U row's set of unsent columns)."""

    def __init__(self, target: DeltaTarget, ts: TableSchema, truncated: bool) -> None:
        self.target, self.ts, self.truncated = target, ts, truncated
        self.mirror = target.mode == "mirror"
        self.rejected: dict[str, set[int]] = {"d": set(), "u": set(), "i": set()}  # row ids per worktable
        self.failures: list[_Failure] = []  # what was set aside, in the order found
        self.masks: list[str] = []

    def _typed_key(self, alias: str, names: Sequence[str]) -> list[str]:
        return [
            DELTA.convert(f"{alias}.{quote_ident(n)}", self.ts, self.ts.column(k))
            for k, n in zip(self.ts.key, names, strict=True)
        ]

    def _match(self, t: str, exprs: Sequence[str]) -> str:
        parts = []
        for k, e in zip(self.ts.key, exprs, strict=True):
            op = "IS NOT DISTINCT FROM" if self.ts.column(k).nullable else "="
            parts.append(f"{t}.{quote_ident(k)} {op} {e}")
        return " AND ".join(parts) or "TRUE"

    def _exists(self, exprs: Sequence[str]) -> str:
        if self.truncated:
            return "FALSE"
        return f"EXISTS (SELECT 1 FROM tgt t WHERE {self._match('t', exprs)})"

    def _fail(self, kind: str, row_id: int, failure: _Failure) -> None:
        self.rejected[kind].add(row_id)
        self.failures.append(failure)

    def _pending(self, kind: str, alias: str = "w") -> str:
        """Not set aside already (a re-run after :meth:`bad_values` looks at the other rows only)."""
        return f"{alias}._ml_row NOT IN ({_ids(self.rejected[kind])})"

    def check(self, con: duckdb.DuckDBPyConnection) -> list[_Failure]:
        """Set aside the net changes the table's current version cannot take; every failure so far."""
        ts, nk = self.ts, len(self.ts.key)
        wk = [key_col(i) for i in range(nk)]
        dkey = self._typed_key("w", wk)

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return con.sql(sql).fetchall()

        # a delete with an insert of the same key is a replace: the row is written whether it was there or not (a
        # table whose actions drop D sends every first insert of a key so, the row maybe kept at the target)
        replaced = (
            f"EXISTS (SELECT 1 FROM w_i i WHERE {self._pending('i', 'i')} AND "
            + " AND ".join(
                f"{DELTA.convert('i.' + quote_ident(k), ts, ts.column(k))} IS NOT DISTINCT FROM {e}"
                for k, e in zip(ts.key, dkey, strict=True)
            )
            + ")"
        )
        for row in rows(
            f"SELECT _ml_row, {', '.join(wk)} FROM w_d w WHERE {self._pending('d')} AND NOT {replaced} "
            f"AND NOT {self._exists(dkey)} ORDER BY 1"
        ):
            self._fail(
                "d", row[0], _Failure("D", list(row[1:]), "", "no row with this key at the target to delete", None)
            )
        need_u = "TRUE" if not self.mirror else f"w.{MASK_COL} <> ''"
        for row in rows(
            f"SELECT _ml_row, {', '.join(wk)} FROM w_u w WHERE {self._pending('u')} AND {need_u} "
            f"AND NOT {self._exists(dkey)} ORDER BY 1"
        ):
            self._fail(
                "u", row[0], _Failure("U", list(row[1:]), "", "no row with this key at the target to update", None)
            )
        icols = [quote_ident(k) for k in ts.key]
        ikey = self._typed_key("w", list(ts.key))
        deleted = (
            f"EXISTS (SELECT 1 FROM w_d d WHERE {self._pending('d', 'd')} AND "
            + " AND ".join(
                f"{e} IS NOT DISTINCT FROM {DELTA.convert('d.' + quote_ident(key_col(i)), ts, ts.column(k))}"
                for i, (k, e) in enumerate(zip(ts.key, ikey, strict=True))
            )
            + ")"
        )
        self._deleted = deleted
        pos = "w._ml_lsn, w._ml_seq"
        for row in rows(
            f"SELECT _ml_row, {pos}, {', '.join('w.' + c for c in icols)} FROM w_i w "
            f"WHERE {self._pending('i')} AND {self._exists(ikey)} AND NOT {deleted} ORDER BY 1"
        ):
            where = str(Position(int(row[1]), int(row[2])))
            self._fail(
                "i", row[0], _Failure("I", list(row[3:]), where, "a row with this key is at the target already", None)
            )
        mk = self._typed_key("w", [moved_col(i) for i in range(nk)])
        moved_exists = f"EXISTS (SELECT 1 FROM tgt t WHERE {self._match('t', mk)})"
        moved = ", ".join(f"w.{quote_ident(moved_col(i))}" for i in range(nk))
        for row in rows(
            f"SELECT _ml_row, {', '.join('w.' + c for c in icols)}, {moved}, {pos}, w.{MASK_COL} FROM w_i w "
            f"WHERE {self._pending('i')} AND w.{MASK_COL} <> '' AND NOT {moved_exists} ORDER BY 1"
        ):
            err = self.target._moved_error(ts, row[1:-1], parse_mask(row[-1]))
            p = Position(int(row[1 + 2 * nk]), int(row[2 + 2 * nk]))
            self._fail("i", row[0], _Failure("M", list(row[1 : 1 + nk]), str(p), err.message, None, err))
        return self.failures

    def bad_values(self, con: duckdb.DuckDBPyConnection) -> list[_Failure]:
        """The rows holding a value that does not convert to its column's type (looked for once a conversion has
        failed), set aside like the rows that fail a check."""
        ts, nk = self.ts, len(self.ts.key)
        wk = [key_col(i) for i in range(nk)]
        value_cols = [c for c in ts.column_names if c not in ts.key]
        plans = [
            ("D", list(zip(wk, ts.key, strict=True)), wk, None),
            ("U", list(zip(wk, ts.key, strict=True)) + [(c, c) for c in value_cols], wk, None),
            (
                "I",
                [(c, c) for c in ts.column_names] + [(moved_col(i), k) for i, k in enumerate(ts.key)],
                list(ts.key),
                "w._ml_lsn, w._ml_seq",
            ),
        ]
        found = len(self.failures)
        for kind, cols, keys, pos in plans:
            rejected = self.rejected[kind.lower()]
            for name, column in cols:
                col = ts.column(column)
                info = DELTA.type_info(ts.table, col)
                bad = DELTA.bad_value(f"w.{quote_ident(name)}", info)
                if bad is None:
                    continue
                sql = (
                    f"SELECT _ml_row, {pos or 'NULL, NULL'}, w.{quote_ident(name)}, "
                    f"{', '.join('w.' + quote_ident(k) for k in keys)} FROM w_{kind.lower()} w "
                    f"WHERE {bad} AND _ml_row NOT IN ({_ids(rejected)}) ORDER BY 1"
                )
                for row in con.sql(sql).fetchall():
                    where = str(Position(int(row[1]), int(row[2]))) if row[1] is not None else ""
                    what = (
                        f"{ts.table}.{column}: {row[3]!r} is not a valid {col.type_name} value for a Delta "
                        f"{info.target_type} column"
                    )
                    self._fail(kind.lower(), row[0], _Failure(kind, list(row[4:]), where, what, None))
        return self.failures[found:]

    def source(self, con: duckdb.DuckDBPyConnection) -> pa.Table:
        """The MERGE's source rows (rejected rows left out)."""
        ts, nk = self.ts, len(self.ts.key)
        cols = list(ts.column_names)
        wk = [key_col(i) for i in range(nk)]
        dkey = self._typed_key("w", wk)

        def conv(alias: str, c: str) -> str:
            return DELTA.convert(f"{alias}.{quote_ident(c)}", ts, ts.column(c))

        not_in = {k: f"_ml_row NOT IN ({_ids(v)})" for k, v in self.rejected.items()}
        replaced = (
            f"EXISTS (SELECT 1 FROM w_i i WHERE i._ml_row NOT IN ({_ids(self.rejected['i'])}) AND "
            + " AND ".join(f"{conv('i', k)} IS NOT DISTINCT FROM {e}" for k, e in zip(ts.key, dkey, strict=True))
            + ")"
        )
        # UNION ALL matches columns by position: every part lists them in the table's order, the key where it is
        keys_as = {k: f"{e} AS {quote_ident(k)}" for k, e in zip(ts.key, dkey, strict=True)}
        deleted = [keys_as.get(c) or f"NULL AS {quote_ident(c)}" for c in cols]
        updated = [keys_as.get(c) or f"{conv('w', c)} AS {quote_ident(c)}" for c in cols]
        parts = [
            f"SELECT {', '.join(deleted)}, 'D' AS {OP_COL}, '' AS {MASK_COL} FROM w_d w "
            f"WHERE {not_in['d']} AND NOT {replaced}",
            f"SELECT {', '.join(updated)}, 'U' AS {OP_COL}, w.{MASK_COL} AS {MASK_COL} FROM w_u w WHERE {not_in['u']}",
        ]
        op = f"CASE WHEN {self._deleted} THEN 'R' ELSE 'I' END AS {OP_COL}"
        plain = [conv("w", c) + " AS " + quote_ident(c) for c in cols]
        parts.append(
            f"SELECT {', '.join(plain)}, {op}, '' AS {MASK_COL} FROM w_i w WHERE {not_in['i']} AND w.{MASK_COL} = ''"
        )
        mk = self._typed_key("w", [moved_col(i) for i in range(nk)])
        completed = [
            f"CASE WHEN list_contains(string_split(w.{MASK_COL}, {lit(MASK_SEP)}), {lit(c)}) THEN m.{quote_ident(c)} "
            f"ELSE {conv('w', c)} END AS {quote_ident(c)}"
            for c in cols
        ]
        parts.append(
            f"SELECT {', '.join(completed)}, {op}, '' AS {MASK_COL} FROM w_i w JOIN tgt m ON {self._match('m', mk)} "
            f"WHERE {not_in['i']} AND w.{MASK_COL} <> ''"
        )
        sql = " UNION ALL ".join(f"({p})" for p in parts)
        src = con.sql(sql).to_arrow_table()
        schema = DELTA.arrow_schema(ts)
        src = pa.table(
            {**{c: src[c].cast(schema.field(c).type) for c in cols}, OP_COL: src[OP_COL], MASK_COL: src[MASK_COL]}
        )
        self.masks = sorted(set(pc.unique(pc.fill_null(src[MASK_COL], "")).to_pylist()))
        group = pc.index_in(pc.fill_null(src[MASK_COL], ""), value_set=pa.array(self.masks, pa.string()))
        return src.drop_columns([MASK_COL]).append_column(GROUP_COL, group)

    def merge(self, dt: DeltaTable, src: pa.Table, props: Any) -> None:
        ts = self.ts
        cols = list(ts.column_names)
        value_cols = [c for c in cols if c not in ts.key]
        s = {c: f"s.{quote_ident(c)}" for c in cols}
        pred = " AND ".join(
            f"(t.{quote_ident(k)} {'IS NOT DISTINCT FROM' if ts.column(k).nullable else '='} s.{quote_ident(k)})"
            for k in ts.key
        )
        m = dt.merge(src, predicate=pred, source_alias="s", target_alias="t", commit_properties=props)
        m = m.when_matched_delete(predicate=f"s.{OP_COL} = 'D'")
        m = m.when_matched_update(updates=s, predicate=f"s.{OP_COL} = 'R'")
        for i, mask in enumerate(self.masks):
            kept = parse_mask(mask)
            set_cols = [c for c in value_cols if c not in kept]
            if set_cols:
                m = m.when_matched_update(
                    updates={c: s[c] for c in set_cols}, predicate=f"s.{OP_COL} = 'U' AND s.{GROUP_COL} = {i}"
                )
        if self.mirror and "" in self.masks:
            m = m.when_not_matched_insert(
                updates=s, predicate=f"s.{OP_COL} = 'U' AND s.{GROUP_COL} = {self.masks.index('')}"
            )
        m = m.when_not_matched_insert(updates=s, predicate=f"s.{OP_COL} IN ('I', 'R')")
        m.execute()


class _BagPlan(_Plan):
    """A table without a key (a bag of rows): the unit's net rows are copies of images to delete (``w_d``, one row
    per copy) and to insert (``w_i``). A Delta MERGE deletes every row matching a source row, so each image that
    loses copies is deleted whole and the copies it keeps are inserted again, in the same commit."""

    def _images(self) -> str:
        wk = ", ".join(key_col(i) for i in range(len(self.ts.key)))
        return (
            f"(SELECT {wk}, count(*) AS ml_n, min(_ml_row) AS ml_r, row_number() OVER () AS ml_g FROM w_d w "
            f"WHERE {self._pending('d')} GROUP BY {wk})"
        )

    def _copies(self) -> str:
        """Each target row holding an image the unit deletes copies of: its image's ``ml_r``, ``ml_n`` and its rank
        ``ml_rn`` among the image's copies."""
        ikey = self._typed_key("i", [key_col(i) for i in range(len(self.ts.key))])
        cols = ", ".join(f"t.{quote_ident(c)}" for c in self.ts.column_names)
        return (
            f"SELECT {cols}, i.ml_r, i.ml_n, row_number() OVER (PARTITION BY i.ml_g) AS ml_rn "
            f"FROM {self._images()} AS i JOIN tgt t ON {self._match('t', ikey)}"
        )

    def check(self, con: duckdb.DuckDBPyConnection) -> list[_Failure]:
        if self.truncated:  # nothing is there to delete: the unit's deletes were of copies it inserted itself
            return self.failures
        wk = [key_col(i) for i in range(len(self.ts.key))]
        sql = (
            f"SELECT i.ml_r, i.ml_n, coalesce(c.have, 0), {', '.join('i.' + k for k in wk)} FROM {self._images()} i "
            f"LEFT JOIN (SELECT ml_r, max(ml_rn) AS have FROM ({self._copies()}) GROUP BY ml_r) c ON c.ml_r = i.ml_r "
            "WHERE coalesce(c.have, 0) < i.ml_n ORDER BY 1"
        )
        for row in con.sql(sql).fetchall():
            what = f"the target holds {row[2]} copies of this row, the unit deletes {row[1]}"
            self._fail("d", row[0], _Failure("D", list(row[3:]), "", what, None))
        return self.failures

    def source(self, con: duckdb.DuckDBPyConnection) -> pa.Table:
        ts = self.ts
        cols = list(ts.column_names)
        ikey = self._typed_key("i", [key_col(i) for i in range(len(ts.key))])
        parts = [
            f"SELECT {', '.join(f'{e} AS {quote_ident(k)}' for k, e in zip(ts.key, ikey, strict=True))}, "
            f"'D' AS {OP_COL} FROM {self._images()} AS i"
        ]
        if not self.truncated:  # the copies each image keeps go back
            parts.append(
                f"SELECT {', '.join(quote_ident(c) for c in cols)}, 'I' AS {OP_COL} FROM ({self._copies()}) "
                "WHERE ml_rn > ml_n"
            )
        plain = ", ".join(f"{DELTA.convert('w.' + quote_ident(c), ts, ts.column(c))} AS {quote_ident(c)}" for c in cols)
        parts.append(f"SELECT {plain}, 'I' AS {OP_COL} FROM w_i w WHERE {self._pending('i')}")
        src = con.sql(" UNION ALL ".join(f"({p})" for p in parts)).to_arrow_table()
        schema = DELTA.arrow_schema(ts)
        self.masks = [""]
        return pa.table(
            {
                **{c: src[c].cast(schema.field(c).type) for c in cols},
                OP_COL: src[OP_COL],
                GROUP_COL: pa.array([0] * src.num_rows, pa.int32()),
            }
        )

    def merge(self, dt: DeltaTable, src: pa.Table, props: Any) -> None:
        pred = " AND ".join(
            f"(t.{quote_ident(c)} {'IS NOT DISTINCT FROM' if self.ts.column(c).nullable else '='} s.{quote_ident(c)})"
            for c in self.ts.key
        )
        m = dt.merge(
            src, predicate=f"s.{OP_COL} = 'D' AND {pred}", source_alias="s", target_alias="t", commit_properties=props
        )
        m = m.when_matched_delete()
        m = m.when_not_matched_insert(
            updates={c: f"s.{quote_ident(c)}" for c in self.ts.column_names}, predicate=f"s.{OP_COL} = 'I'"
        )
        m.execute()


def _fit(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """``data`` as the Delta table's columns: one the table has and the rows lack (dropped at the source since) is
    NULL, as it is in the rows a MERGE writes."""
    n = data.num_rows
    have = set(data.column_names)
    return pa.table(
        [data[f.name].cast(f.type) if f.name in have else pa.nulls(n, f.type) for f in schema], schema=schema
    )


def _folder_part(part: str) -> str:
    # escaped as ~XX (delta-rs decodes %XX in a path): ~, /, \\, NUL, a leading dot, and this folder's own files
    out = "".join(f"~{ord(ch):02X}" if ch in "~/\\\x00%" else ch for ch in part)
    if out.startswith("."):
        out = "~2E" + out[1:]
    if out in (STATE_FILE, LOCK_FILE):
        out = "~5F" + out[1:]
    return out


def _unescape(part: str) -> str:
    return re.sub(r"~([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), part)


def _table_of(folder: str) -> str:
    """The source table whose Delta table is in ``folder`` (the inverse of :meth:`DeltaDialect.table_dir`)."""
    if "." not in folder:
        return f"public.{_unescape(folder)}"
    schema, name = folder.split(".", 1)
    return f"{_unescape(schema)}.{_unescape(name)}"


class _Conflict(Exception):
    """A commit lost to a concurrent one (a compaction, another writer): the table's apply is redone."""


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids)) or "-1"
