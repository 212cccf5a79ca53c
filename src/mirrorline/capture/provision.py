"""What capture makes and owns at the source: the publication, reconciled with the configured tables; the logical
replication slot; and the teardown that drops both.

Each function takes a normal SQL connection (:func:`mirrorline.capture.source.connect`) and changes the source only as
its docstring says; errors are :class:`~mirrorline.errors.SourceError` saying what to do. The catalog queries capture
makes before it streams are :mod:`mirrorline.capture.source`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mirrorline.capture.source import fetch, publication_members
from mirrorline.errors import SourceError
from mirrorline.model import quote_ident, quote_table

log = logging.getLogger(__name__)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# --------------------------------------------------------------------------------------------------------- publication


def _has_parts(conn: Any, publication: str) -> bool:
    """Does the publication carry a column list or a row filter for some table (PostgreSQL 15 or later)?"""
    if int(fetch(conn, "SHOW server_version_num")[0][0]) < 150000:
        return False
    return bool(
        fetch(
            conn,
            "SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = %s "
            "AND (r.prattrs IS NOT NULL OR r.prqual IS NOT NULL)",
            (publication,),
        )
    )


@dataclass
class PublicationReport:
    publication: str
    created: bool = False
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    publish_fixed: bool = False

    @property
    def changed(self) -> bool:
        return self.created or bool(self.added or self.removed) or self.publish_fixed

    def summary(self) -> str:
        if not self.changed:
            return f"publication {self.publication}: unchanged"
        parts = []
        if self.created:
            parts.append("created")
        if self.added:
            parts.append("added " + ", ".join(self.added))
        if self.removed:
            parts.append("removed " + ", ".join(self.removed))
        if self.publish_fixed:
            parts.append("now publishes insert, update, delete, truncate")
        return f"publication {self.publication}: " + "; ".join(parts)


OWNER_MARK = "mirrorline: the publication of the log at "


def _owns_publication(conn: Any, publication: str) -> bool:
    """The role may change the publication's comment: it owns it (one an administrator made for it, holding the
    configured tables already, is used without the mark that says which log it belongs to)."""
    rows = fetch(conn, "SELECT pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = %s", (publication,))
    return bool(rows and rows[0][0])


def _check_foreign(publication: str, report: PublicationReport, via_root: bool, publishes_all: bool) -> None:
    """A publication an administrator made for mirrorline's role (which cannot change it) is used as it is when it
    publishes the configured tables, every operation, partitions as their root; otherwise what its owner must run
    is named. Its column lists and row filters are taken as made (from the statement the start's checks gave)."""
    pub = quote_ident(publication)
    fixes = []
    if report.added:
        fixes.append(f"ALTER PUBLICATION {pub} ADD TABLE {', '.join(quote_table(t) for t in report.added)};")
    if report.removed:
        fixes.append(f"ALTER PUBLICATION {pub} DROP TABLE {', '.join(quote_table(t) for t in report.removed)};")
    if not via_root or not publishes_all:
        fixes.append(
            f"ALTER PUBLICATION {pub} SET (publish_via_partition_root = true, "
            "publish = 'insert, update, delete, truncate');"
        )
    if fixes:
        raise SourceError(
            f"publication {publication} is not the configured tables' as mirrorline publishes them, and its role "
            "does not own it to change it; as its owner run:\n      " + "\n      ".join(fixes),
            hint="then start mirrorline again",
        )


def reconcile_publication(
    conn: Any, publication: str, tables: Iterable[str], owner: str, specs: Mapping[str, str] | None = None
) -> PublicationReport:
    """Make the publication hold exactly the configured tables (DESIGN §3): create it, add the missing tables,
    remove the ones no longer configured, publish every operation, and publish a partitioned table's changes as its
    own (``publish_via_partition_root``: its partitions' changes come under its name, in its columns). The
    publication belongs to the log at ``owner`` (its comment says so, written when it is created or first
    reconciled): one that another log owns is refused before anything changes. ``specs``: a table published in
    part, as the publication names it with its column list and row filter
    (:func:`~mirrorline.capture.selection.publication_spec`; PostgreSQL 15 or later). Reports what changed."""
    wanted = sorted(set(tables))
    report = PublicationReport(publication)
    pub = quote_ident(publication)
    old_autocommit = conn.autocommit
    conn.autocommit = False
    try:
        rows = fetch(
            conn,
            "SELECT puballtables, pubinsert AND pubupdate AND pubdelete AND pubtruncate, pubviaroot, "
            "obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s",
            (publication,),
        )
        mark = OWNER_MARK + owner
        if rows and rows[0][3] and str(rows[0][3]).startswith(OWNER_MARK) and rows[0][3] != mark:
            other = str(rows[0][3])[len(OWNER_MARK) :]
            raise SourceError(
                f"publication {publication} belongs to another mirrorline log (the one at {other}); this "
                f"configuration's log is {owner}, and reconciling the publication would change what that log "
                "receives",
                hint='give this configuration a publication of its own: [source] publication = "..."',
            )
        parts = {t: v for t, v in (specs or {}).items() if t in wanted and v != quote_table(t)}
        if parts and int(fetch(conn, "SHOW server_version_num")[0][0]) < 150000:
            raise SourceError(
                f"{', '.join(sorted(parts))}: replicating part of a table (columns, exclude, where) needs PostgreSQL "
                "15 or later at the source, whose publications carry column lists and row filters",
                hint="replicate the whole table, or upgrade the source",
            )
        named = ", ".join(parts.get(t, quote_table(t)) for t in wanted)
        if not rows:
            fetch(conn, f"CREATE PUBLICATION {pub} FOR TABLE {named} WITH (publish_via_partition_root = true)")
            report.created = True
            report.added = wanted
        else:
            all_tables, publishes_all, via_root, _ = rows[0]
            if all_tables:
                raise SourceError(
                    f"publication {publication} is FOR ALL TABLES, so mirrorline cannot reconcile it "
                    "with the configured tables",
                    hint="set [source] publication to a name of mirrorline's own",
                )
            current = publication_members(conn, publication)
            report.added = [t for t in wanted if t not in current]
            report.removed = [t for t in current if t not in wanted]
            if not _owns_publication(conn, publication):
                _check_foreign(publication, report, via_root, publishes_all)
                conn.commit()
                return report
            if not via_root:
                fetch(conn, f"ALTER PUBLICATION {pub} SET (publish_via_partition_root = true)")
            partial = bool(parts) or _has_parts(conn, publication)
            if partial:  # column lists and row filters set as configured, with the members, at once
                fetch(conn, f"ALTER PUBLICATION {pub} SET TABLE {named}")
            elif report.added:
                fetch(conn, f"ALTER PUBLICATION {pub} ADD TABLE {', '.join(quote_table(t) for t in report.added)}")
            if report.removed and not partial:
                fetch(conn, f"ALTER PUBLICATION {pub} DROP TABLE {', '.join(quote_table(t) for t in report.removed)}")
            if not publishes_all:
                fetch(conn, f"ALTER PUBLICATION {pub} SET (publish = 'insert, update, delete, truncate')")
                report.publish_fixed = True
        if not rows or rows[0][3] != mark:
            fetch(conn, f"COMMENT ON PUBLICATION {pub} IS {_literal(mark)}")
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = old_autocommit
    return report


# --------------------------------------------------------------------------------------------------------- slot


def check_failover(conn: Any, failover: bool) -> None:
    """``failover = true`` needs a server that has failover slots (PostgreSQL 17 and later)."""
    if not failover:
        return
    ((version,),) = fetch(conn, "SELECT current_setting('server_version_num')::int")
    if version < 170000:
        raise SourceError(
            f"[source] failover = true needs PostgreSQL 17 or later (the source runs {version // 10000}): before it, a "
            "logical slot is not carried over to a promoted standby",
            hint="remove failover (after a failover, reload every target: mirrorline snapshot --target NAME), or "
            "upgrade the source",
        )


def ensure_slot(conn: Any, slot: str, failover: bool = False) -> bool:
    """Create the logical replication slot (pgoutput) if it is missing, as a failover slot when ``failover``
    (:func:`check_failover` first); True when created. An existing slot must be a logical pgoutput slot of this
    database."""
    check_failover(conn, failover)
    rows = fetch(
        conn,
        "SELECT plugin, slot_type, database = current_database() FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    if rows:
        plugin, kind, same_db = rows[0]
        if kind != "logical" or plugin != "pgoutput":
            raise SourceError(
                f"replication slot {slot} exists but is a {kind} slot of plugin {plugin}",
                hint="set [source] slot to another name, or drop that slot",
            )
        if not same_db:
            raise SourceError(
                f"replication slot {slot} belongs to another database",
                hint="set [source] slot to a name of its own for this source",
            )
        if (
            failover
            and not fetch(conn, "SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0]
        ):
            log.warning(
                "replication slot %s is not a failover slot: a promoted standby will not have it (on a replication "
                "connection, ALTER_REPLICATION_SLOT %s (FAILOVER true) makes it one)",
                slot,
                slot,
            )
        return False
    if failover:
        fetch(conn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)", (slot,))
    else:
        fetch(conn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return True


# --------------------------------------------------------------------------------------------------------- teardown


@dataclass
class Teardown:
    """What :func:`teardown` found at the source, and did (``done``)."""

    slot: str
    slot_exists: bool
    slot_holder: int | None  # the pid of the process streaming from the slot
    slot_retained_bytes: int | None
    publication: str
    publication_exists: bool
    publication_owner: str | None  # the log path its mark names (None: no mark, not mirrorline's)
    done: list[str] = field(default_factory=list)

    def plan(self, owner: str) -> list[str]:
        """What dropping would do, one line each."""
        out = []
        if self.slot_exists:
            held = f"{self.slot_retained_bytes} bytes of WAL" if self.slot_retained_bytes is not None else "WAL"
            out.append(f"drop the replication slot {self.slot} (it retains {held})")
        if self.publication_exists and self.publication_owner == owner:
            out.append(f"drop the publication {self.publication}")
        elif self.publication_exists:
            whose = f"the log at {self.publication_owner}" if self.publication_owner else "no mirrorline log"
            out.append(f"keep the publication {self.publication}: it belongs to {whose}")
        return out


def inspect_teardown(conn: Any, slot: str, publication: str) -> Teardown:
    """The slot and the publication as the source has them now."""
    rows = fetch(
        conn,
        "SELECT active_pid, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )
    pubs = fetch(
        conn, "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = %s", (publication,)
    )
    mark = str(pubs[0][0]) if pubs and pubs[0][0] else ""
    return Teardown(
        slot,
        bool(rows),
        int(rows[0][0]) if rows and rows[0][0] is not None else None,
        int(rows[0][1]) if rows and rows[0][1] is not None else None,
        publication,
        bool(pubs),
        mark[len(OWNER_MARK) :] if mark.startswith(OWNER_MARK) else None,
    )


def teardown(conn: Any, slot: str, publication: str, owner: str) -> Teardown:
    """Drop what capture made at the source: the replication slot (refused while a process streams from it) and the
    publication, when it belongs to this log (``owner``: its path). The log and the targets are left as they are."""
    t = inspect_teardown(conn, slot, publication)
    if t.slot_holder is not None:
        raise SourceError(
            f"the replication slot {slot} is in use by the process with pid {t.slot_holder} (a running capture)",
            hint="stop `mirrorline run` (or `capture`) first",
        )
    if t.slot_exists:
        fetch(conn, "SELECT pg_drop_replication_slot(%s)", (slot,))
        t.done.append(f"dropped the replication slot {slot}")
    if t.publication_exists and t.publication_owner == owner:
        fetch(conn, f"DROP PUBLICATION {quote_ident(publication)}")
        t.done.append(f"dropped the publication {publication}")
    return t
