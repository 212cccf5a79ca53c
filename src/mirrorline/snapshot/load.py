"""Loading chunk files into a target in one transaction with the fastest bulk path of each engine (its session's
``load_chunk``: ``COPY ... FROM STDIN`` on PostgreSQL, ``executemany`` of converted rows on SQLite, an INSERT ...
SELECT over Arrow on DuckDB). Values become what apply would store (:mod:`mirrorline.apply.types`). The tables are
emptied first, and the applied positions and the snapshot state are written in the same transaction: a load is all
or nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from mirrorline.apply.session import Session
from mirrorline.apply.target import Target
from mirrorline.model import TableSchema
from mirrorline.position import Position
from mirrorline.snapshot import state as snapstate

log = logging.getLogger(__name__)


class BulkLoader:
    """One transaction on ``target``: :meth:`begin` (empty the tables), :meth:`load` each chunk file (the target
    kind's bulk path, :meth:`~mirrorline.apply.session.Session.load_chunk`), :meth:`finish` (positions, snapshot
    state, commit) or :meth:`abort`."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.s: Session = target.session()
        self.d = target.dialect
        self.schemas: list[TableSchema] = []

    def begin(self, schemas: Sequence[TableSchema]) -> None:
        s = self.s
        self.schemas = list(schemas)
        s.bulk_begin()
        s.begin()
        log.debug("target %s: snapshot load open: %s", self.target.name, [ts.table for ts in schemas])
        snapstate.ensure_tables(s)
        for ts in schemas:
            s.truncate(ts.table)

    def load(self, schema: TableSchema, path: str | Path, header: bool = True) -> int:
        return self.s.load_chunk(schema, path, header)

    def finish(self, loaded: Mapping[str, int], position: Position, end_lsn: int, origin: str, whole: bool) -> None:
        s = self.s
        self.target.loaded(s, [ts for ts in self.schemas if ts.table in loaded], position)
        snapstate.write_positions(s, loaded, position, whole)
        stamp = snapstate.now()
        snapstate.write(
            s, [snapstate.TableSnapshot(t, "loaded", position, end_lsn, n, origin, stamp) for t, n in loaded.items()]
        )
        s.commit()
        log.debug("target %s: snapshot load committed", self.target.name)
        self.close()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.s.rollback()
        self.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.s.close()


def mark_loading(
    target: Target, schemas: Sequence[TableSchema], position: Position, origin: str, truncate: bool
) -> None:
    """Record (and commit) that ``schemas``' tables are being loaded, emptying them first when ``truncate``: a crash
    from here to the end of the load leaves the target visibly ``loading``."""
    with target.transaction() as s:
        snapstate.ensure_tables(s)
        if truncate:
            for ts in schemas:
                s.truncate(ts.table)
        stamp = snapstate.now()
        snapstate.write(
            s, [snapstate.TableSnapshot(ts.table, "loading", position, 0, 0, origin, stamp) for ts in schemas]
        )


def finish_loading(
    target: Target,
    loaded: Mapping[str, int],
    position: Position,
    end_lsn: int,
    origin: str,
    whole: bool,
    also: Callable[[Session], None] | None = None,
    schemas: Sequence[TableSchema] = (),
) -> None:
    """The end of a load whose rows were committed by parallel tasks: positions and state in one transaction, with
    ``also`` (the kind forgetting its records of the load's chunks); ``schemas``: the loaded tables'."""
    with target.transaction() as s:
        target.loaded(s, [ts for ts in schemas if ts.table in loaded], position)
        snapstate.write_positions(s, loaded, position, whole)
        stamp = snapstate.now()
        snapstate.write(
            s, [snapstate.TableSnapshot(t, "loaded", position, end_lsn, n, origin, stamp) for t, n in loaded.items()]
        )
        if also is not None:
            also(s)
