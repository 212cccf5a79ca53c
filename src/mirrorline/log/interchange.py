"""Import daystream files into the change log and export the log as daystream lines (the I/O around
:mod:`mirrorline.log.daystream`).

Import is atomic per batch of files: every file is parsed and written into one new segment that becomes visible only
when all of them parsed; a line that does not parse is a DecodeError naming the file and the line, and nothing is
appended. Imported transactions get commit LSNs ``last_lsn + 1, + 2, ...`` (after everything the log holds), seq the
index inside each transaction. Tables take key and column types from the configuration (``[tables."s.t"] key``,
``columns``), else from the schema the log already has for them. Lines already imported are skipped: each imported
segment records the address ``(_c, _s)`` of the last line it took, and a line whose address is not beyond the
highest recorded is left out (lines without ``_c`` and ``_s`` are always imported).

Export gives every line its stable address (:class:`~mirrorline.log.daystream.Address`): the addressing state
where it starts is computed from the segments' timestamps and a scan of the lines of the current second before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.config import TableConfig
from mirrorline.errors import DecodeError, LogError
from mirrorline.log import source
from mirrorline.log.columns import transactions_to_arrow
from mirrorline.log.daystream import Address, Decoder, Encoder, LineError, Transaction, parse_line
from mirrorline.log.layout import SegmentInfo
from mirrorline.log.reader import ChangeLog, range_mask
from mirrorline.log.segments import read_columns
from mirrorline.log.writer import LogWriter
from mirrorline.model import Column, TableSchema, default_key
from mirrorline.position import Position

BATCH_CHANGES = 50_000


@dataclass(frozen=True)
class ImportResult:
    files: int
    transactions: int
    changes: int
    first: Position | None  # position of the first imported change
    last: Position | None  # ... and of the last (the log's new durable position)
    skipped: int = 0  # lines left out: imported before


class _Schemas:
    """Each imported table's schema: configured key/columns, else the log's latest schema of the table."""

    def __init__(self, writer: LogWriter, tables: Mapping[str, TableConfig], since: Callable[[], Position]) -> None:
        self.writer = writer
        self.tables = tables
        self.since = since  # where the transaction being read will be in the log
        self.planned: dict[str, TableSchema] = {}

    def __call__(self, table: str) -> TableSchema:
        s = self.planned.get(table)
        if s is None:
            s = self.planned[table] = self.writer.schemas.plan(replace(self._spec(table), since=self.since()))
        return s

    def _spec(self, table: str) -> TableSchema:
        cfg = self.tables.get(table)
        logged = self.writer.schemas.latest(table)
        if cfg is not None and cfg.columns:
            columns = tuple(Column(name, typ) for name, typ in cfg.columns.items())
        elif logged is not None:
            columns = logged.columns
        else:
            raise LineError(
                f"table {table} has no configured columns and no schema in the log: add "
                f'[tables."{table}"] with key = [...] and columns = {{ name = "type", ... }}'
            )
        bag = False
        if cfg is not None and cfg.key:
            key = cfg.key
            if cfg.columns:  # a configured key is a primary key: its columns are never NULL
                columns = tuple(replace(c, nullable=False) if c.name in key else c for c in columns)
        elif logged is not None and logged.key and all(k in [c.name for c in columns] for k in logged.key):
            key, bag = logged.key, logged.bag
            if bag:
                key = default_key(columns)
        else:
            key, bag = default_key(columns), True
        return TableSchema(table=table, columns=columns, key=tuple(key), bag=bag)


@dataclass
class _Marks:
    """The import's view of line addresses: ``before``, the highest address imported into the log so far (lines at
    or below it are skipped); ``last``, the highest this import takes."""

    before: tuple[int, int] | None
    last: tuple[int, int] | None = None
    skipped: int = 0

    def take(self, c: int | None, s: int | None) -> bool:
        if c is None or s is None:
            return True
        addr = (c // 1_000_000, s)
        if self.before is not None and addr <= self.before:
            self.skipped += 1
            return False
        self.last = addr if self.last is None else max(self.last, addr)
        return True


def imported_mark(log: ChangeLog) -> tuple[int, int] | None:
    """The highest daystream address imported into the log (kept by retention when it removes the segment)."""
    retained = log.retained()
    marks = [s.imported for s in log.segments() if s.imported is not None]
    if retained is not None and retained.imported is not None:
        marks.append(retained.imported)
    return max(marks) if marks else None


def _transactions(files: Sequence[Path], decoder: Decoder, marks: _Marks | None = None) -> Iterator[Transaction]:
    """Every transaction of the files, in order (a transaction may go on from one file into the next); lines
    ``marks`` says were imported before are left out."""
    path, lineno = None, 0
    try:
        for path in files:
            lineno = 0
            with open(path, "rb") as f:  # each line decoded on its own, so that an error names its line
                for lineno, raw in enumerate(f, 1):  # noqa: B007 (lineno names the line in errors)
                    line = parse_line(raw.decode("utf-8"))
                    if line is None or (marks is not None and not marks.take(line.c, line.s)):
                        continue
                    if (done := decoder.feed(line)) is not None:
                        yield done
        if (done := decoder.finish()) is not None:
            yield done
    except LineError as e:
        raise DecodeError(
            f"{path}:{lineno}: {e}", hint="fix or remove the line; nothing was imported", file=str(path), line=lineno
        ) from None
    except UnicodeDecodeError:
        raise DecodeError(
            f"{path}:{lineno}: not UTF-8 text", hint="nothing was imported", file=str(path), line=lineno
        ) from None
    except OSError as e:
        raise DecodeError(f"{path}: cannot read: {e.strerror}", hint="nothing was imported", file=str(path)) from None


def import_daystream(
    root: Path, files: Sequence[Path], tables: Mapping[str, TableConfig] | None = None, segment_changes: int = 100_000
) -> ImportResult:
    """Append daystream files to the log at ``root`` (atomically: all of them or nothing). A log that capture feeds
    is refused: imported transactions take positions after the log's last one, which the source's next commits may
    not be beyond (capture would then take them for changes it already holds)."""

    fed = source.read(root)
    if fed is not None:
        raise LogError(
            f"the change log at {root} is fed by capture from {fed.database} (system {fed.system_identifier}): "
            "importing files into it would give them positions the source's own changes also take",
            hint="import into a log of its own (another [log] path), with a configuration without [source]",
            root=str(root),
        )
    with LogWriter(root, segment_changes=segment_changes) as writer:
        marks = _Marks(imported_mark(ChangeLog(root)))
        next_lsn = writer.last_lsn + 1
        schemas = _Schemas(writer, tables or {}, lambda: Position(next_lsn, 0))
        decoder = Decoder(schemas, default_ts=int(time.time() * 1_000_000))
        counts = {"txns": 0, "changes": 0}
        first: list[Position] = []

        def batches() -> Iterator[pa.Table]:
            nonlocal next_lsn
            pending: list[tuple[int, int, list]] = []
            size = 0
            for txn in _transactions(files, decoder, marks):
                if not txn.changes:
                    continue
                pending.append((next_lsn, txn.ts, txn.changes))
                if not first:
                    first.append(Position(next_lsn, 0))
                next_lsn += 1
                counts["txns"] += 1
                counts["changes"] += len(txn.changes)
                size += len(txn.changes)
                if size >= BATCH_CHANGES:
                    yield transactions_to_arrow(pending)
                    pending, size = [], 0
            if pending:
                yield transactions_to_arrow(pending)

        def record_schemas() -> None:
            for s in schemas.planned.values():
                recorded = writer.record_schema(s)
                if recorded.version != s.version:  # cannot happen: we hold the writer's lock
                    raise LogError(f"schema version of {s.table} changed during the import", table=s.table)

        before = writer.durable
        durable = writer.append_segment(batches(), record_schemas, lambda: marks.last)
    return ImportResult(
        files=len(files),
        transactions=counts["txns"],
        changes=counts["changes"],
        first=first[0] if first else None,
        last=durable if durable != before else None,
        skipped=marks.skipped,
    )


def _seconds(log: ChangeLog) -> tuple[Address, list[tuple[SegmentInfo, int]]]:
    """The addressing state where the retained log starts, and each segment with the highest ``_c`` of the lines
    up to its end (the running maximum of commit seconds)."""
    retained = log.retained()
    if retained is None:
        start = Address()
    elif retained.c is not None:
        start = Address(retained.c, retained.c_lines)
    else:  # trimmed before retention kept the state: the second it ended in counts from the log's start
        start = Address(retained.max_ts // 1_000_000, 0)
    out, c = [], start.c
    for s in log.segments():
        c = max(c, s.max_ts // 1_000_000)
        out.append((s, c))
    return start, out


def _scan(log: ChangeLog, state: Address, segments: list[SegmentInfo], upto: Position) -> Address:
    """``state`` moved over the lines of ``segments`` up to ``upto`` (reading four columns, not the images)."""
    for seg in segments:
        t = read_columns(seg, ["lsn", "seq", "ts", "op", "old_key"])
        m = range_mask(t, None, upto)
        if m is not None:
            t = t.filter(m)
        # an update that changed the key is two lines (line_count)
        two = pc.and_(pc.equal(t.column("op"), "U"), pc.is_valid(t.column("old_key")))
        state.skip(t.column("ts").to_numpy(), two.to_numpy(zero_copy_only=False).astype(np.int64) + 1)
    return state


def address_at(log: ChangeLog, after: Position | None) -> Address:
    """The addressing state after the last line of the changes up to ``after`` (None: the log's start). Only the
    lines of ``after``'s second are read: from the first segment whose lines reach it."""
    start, segs = _seconds(log)
    before = [(s, c) for s, c in segs if after is not None and s.first <= after]
    if not before:
        return start
    floor = before[-2][1] if len(before) > 1 else start.c  # _c where after's segment starts: its lines are >= it
    i = next(i for i, (_, c) in enumerate(before) if c >= floor)
    state = Address(before[i - 1][1], 0) if i > 0 else Address(start.c, start.lines)
    assert after is not None
    return _scan(log, state, [s for s, _ in before[i:]], after)


def _after_address(log: ChangeLog, c: int, s: int) -> Position | None:
    """A position at or before the line at address ``(c, s)``: the end of the last segment whose lines stay below
    ``c``. LogError when lines of that address are no longer retained."""
    start, segs = _seconds(log)
    if (c, s) < (start.c, start.lines - 1):
        raise LogError(
            f"the daystream line {c}:{s} is no longer retained (the log starts after {start.c}:{start.lines - 1})",
            hint="reload the replica from a snapshot",
        )
    prev = log.start()
    for seg, top in segs:
        if top >= c:
            break
        prev = seg.last
    return prev


def export_daystream(
    log: ChangeLog,
    out: TextIO,
    after: Position | None = None,
    from_ts: int | None = None,
    upto: Position | None = None,
    from_address: tuple[int, int] | None = None,
) -> int:
    """Write the log's changes after ``after`` (or from the first change at or after ``from_ts``, microseconds; or
    right after the line at the daystream address ``from_address``) up to ``upto`` as daystream lines with their
    stable addresses. Returns the number of lines."""
    if from_ts is not None:
        after = log.after_time(from_ts)
    if from_address is not None:
        after = _after_address(log, *from_address)
    encoder = Encoder(log.schema, address_at(log, after))
    n = 0
    for change in log.read(after, upto):
        for line in encoder.lines(change):
            if from_address is not None and encoder.last is not None and encoder.last <= from_address:
                continue
            out.write(line)
            out.write("\n")
            n += 1
    return n
