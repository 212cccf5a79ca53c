"""Loading chunk files into a target in one transaction with the fastest bulk path of each engine: ``COPY ... FROM
STDIN`` (PostgreSQL), ``executemany`` of converted rows (SQLite), an INSERT ... SELECT over Arrow (DuckDB). Values
become what apply would store (:mod:`mirrorline.apply.types`). The tables are emptied first, and the applied
positions and the snapshot state are written in the same transaction: a load is all or nothing.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from mirrorline.apply.engine import Target
from mirrorline.apply.session import Session
from mirrorline.errors import TargetError
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import Position
from mirrorline.snapshot import state as S
from mirrorline.snapshot.plan import copy_in_sql

BLOCK = 16 << 20
_views = itertools.count(1)


def read_chunk(path: str | Path, columns: Sequence[str], header: bool = True) -> Iterator[pa.RecordBatch]:
    """A chunk file's rows as string columns (PostgreSQL CSV: NULL is an unquoted empty field, '' is quoted)."""
    names = [f"c{i}" for i in range(len(columns))]
    ropts = pacsv.ReadOptions(column_names=names, skip_rows=1 if header else 0, block_size=BLOCK)
    popts = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False)
    copts = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=True,
                                 quoted_strings_can_be_null=False, null_values=[""])
    try:
        reader = pacsv.open_csv(str(path), ropts, popts, copts)
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return
        raise
    for b in reader:
        if b.num_rows:
            yield b


def skip_header(f: Any) -> None:
    f.readline()


def sqlite_values(batch: pa.RecordBatch, schema: TableSchema, dialect: Any) -> list[list[Any]]:
    """Columns of Python values as apply's SQLite conversions store them."""
    out: list[list[Any]] = []
    for arr, col in zip(batch.columns, schema.columns, strict=True):
        conv = dialect.type_info(schema.table, col).conv
        if conv == "int":
            out.append(pc.cast(arr, pa.int64()).to_pylist())
        elif conv == "real":
            vals = pc.cast(arr, pa.float64())
            if pc.any(pc.is_nan(vals)).as_py():
                raise TargetError(f"{schema.table}.{col.name}: NaN is not a valid {col.type_name} value for SQLite",
                                  table=schema.table, column=col.name)
            out.append(vals.to_pylist())
        elif conv == "bool":
            out.append(pc.cast(pc.equal(arr, "t"), pa.int64()).to_pylist())
        elif conv == "bytea":
            out.append([None if v is None else bytes.fromhex(v[2:]) for v in arr.to_pylist()])
        else:
            out.append(arr.to_pylist())
    return out


class BulkLoader:
    """One transaction on ``target``: :meth:`begin` (empty the tables), :meth:`load` each chunk file,
    :meth:`finish` (positions, snapshot state, commit) or :meth:`abort`."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.kind = target.kind
        self.s: Session = target.session()
        self.d = target.dialect

    def begin(self, schemas: Sequence[TableSchema]) -> None:
        s = self.s
        if self.kind == "sqlite":
            s.execute("PRAGMA synchronous = OFF")  # the load is one transaction: it commits whole or not at all
        s.begin()
        S.ensure_tables(s)
        for ts in schemas:
            s.execute(self.d.truncate(ts.table))

    def load(self, schema: TableSchema, path: str | Path, header: bool = True) -> int:
        if self.kind == "postgresql":
            return self._load_pg(schema, path, header)
        n = 0
        for batch in read_chunk(path, schema.column_names, header):
            n += batch.num_rows
            if self.kind == "sqlite":
                self._load_sqlite(schema, batch)
            else:
                self._load_duckdb(schema, batch)
        return n

    def _load_pg(self, schema: TableSchema, path: str | Path, header: bool) -> int:
        cur = self.s.cur  # type: ignore[attr-defined]
        with open(path, "rb") as f:
            if header:
                skip_header(f)
            cur.copy_expert(copy_in_sql(self.d.table(schema.table), schema.column_names, "csv"), f, size=1 << 20)
        return int(cur.rowcount)

    def _load_sqlite(self, schema: TableSchema, batch: pa.RecordBatch) -> None:
        conn = self.s.conn  # type: ignore[attr-defined]
        cols = ", ".join(quote_ident(c) for c in schema.column_names)
        marks = ", ".join("?" * len(schema.columns))
        values = sqlite_values(batch, schema, self.d)
        sql = f"INSERT INTO {self.d.table(schema.table)} ({cols}) VALUES ({marks})"
        conn.executemany(sql, zip(*values, strict=True))

    def _load_duckdb(self, schema: TableSchema, batch: pa.RecordBatch) -> None:
        cur = self.s.cur  # type: ignore[attr-defined]
        view = f"mirrorline_snap_{next(_views)}"
        cur.register(view, pa.Table.from_batches([batch]))
        try:
            exprs = ", ".join(self.d.conv(f"v.c{i}", self.d.type_info(schema.table, c), schema.table, c.name)
                              for i, c in enumerate(schema.columns))
            cols = ", ".join(quote_ident(c) for c in schema.column_names)
            cur.execute(f"INSERT INTO {self.d.table(schema.table)} ({cols}) SELECT {exprs} FROM {view} AS v")
        finally:
            cur.unregister(view)

    def finish(self, loaded: Mapping[str, int], position: Position, end_lsn: int, origin: str, whole: bool) -> None:
        s = self.s
        S.write_positions(s, loaded, position, whole)
        stamp = S.now()
        S.write(s, [S.TableSnapshot(t, "loaded", position, end_lsn, n, origin, stamp) for t, n in loaded.items()])
        s.commit()
        self.close()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.s.rollback()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.s.close()


def mark_loading(target: Target, schemas: Sequence[TableSchema], position: Position, origin: str,
                 truncate: bool) -> None:
    """Record (and commit) that ``schemas``' tables are being loaded, emptying them first when ``truncate``: a crash
    from here to the end of the load leaves the target visibly ``loading``."""
    s = target.session()
    try:
        s.begin()
        S.ensure_tables(s)
        if truncate:
            for ts in schemas:
                s.execute(target.dialect.truncate(ts.table))
        stamp = S.now()
        S.write(s, [S.TableSnapshot(ts.table, "loading", position, 0, 0, origin, stamp) for ts in schemas])
        s.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            s.rollback()
        raise
    finally:
        s.close()


def finish_loading(target: Target, loaded: Mapping[str, int], position: Position, end_lsn: int, origin: str,
                   whole: bool, load_id: str | None = None) -> None:
    """The end of a load whose rows were committed by parallel tasks: positions and state in one transaction."""
    s = target.session()
    try:
        s.begin()
        S.write_positions(s, loaded, position, whole)
        stamp = S.now()
        S.write(s, [S.TableSnapshot(t, "loaded", position, end_lsn, n, origin, stamp) for t, n in loaded.items()])
        if load_id is not None and target.kind == "postgresql":
            s.execute(f"DELETE FROM {target.dialect.own(S.CHUNKS_TABLE)} WHERE load_id = %s", (load_id,))
        s.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            s.rollback()
        raise
    finally:
        s.close()
