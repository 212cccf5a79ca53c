"""Net rows (the :mod:`mirrorline.compile.batch` layout, as Arrow) to worktable rows: flat text columns in the layout
:mod:`mirrorline.apply.sql` describes. Vectorised with pyarrow compute; pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply.history import HistoryShape, keyed_shape
from mirrorline.apply.sql import MASK_COL, MASK_SEP, POS_COLS, key_col, moved_col
from mirrorline.compile.batch import POSITION_COLUMNS, Inserts
from mirrorline.compile.history import Frames
from mirrorline.log.columns import image_columns
from mirrorline.model import TableSchema

KINDS = ("D", "U", "I")


def work_columns(s: TableSchema, kind: str) -> list[str]:
    keys = [key_col(i) for i in range(len(s.key))]
    if kind == "D":
        return keys
    if kind == "U":
        return keys + value_columns(s) + [MASK_COL]
    if kind == "I":
        return list(s.column_names) + [MASK_COL] + [moved_col(i) for i in range(len(s.key))] + list(POS_COLS)
    raise ValueError(f"unknown net kind {kind!r}")


def value_columns(s: TableSchema) -> list[str]:
    """The non-key columns: what an update can write."""
    return [c for c in s.column_names if c not in s.key]


def select(net: pa.Table, table: str, kind: str | None = None) -> pa.Table:
    """The net rows of one table (and kind): ``net`` itself when it holds no other (filtering copies every column,
    the images too: a unit of one table and kind, a big transaction's, would be held twice)."""
    cond = pc.equal(net["table"], table)
    if kind is not None:
        cond = pc.and_(cond, pc.equal(net["kind"], kind))
    if pc.all(cond, skip_nulls=False).as_py() is True:  # (None: a null somewhere, or no row)
        return net
    return net.filter(cond)


def flatten(net: pa.Table, s: TableSchema, kind: str) -> pa.Table:
    """Net rows of one table and kind -> the worktable's rows (all strings)."""
    n = net.num_rows
    out: dict[str, pa.ChunkedArray | pa.Array] = {}
    if kind in ("D", "U"):
        keys = net["key"]
        for i in range(len(s.key)):
            out[key_col(i)] = pc.list_element(keys, i) if n else pa.array([], pa.string())
    if kind in ("U", "I"):
        cols = value_columns(s) if kind == "U" else list(s.column_names)
        out.update(image_columns(net["new"], cols) if n else {c: pa.array([], pa.string()) for c in cols})
    if kind in ("U", "I"):
        out[MASK_COL] = pc.fill_null(pc.binary_join(net["unchanged"], MASK_SEP), "") if n else pa.array([], pa.string())
    if kind == "I":
        moved = net["moved_from"] if "moved_from" in net.column_names else pa.nulls(n, pa.list_(pa.string()))
        for i in range(len(s.key)):
            out[moved_col(i)] = pc.list_element(moved, i) if n else pa.array([], pa.string())
        out[POS_COLS[0]], out[POS_COLS[1]] = net["lsn"], net["seq"]
    names = work_columns(s, kind)
    flat = pa.table([_as_string(out[c]) for c in names], names=names)
    return key_order(flat, s, [key_col(i) for i in range(len(s.key))] if kind in ("D", "U") else list(s.key))


def direct_from_inserts(rows: pa.Table, s: TableSchema) -> pa.Table:
    """Rows of an inserts-only unit's table (:class:`Inserts`, whole or a chunk) as the table's own columns in key
    order (:func:`direct_inserts`)."""
    n = rows.num_rows
    have = set(rows.column_names)
    cols = {c: rows[c] if c in have else pa.nulls(n, pa.string()) for c in s.column_names}
    return key_order(pa.table({c: _as_string(v) for c, v in cols.items()}), s, list(s.key))


def from_inserts(ins: Inserts, s: TableSchema) -> pa.Table:
    """An inserts-only unit's rows of one table (already flat) -> the worktable's rows of kind I, in key order."""
    n = ins.rows.num_rows
    have = set(ins.rows.column_names)
    out: dict[str, pa.ChunkedArray | pa.Array] = {
        c: ins.rows[c] if c in have else pa.nulls(n, pa.string()) for c in s.column_names
    }
    out[MASK_COL] = _empty_strings(n)
    for i in range(len(s.key)):
        out[moved_col(i)] = pa.nulls(n, pa.string())
    out[POS_COLS[0]], out[POS_COLS[1]] = ins.rows[POSITION_COLUMNS[0]], ins.rows[POSITION_COLUMNS[1]]
    names = work_columns(s, "I")
    return key_order(pa.table([_as_string(out[c]) for c in names], names=names), s, list(s.key))


def _empty_strings(n: int) -> pa.Array:
    """``n`` empty strings, made without a Python list."""
    offsets = pa.py_buffer(np.zeros(n + 1, dtype=np.int32).tobytes())
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(b""))


def _as_string(a: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    return a if a.type == pa.string() else pc.cast(a, pa.string())


_INTEGER_TYPES = frozenset({"smallint", "integer", "bigint", "int2", "int4", "int8"})


def direct_inserts(rows: pa.Table, s: TableSchema) -> pa.Table | None:
    """Insert worktable rows (:func:`flatten` ``"I"``) as the table's own columns in key order, ready to load
    straight into the table; None when some row marks columns unchanged (its image must be completed from the
    target first, through a worktable). Integer keys sort as numbers, others as text (what matters is that rows
    close in the key's index arrive together)."""
    if rows.num_rows and pc.any(pc.not_equal(rows[MASK_COL], "")).as_py():
        return None
    return key_order(rows.select(list(s.column_names)), s, list(s.key))


def key_order(rows: pa.Table, s: TableSchema, columns: Sequence[str]) -> pa.Table:
    """``rows`` sorted by the table's key, held in ``columns`` (text): integer keys as numbers, others as text. A
    set-based statement then meets the target's key index in order (measured on SQLite: an update of 37,000 random
    rows of 1M, 0.64 s in arrival order, 0.44 s in key order)."""
    if rows.num_rows < 2 or not columns:
        return rows
    sort_cols = []
    for i, (k, name) in enumerate(zip(s.key, columns, strict=True)):
        col = rows[name]
        if s.column(k).type_name.split("(")[0].strip().lower() in _INTEGER_TYPES and _all_ints(col):
            col = pc.cast(col, pa.int64(), safe=False)
        sort_cols.append((f"_k{i}", col))
    if len(sort_cols) == 1 and _ascending(sort_cols[0][1]):
        return rows  # already in key order (a bulk load's inserts, mostly): no copy of the rows
    keyed = pa.table(dict(sort_cols))
    return rows.take(pc.sort_indices(keyed, sort_keys=[(name, "ascending") for name, _ in sort_cols]))


def _ascending(col: pa.ChunkedArray | pa.Array) -> bool:
    """Is ``col`` (without nulls) in ascending order, as :func:`pyarrow.compute.sort_indices` orders it?"""
    if col.null_count:
        return False
    return bool(pc.all(pc.less_equal(col[:-1], col[1:])).as_py())


def _all_ints(col: pa.ChunkedArray) -> bool:
    """Is every value of a text column an integer literal (else it sorts as text, and the load reports it)?"""
    return bool(pc.all(pc.match_substring_regex(col, r"^-?[0-9]{1,18}$")).as_py() is not False)


def versions_work(frames: Frames, hs: HistoryShape) -> pa.Table:
    """The new versions of :class:`~mirrorline.compile.history.Frames` as the insert worktable's rows of ``hs``
    (:func:`work_columns` ``"I"``), in the order of the table's primary key."""
    v = frames.versions
    meta = {hs.start_lsn: "start_lsn", hs.start_at: "start_at", hs.end_lsn: "end_lsn", hs.end_at: "end_at"}
    meta[hs.deleted] = "deleted"
    source = {c: f"c{i}" for i, c in enumerate(frames.columns)}
    out: dict[str, Any] = {}
    for c in hs.column_names:
        name = meta.get(c) or source.get(c)
        out[c] = v[name] if name is not None else pa.nulls(v.num_rows, pa.string())
    out[MASK_COL] = pc.fill_null(pc.binary_join(v["unsent"], MASK_SEP), "")
    for i in range(len(hs.key)):
        out[moved_col(i)] = v[f"m{i}"]
    out[POS_COLS[0]], out[POS_COLS[1]] = v["lsn"], v["seq"]
    primary = keyed_shape(hs)  # (in the order of the table's primary key: each key's versions in start order)
    return key_order(pa.table(out), primary, list(primary.key))


def closes_work(frames: Frames, hs: HistoryShape) -> pa.Table:
    """The ends of current versions of :class:`~mirrorline.compile.history.Frames` as a worktable: the key as
    ``_ml_k0..``, then the end columns of ``hs`` by name."""
    c = frames.closes
    cols = {key_col(i): c[f"k{i}"] for i in range(len(hs.key))}
    cols.update({hs.end_lsn: c["end_lsn"], hs.end_at: c["end_at"], hs.deleted: c["deleted"]})
    return pa.table(cols)
