"""The one writer of a change log: buffers whole committed transactions and makes them visible, a segment at a time,
atomically and durably (DESIGN §2, §4).

Watermarks: ``durable`` is the position of the last change in the log (fsynced). ``flushed_lsn`` is the LSN capture
may report to PostgreSQL as flushed: every transaction handed in up to it is durable (empty ones included).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from mirrorline.errors import LogError
from mirrorline.log.columns import conform, lsn_span, transactions_to_arrow, ts_range
from mirrorline.log.layout import Layout, SegmentInfo, parse_segment_name, read_json, segment_name, write_json_atomic
from mirrorline.log.rows import ARROW_SCHEMA
from mirrorline.log.schemas import SchemaStore
from mirrorline.log.segments import read_info, remove_tree, write_segment, write_segment_stream
from mirrorline.log.stats import table_stats
from mirrorline.log.stream import StreamSpill, StreamWatcher
from mirrorline.model import Change, TableSchema
from mirrorline.position import Position, format_lsn


def last_segment(layout: Layout) -> SegmentInfo | None:
    names = sorted(n for n in os.listdir(layout.segments) if parse_segment_name(n))
    return read_info(layout.segments / names[-1]) if names else None


def retained_after(layout: Layout) -> Position | None:
    """The position the log starts after, as set by retention (None: nothing was ever removed)."""
    if not layout.retained.exists():
        return None
    d = read_json(layout.retained)
    return Position(int(d["lsn"]), int(d["seq"]))


def writer_pid(root: str | os.PathLike[str]) -> int | None:
    """The pid of the process writing the change log at ``root`` now (a capture, ``run`` or an import: it holds
    ``writer.lock``), or None when none does."""
    layout = Layout(root)
    try:
        fd = os.open(layout.lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


RUN_FILE = "run.json"  # the targets the live ``run`` applies to, with its pid (:func:`live_run`)


def announce_run(root: str | os.PathLike[str], targets: Iterable[str]) -> None:
    """Record, beside the log, the targets this process (a ``run``, which writes the log) applies to now."""
    write_json_atomic(Layout(root).root / RUN_FILE, {"pid": os.getpid(), "targets": sorted(targets)})


def live_run(root: str | os.PathLike[str]) -> tuple[int, list[str]] | None:
    """The pid of the live ``run`` of the log at ``root`` and the targets it applies to (None: no run writes it)."""
    pid = writer_pid(root)
    if pid is None:
        return None
    try:
        data = read_json(Layout(root).root / RUN_FILE)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("pid") != pid:
        return None
    return pid, [str(t) for t in data.get("targets", [])]


class LogWriter:
    """Appends to the change log at ``root``. One writer per log: an exclusive lock is held until :meth:`close`.

    With ``background``, a segment that fills up by itself (``segment_changes``) is encoded and made
    durable by a worker thread while the caller goes on (Parquet encoding releases the GIL); at most one segment is
    in flight. :meth:`flush`, :meth:`tick` (when due), stream commits and :meth:`close` wait for it, so ``durable``
    after them is what they say. An error of the worker is raised by the next call; the writer is then unusable.
    Off by default: on a busy 2-core machine the GIL hand-overs cost more than the overlap gains
    (bench/log_write.py measures both).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        segment_changes: int = 100_000,
        segment_seconds: float = 1.0,
        background: bool = False,
    ) -> None:
        self.layout = Layout(root)
        self.layout.create()
        self.segment_changes = segment_changes
        self.segment_seconds = segment_seconds
        self._lock_fd = self._take_lock()
        try:
            self.schemas = SchemaStore(self.layout.schemas)
            self.schemas.refresh()
            self._clean_temp_files()
            last = last_segment(self.layout)
            self._durable: Position | None = last.last if last else retained_after(self.layout)
            self._tail = self._durable  # last position written or being written (the next segment's "prev")
            self._last_lsn = self._durable.lsn if self._durable else 0
            self._flushed_lsn: int | None = self._durable.lsn if self._durable else None
            # Buffered transactions, in commit order: finished Arrow pieces, then either Change transactions or
            # Arrow transactions still without lsn/ts (each kind converted in bulk when the other arrives or at flush).
            self._pieces: list[pa.Table] = []
            self._txns: list[tuple[int, int, Sequence[Change]]] = []
            self._arrow_txns: list[tuple[pa.Table, int, int]] = []
            self._pending = 0
            self._buffer_since = 0.0
            self._empty_lsn: int | None = None  # highest empty transaction handed in while others were not durable
            self._inflight = 0  # changes of the segment the worker is writing
            self._future: Future[None] | None = None
            self._failed: BaseException | None = None
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="mirrorline-log") if background else None
            self._streams: dict[int, StreamSpill] = {}
            self.stream_watcher: StreamWatcher | None = None  # told of streams' cuts and ends (log/stream.py)
            self.discard_incomplete_streams()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # -- lock and start-up -------------------------------------------------------------------------------------

    def _take_lock(self) -> int:
        fd = os.open(self.layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LogError(
                f"another writer (pid {holder}) holds the change log at {self.layout.root}",
                hint="only one capture or import may write a log at a time; stop the other one first",
                root=str(self.layout.root),
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _clean_temp_files(self) -> None:
        """A crashed writer's temp files were never visible: remove them."""
        for folder in (self.layout.segments, self.layout.schemas, self.layout.readers, self.layout.root):
            for p in folder.iterdir():
                if p.name.startswith(".tmp-"):
                    if p.is_dir():
                        remove_tree(p)
                    else:
                        p.unlink(missing_ok=True)

    def discard_incomplete_streams(self) -> None:
        """Remove spill folders of streams not committed (PostgreSQL sends them again after a restart)."""
        for xid in list(self._streams):
            self._streams[xid].abort()
        for p in self.layout.spill.iterdir():
            remove_tree(p) if p.is_dir() else p.unlink(missing_ok=True)

    # -- watermarks --------------------------------------------------------------------------------------------

    @property
    def durable(self) -> Position | None:
        """Position of the last change in the log (fsynced), None for an empty log."""
        return self._durable

    @property
    def flushed_lsn(self) -> int | None:
        """The LSN up to which every transaction handed in is durable (to report to PostgreSQL as flushed)."""
        return self._flushed_lsn

    @property
    def last_lsn(self) -> int:
        """The highest commit LSN written or buffered (0 for an empty log). Resent transactions are at or below."""
        return self._last_lsn

    @property
    def pending(self) -> int:
        """Changes handed in and not yet durable (buffered or being written)."""
        return self._pending + self._inflight

    # -- schemas -----------------------------------------------------------------------------------------------

    def record_schema(self, schema: TableSchema) -> TableSchema:
        """Assign (or reuse: same columns and key) a version of the table's schema; durable before returning."""
        return self.schemas.record(schema)

    # -- ordinary transactions ---------------------------------------------------------------------------------

    def check_commit_lsn(self, commit_lsn: int) -> None:
        """LogError unless a transaction committed at ``commit_lsn`` may be added now (after the log's last commit,
        the writer not failed)."""
        if self._failed is not None:
            raise LogError(
                f"the log writer failed earlier: {self._failed}",
                hint="restart: the log keeps what was durable",
                root=str(self.layout.root),
            )
        if commit_lsn <= self._last_lsn:
            raise LogError(
                f"transaction committed at {format_lsn(commit_lsn)} is not after the log's last commit "
                f"{format_lsn(self._last_lsn)}",
                hint="the log holds whole transactions in commit order; skip transactions at or below last_lsn",
                lsn=format_lsn(commit_lsn),
            )

    def add_transaction(
        self, commit_lsn: int, commit_ts: int, changes: Sequence[Change] | pa.Table | pa.RecordBatch
    ) -> None:
        """Buffer one whole committed transaction. For Change input, seq = index (``pos`` and ``commit_ts`` of the
        changes are not used); for Arrow input (log layout) seq and xid are the rows' own. lsn/ts always come from
        the arguments. Flushes by itself when ``segment_changes`` are buffered."""
        self.check_commit_lsn(commit_lsn)
        if isinstance(changes, pa.Table | pa.RecordBatch):
            t = conform(changes)
            n = t.num_rows
            if n:
                if self._txns:
                    self._materialize()
                self._arrow_txns.append((t, commit_lsn, commit_ts))
        else:
            n = len(changes)
            if n:
                if self._arrow_txns:
                    self._materialize()
                self._txns.append((commit_lsn, commit_ts, list(changes)))
        if n:
            self._buffered(n, commit_lsn)
        else:
            self.note_empty(commit_lsn)

    def add_transactions(self, table: pa.Table | pa.RecordBatch) -> None:
        """Buffer many whole transactions at once: rows in commit order with their own lsn, seq, ts and xid."""
        t = conform(table)
        span = lsn_span(t)
        if span is None:
            return
        self.check_commit_lsn(span[0])
        self._materialize()
        self._pieces.append(t)
        self._buffered(t.num_rows, span[1])

    def _materialize(self) -> None:
        """Turn the buffered transactions not yet in Arrow form (or lacking lsn/ts) into one piece."""
        if self._txns:
            self._pieces.append(transactions_to_arrow(self._txns))
            self._txns = []
        if self._arrow_txns:
            tables = [t for t, _, _ in self._arrow_txns]
            counts = np.fromiter((t.num_rows for t in tables), dtype=np.int64, count=len(tables))
            lsns = np.fromiter((x[1] for x in self._arrow_txns), dtype=np.int64, count=len(tables))
            tss = np.fromiter((x[2] for x in self._arrow_txns), dtype=np.int64, count=len(tables))
            t = pa.concat_tables(tables).combine_chunks()
            t = t.set_column(0, ARROW_SCHEMA.field("lsn"), pa.array(np.repeat(lsns, counts)))
            t = t.set_column(2, ARROW_SCHEMA.field("ts"), pa.array(np.repeat(tss, counts)))
            self._pieces.append(t)
            self._arrow_txns = []

    def _buffered(self, n: int, last_lsn: int) -> None:
        if not self._pending:
            self._buffer_since = time.monotonic()
        self._last_lsn = last_lsn
        self._pending += n
        if self._pending >= self.segment_changes:
            self._start_flush()

    def note_empty(self, commit_lsn: int) -> None:
        """A transaction committed at ``commit_lsn`` with nothing to log: the log has seen up to there."""
        self._last_lsn = commit_lsn
        if self._pending or self._inflight:
            self._empty_lsn = commit_lsn
        else:
            self._flushed_lsn = commit_lsn

    def tick(self) -> Position | None:
        """Flush if the oldest buffered transaction has waited ``segment_seconds``; call it when idle."""
        if self._pending and time.monotonic() - self._buffer_since >= self.segment_seconds:
            return self.flush()
        return self._durable

    def flush(self) -> Position | None:
        """Buffered transactions -> one segment, atomically visible and durable. Returns ``durable``."""
        self._start_flush()
        self._wait()
        if self._empty_lsn is not None and not self._pending:
            self._flushed_lsn = max(self._flushed_lsn or 0, self._empty_lsn)
            self._empty_lsn = None
        return self._durable

    def _start_flush(self) -> None:
        """Hand the buffered transactions to the worker as one segment (or write it here without a worker)."""
        if not self._pending:
            return
        self._materialize()
        table = pa.concat_tables(self._pieces)
        if len(self._pieces) > 16:
            table = table.combine_chunks()  # many small pieces would make tiny Parquet pages
        lsn, seq = table.column("lsn"), table.column("seq")
        first = Position(lsn[0].as_py(), seq[0].as_py())
        last = Position(lsn[-1].as_py(), seq[-1].as_py())
        min_ts, max_ts = ts_range(table)
        name = segment_name(first.lsn, last.lsn)
        info = SegmentInfo(
            name=name,
            path=self.layout.segments / name,
            stream=False,
            first=first,
            last=last,
            count=table.num_rows,
            min_ts=min_ts,
            max_ts=max_ts,
            prev=self._tail,
        )
        empty, self._empty_lsn = self._empty_lsn, None
        self._wait()  # at most one segment in flight
        self._pieces = []
        self._inflight, self._pending = self._pending, 0
        self._tail = info.last
        if self._executor is None:
            self._write(table, info, empty)
        else:
            self._future = self._executor.submit(self._write, table, info, empty)

    def _write(self, table: pa.Table, info: SegmentInfo, empty_lsn: int | None) -> None:
        info = dataclasses.replace(info, tables=table_stats(table))
        write_segment(self.layout.segments, info.name, [table], info)
        self.segment_appended(info)
        if empty_lsn is not None:
            self._flushed_lsn = max(self._flushed_lsn or 0, empty_lsn)
        self._inflight = 0

    def _wait(self) -> None:
        if self._future is not None:
            future, self._future = self._future, None
            try:
                future.result()
            except BaseException as e:
                self._failed = e
                raise
        if self._failed is not None:
            raise LogError(
                f"the log writer failed earlier: {self._failed}",
                hint="restart: the log keeps what was durable",
                root=str(self.layout.root),
            )

    @property
    def tail(self) -> Position | None:
        """The last position written or being written: the next segment's ``prev``."""
        return self._tail

    def segment_appended(self, info: SegmentInfo) -> None:
        """A segment written by other means than this writer's flush (an import, a streamed transaction's commit,
        :class:`~mirrorline.log.stream.StreamSpill`) is published: it is now the log's end."""
        self._durable = info.last
        if self._tail is None or info.last > self._tail:
            self._tail = info.last
        self._last_lsn = max(self._last_lsn, info.last.lsn)
        self._flushed_lsn = max(self._flushed_lsn or 0, info.last.lsn)

    def append_segment(
        self,
        batches: Iterable[pa.Table],
        before_publish: Callable[[], None] | None = None,
        imported: Callable[[], tuple[int, int] | None] | None = None,
    ) -> Position | None:
        """Append whole transactions as one segment of their own (e.g. an import), streamed to disk: rows with their
        final lsn/seq/ts in commit order, every commit LSN above ``last_lsn``. Nothing becomes visible unless
        ``batches`` is exhausted without error; ``before_publish`` runs just before the segment becomes visible.
        Returns ``durable``. ``imported``: the daystream address its metadata records (see ``write_segment_stream``).
        """
        self.flush()
        info = write_segment_stream(self.layout.segments, batches, self._tail, self._last_lsn, before_publish, imported)
        if info is not None:
            self.segment_appended(info)
        return self._durable

    # -- streamed transactions ---------------------------------------------------------------------------------

    def open_stream(self, xid: int) -> StreamSpill:
        """The spill of streamed transaction ``xid`` (the same object for every block until commit or abort)."""
        s = self._streams.get(xid)
        if s is None:
            s = self._streams[xid] = StreamSpill(self, xid, self.layout.spill / str(xid), self.stream_watcher)
        return s

    def stream_closed(self, xid: int) -> None:
        """The spill of ``xid`` was committed or aborted: :meth:`open_stream` makes a new one."""
        self._streams.pop(xid, None)

    # -- end ---------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what is buffered and release the lock. Streams not committed stay spilled until the next open."""
        if self._lock_fd < 0:
            return
        try:
            if self._failed is None:
                self.flush()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
