"""Changes and logs made up for a test: one helper instead of one per test file."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mirrorline.log.reader import ChangeLog
from mirrorline.log.writer import LogWriter
from mirrorline.model import Change, Op, TableSchema
from mirrorline.position import ZERO


def ch(
    i: int, op: Op = Op.INSERT, table: str = "public.t", xid: int = 0, cols: Sequence[str] = ("id",), **kw: Any
) -> Change:
    """Change number ``i``: key ``(i,)`` and a row holding ``cols`` (``id`` = i, ``v`` = "v<i>", any other NULL);
    no row for a delete, no key for a truncate. ``kw``: the Change's other fields (``new``, ``old_key``, ...)."""
    values = {"id": str(i), "v": f"v{i}"}
    new = None if op in (Op.DELETE, Op.TRUNCATE) else {c: values.get(c) for c in cols}
    key = () if op is Op.TRUNCATE else (str(i),)
    return Change(ZERO, 0, xid, table, op, key, kw.pop("new", new), **kw)


def write_log(
    path: Path,
    schemas: Iterable[TableSchema],
    changes: Sequence[Change],
    *,
    per_txn: int,
    segment_changes: int,
    lsn_step: int = 10,
) -> ChangeLog:
    """A log at ``path`` holding ``schemas`` and then ``changes`` in transactions of ``per_txn``, the one starting at
    change ``i`` committed at LSN 1000 + ``lsn_step`` * i."""
    with LogWriter(path, segment_changes=segment_changes) as w:
        for s in schemas:
            w.record_schema(s)
        for i in range(0, len(changes), per_txn):
            w.add_transaction(1000 + lsn_step * i, 1, list(changes[i : i + per_txn]))
    return ChangeLog(path)
