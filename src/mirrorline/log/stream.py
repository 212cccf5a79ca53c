"""Streamed large transactions (DESIGN §3, seed 004): spilled to Parquet part files as their blocks arrive, turned
into log content at commit by an atomic folder rename, without copying a row again.

``<root>/spill/<xid>/part-<n>-<subxid>.parquet``: each part holds rows of one (sub)transaction only, so aborting a
subtransaction deletes exactly its parts. A subtransaction's part stays open across stream blocks (PostgreSQL may
stream blocks of a few hundred rows), so the number of parts follows subtransaction switches, not blocks; at most
``MAX_OPEN_PARTS`` are open at once (the least recently used is closed; its subtransaction then starts a new part).
Rows carry ``seq`` in arrival order, ``lsn = ts = 0`` (not known yet). Memory stays bounded: at most ``SPILL_ROWS``
rows buffered per open part and ``MAX_BUFFERED_ROWS`` in all before they go to disk as row groups. Each part's
statistics (:mod:`mirrorline.log.stats`) are counted as its rows spill, from their small columns (about
``STATS_ROWS`` rows at a time), so that the commit only sums them: reading them back from the parts after the commit
was on the path from the source's commit to the log's (``./dev bench capture --shape delete``).

A :class:`StreamWatcher` given to the writer (``run`` applying ahead of the commit, pipeline/ahead.py) is told of each
cut: at the end of a stream block, once ``cut_rows`` rows or ``cut_bytes`` bytes came since the last cut, every open
part is closed, so that the rows since then are whole Parquet files (:class:`StreamCut`), readable while the
transaction is still open; at the commit, of a last cut of the rows since the one before (unless there are none);
then of the transaction's commit or abort. Without one, parts stay open across blocks. A cut also carries its rows as
they were spilled (up to ``KEEP_BYTES`` of them), so that the watcher need not decode from Parquet what capture just
wrote (``bench/bigtxn --tables narrow``, the ``INSERT``: the thread applying ahead 0.8-1.1 CPU s, 1.4 s reading back).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mirrorline import limits
from mirrorline.errors import LogError
from mirrorline.log.columns import changes_to_arrow, conform, with_constants, with_seq
from mirrorline.log.layout import COMMIT_RECORD, SegmentInfo, publish, segment_name, write_json_atomic
from mirrorline.log.segments import fsync_tree, merge_parts, open_parquet, remove_tree
from mirrorline.log.stats import COLUMNS as STAT_COLUMNS
from mirrorline.log.stats import Stats, at_lsn, merge, table_stats
from mirrorline.model import Change
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.log.writer import LogWriter

SPILL_ROWS = 4096
MAX_BUFFERED_ROWS = 65_536
MAX_OPEN_PARTS = 64
STATS_ROWS = 65_536
KEEP_BYTES = 64 << 20  # the rows of a cut it carries in memory, at most (a stream block may be hundreds of MB)


@dataclass(frozen=True)
class StreamCut:
    """The rows ``first_seq..last_seq`` of open streamed transaction ``xid``: every row of it in that range, in the
    closed part files ``parts`` (of one subtransaction each) of ``folder``, until the transaction commits (then in
    its segment's folder) or aborts."""

    xid: int
    folder: Path
    parts: tuple[str, ...]
    first_seq: int
    last_seq: int  # (the seqs of a subtransaction aborted meanwhile are in the range, its rows in no part)
    # its rows as spilled, in arrival order (None: read from the parts); held only while the watcher can afford them
    rows: pa.Table | None = field(default=None, compare=False, repr=False)


def iter_cut(cut: StreamCut, folder: Path | None = None, batch_bytes: int | None = None) -> Iterator[pa.Table]:
    """A cut's rows in arrival order (the log layout; ``lsn`` and ``ts`` 0), a batch of about ``batch_bytes``
    (default :data:`~mirrorline.limits.SLICE_BYTES`) at a time: a cut may be one stream block of hundreds of MB (a
    transaction of TOASTed values that PostgreSQL could not stream until a block was whole). From the rows it carries,
    else from its parts; ``folder``: where its parts are now, if not where the cut found them (the transaction's
    segment, once committed). Raises FileNotFoundError where they are gone (then the batches yielded before are the
    cut's first rows)."""
    batch_bytes = limits.SLICE_BYTES if batch_bytes is None else batch_bytes
    if cut.rows is not None:
        rows = cut.rows
        step = limits.slice_rows(rows.nbytes, rows.num_rows, 1 << 62, batch_bytes)
        for off in range(0, rows.num_rows, step):
            yield rows.slice(off, step)
        return
    where = cut.folder if folder is None else folder
    try:
        yield from merge_parts([where / p for p in cut.parts], 0, 0, 1 << 62, batch_bytes)
    except LogError:
        if not all((where / p).exists() for p in cut.parts):
            raise FileNotFoundError(where) from None
        raise


def read_cut(cut: StreamCut, folder: Path | None = None) -> pa.Table:
    """A cut's rows in arrival order, in one table (:func:`iter_cut`)."""
    return pa.concat_tables(list(iter_cut(cut, folder)))


class StreamWatcher(Protocol):
    """Told, in the capture thread, of streamed transactions' cuts and ends (it must not block)."""

    cut_rows: int  # a stream block's end cuts once at least this many rows came since the last cut ...
    cut_bytes: int  # ... or this many bytes of them (Arrow's size)

    def cut(self, cut: StreamCut) -> None: ...

    def committed(self, xid: int, info: SegmentInfo) -> None: ...

    def aborted(self, xid: int, subxid: int) -> None:
        """Subtransaction ``subxid`` of ``xid`` aborted (``subxid == xid``: the whole transaction)."""


@dataclass
class _Part:
    subxid: int
    name: str
    writer: pq.ParquetWriter | None = None
    buffered: list[pa.Table] = field(default_factory=list)
    buffered_rows: int = 0
    rows: int = 0  # written and buffered
    first_seq: int = -1
    last_seq: int = -1
    stats: list[Stats] = field(default_factory=list)  # of the rows counted so far (positions at LSN 0)
    uncounted: list[pa.Table] = field(default_factory=list)  # the small columns of rows spilled, not yet counted
    uncounted_rows: int = 0

    def count(self, force: bool = False) -> None:
        """Count the spilled rows' statistics once there are enough of them (or ``force``)."""
        if self.uncounted and (force or self.uncounted_rows >= STATS_ROWS):
            self.stats.append(table_stats(pa.concat_tables(self.uncounted)))
            self.uncounted, self.uncounted_rows = [], 0


class StreamSpill:
    """One streamed transaction in progress. Get it from :meth:`LogWriter.open_stream`."""

    def __init__(self, writer: LogWriter, xid: int, folder: Path, watcher: StreamWatcher | None = None) -> None:
        self._writer = writer
        self._watcher = watcher
        self._cut_seq = 0  # the first row after the last cut
        self._cut_bytes = 0  # bytes of the rows since the last cut
        self._closed: list[_Part] = []  # parts closed since the last cut
        self._kept: list[tuple[int, pa.Table]] | None = []  # (subxid, rows) spilled since the last cut (None: too many)
        self._kept_bytes = 0
        self.xid = xid
        self.folder = folder
        self.block = 0
        self._next_seq = 0
        self._parts: dict[int, list[_Part]] = {}  # subxid -> its parts, oldest first
        self._open: OrderedDict[int, _Part] = OrderedDict()  # subxid -> its current part, least recently used first
        self._buffered_rows = 0
        self._part_count = 0
        self._done = False
        folder.mkdir(parents=True, exist_ok=False)

    @property
    def changes(self) -> int:
        """Rows spilled so far (aborted subtransactions excluded)."""
        return sum(p.rows for ps in self._parts.values() for p in ps)

    def _check(self) -> None:
        if self._done:
            raise LogError(f"stream of transaction {self.xid} is already committed or aborted", xid=self.xid)

    def add(self, subxid: int, changes: Sequence[Change] | pa.Table | pa.RecordBatch) -> None:
        """Spill changes of (sub)transaction ``subxid`` (the top-level xid for the transaction's own changes)."""
        self._check()
        if isinstance(changes, pa.Table | pa.RecordBatch):
            t = with_seq(with_constants(conform(changes), lsn=0, ts=0, xid=self.xid), self._next_seq)
        else:
            t = changes_to_arrow(changes, 0, 0, self._next_seq, xid=self.xid)
        n = t.num_rows
        if n == 0:
            return
        part = self._open.get(subxid)
        if part is None:
            part = self._new_part(subxid)
        else:
            self._open.move_to_end(subxid)
        if part.first_seq < 0:
            part.first_seq = self._next_seq
        self._next_seq += n
        part.last_seq = self._next_seq - 1
        part.buffered.append(t)
        if self._watcher is not None:
            self._cut_bytes += t.nbytes
        part.buffered_rows += n
        part.rows += n
        self._buffered_rows += n
        if part.buffered_rows >= SPILL_ROWS:
            self._spill(part)
        if self._buffered_rows >= MAX_BUFFERED_ROWS:
            for p in self._open.values():
                self._spill(p)

    def _new_part(self, subxid: int) -> _Part:
        if len(self._open) >= MAX_OPEN_PARTS:
            _, lru = self._open.popitem(last=False)
            self._close(lru)
        part = _Part(subxid, f"part-{self._part_count:06d}-{subxid:010d}.parquet")
        self._part_count += 1
        self._open[subxid] = part
        self._parts.setdefault(subxid, []).append(part)
        return part

    def _spill(self, part: _Part) -> None:
        if not part.buffered:
            return
        if part.writer is None:
            part.writer = open_parquet(self.folder / part.name)
        rows = pa.concat_tables(part.buffered)
        part.writer.write_table(rows, row_group_size=1 << 30)
        if self._watcher is not None and self._kept is not None:
            self._kept_bytes += rows.nbytes
            if self._kept_bytes <= KEEP_BYTES:
                self._kept.append((part.subxid, rows))
            else:
                self._kept = None  # (the watcher reads this cut from its parts)
        part.uncounted.append(rows.select(STAT_COLUMNS))
        part.uncounted_rows += rows.num_rows
        part.count()
        self._buffered_rows -= part.buffered_rows
        part.buffered, part.buffered_rows = [], 0

    def _close(self, part: _Part) -> None:
        self._spill(part)
        if part.writer is not None:
            part.writer.close()
            part.writer = None
        if part.rows:
            self._closed.append(part)

    def end_block(self) -> None:
        """The end of a stream block (STREAM STOP). Nothing needs to be on disk yet: after a crash PostgreSQL sends
        the whole transaction again."""
        self._check()
        self.block += 1
        w = self._watcher
        if w is not None and (self._next_seq - self._cut_seq >= max(w.cut_rows, 1) or self._cut_bytes >= w.cut_bytes):
            self._cut(w)

    def _cut(self, w: StreamWatcher) -> None:
        """Every open part closed, and the watcher told of the rows since the last cut."""
        for p in self._open.values():
            self._close(p)
        self._open.clear()
        rows = None
        if self._kept is not None:
            tables = [t for _, t in self._kept]
            rows = pa.concat_tables(tables) if tables else None
            if rows is not None and len(tables) > 1:
                seq = rows.column("seq").to_numpy()
                if not bool(np.all(seq[1:] > seq[:-1])):  # parts of several subtransactions: in arrival order
                    rows = rows.sort_by("seq")
        parts = tuple(p.name for p in self._closed)
        cut = StreamCut(self.xid, self.folder, parts, self._cut_seq, self._next_seq - 1, rows)
        self._closed, self._cut_seq, self._cut_bytes = [], self._next_seq, 0
        self._kept, self._kept_bytes = [], 0
        w.cut(cut)

    def abort_subxact(self, subxid: int) -> None:
        """Discard exactly the changes of one aborted subtransaction (the whole stream if it is the top xid)."""
        self._check()
        if subxid == self.xid:
            self.abort()
            return
        self._open.pop(subxid, None)
        gone = self._parts.pop(subxid, [])
        self._closed = [p for p in self._closed if p not in gone]
        if self._kept is not None:
            self._kept = [(s, t) for s, t in self._kept if s != subxid]
            self._kept_bytes = sum(t.nbytes for _, t in self._kept)
        if self._watcher is not None:
            self._watcher.aborted(self.xid, subxid)
        for p in gone:
            if p.writer is not None:
                p.writer.close()
                p.writer = None
            self._buffered_rows -= p.buffered_rows
            (self.folder / p.name).unlink(missing_ok=True)

    def abort(self) -> None:
        """Discard the whole transaction."""
        if self._done:
            return
        for p in self._open.values():
            if p.writer is not None:
                p.writer.close()
        self._open.clear()
        self._parts.clear()
        remove_tree(self.folder)
        self._done = True
        self._writer.stream_closed(self.xid)
        if self._watcher is not None:
            self._watcher.aborted(self.xid, self.xid)

    def commit(self, commit_lsn: int, commit_ts: int) -> Position:
        """Make the spilled rows log content at ``commit_lsn``: buffered transactions before it are flushed first,
        then a commit record is written and the spill folder renamed into segments/. Returns the position of the
        transaction's last change (the log's durable position if nothing was left to commit)."""
        self._check()
        w = self._writer
        w.check_commit_lsn(commit_lsn)
        if self._watcher is not None and (self._closed or any(p.rows for p in self._open.values())):
            self._cut(self._watcher)  # the rows since the last cut: the watcher has them before the commit
        for p in self._open.values():
            self._close(p)
        self._open.clear()
        w.flush()
        parts = sorted((p for ps in self._parts.values() for p in ps if p.rows), key=lambda p: p.name)
        if not parts:
            self.abort()
            w.note_empty(commit_lsn)
            return w.durable or Position(commit_lsn, 0)
        info = SegmentInfo(
            name=segment_name(commit_lsn, commit_lsn, stream=True),
            path=w.layout.segments / segment_name(commit_lsn, commit_lsn, stream=True),
            stream=True,
            first=Position(commit_lsn, min(p.first_seq for p in parts)),
            last=Position(commit_lsn, max(p.last_seq for p in parts)),
            count=sum(p.rows for p in parts),
            min_ts=commit_ts,
            max_ts=commit_ts,
            prev=w.tail,
            parts=tuple(p.name for p in parts),
            xid=self.xid,
        )
        # the statistics counted as the parts spilled, at the commit's position (readers then plan from the record)
        for p in parts:
            p.count(force=True)
        info = dataclasses.replace(info, tables=at_lsn(merge(s for p in parts for s in p.stats), commit_lsn))
        write_json_atomic(self.folder / COMMIT_RECORD, info.meta())
        fsync_tree(self.folder)  # every part and the folder itself
        publish(self.folder, info.path)
        self._done = True
        w.stream_closed(self.xid)
        w.segment_appended(info)
        if self._watcher is not None:
            self._watcher.committed(self.xid, info)
        return info.last
