"""Chunk files as a snapshot writes them (PostgreSQL's CSV: NULL an unquoted empty field, '' quoted), read as Arrow
string columns for the engines that load them through the driver
(:meth:`mirrorline.apply.session.Session.load_chunk`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

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
