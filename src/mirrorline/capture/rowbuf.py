"""Changes gathered column by column, straight into the log's Arrow layout (:data:`mirrorline.log.rows.ARROW_SCHEMA`).

Capture's hot path: one change costs a handful of list appends here instead of a :class:`mirrorline.model.Change`
object and a row dict; the Arrow arrays are built once per batch from flat lists. :func:`to_changes` turns a batch
back into ``Change`` objects for tests and tools.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain

import numpy as np
import pyarrow as pa

from mirrorline.log.rows import ARROW_SCHEMA, table_to_changes
from mirrorline.model import Change, Value

_LIST_T = ARROW_SCHEMA.field("key").type
_MAP_T = ARROW_SCHEMA.field("new").type
_NO_NAMES: tuple[str, ...] = ()


class RowBuffer:
    """Rows in the log layout, column by column. ``new`` is kept flat: per row its length (``-1``: no new image, a
    DELETE or TRUNCATE) and the names and values of its columns, in order."""

    __slots__ = (
        "flat",
        "key",
        "lsn",
        "new_len",
        "new_names",
        "new_values",
        "old_key",
        "op",
        "seq",
        "table",
        "ts",
        "unchanged",
        "version",
        "xid",
    )

    def __init__(self) -> None:
        self.lsn: list[int] = []
        self.seq: list[int] = []
        self.ts: list[int] = []
        self.xid: list[int] = []
        self.table: list[str] = []
        self.op: list[str] = []
        self.key: list[tuple[Value, ...]] = []
        self.old_key: list[tuple[Value, ...] | None] = []
        self.new_len: list[int] = []
        self.new_names: list[str] = []
        self.new_values: list[Value] = []
        self.unchanged: list[tuple[str, ...]] = []
        self.version: list[int] = []
        self.flat = 0  # len(new_names), kept for cutting

    def __len__(self) -> int:
        return len(self.op)

    def add(
        self,
        lsn: int,
        seq: int,
        ts: int,
        xid: int,
        table: str,
        op: str,
        key: tuple[Value, ...],
        old_key: tuple[Value, ...] | None,
        names: Sequence[str] | None,
        values: Sequence[Value] | None,
        unchanged: tuple[str, ...],
        version: int,
    ) -> None:
        """One row. ``names``/``values``: the new image's columns (``None`` for DELETE / TRUNCATE)."""
        self.lsn.append(lsn)
        self.seq.append(seq)
        self.ts.append(ts)
        self.xid.append(xid)
        self.table.append(table)
        self.op.append(op)
        self.key.append(key)
        self.old_key.append(old_key)
        if names is None or values is None:
            self.new_len.append(-1)
        else:
            n = len(names)
            self.new_len.append(n)
            self.new_names.extend(names)
            self.new_values.extend(values)
            self.flat += n
        self.unchanged.append(unchanged)
        self.version.append(version)

    def mark(self) -> tuple[int, int]:
        """Where the buffer ends now (rows, flat new-image entries): a place to :meth:`cut` at later."""
        return len(self.op), self.flat

    def cut(self, at: tuple[int, int]) -> RowBuffer:
        """Move the rows after ``at`` into a new buffer (this one keeps the rows before)."""
        rows, flat = at
        out = RowBuffer()
        for name in ("lsn", "seq", "ts", "xid", "table", "op", "key", "old_key", "new_len", "unchanged", "version"):
            col = getattr(self, name)
            setattr(out, name, col[rows:])
            del col[rows:]
        out.new_names = self.new_names[flat:]
        out.new_values = self.new_values[flat:]
        del self.new_names[flat:]
        del self.new_values[flat:]
        out.flat = self.flat - flat
        self.flat = flat
        return out

    def to_arrow(self) -> pa.Table:
        """The rows as an Arrow table in the log layout."""
        n = len(self.op)
        if n == 0:
            return ARROW_SCHEMA.empty_table()
        lengths = np.array(self.new_len, dtype=np.int64)
        absent = lengths < 0
        offsets = _offsets(np.maximum(lengths, 0))
        new = pa.MapArray.from_arrays(
            pa.array(offsets),
            pa.array(self.new_names, pa.string()),
            pa.array(self.new_values, pa.string()),
            type=_MAP_T,
            mask=pa.array(absent) if absent.any() else None,
        )
        old_valid = [k is not None for k in self.old_key]
        arrays = [
            pa.array(self.lsn, pa.int64()),
            pa.array(self.seq, pa.int64()),
            pa.array(self.ts, pa.int64()),
            pa.array(self.xid, pa.int64()),
            pa.array(self.table, pa.string()),
            pa.array(self.op, pa.string()),
            _lists(self.key),
            _lists([k if k is not None else _NO_NAMES for k in self.old_key], None if all(old_valid) else old_valid),
            new,
            _lists(self.unchanged),
            pa.array(self.version, pa.int32()),
        ]
        return pa.Table.from_arrays(arrays, schema=ARROW_SCHEMA)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out.astype(np.int32)


def _lists(items: list[tuple[Value, ...]] | list[tuple[str, ...]], valid: list[bool] | None = None) -> pa.Array:
    offsets = _offsets(np.fromiter(map(len, items), dtype=np.int64, count=len(items)))
    values = pa.array(list(chain.from_iterable(items)), pa.string())
    mask = pa.array(np.logical_not(np.array(valid, dtype=bool))) if valid is not None else None
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=_LIST_T, mask=mask)


def to_changes(table: pa.Table) -> Iterator[Change]:
    """An Arrow batch in the log layout -> Change objects (tests, tools)."""
    return table_to_changes(table)


class Rows:
    """Rows in log order: finished Arrow pieces, then a :class:`RowBuffer` tail that one-by-one additions go to.
    Cutting and taking are zero-copy slices of the pieces."""

    __slots__ = ("buffer", "piece_rows", "pieces")

    def __init__(self) -> None:
        self.pieces: list[pa.Table] = []
        self.piece_rows = 0
        self.buffer = RowBuffer()

    def __len__(self) -> int:
        return self.piece_rows + len(self.buffer)

    def _seal(self) -> None:
        if len(self.buffer):
            t = self.buffer.to_arrow()
            self.buffer = RowBuffer()
            self.pieces.append(t)
            self.piece_rows += t.num_rows

    def append_table(self, table: pa.Table) -> None:
        if table.num_rows:
            self._seal()
            self.pieces.append(table)
            self.piece_rows += table.num_rows

    def split(self, at: int) -> pa.Table | None:
        """Remove and return the rows from index ``at`` on (None if there are none)."""
        if at >= len(self):
            return None
        self._seal()
        whole = pa.concat_tables(self.pieces)
        tail = whole.slice(at)
        self.pieces = [whole.slice(0, at)] if at else []
        self.piece_rows = at
        return tail

    def take(self) -> pa.Table | None:
        """Remove and return every row (None if there are none)."""
        return self.split(0)
