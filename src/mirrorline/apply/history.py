"""History mode at the target (``history = "versions"``): a table's shape with its version columns, and a unit's
versions (:mod:`mirrorline.compile.history`) as rows the set-based statements take.

A table kept in versions has, after the source's columns (``p`` = the prefix, ``_ml_`` unless configured):

====================  ===========================  ===============================================================
column                type                         holds
====================  ===========================  ===============================================================
``p`` start_lsn       bigint, not null             the commit LSN of the source transaction that made the version
                                                   (the snapshot's position for the rows a snapshot loaded)
``p`` start_at        timestamp with time zone     its commit time (the load's for a snapshot's rows)
``p`` end_lsn         bigint                       the commit LSN of the transaction that ended it; NULL while it
                                                   is current
``p`` end_at          timestamp with time zone     its commit time; NULL while current
``p`` deleted         boolean, not null            that transaction deleted the row (a DELETE, a TRUNCATE, a key
                                                   change away from this key)
====================  ===========================  ===============================================================

The target's key is the source's key plus ``p``\\ start_lsn. The current rows are those whose ``p``\\ end_lsn IS
NULL; the row as it was at time T: ``p``\\ start_at <= T AND (``p``\\ end_at IS NULL OR ``p``\\ end_at > T).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mirrorline.compile.batch import NET_ARROW
from mirrorline.compile.history import History, versions
from mirrorline.errors import ApplyError, TargetError
from mirrorline.model import Column, TableSchema

if TYPE_CHECKING:
    from mirrorline.compile.batch import NetBatch

VERSIONS = "versions"
MODES = (VERSIONS,)
DEFAULT_PREFIX = "_ml_"


@dataclass(frozen=True, slots=True)
class HistoryShape(TableSchema):
    """A table kept in versions, as the target holds it: the source's columns and the version columns. ``key`` is
    the source's key (how a unit's rows find a key's current version: with ``open_column`` IS NULL); the table's
    primary key is :attr:`primary`."""

    prefix: str = DEFAULT_PREFIX

    @property
    def start_lsn(self) -> str:
        return self.prefix + "start_lsn"

    @property
    def start_at(self) -> str:
        return self.prefix + "start_at"

    @property
    def end_lsn(self) -> str:
        return self.prefix + "end_lsn"

    @property
    def end_at(self) -> str:
        return self.prefix + "end_at"

    @property
    def deleted(self) -> str:
        return self.prefix + "deleted"

    @property
    def open_column(self) -> str:
        return self.end_lsn

    @property
    def primary(self) -> tuple[str, ...]:
        return (*self.key, self.start_lsn)

    @property
    def source_columns(self) -> tuple[str, ...]:
        n = len(version_columns(self.prefix))
        return self.column_names[:-n]


def version_columns(prefix: str) -> tuple[Column, ...]:
    return (
        Column(prefix + "start_lsn", "bigint", 20, nullable=False),
        Column(prefix + "start_at", "timestamp with time zone", 1184),
        Column(prefix + "end_lsn", "bigint", 20),
        Column(prefix + "end_at", "timestamp with time zone", 1184),
        Column(prefix + "deleted", "boolean", 16, nullable=False),
    )


def shape(ts: TableSchema, prefix: str = DEFAULT_PREFIX) -> HistoryShape:
    """``ts`` kept in versions. A source column whose name starts with the prefix is an error (the version
    columns could collide with it)."""
    clash = [c.name for c in ts.columns if c.name.startswith(prefix)]
    if clash:
        raise TargetError(
            f"{ts.table}: column {clash[0]!r} starts with {prefix!r}, the prefix of history mode's columns",
            hint="set history_prefix (on the table or the target) to a prefix none of its columns starts with",
            table=ts.table,
            column=clash[0],
        )
    if ts.bag:
        raise TargetError(
            f"{ts.table} has no key (REPLICA IDENTITY FULL), so its versions cannot be told apart",
            hint='give it a primary key at the source, or a key in [tables], or leave out history = "versions"',
            table=ts.table,
        )
    return HistoryShape(
        table=ts.table,
        columns=ts.columns + version_columns(prefix),
        key=ts.key,
        version=ts.version,
        since=ts.since,
        bag=False,
        relid=ts.relid,
        resync=ts.resync,
        prefix=prefix,
    )


def unit_versions(batch: NetBatch, changes: Any, table: str) -> History:
    """``table``'s versions from the unit of ``batch`` (``changes``: its changes, a sequence or a callable giving
    them), derived once per unit and shared by the targets."""
    if changes is None:
        raise ApplyError(
            f"{table} is kept in versions, and the unit's changes were not given",
            hint="its versions are written from the unit's changes once its transactions commit",
            table=table,
        )
    return batch.derive(
        ("history versions", table), lambda: versions(changes() if callable(changes) else changes, table)
    )


def pg_time(us: int | None) -> str | None:
    """Microseconds since the Unix epoch -> PostgreSQL's text of a timestamp with time zone, in UTC."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00")


def _bool(b: bool) -> str:
    return "t" if b else "f"


def closes_rows(h: History, hs: HistoryShape) -> pa.Table:
    """The unit's closes of the target's open versions, as kind U net rows writing only the end columns."""
    cols: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}
    for c in h.closes:
        cols["table"].append(hs.table)
        cols["kind"].append("U")
        cols["key"].append(list(c.key))
        cols["new"].append([(hs.end_lsn, str(c.end)), (hs.end_at, pg_time(c.end_ts)), (hs.deleted, _bool(c.deleted))])
        cols["unchanged"].append([])
        cols["lsn"].append(c.pos.lsn)
        cols["seq"].append(c.pos.seq)
        cols["moved_from"].append(None)
    return pa.table(cols, schema=NET_ARROW)


def versions_rows(h: History, hs: HistoryShape) -> pa.Table:
    """The unit's new versions, as kind I net rows of the whole shape (unsent columns named in ``unchanged``, to be
    read from the target's open version of ``moved_from``)."""
    cols: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}
    for v in h.versions:
        image = [
            *v.image.items(),
            (hs.start_lsn, str(v.start.lsn)),
            (hs.start_at, pg_time(v.start_ts)),
            (hs.end_lsn, str(v.end) if v.end is not None else None),
            (hs.end_at, pg_time(v.end_ts)),
            (hs.deleted, _bool(v.deleted)),
        ]
        cols["table"].append(hs.table)
        cols["kind"].append("I")
        cols["key"].append(list(v.key))
        cols["new"].append(image)
        cols["unchanged"].append(sorted(v.unchanged))
        cols["lsn"].append(v.start.lsn)
        cols["seq"].append(v.start.seq)
        cols["moved_from"].append(list(v.source) if v.source is not None else None)
    return pa.table(cols, schema=NET_ARROW)
