"""The log knows its source (DESIGN §3): the source's system identifier, timeline and database, and the slot the log
is fed from, recorded in the log (:mod:`mirrorline.log.source`) when capture first connects. Every start compares
them:

- another system (another cluster, or a restored copy under a new identifier): capture stops;
- the source's WAL behind what the log holds (restored from a backup, or another server): capture stops;
- the slot gone while the log holds changes or targets have positions (dropped, or a failover to a standby that
  had no copy of it): the changes committed since the slot was lost are not in the log, and never will be. Every
  registered target is marked *needs reload* (``snapshot --target NAME`` loads it again; ``status`` and ``apply``
  say so), and capture creates the slot anew and goes on from there.

:func:`judge` is the pure decision; the rest reads and writes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from mirrorline.capture.source import connect
from mirrorline.errors import SourceError
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import EXPORT_PREFIX, mark_reload, readers
from mirrorline.log.source import SourceIdentity, read, write
from mirrorline.position import Position, format_lsn, parse_lsn

__all__ = ["SourceIdentity", "Verdict", "judge", "mark_lost", "query", "read", "write"]

log = logging.getLogger("mirrorline.capture")


@dataclass(frozen=True)
class Verdict:
    """What a start does: ``slot_lost`` (mark every target needs reload, then create the slot), ``record`` (write
    the identity as it is now)."""

    slot_lost: bool
    record: bool


def judge(
    recorded: SourceIdentity | None,
    now: SourceIdentity,
    *,
    slot_exists: bool,
    log_has_positions: bool,
    durable: Position | None,
    current_lsn: int,
) -> Verdict:
    """Compare the source as the log recorded it with the source now. Raises :class:`SourceError` when the log
    cannot go on from this source."""
    if recorded is not None and recorded.system_identifier != now.system_identifier:
        raise SourceError(
            f"the source is another PostgreSQL system (system identifier {now.system_identifier}; the log was fed by "
            f"{recorded.system_identifier}, database {recorded.database})",
            hint="point [source] dsn at the log's source; or, to replicate this one, start a new log (another [log] "
            "path) and load every target again (mirrorline snapshot --target NAME)",
        )
    if recorded is not None and recorded.database != now.database:
        raise SourceError(
            f"the source is database {now.database}, the log was fed by database {recorded.database}",
            hint="point [source] dsn at the log's database, or start a new log and load every target again",
        )
    if durable is not None and current_lsn < durable.lsn:
        raise SourceError(
            f"the source's WAL is at {format_lsn(current_lsn)}, behind the log's {durable}: the source went back "
            "(restored from a backup, or a standby promoted from an older point); changes the log holds may not "
            "exist there",
            hint="start a new log (another [log] path) and load every target again (mirrorline snapshot --target NAME)",
        )
    lost = not slot_exists and log_has_positions
    return Verdict(slot_lost=lost, record=lost or recorded is None or recorded != now)


def query(dsn: str, slot: str) -> tuple[SourceIdentity, int]:
    """The source's identity now, and its current WAL position (``IDENTIFY_SYSTEM`` on a replication connection,
    which a replication role may run)."""

    conn = connect(dsn, replication=True)
    try:
        with conn.cursor() as cur:
            cur.execute("IDENTIFY_SYSTEM")
            sysid, timeline, xlogpos, db = cur.fetchone()
    finally:
        conn.close()
    return SourceIdentity(str(sysid), int(timeline), str(db), slot), parse_lsn(str(xlogpos))


def mark_lost(log_root: Path, slot: str, durable: Position | None) -> list[str]:
    """The slot is gone: every registered target needs a reload (the changes since the slot was lost are in no
    log). Returns their names."""

    cl = ChangeLog(log_root)
    names = sorted(n for n in readers(cl) if not n.startswith(EXPORT_PREFIX))
    reason = (
        f"the replication slot {slot} was lost (dropped, or the source failed over) while the log held changes up "
        f"to {durable or 'nothing yet'}: the changes committed after it are in no log"
    )
    for name in names:
        mark_reload(cl, name, reason)
    log.error("%s; every target needs a reload (mirrorline snapshot --target NAME): %s", reason, ", ".join(names))
    return names
