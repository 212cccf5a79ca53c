"""What the assembler hands to its caller: transaction and stream-spill events, and the table facts it works with."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# ----------------------------------------------------------------------------------------------------- events


@dataclass(slots=True)
class Committed:
    """A whole non-streamed transaction committed; its ``rows`` changes wait in the assembler for :meth:`take`."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int  # microseconds since the Unix epoch
    rows: int


@dataclass(slots=True)
class SpillChanges:
    """Changes of spilled transaction ``xid`` made by (sub)transaction ``subxid``, in arrival order (log layout)."""

    xid: int
    subxid: int
    rows: pa.Table


@dataclass(slots=True)
class SpillBlockEnd:
    """A stream block of ``xid`` ended (Stream Stop): what was added so far belongs on disk."""

    xid: int


@dataclass(slots=True)
class SpillCommit:
    """Spilled transaction ``xid`` committed. Take the committed rows before it (:meth:`Assembler.take`) first."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int  # microseconds since the Unix epoch


@dataclass(slots=True)
class SpillAbort:
    """Discard subtransaction ``subxid`` of spilled transaction ``xid``; the whole transaction when equal."""

    xid: int
    subxid: int


@dataclass(slots=True)
class SkippedTxn:
    """A transaction at or before ``skip_through``: already in the log."""

    xid: int
    commit_lsn: int
    end_lsn: int


Event = Committed | SpillChanges | SpillBlockEnd | SpillCommit | SpillAbort | SkippedTxn

# ----------------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True, slots=True)
class TableInfo:
    """What the catalog said about a configured table at start (see :mod:`mirrorline.capture.source`)."""

    table: str
    key: tuple[str, ...] = ()  # configured key (config.tables[...].key)
    primary_key: tuple[str, ...] = ()
    not_null: frozenset[str] = frozenset()


@dataclass(slots=True)
class RelInfo:
    """A Relation message resolved: the table, its schema version and where its key columns sit in a tuple."""

    relid: int
    table: str
    version: int
    names: tuple[str, ...]
    key_idx: tuple[int, ...]
    captured: bool  # False: a published table that is not configured; its changes are dropped
