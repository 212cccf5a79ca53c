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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mirrorline.compile.batch import NET_ARROW
from mirrorline.compile.history import Final, History, pg_text_time, versions
from mirrorline.errors import ApplyError, TargetError
from mirrorline.model import Column, Key, TableSchema, quote_ident

if TYPE_CHECKING:
    from mirrorline.compile.batch import NetBatch

VERSIONS = "versions"
SOFT_DELETE = "soft_delete"
MODES = (VERSIONS, SOFT_DELETE)
DEFAULT_PREFIX = "_ml_"


@dataclass(frozen=True, slots=True)
class HistoryShape(TableSchema):
    """A table kept with its history, as the target holds it: the source's columns, then the columns of its
    ``mode``. ``key`` is the source's key (in versions, how a unit's rows find a key's current version: with
    :attr:`open_column` IS NULL); the table's primary key is :attr:`primary`."""

    prefix: str = DEFAULT_PREFIX
    mode: str = VERSIONS

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
    def deleted_lsn(self) -> str:
        return self.prefix + "deleted_lsn"

    @property
    def deleted_at(self) -> str:
        return self.prefix + "deleted_at"

    @property
    def versions(self) -> bool:
        return self.mode == VERSIONS

    @property
    def open_column(self) -> str | None:
        """In versions, the column NULL on a key's current version (else None: a key has one row)."""
        return self.end_lsn if self.versions else None

    @property
    def primary(self) -> tuple[str, ...]:
        return (*self.key, self.start_lsn) if self.versions else self.key

    @property
    def current(self) -> str:
        """SQL true for the rows the source has now (DuckDB, SQLite and PostgreSQL alike)."""
        if self.versions:
            return f"{quote_ident(self.end_lsn)} IS NULL"
        return f"NOT {quote_ident(self.deleted)}"

    @property
    def defaults(self) -> dict[str, str]:
        """The columns a snapshot's load leaves to their defaults (rows loaded are current)."""
        if self.versions:
            return {self.start_lsn: "0", self.deleted: "FALSE"}
        return {self.deleted: "FALSE"}


def mode_columns(mode: str, prefix: str) -> tuple[Column, ...]:
    """The columns history mode ``mode`` adds after the source's."""
    if mode == SOFT_DELETE:
        return (
            Column(prefix + "deleted", "boolean", 16, nullable=False),
            Column(prefix + "deleted_lsn", "bigint", 20),
            Column(prefix + "deleted_at", "timestamp with time zone", 1184),
        )
    return (
        Column(prefix + "start_lsn", "bigint", 20, nullable=False),
        Column(prefix + "start_at", "timestamp with time zone", 1184),
        Column(prefix + "end_lsn", "bigint", 20),
        Column(prefix + "end_at", "timestamp with time zone", 1184),
        Column(prefix + "deleted", "boolean", 16, nullable=False),
    )


def shape(ts: TableSchema, mode: str = VERSIONS, prefix: str = DEFAULT_PREFIX) -> HistoryShape:
    """``ts`` kept in history mode ``mode``. A source column whose name starts with the prefix is an error (the
    mode's columns could collide with it)."""
    if mode not in MODES:
        raise TargetError(f"{ts.table}: unknown history mode {mode!r}", table=ts.table)
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
            f"{ts.table} has no key (REPLICA IDENTITY FULL), so its history cannot be told apart by row",
            hint="give it a primary key at the source, or a key in [tables], or leave out its history setting",
            table=ts.table,
        )
    return HistoryShape(
        table=ts.table,
        columns=ts.columns + mode_columns(mode, prefix),
        key=ts.key,
        version=ts.version,
        since=ts.since,
        bag=False,
        relid=ts.relid,
        resync=ts.resync,
        prefix=prefix,
        mode=mode,
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


pg_time = pg_text_time  # (apply names it so)


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


def soft_rows(h: History, hs: HistoryShape) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Soft deletes: the unit's rows as (marks: kind U rows marking deleted a row only the target holds; deletes:
    kind D rows of the keys written again; inserts: kind I rows writing them, marked deleted where the source
    deleted them)."""
    marks: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}
    deletes: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}
    inserts: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}

    def add(cols: dict[str, list[object]], kind: str, f: Final, new: Any, unchanged: list[str], moved: Any) -> None:
        cols["table"].append(hs.table)
        cols["kind"].append(kind)
        cols["key"].append(list(f.key))
        cols["new"].append(new)
        cols["unchanged"].append(unchanged)
        cols["lsn"].append(f.pos.lsn)
        cols["seq"].append(f.pos.seq)
        cols["moved_from"].append(moved)

    for f in h.finals:
        gone = [
            (hs.deleted, _bool(not f.there)),
            (hs.deleted_lsn, str(f.gone) if f.gone is not None else None),
            (hs.deleted_at, pg_time(f.gone_ts)),
        ]
        if f.image is None:
            add(marks, "U", f, gone, [], None)
        else:
            add(deletes, "D", f, None, [], None)
            moved = list(f.source) if f.source is not None else None
            add(inserts, "I", f, [*f.image.items(), *gone], sorted(f.unchanged), moved)
    return pa.table(marks, schema=NET_ARROW), pa.table(deletes, schema=NET_ARROW), pa.table(inserts, schema=NET_ARROW)


def keyed_shape(hs: HistoryShape, kept: Sequence[Column] = ()) -> TableSchema:
    """``hs`` keyed by its primary key (in versions, the source's key and the version's start), with the columns
    the source dropped that the table keeps (``kept``): the shape whose net rows the table formats' plans take, one
    row per version."""
    return TableSchema(
        table=hs.table,
        columns=hs.columns + tuple(kept),
        key=hs.primary,
        version=hs.version,
        since=hs.since,
        relid=hs.relid,
        resync=hs.resync,
    )


def keyed_rows(
    h: History,
    hs: HistoryShape,
    starts: Mapping[Key, int],
    current: Sequence[Key] | None,
    pk: TableSchema | None = None,
) -> pa.Table:
    """The unit's rows as net rows of :func:`keyed_shape` (for a format that finds rows by their whole primary
    key): ``starts``, the start of each current version the unit ends or takes unsent columns from (versions);
    ``current``, after a TRUNCATE, the keys of every current row (each ended, or marked deleted, unless the unit
    writes it); ``pk``: :func:`keyed_shape`'s (its kept columns). A current version ``starts`` lacks is the target's
    error, named."""
    pk = pk or keyed_shape(hs)
    cols: dict[str, list[object]] = {n: [] for n in NET_ARROW.names}
    value_cols = [c for c in pk.column_names if c not in pk.key]

    def add(
        kind: str,
        key: list[str | None],
        new: Any,
        pos: tuple[int, int],
        unchanged: Iterable[str] = (),
        moved: Any = None,
    ) -> None:
        cols["table"].append(hs.table)
        cols["kind"].append(kind)
        cols["key"].append(key)
        cols["new"].append(new)
        cols["unchanged"].append(sorted(unchanged))
        cols["lsn"].append(pos[0])
        cols["seq"].append(pos[1])
        cols["moved_from"].append(moved)

    def ending(new: list[tuple[str, str | None]]) -> list[str]:
        written = {c for c, _ in new}
        return [c for c in value_cols if c not in written]

    def start_of(k: Key) -> str:
        if k not in starts:
            raise ApplyError(
                f"{hs.table}: the unit changes key {list(k)}, which has no current version at the target",
                hint="the table's versions at the target are not the source's rows: reload it (snapshot --table)",
                table=hs.table,
                key=list(k),
            )
        return str(starts[k])

    written: set[Key] = set()
    if hs.versions:
        for c in h.closes:
            new = [(hs.end_lsn, str(c.end)), (hs.end_at, pg_time(c.end_ts)), (hs.deleted, _bool(c.deleted))]
            add("U", [*c.key, start_of(c.key)], new, (c.pos.lsn, c.pos.seq), ending(new))
            written.add(c.key)
        for v in h.versions:
            image = [
                *v.image.items(),
                (hs.start_lsn, str(v.start.lsn)),
                (hs.start_at, pg_time(v.start_ts)),
                (hs.end_lsn, str(v.end) if v.end is not None else None),
                (hs.end_at, pg_time(v.end_ts)),
                (hs.deleted, _bool(v.deleted)),
            ]
            moved = [*v.source, start_of(v.source)] if v.source is not None else None
            add("I", [*v.key, str(v.start.lsn)], image, (v.start.lsn, v.start.seq), v.unchanged, moved)
    else:
        for f in h.finals:
            gone = [
                (hs.deleted, _bool(not f.there)),
                (hs.deleted_lsn, str(f.gone) if f.gone is not None else None),
                (hs.deleted_at, pg_time(f.gone_ts)),
            ]
            pos = (f.pos.lsn, f.pos.seq)
            if f.image is None:
                add("U", list(f.key), gone, pos, ending(gone))
            else:
                add("D", list(f.key), None, pos)
                add("I", list(f.key), [*f.image.items(), *gone], pos, f.unchanged, list(f.source) if f.source else None)
            written.add(f.key)
    if h.truncated is not None and current is not None:
        lsn, ts = h.truncated
        if hs.versions:
            new = [(hs.end_lsn, str(lsn)), (hs.end_at, pg_time(ts)), (hs.deleted, "t")]
        else:
            new = [(hs.deleted, "t"), (hs.deleted_lsn, str(lsn)), (hs.deleted_at, pg_time(ts))]
        for k in current:
            if k not in written:
                add("U", [*k, start_of(k)] if hs.versions else list(k), new, (lsn, 0), ending(new))
    return pa.table(cols, schema=NET_ARROW)


def loaded_rows(part: pa.Table, hs: HistoryShape, schema: pa.Schema, lsn: int, at_us: int) -> pa.Table:
    """A snapshot's loaded rows of a table kept with its history (its own columns null): current, and in versions
    opened at the snapshot's position ``lsn`` and time."""
    n = part.num_rows
    values: dict[str, Any] = {hs.deleted: False}
    if hs.versions:
        values[hs.start_lsn] = lsn
        values[hs.start_at] = datetime.fromtimestamp(at_us / 1_000_000, UTC)
    for name, v in values.items():
        i = part.column_names.index(name)
        f = schema.field(name)
        part = part.set_column(i, f, pa.array([v] * n).cast(f.type))
    return part
