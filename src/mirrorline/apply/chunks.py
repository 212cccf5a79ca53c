"""A snapshot's chunks at the target, either way they arrive:

- chunk files as a snapshot stages or exports them (PostgreSQL's CSV: NULL an unquoted empty field, '' quoted), read
  as Arrow string columns for the engines that load them through the driver
  (:meth:`mirrorline.apply.session.Session.load_chunk`);
- a COPY stream a Spark task loads straight into a target whose kind has a :class:`ChunkLoader` (PostgreSQL).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv

if TYPE_CHECKING:
    from mirrorline.apply.session import Session
    from mirrorline.model import TableSchema

BLOCK = 16 << 20


def read_chunk(path: str | Path, columns: Sequence[str], header: bool = True) -> Iterator[pa.RecordBatch]:
    """A chunk file's rows as string columns (PostgreSQL CSV: NULL is an unquoted empty field, '' is quoted)."""
    names = [f"c{i}" for i in range(len(columns))]
    ropts = pacsv.ReadOptions(column_names=names, skip_rows=1 if header else 0, block_size=BLOCK)
    popts = pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False)
    copts = pacsv.ConvertOptions(
        column_types={n: pa.string() for n in names},
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
        null_values=[""],
    )
    try:
        reader = pacsv.open_csv(str(path), ropts, popts, copts)
    except pa.ArrowInvalid as e:
        if "Empty CSV file" in str(e):
            return
        raise
    for b in reader:
        if b.num_rows:
            yield b


def skip_header(f: Any) -> None:
    f.readline()


class ChunkSink(ABC):
    """One snapshot chunk loaded by a Spark task straight into a target: the task streams the source's ``COPY ... TO
    STDOUT`` into :meth:`copy_in`, and the rows commit together with a record of the chunk, so that a task Spark runs
    twice loads its rows once. Opened in the task from a spec (:meth:`ChunkLoader.spec`)."""

    @abstractmethod
    def begin(self) -> int | None:
        """Open the chunk's transaction: None, or the rows an earlier attempt of the task committed (nothing more to
        do)."""

    @abstractmethod
    def copy_in(self, stream: BinaryIO) -> int:
        """Load the COPY stream; the number of rows."""

    @abstractmethod
    def commit(self, rows: int) -> None:
        """Commit the rows with the chunk's record."""

    @abstractmethod
    def rollback(self) -> None:
        """Keep nothing of the chunk (the table was rewritten under the snapshot: the rows are wrong)."""

    @abstractmethod
    def close(self) -> None: ...


class ChunkLoader(ABC):
    """A target kind's load of a snapshot's chunks from Spark tasks (:meth:`~mirrorline.apply.target.Target.
    chunk_loader`): each task opens :attr:`sink` with its chunk's spec and commits its rows itself, so the load scales
    out with the tasks. The driver prepares the records, and forgets them in the transaction that marks the load
    done."""

    sink: str  # "module:function" turning a spec into a ChunkSink, imported in the task

    @abstractmethod
    def formats(self, schemas: Mapping[str, TableSchema]) -> dict[str, str]:
        """The COPY format each table's chunks travel in from the source ("text", "binary")."""

    @abstractmethod
    def prepare(self, s: Session) -> None:
        """Create what records the loaded chunks (in the caller's transaction)."""

    @abstractmethod
    def spec(self, ts: TableSchema, fmt: str, load_id: str, chunk: int) -> dict[str, Any]:
        """What the sink of one chunk needs (plain values: it travels to an executor)."""

    @abstractmethod
    def forget(self, s: Session, load_id: str) -> None:
        """Drop the records of a load's chunks (in the caller's transaction)."""


def open_sink(name: str, spec: dict[str, Any]) -> ChunkSink:
    """The sink ``name`` ("module:function") opened for ``spec``."""
    import importlib

    module, fn = name.split(":")
    sink: ChunkSink = getattr(importlib.import_module(module), fn)(spec)
    return sink
