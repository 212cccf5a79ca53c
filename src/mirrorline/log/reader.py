"""Reading the change log: any number of readers, each from its own position (exclusive) up to a position
(inclusive), or from a timestamp (the first change whose commit ts >= T: the daystream idea).

Segment metadata is cheap (names plus footers or commit records, cached: segments are immutable). The chain of
segments is checked: each segment records the last position of the one before it, so a missing segment is a
LogError, never a silent gap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mirrorline.errors import LogError
from mirrorline.log.layout import Layout, SegmentInfo, parse_segment_name, read_json
from mirrorline.log.rows import ARROW_SCHEMA, table_to_changes
from mirrorline.log.schemas import SchemaStore
from mirrorline.log.segments import ROW_GROUP_ROWS, damaged, iter_batches, read_columns, read_info
from mirrorline.log.stats import COLUMNS as STAT_COLUMNS
from mirrorline.log.stats import Stats, merge, table_stats
from mirrorline.model import Change, TableSchema
from mirrorline.position import Position


@dataclass(frozen=True)
class Retained:
    """What retention removed: everything up to ``after`` (whose latest commit ts was ``max_ts``), with the daystream
    addressing state after its last line (``c``, ``c_lines``: see :class:`mirrorline.log.daystream.Address`; None in
    records written before there was one) and the address of the last line imported into it."""

    after: Position
    max_ts: int
    c: int | None = None
    c_lines: int = 0
    imported: tuple[int, int] | None = None


def read_retained(layout: Layout) -> Retained | None:
    if not layout.retained.exists():
        return None
    d = read_json(layout.retained)
    imp = d.get("imported")
    return Retained(
        Position(int(d["lsn"]), int(d["seq"])),
        int(d.get("max_ts", 0)),
        int(d["c"]) if d.get("c") is not None else None,
        int(d.get("c_lines", 0)),
        (int(imp[0]), int(imp[1])) if imp else None,
    )


def _last(t: pa.Table) -> Position:
    """The position of a table's last row."""
    return Position(int(t.column("lsn")[-1].as_py()), int(t.column("seq")[-1].as_py()))


def range_mask(t: pa.Table, after: Position | None, upto: Position | None) -> pa.Array | None:
    """Rows with ``after < (lsn, seq) <= upto``; None when every row qualifies."""
    lsn, seq = t.column("lsn"), t.column("seq")
    mask = None
    if after is not None:
        mask = pc.or_(pc.greater(lsn, after.lsn), pc.and_(pc.equal(lsn, after.lsn), pc.greater(seq, after.seq)))
    if upto is not None:
        m2 = pc.or_(pc.less(lsn, upto.lsn), pc.and_(pc.equal(lsn, upto.lsn), pc.less_equal(seq, upto.seq)))
        mask = m2 if mask is None else pc.and_(mask, m2)
    return mask


def _index(lsn: np.ndarray, seq: np.ndarray, p: Position, side: Literal["left", "right"]) -> int:
    """Where ``p`` goes in the positions ``(lsn, seq)`` sorted by lsn, then seq (``side`` as numpy's)."""
    i = int(np.searchsorted(lsn, p.lsn, "left"))
    j = int(np.searchsorted(lsn, p.lsn, "right"))
    return i + int(np.searchsorted(seq[i:j], p.seq, side))


def _hits(pos: pa.Table, want: pa.Table) -> np.ndarray:
    """The sorted indexes of the rows of ``pos`` (lsn, seq) whose position is in ``want``."""
    idx = pos.select(["lsn", "seq"]).append_column("_i", pa.array(np.arange(pos.num_rows, dtype=np.int64)))
    return np.sort(idx.join(want, ["lsn", "seq"], join_type="left semi").column("_i").to_numpy())


def _rows_at(s: SegmentInfo, want: pa.Table, cols: list[str]) -> Iterator[pa.Table]:
    """The rows of segment ``s`` at the positions ``want``: of a plain segment, only the row groups holding some."""
    if s.stream:  # one transaction's parts, merged in log order a batch at a time
        for b in iter_batches(s, ROW_GROUP_ROWS):
            hit = _hits(b, want)
            if len(hit):
                yield b.select(cols).take(pa.array(hit))
        return
    try:
        with pq.ParquetFile(str(s.path)) as f:
            pos = f.read(columns=["lsn", "seq"])
            sizes = [f.metadata.row_group(g).num_rows for g in range(f.num_row_groups)]
    except (OSError, pa.ArrowException) as e:
        raise damaged(s.path, e) from None
    hit = _hits(pos, want)
    groups, start = [], 0
    for g, n in enumerate(sizes):
        local = hit[(hit >= start) & (hit < start + n)] - start
        if len(local):
            groups.append((g, local))
        start += n
    if not groups:
        return
    for g, local in groups:  # one row group at a time, each as soon as it is read
        try:
            with pq.ParquetFile(str(s.path)) as f:
                t = f.read_row_group(g, columns=cols)
        except (OSError, pa.ArrowException) as e:
            raise damaged(s.path, e) from None
        yield t.take(pa.array(local))


class ChangeLog:
    """The read side of the log at ``root`` (any number at once, alongside the one writer)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.layout = Layout(root)
        self._infos: dict[str, SegmentInfo] = {}
        self.schemas = SchemaStore(self.layout.schemas)

    # -- metadata ----------------------------------------------------------------------------------------------

    def retained(self) -> Retained | None:
        return read_retained(self.layout)

    def receiving(self) -> bool:
        """Is a streamed transaction being received (spilled, neither committed nor aborted yet)? A large
        transaction's changes arrive while its statement runs; the source is not idle then."""
        try:
            return any(True for _ in os.scandir(self.layout.spill))
        except FileNotFoundError:
            return False

    def segments(self) -> list[SegmentInfo]:
        """Every retained segment in log order, their chain checked."""
        infos = self.segment_files()
        retained = self.retained()
        if retained is not None:
            infos = [i for i in infos if i.last > retained.after]
        prev = retained.after if retained is not None else None
        for info in infos:
            if info.prev != prev:
                raise LogError(
                    f"the change log is missing a segment before {info.name} (it follows {info.prev}, the log "
                    f"has {prev if prev is not None else 'nothing'} before it)",
                    hint="restore the missing segment from a backup, or rebuild the log",
                    segment=info.name,
                )
            prev = info.last
        return infos

    def segment_files(self) -> list[SegmentInfo]:
        """Every segment on disk in log order, including any that retention was removing when it stopped."""
        self.layout.require()
        names = sorted(n for n in os.listdir(self.layout.segments) if parse_segment_name(n))
        infos = []
        for n in names:
            info = self._infos.get(n)
            if info is None:
                info = self._infos[n] = read_info(self.layout.segments / n)
            infos.append(info)
        for gone in set(self._infos) - set(names):
            del self._infos[gone]
        return infos

    def start(self) -> Position | None:
        """Readers can start after this position or anything later (None: the log never lost anything)."""
        r = self.retained()
        return r.after if r is not None else None

    def durable(self) -> Position | None:
        """The position of the log's last change (None: empty log)."""
        segs = self.segments()
        if segs:
            return segs[-1].last
        return self.start()

    def schema(self, table: str, version: int) -> TableSchema:
        return self.schemas.get(table, version)

    def schema_at(self, table: str, end: Position) -> TableSchema | None:
        """The table's logged schema in force at ``end`` (the newest version recorded since at or before it, else
        the newest one); None when the log has none for it."""
        self.schemas.refresh()
        versions = self.schemas.versions(table)
        if not versions:
            return None
        fitting = [v for v, s in versions.items() if s.since <= end]
        return versions[max(fitting)] if fitting else versions[max(versions)]

    def shape_at(self, table: str, position: Position) -> TableSchema | None:
        """The logged schema a table loaded at ``position`` has the shape of: the newest version recorded at or
        before it, else the oldest one (the table was loaded before its first logged change)."""
        self.schemas.refresh()
        versions = self.schemas.versions(table)
        fitting = [v for v, s in versions.items() if s.since <= position]
        return versions[max(fitting)] if fitting else versions[min(versions)] if versions else None

    def select(self, after: Position | None = None, upto: Position | None = None) -> list[SegmentInfo]:
        """The segments holding changes in ``(after, upto]``; LogError if ``after`` is no longer retained."""
        segs = self.segments()
        start = self.start()
        if start is not None and after is not None and after < start:
            raise LogError(
                f"position {after} is no longer retained (the log now starts after {start})",
                hint="this reader fell behind retention; reload its target (snapshot) and go on",
                position=str(after),
                start=str(start),
            )
        return [s for s in segs if (after is None or s.last > after) and (upto is None or s.first <= upto)]

    def count(self, after: Position | None = None, upto: Position | None = None) -> int:
        """How many changes are in ``(after, upto]`` (reads only lsn/seq of the boundary segments)."""
        total = 0
        for s in self.select(after, upto):
            if (after is None or s.first > after) and (upto is None or s.last <= upto):
                total += s.count
            else:
                t = read_columns(s, ["lsn", "seq"])
                m = range_mask(t, after, upto)
                total += t.num_rows if m is None else int(pc.sum(m).as_py() or 0)
        return total

    def stats(self, after: Position | None = None, upto: Position | None = None) -> Stats:
        """Per-table statistics of the changes in ``(after, upto]`` (:mod:`mirrorline.log.stats`): summed from
        the footers of whole segments; only boundary segments (and segments written before footers carried them)
        have their small columns read."""
        parts = []
        for s in self.select(after, upto):
            whole = (after is None or s.first > after) and (upto is None or s.last <= upto)
            if whole and s.tables is not None:
                parts.append(s.tables)
                continue
            # a stream (one transaction, maybe millions of rows) a bounded batch at a time
            for t in iter_batches(s, 65_536) if s.stream else [read_columns(s, STAT_COLUMNS)]:
                m = range_mask(t, after, upto)
                parts.append(table_stats(t if m is None else t.filter(m)))
        return merge(parts)

    def advance(
        self, after: Position | None, max_changes: int, upto: Position | None = None
    ) -> tuple[Position | None, int]:
        """The furthest position ``p <= upto`` (default: durable) such that ``(after, p]`` holds at most
        ``max_changes`` changes, ending at a transaction's end where the log allows (a single transaction larger
        than ``max_changes`` is taken whole). Returns ``(p, changes)``; p is ``after`` when nothing is there."""
        total = 0
        end = after
        for s in self.select(after, upto):
            whole = (after is None or s.first > after) and (upto is None or s.last <= upto)
            if whole and total + s.count <= max_changes:
                total += s.count
                end = s.last
                continue
            t = read_columns(s, ["lsn", "seq"])
            m = range_mask(t, after, upto)
            if m is not None:
                t = t.filter(m)
            lsns = t.column("lsn").to_numpy()
            if len(lsns) == 0:
                continue
            room = max_changes - total
            # transaction ends inside this segment: last row of each lsn run
            ends = np.flatnonzero(np.append(lsns[1:] != lsns[:-1], True))
            fitting = ends[ends < room]
            cut = int(fitting[-1]) if len(fitting) else (int(ends[0]) if total == 0 else -1)
            if cut >= 0:
                total += cut + 1
                end = Position(int(lsns[cut]), int(t.column("seq")[cut].as_py()))
            if cut < len(lsns) - 1:  # full: the unit ends inside this segment
                break
            # the rest of a segment the unit started inside fitted: go on with the next ones
        return end, total

    def changing_schemas(self) -> bool:
        """Does any table have more than one logged schema version (so that a unit may have to be cut at one)?"""
        self.schemas.refresh()
        return any(len(self.schemas.versions(t)) > 1 for t in self.schemas.tables())

    def unit_versions(
        self, after: Position | None, upto: Position, tables: Iterable[str] | None = None
    ) -> tuple[Position, int, dict[str, int]]:
        """Cut ``(after, upto]`` before the first change whose table's schema version differs from the version of
        that table's first change in the range (a schema change takes effect at its position: the changes before it
        are applied with the old shape, the ones after it with the new, DESIGN §4). Returns the end (``upto`` when
        nothing changes), how many changes ``(after, end]`` holds and each table's schema version there. Only the
        tables in ``tables`` count (default: every one)."""
        keep = set(tables) if tables is not None else None
        versions: dict[str, int] = {}
        end, n = after if after is not None else Position(0, 0), 0
        for s in self.select(after, upto):
            t = read_columns(s, ["lsn", "seq", "table", "schema_version"])
            m = range_mask(t, after, upto)
            if m is not None:
                t = t.filter(m)
            if t.num_rows == 0:
                continue
            names = t.column("table").combine_chunks()
            vs = t.column("schema_version").to_numpy()
            cut = t.num_rows
            for name in pc.unique(names).to_pylist():
                if keep is not None and name not in keep:
                    continue
                rows = np.flatnonzero(pc.equal(names, name).to_numpy(zero_copy_only=False))
                first = versions.setdefault(name, int(vs[rows[0]]))
                other = rows[vs[rows] != first]
                if len(other):
                    cut = min(cut, int(other[0]))
            if cut > 0:
                end = Position(int(t.column("lsn")[cut - 1].as_py()), int(t.column("seq")[cut - 1].as_py()))
                n += cut
            if cut < t.num_rows:
                return end, n, versions
        return upto, n, versions

    def first_ts_after(self, after: Position | None) -> int | None:
        """The commit timestamp of the first change after ``after`` (None: the log holds none after it), where a
        reader's lag is measured from. Reads three small columns of one segment (or two)."""
        for s in self.select(after, None):
            t = read_columns(s, ["lsn", "seq", "ts"])
            m = range_mask(t, after, None)
            if m is not None:
                t = t.filter(m)
            if t.num_rows:
                return int(t.column("ts")[0].as_py())
        return None

    # -- rows --------------------------------------------------------------------------------------------------

    def read_arrow(
        self, after: Position | None = None, upto: Position | None = None, batch_rows: int = 8192
    ) -> Iterator[pa.Table]:
        """The rows of ``(after, upto]`` in log order, log layout, in batches of at most ``batch_rows`` rows and
        about :data:`~mirrorline.limits.SLICE_BYTES` bytes."""
        for s in self.select(after, upto):
            inner = (after is None or s.first > after) and (upto is None or s.last <= upto)
            for b in iter_batches(s, batch_rows):
                past = False
                if not inner:
                    # a segment's rows are in log order: the batch that reaches past ``upto`` is its last one read
                    past = upto is not None and b.num_rows > 0 and _last(b) > upto
                    m = range_mask(b, after, upto)
                    if m is not None:
                        b = b.filter(m)
                if b.num_rows:
                    yield b
                if past:
                    break

    def read_at(self, positions: pa.Table, columns: list[str]) -> pa.Table:
        """The rows at ``positions`` (a table of ``lsn`` and ``seq``), their ``columns`` beside ``lsn`` and
        ``seq``, in log order (:meth:`iter_at`, all at once)."""
        cols = list(dict.fromkeys(["lsn", "seq", *columns]))
        out = list(self.iter_at(positions, columns))
        return pa.concat_tables(out) if out else pa.schema([ARROW_SCHEMA.field(c) for c in cols]).empty_table()

    def iter_at(self, positions: pa.Table, columns: list[str]) -> Iterator[pa.Table]:
        """The rows at ``positions`` (a table of ``lsn`` and ``seq``), their ``columns`` beside ``lsn`` and
        ``seq``, in log order, a row group's at a time as it is read. Only the segments and row groups that hold
        some of them are read (beyond the small position columns); a stream segment (one large transaction) is read
        whole, a bounded batch at a time. A position with no change in the log is absent from the result."""
        cols = list(dict.fromkeys(["lsn", "seq", *columns]))
        schema = pa.schema([ARROW_SCHEMA.field(c) for c in cols])
        lsn = positions.column("lsn").to_numpy()
        seq = positions.column("seq").to_numpy()
        order = np.lexsort((seq, lsn))
        lsn, seq = lsn[order], seq[order]
        if not len(lsn):
            return
        for s in self.select(None, Position(int(lsn[-1]), int(seq[-1]))):
            lo, hi = _index(lsn, seq, s.first, "left"), _index(lsn, seq, s.last, "right")
            if lo == hi:
                continue
            want = pa.table({"lsn": pa.array(lsn[lo:hi]), "seq": pa.array(seq[lo:hi])})
            for t in _rows_at(s, want, cols):
                yield t.cast(schema)

    def read(self, after: Position | None = None, upto: Position | None = None) -> Iterator[Change]:
        """The changes of ``(after, upto]`` in log order."""
        for b in self.read_arrow(after, upto):
            yield from table_to_changes(b)

    def after_time(self, ts: int) -> Position | None:
        """The position to read after to start at the first change whose commit ts >= ``ts`` (microseconds)."""
        retained = self.retained()
        if retained is not None and ts <= retained.max_ts:
            raise LogError(
                f"changes at {ts} (microseconds since the epoch) are no longer retained",
                hint="start at a later time, or reload the target",
                ts=ts,
            )
        prev = retained.after if retained is not None else None
        for s in self.segments():
            if s.max_ts >= ts:
                t = read_columns(s, ["lsn", "seq", "ts"])
                hit = np.flatnonzero(t.column("ts").to_numpy() >= ts)
                i = int(hit[0]) if len(hit) else 0
                if i == 0:
                    return prev
                return Position(int(t.column("lsn")[i - 1].as_py()), int(t.column("seq")[i - 1].as_py()))
            prev = s.last
        return prev

    def read_from_time(self, ts: int, upto: Position | None = None) -> Iterator[Change]:
        return self.read(self.after_time(ts), upto)
