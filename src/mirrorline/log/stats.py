"""Per-table statistics of log rows: what compiling a unit must know before it folds (DESIGN §5), kept in each
segment's metadata so that a unit's statistics are a sum over footers instead of a job over its rows.

Per table: how many changes, the first position of each kind of change (I, U, D, T, and K: an update that changes
the key, counted under K and not U), the last position of any change, every TRUNCATE's position, how many updates
change the key and how many of those mark columns unchanged, how many changes of any kind mark columns unchanged
(``marks``; None, unknown, in segments written before it was kept), and a HyperLogLog sketch of the keys changed
(``keys``, :class:`KeySketch`: about how many different keys, within a few per cent; None in segments written before
it was kept, or kept of another hash), which tells compile, before it reads a row, whether a unit's changes fold at
all. Compile takes the table order (first kept change), the TRUNCATE positions, whether key changes need splitting
and whether a unit of inserts and updates may skip the fold (no change marks columns:
:mod:`mirrorline.compile.updates`) from these. Pure: Arrow in, values out.

:func:`table_stats` takes rows in log order (as segments hold them: the first and last rows of a kind are its first
and last positions); :func:`merge` sums the statistics of disjoint row sets, such as a stream's parts.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.model import kept_kinds
from mirrorline.position import Position

KINDS = ("I", "U", "D", "T", "K")
COLUMNS = ["lsn", "seq", "table", "op", "key", "old_key", "unchanged"]  # what table_stats reads


SKETCH_BITS = 10  # 1,024 registers: a standard error of 3.3%
# the metadata field of a table's key sketch; segments written before :func:`key_hashes` hashed Arrow's buffers keep
# theirs, of another hash, as "keys", which is left unread (its registers cannot be joined with these): unknown
SKETCH_FIELD = "key_sketch"
_REGISTERS = 1 << SKETCH_BITS


@dataclass(frozen=True)
class KeySketch:
    """A HyperLogLog sketch (Flajolet et al., 2007) of a set of keys: one byte a register, the most leading zeros
    (plus one) seen among the 64-bit hashes that fall in it. The sketch of a union is the registers' maximum."""

    registers: bytes

    @classmethod
    def of(cls, hashes: np.ndarray, groups: np.ndarray | None = None, n_groups: int = 1) -> list[KeySketch]:
        """The sketch of each group's ``hashes`` (uint64; ``groups``: each hash's group, 0 .. ``n_groups`` - 1)."""
        idx = (hashes >> np.uint64(64 - SKETCH_BITS)).astype(np.int64)
        rest = (hashes << np.uint64(SKETCH_BITS)) | np.uint64(1 << (SKETCH_BITS - 1))  # (never 0: bounds the run)
        rho = (64 - np.floor(np.log2(rest.astype(np.float64)))).astype(np.int64)  # 1 .. 55
        # each (group, register, rho) seen marked, then per register the highest rho marked (np.maximum.at: 3x slower)
        cells = (idx if groups is None else groups * _REGISTERS + idx) * 64 + rho
        seen = np.zeros(n_groups * _REGISTERS * 64, bool)
        seen[cells] = True
        grid = seen.reshape(n_groups * _REGISTERS, 64)
        top = np.where(grid.any(axis=1), 63 - np.argmax(grid[:, ::-1], axis=1), 0).astype(np.uint8)
        regs = top.reshape(n_groups, _REGISTERS)
        return [cls(r.tobytes()) for r in regs]

    def union(self, other: KeySketch) -> KeySketch:
        a, b = np.frombuffer(self.registers, np.uint8), np.frombuffer(other.registers, np.uint8)
        return KeySketch(np.maximum(a, b).tobytes())

    def estimate(self) -> float:
        """About how many different keys (linear counting while registers are empty, as the paper corrects)."""
        regs = np.frombuffer(self.registers, np.uint8)
        m = float(_REGISTERS)
        raw = 0.7213 / (1 + 1.079 / m) * m * m / float(np.sum(np.exp2(-regs.astype(np.float64))))
        zeros = int(np.count_nonzero(regs == 0))
        return m * math.log(m / zeros) if raw <= 2.5 * m and zeros else raw

    def text(self) -> str:
        return base64.b64encode(self.registers).decode("ascii")

    @classmethod
    def parse(cls, text: str) -> KeySketch:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        if len(raw) != _REGISTERS:
            raise ValueError(f"a key sketch of {len(raw)} registers, not {_REGISTERS}")
        return cls(raw)


def key_ids(keys: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Each key (a list of the key's values as text) as one value: a one-column key as it is, else its columns
    joined by NUL, which PostgreSQL's text never holds. A key holding a NULL (no key column does) is NULL."""
    lengths = pc.min_max(pc.list_value_length(keys)).as_py()
    return pc.list_element(keys, 0) if lengths["min"] == lengths["max"] == 1 else pc.binary_join(keys, "\x00")


_MIX = (np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LOW_BYTES = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [(1 << 64) - 1], np.uint64)  # [i]: i low bytes kept
HASH_ROWS = 262_144  # keys hashed at a time (a slice's arrays: a few of 8 bytes a key)


def _fmix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's finalizer: every bit of ``h`` moves every bit of the result (HyperLogLog reads the top bits)."""
    h ^= h >> np.uint64(33)
    h *= _MIX[0]
    h ^= h >> np.uint64(33)
    h *= _MIX[1]
    h ^= h >> np.uint64(33)
    return h


def _text_hashes(arr: pa.Array) -> np.ndarray:
    """A 64-bit hash of each text of ``arr`` (string, not chunked) from its bytes in place: its length, then its
    bytes eight at a time (a little-endian word read at any offset; the last one's bytes past the text zeroed), each
    word mixed in (:func:`_fmix`); a pass per word, over the texts that still have bytes. A NULL hashes as a
    constant."""
    n = len(arr)
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], np.int64 if wide else np.int32, n + 1, arr.offset * (8 if wide else 4))
    lo, hi = int(offsets[0]), int(offsets[-1])
    offsets = offsets.astype(np.intp)
    starts = (offsets[:-1] - lo).astype(np.intp)
    lengths = np.diff(offsets).astype(np.intp)
    padded = np.zeros(hi - lo + 8, np.uint8)  # (a word read at the last byte stays inside)
    if hi > lo:
        padded[: hi - lo] = np.frombuffer(bufs[2], np.uint8, hi - lo, lo)
    words = np.ndarray((hi - lo + 1,), "<u8", padded, 0, (1,))  # words[i]: the eight bytes from byte i
    h = lengths.astype(np.uint64) * _GOLDEN
    at = np.flatnonzero(lengths > 0)
    k = 0
    while len(at):
        left = lengths[at] - k  # > 0
        w = words.take(starts[at] + k) & _LOW_BYTES.take(np.minimum(left, 8).astype(np.intp))
        h[at] = _fmix(h[at] ^ w)
        k += 8
        at = at[left > 8]
    h = _fmix(h)
    if arr.null_count:
        h[arr.is_null().to_numpy(zero_copy_only=False)] = _GOLDEN
    return h


def key_hashes(keys: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A 64-bit hash of each key (:func:`key_ids`; NULL keys hash alike), computed over Arrow's buffers, a slice of
    :data:`HASH_ROWS` at a time, no Python object made per key (1,000,000 narrow keys: 50-90 ms)."""
    ids = key_ids(keys)
    chunks = ids.chunks if isinstance(ids, pa.ChunkedArray) else [ids]
    out = [_text_hashes(c.slice(i, HASH_ROWS)) for c in chunks for i in range(0, len(c), HASH_ROWS)]
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


@dataclass(frozen=True)
class TableStats:
    count: int
    first: Mapping[str, Position]  # kind (I, U, D, T, K) -> its first position; kinds absent have none
    last: Position
    truncates: tuple[Position, ...] = ()
    key_changes: int = 0
    moves: int = 0  # key changes marking columns unchanged
    marks: int | None = None  # changes marking columns unchanged (None: unknown, a segment from before it was kept)
    # the keys changed (None: unknown, a segment from before it was kept); an estimate, so not compared
    keys: KeySketch | None = field(default=None, compare=False)

    def meta(self) -> dict[str, Any]:
        out = {
            "count": self.count,
            "first": {k: [p.lsn, p.seq] for k, p in sorted(self.first.items())},
            "last": [self.last.lsn, self.last.seq],
            "truncates": [[p.lsn, p.seq] for p in self.truncates],
            "key_changes": self.key_changes,
            "moves": self.moves,
            "marks": self.marks,
        }
        if self.keys is not None:
            out[SKETCH_FIELD] = self.keys.text()
        return out

    def distinct_keys(self) -> float | None:
        """About how many different keys these changes touch (None: unknown)."""
        return self.keys.estimate() if self.keys is not None else None

    @classmethod
    def from_meta(cls, m: Mapping[str, Any]) -> TableStats:
        first = {str(k): Position(*v) for k, v in m["first"].items()}
        unknown = set(first) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown change kinds {sorted(unknown)}")
        return cls(
            count=int(m["count"]),
            first=first,
            last=Position(*m["last"]),
            truncates=tuple(Position(*p) for p in m.get("truncates") or ()),
            key_changes=int(m.get("key_changes") or 0),
            moves=int(m.get("moves") or 0),
            marks=int(m["marks"]) if m.get("marks") is not None else None,
            keys=KeySketch.parse(m[SKETCH_FIELD]) if m.get(SKETCH_FIELD) else None,
        )

    def combine(self, other: TableStats) -> TableStats:
        """The statistics of both sets of rows (disjoint, in any order)."""
        kinds = self.first.keys() | other.first.keys()
        return TableStats(
            count=self.count + other.count,
            first={k: min(p for p in (self.first.get(k), other.first.get(k)) if p is not None) for k in kinds},
            last=max(self.last, other.last),
            truncates=tuple(sorted(self.truncates + other.truncates)),
            key_changes=self.key_changes + other.key_changes,
            moves=self.moves + other.moves,
            marks=self.marks + other.marks if self.marks is not None and other.marks is not None else None,
            keys=self.keys.union(other.keys) if self.keys is not None and other.keys is not None else None,
        )

    def first_kept(self, kept: frozenset[str]) -> Position | None:
        """The first position of a change the table's actions keep (``kept``: a subset of I, U, D). A TRUNCATE is
        kept with D; a key change when its D or its I is."""
        kinds = set(kept_kinds(kept))
        if kinds & {"D", "I"}:  # K: a key change, kept when its D or its I is
            kinds.add("K")
        found = [self.first[k] for k in kinds if k in self.first]
        return min(found) if found else None


Stats = dict[str, TableStats]


def table_stats(t: pa.Table, sketch: bool = True) -> Stats:
    """The statistics of rows in log order (at least the :data:`COLUMNS`); ``sketch``: with each table's key sketch
    (else ``keys`` is None: a hash of every key spared where nothing asks how many keys there are)."""
    n = t.num_rows
    if n == 0:
        return {}
    op = t.column("op")
    old = t.column("old_key")
    key_change = np.zeros(n, dtype=bool)
    if old.null_count < n:
        cand = pc.and_(pc.is_valid(old), pc.equal(op, "U"))
        idx = np.flatnonzero(cand.to_numpy(zero_copy_only=False))
        if len(idx):
            keys = t.column("key").take(pa.array(idx)).to_pylist()
            olds = old.take(pa.array(idx)).to_pylist()
            key_change[idx[[k != o for k, o in zip(keys, olds, strict=True)]]] = True
    marks = pc.fill_null(pc.greater(pc.list_value_length(t.column("unchanged")), 0), False)
    marked = marks.to_numpy(zero_copy_only=False)
    moves = np.logical_and(key_change, marked)
    kind = pc.if_else(pa.array(key_change), "K", op)
    g = pa.table(
        {
            "table": t.column("table"),
            "kind": kind,
            "i": pa.array(np.arange(n, dtype=np.int64)),
            "mv": pa.array(moves.astype(np.int64)),
            "mk": pa.array(marked.astype(np.int64)),
        }
    )
    agg = g.group_by(["table", "kind"]).aggregate(
        [("i", "min"), ("i", "max"), ("i", "count"), ("mv", "sum"), ("mk", "sum")]
    )
    lsn = t.column("lsn").to_numpy()
    seq = t.column("seq").to_numpy()

    def pos(i: int) -> Position:
        return Position(int(lsn[i]), int(seq[i]))

    acc: dict[str, dict[str, Any]] = {}
    for r in agg.to_pylist():
        a = acc.setdefault(r["table"], {"count": 0, "first": {}, "last": -1, "key_changes": 0, "moves": 0, "marks": 0})
        a["count"] += r["i_count"]
        a["marks"] += r["mk_sum"]
        a["first"][r["kind"]] = pos(r["i_min"])
        a["last"] = max(a["last"], r["i_max"])
        if r["kind"] == "K":
            a["key_changes"] += r["i_count"]
            a["moves"] += r["mv_sum"]
    sketches: dict[str, KeySketch] = {}
    if sketch:
        names = t.column("table").dictionary_encode().combine_chunks()
        groups = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        sketched = KeySketch.of(key_hashes(t.column("key")), groups, len(names.dictionary))
        sketches = dict(zip(names.dictionary.to_pylist(), sketched, strict=True))
    truncs: dict[str, list[Position]] = {}
    if any("T" in a["first"] for a in acc.values()):
        ti = np.flatnonzero(pc.equal(op, "T").to_numpy(zero_copy_only=False))
        tables = t.column("table").take(pa.array(ti)).to_pylist()
        for i, name in zip(ti, tables, strict=True):
            truncs.setdefault(name, []).append(pos(int(i)))
    return {
        name: TableStats(
            count=a["count"],
            first=a["first"],
            last=pos(a["last"]),
            truncates=tuple(truncs.get(name, ())),
            key_changes=a["key_changes"],
            moves=a["moves"],
            marks=a["marks"],
            keys=sketches.get(name),
        )
        for name, a in acc.items()
    }


def at_lsn(stats: Stats, lsn: int) -> Stats:
    """``stats`` with every position moved to ``lsn`` (its seq kept): a streamed transaction's statistics, counted
    from its parts' rows while their commit LSN was unknown (0), once it commits."""

    def moved(p: Position) -> Position:
        return Position(lsn, p.seq)

    return {
        name: dataclasses.replace(
            s,
            first={k: moved(p) for k, p in s.first.items()},
            last=moved(s.last),
            truncates=tuple(moved(p) for p in s.truncates),
        )
        for name, s in stats.items()
    }


def merge(parts: Iterable[Stats]) -> Stats:
    """The statistics of disjoint sets of rows (each computed from rows in log order), given in any order."""
    out: Stats = {}
    for p in parts:
        for name, s in p.items():
            out[name] = out[name].combine(s) if name in out else s
    return out


def to_meta(stats: Stats) -> dict[str, Any]:
    return {name: s.meta() for name, s in sorted(stats.items())}


def from_meta(m: Mapping[str, Any]) -> Stats:
    return {str(name): TableStats.from_meta(v) for name, v in m.items()}
