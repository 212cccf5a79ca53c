"""Import daystream files into the change log and export the log as daystream lines (the I/O around
:mod:`mirrorline.log.daystream`).

Import is atomic per batch of files: every file is parsed and written into one new segment that becomes visible only
when all of them parsed; a line that does not parse is a DecodeError naming the file and the line, and nothing is
appended. Imported transactions get commit LSNs ``last_lsn + 1, + 2, ...`` (after everything the log holds), seq the
index inside each transaction. Tables take key and column types from the configuration (``[tables."s.t"] key``,
``columns``), else from the schema the log already has for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import pyarrow as pa

from mirrorline.config import TableConfig
from mirrorline.errors import DecodeError, LogError
from mirrorline.log.columns import transactions_to_arrow
from mirrorline.log.daystream import Decoder, Encoder, LineError, Transaction, parse_line
from mirrorline.log.reader import ChangeLog
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


def _transactions(files: Sequence[Path], decoder: Decoder) -> Iterator[Transaction]:
    """Every transaction of the files, in order (a transaction may go on from one file into the next)."""
    path, lineno = None, 0
    try:
        for path in files:
            lineno = 0
            with open(path, encoding="utf-8", newline="\n") as f:
                for lineno, text in enumerate(f, 1):  # noqa: B007 (lineno names the line in errors)
                    line = parse_line(text)
                    if line is not None and (done := decoder.feed(line)) is not None:
                        yield done
        if (done := decoder.finish()) is not None:
            yield done
    except LineError as e:
        raise DecodeError(
            f"{path}:{lineno}: {e}", hint="fix or remove the line; nothing was imported", file=str(path), line=lineno
        ) from None
    except UnicodeDecodeError:
        raise DecodeError(
            f"{path}:{lineno + 1}: not UTF-8 text", hint="nothing was imported", file=str(path), line=lineno + 1
        ) from None
    except OSError as e:
        raise DecodeError(f"{path}: cannot read: {e.strerror}", hint="nothing was imported", file=str(path)) from None


def import_daystream(
    root: Path, files: Sequence[Path], tables: Mapping[str, TableConfig] | None = None, segment_changes: int = 100_000
) -> ImportResult:
    """Append daystream files to the log at ``root`` (atomically: all of them or nothing)."""
    with LogWriter(root, segment_changes=segment_changes) as writer:
        next_lsn = writer.last_lsn + 1
        schemas = _Schemas(writer, tables or {}, lambda: Position(next_lsn, 0))
        decoder = Decoder(schemas, default_ts=int(time.time() * 1_000_000))
        counts = {"txns": 0, "changes": 0}
        first: list[Position] = []

        def batches() -> Iterator[pa.Table]:
            nonlocal next_lsn
            pending: list[tuple[int, int, list]] = []
            size = 0
            for txn in _transactions(files, decoder):
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
        durable = writer.append_segment(batches(), record_schemas)
    return ImportResult(
        files=len(files),
        transactions=counts["txns"],
        changes=counts["changes"],
        first=first[0] if first else None,
        last=durable if durable != before else None,
    )


def export_daystream(
    log: ChangeLog, out: TextIO, after: Position | None = None, from_ts: int | None = None, upto: Position | None = None
) -> int:
    """Write the log's changes after ``after`` (or from the first change at or after ``from_ts``, microseconds)
    up to ``upto`` as daystream lines. Returns the number of lines."""
    if from_ts is not None:
        after = log.after_time(from_ts)
    encoder = Encoder(log.schema)
    n = 0
    for change in log.read(after, upto):
        for line in encoder.lines(change):
            out.write(line)
            out.write("\n")
            n += 1
    return n
