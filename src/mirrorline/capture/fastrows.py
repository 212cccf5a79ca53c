"""Columnar decoding of a batch of row messages (Insert / Update / Delete of one transaction) straight into the log's
Arrow layout: capture's hot path.

The per-message decoder (:mod:`mirrorline.capture.decoder`) plus the assembler is the reference: this module parses
the same bytes with numpy, one column position at a time across every message of the batch, and builds the Arrow
columns from the payload bytes without a Python object per value. Whenever a batch holds anything but the common,
well-formed case (a malformed message, an unknown or not captured relation, a binary value, a key column not sent...)
it raises :class:`Fallback`, and the caller runs the batch through the reference path, which accepts it or raises the
precise error. The tests check that both paths give the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from mirrorline.log.rows import ARROW_SCHEMA

if TYPE_CHECKING:
    from mirrorline.capture.assembler import RelInfo

_LIST_T = ARROW_SCHEMA.field("key").type
_MAP_T = ARROW_SCHEMA.field("new").type
_OPS = pa.array(["I", "U", "D"], pa.string())
_I, _U, _D, _N, _K, _O = 73, 85, 68, 78, 75, 79
_T, _NULL, _UNCH = 116, 110, 117
I64 = np.int64
# where the ranges are not in the buffer's order: values at least this long on average are copied a slice at a time
# (4,096 values of 2 kB: 1.9 ms, against 31.5 ms for an index of every byte; of 10 bytes the index is faster, 0.4
# against 7.9 ms for 16,384 values)
LONG_VALUES = 64


Segment = tuple[int, int, int, int, int]
"""``(first_index, commit_lsn, commit_ts, xid, seq0)``: one transaction's run of messages in a batch."""


class Fallback(Exception):
    """This batch needs the reference path."""


def _be16(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian 16-bit integers at byte offsets ``at`` of ``buf``: a view of the buffer as one at every byte
    (numpy reads an unaligned word), one gather."""
    words = np.ndarray((max(len(buf) - 1, 0),), dtype=">u2", buffer=buf, strides=(1,))
    return words[at].astype(I64)


def _be32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The big-endian 32-bit integers at byte offsets ``at`` (as :func:`_be16`: 2.4 ms for 364,000 of them, against
    9.0 ms for four gathers of a byte and their shifts)."""
    words = np.ndarray((max(len(buf) - 3, 0),), dtype=">u4", buffer=buf, strides=(1,))
    return words[at].astype(I64)


def _parse_tuples(
    buf: np.ndarray, pos: np.ndarray, end: np.ndarray, ncols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """TupleData at ``pos`` of each message (ending at ``end``): (kinds, starts, lengths) as (messages x ncols)
    arrays, and the position after each tuple."""
    m = len(pos)
    if np.any(pos + 2 > end):
        raise Fallback
    if np.any(_be16(buf, pos) != ncols):
        raise Fallback
    p = pos + 2
    kinds = np.empty((m, ncols), np.uint8)
    starts = np.empty((m, ncols), I64)
    lens = np.empty((m, ncols), I64)
    for j in range(ncols):
        if np.any(p >= end):
            raise Fallback
        k = buf[p]
        is_t = k == _T
        if not np.all(is_t | (k == _NULL) | (k == _UNCH)):
            raise Fallback
        if np.any(is_t & (p + 5 > end)):
            raise Fallback
        q = np.where(is_t, p + 1, 0)
        ln = np.where(is_t, _be32(buf, q), 0)
        start = p + 5
        after = np.where(is_t, start + ln, p + 1)
        if np.any(ln >= 1 << 31) or np.any(after > end):
            raise Fallback
        kinds[:, j] = k
        starts[:, j] = start
        lens[:, j] = ln
        p = after
    return kinds, starts, lens, p


def _strings(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, null: np.ndarray) -> pa.Array:
    """A string array of the byte ranges (``null``: SQL NULL); UTF-8 is checked."""
    n = len(starts)
    offsets = np.zeros(n + 1, I64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise Fallback
    data = _taken(buf, starts, lens, total) if total else np.zeros(0, np.uint8)
    if data is None and total >= LONG_VALUES * n:  # long values (a 2 kB text): a slice each, not indexed by byte
        view = memoryview(buf)  # type: ignore[arg-type]
        data = np.frombuffer(
            b"".join([view[s : s + ln] for s, ln in zip(starts.tolist(), lens.tolist(), strict=True)]), np.uint8
        )
    elif data is None:
        idx = np.repeat(starts - offsets[:-1], lens) + np.arange(total, dtype=I64)
        data = buf[idx]
    validity = pa.array(~null).buffers()[1] if null.any() else None
    arr = pa.Array.from_buffers(
        pa.string(),
        n,
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        null_count=int(null.sum()),
    )
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        raise Fallback from None
    return arr


def _taken(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, total: int) -> np.ndarray | None:
    """The byte ranges end to end, where they ascend in ``buf`` without overlapping (as a tuple's values do): the
    buffer seen as an Arrow binary array of the ranges and the gaps between them, and Arrow's take of every other
    element, a copy per range (364,000 values of a narrow row's sizes: 7.5 ms, against 29 ms for an index of every
    byte). None where they do not ascend."""
    n = len(starts)
    starts = np.minimum(starts, len(buf))  # (a NULL's empty range may start past the end: the last value of all)
    ends = starts + lens
    if n > 1 and not bool(np.all(starts[1:] >= ends[:-1])):
        return None
    base, top = int(starts[0]), int(ends[-1])
    if base < 0 or top > len(buf) or top - base >= 1 << 31:
        return None
    bounds = np.empty(2 * n, np.int32)
    bounds[0::2] = starts - base
    bounds[1::2] = ends - base
    ranges = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buf[base:top])])
    taken = ranges.take(pa.array(np.arange(0, 2 * n, 2, dtype=I64)))
    return np.frombuffer(taken.buffers()[2], np.uint8, count=total)


def _list_offsets(counts: np.ndarray) -> pa.Array:
    out = np.zeros(len(counts) + 1, I64)
    np.cumsum(counts, out=out[1:])
    return pa.array(out.astype(np.int32))


def decode_rows(
    payloads: Sequence[bytes], relations: Mapping[int, RelInfo], segments: Sequence[Segment], in_stream: bool = False
) -> tuple[pa.Table, list[int], np.ndarray]:
    """Row messages of ordinary transactions (not inside a stream block), in order -> their rows in the log layout,
    and how many rows each transaction segment kept. ``segments``: ``(first_index, commit_lsn, commit_ts, xid,
    seq0)`` of each transaction's run of messages (the first starts at 0). Raises :class:`Fallback` for anything but
    the common well-formed case. ``in_stream``: the messages come from a stream block (each carries the xid of its
    (sub)transaction, returned per row as the third item)."""
    n = len(payloads)
    sizes = np.fromiter(map(len, payloads), dtype=I64, count=n)
    off = 4 if in_stream else 0
    if np.any(sizes < 8 + off):
        raise Fallback
    begins = np.zeros(n, I64)
    np.cumsum(sizes[:-1], out=begins[1:])
    ends = begins + sizes
    buf = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    kind = buf[begins]
    relid = _be32(buf, begins + 1 + off)
    parts: list[tuple[np.ndarray, pa.Table]] = []
    for rid in np.unique(relid):
        rel = relations.get(int(rid))
        if rel is None or not rel.captured:  # the reference path drops (and checks) rows of tables not captured
            raise Fallback
        rows = np.flatnonzero(relid == rid)
        parts.append((rows, _relation_rows(buf, begins[rows] + off, ends[rows], kind[rows], rel)))
    nseg = len(segments)
    seg_first = np.array([sg[0] for sg in segments], I64)
    if not parts:
        return ARROW_SCHEMA.empty_table(), [0] * nseg, np.zeros(0, I64)
    if len(parts) == 1:
        kept, table = parts[0]
    else:
        order = np.concatenate([rows for rows, _ in parts])
        perm = np.argsort(order, kind="stable")
        kept = order[perm]
        table = pa.concat_tables([t for _, t in parts]).take(pa.array(perm))
    seg = np.searchsorted(seg_first, kept, side="right") - 1
    counts = np.bincount(seg, minlength=nseg)
    first_kept = np.zeros(nseg, I64)
    np.cumsum(counts[:-1], out=first_kept[1:])
    m = len(kept)
    lsn = np.array([sg[1] for sg in segments], I64)[seg]
    ts = np.array([sg[2] for sg in segments], I64)[seg]
    xid = np.array([sg[3] for sg in segments], I64)[seg]
    seq = np.array([sg[4] for sg in segments], I64)[seg] + np.arange(m, dtype=I64) - first_kept[seg]
    table = (
        table.set_column(0, ARROW_SCHEMA.field("lsn"), pa.array(lsn))
        .set_column(1, ARROW_SCHEMA.field("seq"), pa.array(seq))
        .set_column(2, ARROW_SCHEMA.field("ts"), pa.array(ts))
        .set_column(3, ARROW_SCHEMA.field("xid"), pa.array(xid))
    )
    subxids = _be32(buf, begins[kept] + 1) if in_stream else np.zeros(0, I64)
    return table, counts.tolist(), subxids


def _relation_rows(buf: np.ndarray, begins: np.ndarray, ends: np.ndarray, kind: np.ndarray, rel: RelInfo) -> pa.Table:
    """The rows of one relation's messages (lsn/seq/ts/xid left 0 for the caller). ``begins``: where each message
    would start without an xid field (the marker byte is at +5)."""
    m = len(begins)
    ncols = len(rel.names)
    marker = buf[begins + 5]
    is_i, is_u, is_d = kind == _I, kind == _U, kind == _D
    if not np.all(is_i | is_u | is_d):
        raise Fallback
    has_old = (is_u | is_d) & ((marker == _K) | (marker == _O))
    if np.any(is_d & ~has_old) or np.any((is_i | (is_u & ~has_old)) & (marker != _N)):
        raise Fallback
    new_at = begins + 6
    old = None
    if has_old.any():
        old_rows = np.flatnonzero(has_old)
        old = _parse_tuples(buf, begins[old_rows] + 6, ends[old_rows], ncols)
        after = old[3]
        upd = is_u[old_rows]
        if np.any(after[~upd] != ends[old_rows][~upd]):
            raise Fallback  # trailing bytes after a Delete's tuple
        ur = old_rows[upd]
        if len(ur):
            n_at = after[upd]
            if np.any(n_at >= ends[ur]) or np.any(buf[np.minimum(n_at, len(buf) - 1)] != _N):
                raise Fallback
            new_at = new_at.copy()
            new_at[ur] = n_at + 1
    new_rows = np.flatnonzero(~is_d)
    if len(new_rows) == m:  # no delete: every row's new tuple as parsed
        kinds, starts, lens, after = _parse_tuples(buf, new_at, ends, ncols)
        if np.any(after != ends):
            raise Fallback
        if np.any(kinds[is_i] == _UNCH):
            raise Fallback  # an Insert cannot leave a value unsent
    else:
        kinds = np.full((m, ncols), _NULL, np.uint8)
        starts = np.zeros((m, ncols), I64)
        lens = np.zeros((m, ncols), I64)
        if len(new_rows):
            k, s, ln, after = _parse_tuples(buf, new_at[new_rows], ends[new_rows], ncols)
            if np.any(after != ends[new_rows]):
                raise Fallback
            if np.any(k[is_i[new_rows]] == _UNCH):
                raise Fallback  # an Insert cannot leave a value unsent
            kinds[new_rows], starts[new_rows], lens[new_rows] = k, s, ln
    # the key: from the new tuple, or the old one for deletes
    key_idx = list(rel.key_idx)
    kk, ks, kl = kinds[:, key_idx].copy(), starts[:, key_idx].copy(), lens[:, key_idx].copy()
    if old is not None:
        old_rows = np.flatnonzero(has_old)
        d_in_old = is_d[old_rows]
        if d_in_old.any():
            dr = old_rows[d_in_old]
            kk[dr] = old[0][d_in_old][:, key_idx]
            ks[dr] = old[1][d_in_old][:, key_idx]
            kl[dr] = old[2][d_in_old][:, key_idx]
    if np.any(kk == _UNCH):
        raise Fallback  # a key value that was not sent: the reference path looks in the old tuple or refuses
    key_values = _strings(buf, ks.ravel(), np.where(kk == _T, kl, 0).ravel(), (kk == _NULL).ravel())
    key = pa.ListArray.from_arrays(_list_offsets(np.full(m, len(key_idx), I64)), key_values, type=_LIST_T)
    # old_key: updates whose old tuple's key differs from the new key
    old_key_lists: list[list[str | None] | None] = [None] * m
    if old is not None:
        okind, ostart, olen, _ = old
        old_rows = np.flatnonzero(has_old)
        for j in np.flatnonzero(is_u[old_rows]).tolist():  # (a delete's old tuple is its key)
            r = int(old_rows[j])
            nk = [_value(buf, kinds[r, c], starts[r, c], lens[r, c]) for c in key_idx]
            ok = [
                _value(buf, okind[j, c], ostart[j, c], olen[j, c]) if okind[j, c] != _UNCH else v
                for c, v in zip(key_idx, nk, strict=True)
            ]
            if ok != nk:
                old_key_lists[r] = ok
    old_key = pa.array(old_key_lists, _LIST_T)
    # the new image: every sent column of inserts and updates
    sent = (kinds != _UNCH) & ~is_d[:, None]
    counts = sent.sum(axis=1)
    flat = sent.ravel()
    col_of = np.tile(np.arange(ncols, dtype=I64), m)
    fk, fs, fl = kinds.ravel(), starts.ravel(), lens.ravel()
    if not flat.all():  # (else every value of every row, as they are)
        col_of, fk, fs, fl = col_of[flat], fk[flat], fs[flat], fl[flat]
    names = pa.array(rel.names, pa.string()).take(pa.array(col_of))
    values = _strings(buf, fs, np.where(fk == _T, fl, 0), fk == _NULL)
    new = pa.MapArray.from_arrays(
        _list_offsets(counts), names, values, type=_MAP_T, mask=pa.array(is_d) if is_d.any() else None
    )
    # unchanged: the names of columns not sent (sorted)
    unch = kinds == _UNCH
    if unch.any():  # one list per distinct set of columns unsent (a TOASTed column left alone: the same in every row)
        if ncols <= 62:  # each row's set as the bits of one integer
            codes, which = np.unique(unch @ (np.int64(1) << np.arange(ncols, dtype=I64)), return_inverse=True)
            sets = [[c for c in range(ncols) if int(code) >> c & 1] for code in codes]
        else:
            rows_of, which = np.unique(unch, axis=0, return_inverse=True)
            sets = [np.flatnonzero(row).tolist() for row in rows_of]
        lists = [sorted(rel.names[c] for c in cols) for cols in sets]
        unchanged = pa.array(lists, _LIST_T).take(pa.array(which.ravel()))
    else:
        unchanged = pa.ListArray.from_arrays(
            pa.array(np.zeros(m + 1, np.int32)), pa.array([], pa.string()), type=_LIST_T
        )
    zeros = pa.array(np.zeros(m, I64))
    op = _OPS.take(pa.array(np.where(is_i, 0, np.where(is_u, 1, 2))))
    return pa.Table.from_arrays(
        [
            zeros,
            zeros,
            zeros,
            zeros,
            pa.repeat(pa.scalar(rel.table, pa.string()), m),
            op,
            key,
            old_key,
            new,
            unchanged,
            pa.repeat(pa.scalar(rel.version, pa.int32()), m),
        ],
        schema=ARROW_SCHEMA,
    )


def _value(buf: np.ndarray, kind: int, start: int, length: int) -> str | None:
    if kind == _NULL:
        return None
    try:
        return bytes(buf[start : start + length]).decode("utf-8")
    except UnicodeDecodeError:
        raise Fallback from None
