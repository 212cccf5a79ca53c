"""Getting a unit's net rows into worktables. :class:`ArrowStager` brings them to the driver as Arrow (the whole unit
at once when it is small, else table by table) and bulk-loads each worktable through the session's fastest path.
The PostgreSQL target adds a stager that loads worktables from Spark tasks in parallel."""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply import rows as work_rows
from mirrorline.apply.session import Session
from mirrorline.apply.sql import MASK_COL, MASK_SEP, POS_COLS, key_col, moved_col
from mirrorline.model import TableSchema

if TYPE_CHECKING:
    from mirrorline.compile.batch import Inserts, NetBatch

_ids = itertools.count(1)


class Stager(ABC):
    @abstractmethod
    def stage(self, s: Session, ts: TableSchema, kind: str) -> tuple[str, int] | None:
        """Have the worktable of ``ts``'s net rows of ``kind`` ready in ``s``: (its name, its row count), or None
        when the unit has no such rows."""

    def rows(self, ts: TableSchema, kind: str) -> pa.Table | None:
        """The worktable rows of ``ts``'s net rows of ``kind`` on the driver, when this stager has them there."""
        return None

    def direct(self, ts: TableSchema) -> Iterator[pa.Table] | None:
        """``ts``'s net inserts as the table's own columns, ready to load straight into it, in chunks (each in key
        order), when they are on the driver and complete (none marks columns to take from the target); else None."""
        rows = self.rows(ts, "I")
        direct = work_rows.direct_inserts(rows, ts) if rows is not None else None
        return iter([direct]) if direct is not None else None

    @abstractmethod
    def finish(self, s: Session, table: str) -> None:
        """Drop the table's worktables (inside the session's transaction)."""

    def close(self) -> None:
        """Release whatever outlives the transactions (called once, after the unit)."""
        return None


class ArrowStager(Stager):
    """Net rows to the driver as Arrow. A small unit comes in one collect and is flattened with pyarrow; a large one
    comes table by table, flattened by Spark (``new['col']`` per column), which keeps Spark's map conversion out of
    the collect and bounds the driver's memory to one table."""

    def __init__(self, batch: NetBatch, whole: bool) -> None:
        self.batch = batch
        self._flat: dict[str, dict[str, Any]] = {}  # kind -> pa.Table (or _LazyInserts until first use)
        self._lock = threading.Lock()
        self._load_whole = whole
        self._names: dict[tuple[int, str], list[str]] = {}

    def _tables(self, ts: TableSchema) -> dict[str, Any]:
        """The table's worktable rows per kind (see :meth:`_of`)."""
        with self._lock:
            if ts.table not in self._flat:
                inserts = self.batch.inserts
                if inserts is not None:  # an inserts-only unit: flat already, on the driver; its worktable
                    # layout of the inserts is built only when a worktable is loaded (not for a direct COPY)
                    ins = inserts.get(ts.table)
                    self._flat[ts.table] = {
                        k: _LazyInserts(ins, ts)
                        if k == "I" and ins is not None
                        else pa.table({c: pa.array([], pa.string()) for c in work_rows.work_columns(ts, k)})
                        for k in work_rows.KINDS
                    }
                elif self._load_whole:  # the same for every target: flattened once per unit, shared
                    self._flat[ts.table] = dict(self.batch.derive(("worktable rows", ts), lambda: self._flatten(ts)))
                else:
                    flat = _to_arrow(generic_flatten(self.batch.frame(), {ts.table: ts}, [ts.table]))
                    self._flat[ts.table] = {k: pick(flat, ts, k) for k in work_rows.KINDS}
            return self._flat[ts.table]

    def _flatten(self, ts: TableSchema) -> dict[str, pa.Table]:
        whole = self.batch.derive("arrow", self._arrow)
        rows = work_rows.select(whole, ts.table)
        return {k: work_rows.flatten(work_rows.select(rows, ts.table, k), ts, k) for k in work_rows.KINDS}

    def _arrow(self) -> pa.Table:
        rows = self.batch.rows
        return rows if rows is not None else _to_arrow(self.batch.frame())

    def _of(self, ts: TableSchema, kind: str) -> pa.Table:
        """One kind's worktable rows (an inserts-only unit's built on first use)."""
        flat = self._tables(ts)
        with self._lock:
            data = flat[kind]
            if isinstance(data, _LazyInserts):
                data = flat[kind] = data.build()
        return data

    def rows(self, ts: TableSchema, kind: str) -> pa.Table | None:
        return self._of(ts, kind)

    def direct(self, ts: TableSchema) -> Iterator[pa.Table] | None:
        inserts = self.batch.inserts
        if inserts is not None:  # an inserts-only unit: its flat rows as they are read, no worktable layout
            ins = inserts.get(ts.table)
            return (work_rows.direct_from_inserts(c, ts) for c in ins.chunks()) if ins is not None else iter([])
        return super().direct(ts)

    def stage(self, s: Session, ts: TableSchema, kind: str) -> tuple[str, int] | None:
        data = self._of(ts, kind)
        if data.num_rows == 0:
            return None
        name = f"mirrorline_w{next(_ids)}_{kind.lower()}"
        s.load(name, work_rows.work_columns(ts, kind), data)
        self._names.setdefault((id(s), ts.table), []).append(name)
        return name, data.num_rows

    def finish(self, s: Session, table: str) -> None:
        for name in self._names.pop((id(s), table), []):
            s.drop_worktable(name)
        with self._lock:
            self._flat.pop(table, None)


class _LazyInserts:
    """An inserts-only unit's rows of one table, turned into the worktable layout on first use."""

    def __init__(self, ins: Inserts, ts: TableSchema) -> None:
        self.ins, self.ts = ins, ts

    def build(self) -> pa.Table:
        return work_rows.from_inserts(self.ins, self.ts)


def generic_columns(ts: TableSchema) -> list[str]:
    """Every worktable column a table's net rows can fill, in the order :func:`generic_flatten` puts them in ``g0``,
    ``g1``, ...: the key (from ``key``), every column (from ``new``), the mask, the moved_from key, the position."""
    k = len(ts.key)
    return (
        [key_col(i) for i in range(k)]
        + list(ts.column_names)
        + [MASK_COL]
        + [moved_col(i) for i in range(k)]
        + list(POS_COLS)
    )


def generic_flatten(net: Any, schemas: Mapping[str, TableSchema], tables: list[str]) -> Any:
    """The unit's net rows of ``tables`` flattened by Spark into string columns ``table, kind, g0, g1, ...`` (see
    :func:`generic_columns`; a narrower table leaves the last ones null): one scan for any number of tables, and
    only flat strings cross to Arrow."""
    from pyspark.sql import functions as F

    def source(ts: TableSchema, name: str) -> Any:
        if name == MASK_COL:
            return F.coalesce(F.array_join("unchanged", MASK_SEP), F.lit(""))
        if name in POS_COLS:
            return F.col("lsn" if name == POS_COLS[0] else "seq").cast("string")
        for i in range(len(ts.key)):
            if name == key_col(i):
                return F.col("key")[i]
            if name == moved_col(i):
                return F.col("moved_from")[i]
        return F.col("new")[name]

    layouts = {t: generic_columns(schemas[t]) for t in tables}
    width = max((len(c) for c in layouts.values()), default=0)
    cols = []
    for j in range(width):
        parts = [(t, source(schemas[t], names[j])) for t, names in layouts.items() if j < len(names)]
        expr = parts[0][1]
        if len(layouts) > 1:
            expr = F.when(F.col("table") == parts[0][0], parts[0][1])
            for t, v in parts[1:]:
                expr = expr.when(F.col("table") == t, v)
        cols.append(expr.alias(f"g{j}"))
    return net.where(F.col("table").isin(tables)).select("table", "kind", *cols)


def pick(flat: pa.Table, ts: TableSchema, kind: str) -> pa.Table:
    """The worktable rows of one table and kind from :func:`generic_flatten`'s rows (already that table's)."""
    generic = generic_columns(ts)
    cols = work_rows.work_columns(ts, kind)
    part = flat.filter(pc.equal(flat["kind"], kind))
    return pa.table([part[f"g{generic.index(c)}"] for c in cols], names=cols)


def _to_arrow(df: object) -> pa.Table:
    t = df.toArrow()  # type: ignore[attr-defined]
    assert isinstance(t, pa.Table)
    return t
