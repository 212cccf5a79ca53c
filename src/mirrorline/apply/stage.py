"""Getting a unit's net rows into worktables. :class:`ArrowStager` brings them to the driver as Arrow (the whole unit
at once when it is small, else table by table) and bulk-loads each worktable through the session's fastest path.
The PostgreSQL target adds a stager that loads worktables from Spark tasks in parallel."""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import pyarrow as pa

from mirrorline.apply import rows as R
from mirrorline.apply.session import Session
from mirrorline.model import TableSchema

if TYPE_CHECKING:
    from mirrorline.compile.batch import NetBatch

_ids = itertools.count(1)


class Stager(ABC):
    @abstractmethod
    def stage(self, s: Session, ts: TableSchema, kind: str) -> tuple[str, int] | None:
        """Have the worktable of ``ts``'s net rows of ``kind`` ready in ``s``: (its name, its row count), or None
        when the unit has no such rows."""

    @abstractmethod
    def finish(self, s: Session, table: str) -> None:
        """Drop the table's worktables (inside the session's transaction)."""

    def close(self) -> None:
        """Release whatever outlives the transactions (called once, after the unit)."""
        return None


class ArrowStager(Stager):
    def __init__(self, batch: NetBatch, whole: bool) -> None:
        self.batch = batch
        self._whole: pa.Table | None = None
        self._by_table: dict[str, pa.Table] = {}
        self._lock = threading.Lock()
        self._load_whole = whole
        self._names: dict[tuple[int, str], list[str]] = {}

    def rows(self, table: str) -> pa.Table:
        with self._lock:
            if table in self._by_table:
                return self._by_table[table]
            if self._load_whole:
                if self._whole is None:
                    self._whole = _to_arrow(self.batch.net)
                got = R.select(self._whole, table)
            else:
                from pyspark.sql import functions as F

                got = _to_arrow(self.batch.net.where(F.col("table") == table))
            self._by_table[table] = got
            return got

    def stage(self, s: Session, ts: TableSchema, kind: str) -> tuple[str, int] | None:
        net = R.select(self.rows(ts.table), ts.table, kind)
        if net.num_rows == 0:
            return None
        name = f"mirrorline_w{next(_ids)}_{kind.lower()}"
        s.load(name, R.work_columns(ts, kind), R.flatten(net, ts, kind))
        self._names.setdefault((id(s), ts.table), []).append(name)
        return name, net.num_rows

    def finish(self, s: Session, table: str) -> None:
        for name in self._names.pop((id(s), table), []):
            s.execute(s.dialect.drop_table(name))
        with self._lock:
            self._by_table.pop(table, None)


def _to_arrow(df: object) -> pa.Table:
    t = df.toArrow()  # type: ignore[attr-defined]
    assert isinstance(t, pa.Table)
    return t
