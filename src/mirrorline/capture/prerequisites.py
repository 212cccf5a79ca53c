"""What the source must give mirrorline's role before replication starts, each missing thing named with the statement
that gives it (README "Prepare the source").

A pure core and one read: :func:`read_facts` reads the settings, the role's rights and the slots in a few catalog
queries; :func:`findings` judges them, each :class:`Finding` with the SQL to run at the source; :func:`check` raises
one :class:`~mirrorline.errors.SourceError` listing every blocking finding (nothing has been created at the source
yet, no position has moved) and logs the advice that does not block.

    >>> facts = Facts(role="replicator", may_replicate=False, rds=True)
    >>> [f.statement for f in findings(facts)]
    ['GRANT rds_replication TO "replicator";']
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mirrorline.capture.source import fetch, publication_members
from mirrorline.errors import SourceError
from mirrorline.model import quote_ident, quote_table, split_table_name

log = logging.getLogger(__name__)

MIN_VERSION = 140000  # pgoutput protocol version 2: streamed in-progress transactions


@dataclass(frozen=True)
class Facts:
    """What the source says about itself and about the role mirrorline connects as."""

    role: str
    version: int = MIN_VERSION
    wal_level: str = "logical"
    may_replicate: bool = True  # superuser, REPLICATION, or a member of rds_replication
    rds: bool = False  # the role rds_replication exists (Amazon RDS and Aurora grant replication through it)
    slot: str = "mirrorline"
    slot_exists: bool = True
    slots_used: int = 0
    max_slots: int = 10
    senders_used: int = 0
    max_senders: int = 10
    wal_keep: str = "10GB"  # max_slot_wal_keep_size as the server shows it ("-1": no bound)
    unusable_schemas: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()  # configured tables whose replicated columns the role may not all SELECT
    publication: str = "mirrorline"
    unpublished: tuple[str, ...] = ()  # configured tables the publication lacks (all of them when there is none)
    publication_exists: bool = True
    publication_owned: bool = True  # the role owns the publication (may change it)
    may_create: bool = True  # CREATE on the database: the role may make the publication
    database: str = "postgres"
    temporary_slot: bool = False  # a snapshot beside a live replication opens a second slot and WAL sender
    not_owned: tuple[str, ...] = ()  # of those, the ones the role cannot add to a publication (not their owner)
    specs: Mapping[str, str] = field(default_factory=dict)  # a table published in part, as the publication names it


@dataclass(frozen=True)
class Finding:
    """One thing missing at the source: what, the statement that gives it, and whether replication can start
    without it."""

    what: str
    statement: str
    blocking: bool = True


def findings(f: Facts) -> list[Finding]:
    """Everything missing, blocking first, in the order an administrator would fix it."""
    role = quote_ident(f.role)
    out: list[Finding] = []
    if f.version < MIN_VERSION:
        out.append(
            Finding(
                f"the source runs PostgreSQL {f.version // 10000}; mirrorline needs 14 or newer (pgoutput protocol "
                "version 2, which streams large transactions before they commit)",
                "-- upgrade the server (pg_upgrade), then start mirrorline again",
            )
        )
    if f.wal_level != "logical":
        out.append(
            Finding(
                f"wal_level is {f.wal_level}; logical decoding needs wal_level = logical",
                "ALTER SYSTEM SET wal_level = logical;  -- then restart the server (a managed service: its parameter, "
                'README "Prepare the source")',
            )
        )
    if not f.may_replicate:
        statement = f"GRANT rds_replication TO {role};" if f.rds else f"ALTER ROLE {role} WITH REPLICATION;"
        out.append(Finding(f"the role {f.role} may not replicate (create a slot, stream from it)", statement))
    if f.unusable_schemas:
        schemas = ", ".join(quote_ident(s) for s in f.unusable_schemas)
        out.append(
            Finding(
                f"the role {f.role} may not use the schema(s) {', '.join(f.unusable_schemas)}",
                f"GRANT USAGE ON SCHEMA {schemas} TO {role};",
            )
        )
    if f.unreadable:
        tables = ", ".join(quote_table(t) for t in f.unreadable)
        out.append(
            Finding(
                f"the role {f.role} may not read {', '.join(f.unreadable)} (a snapshot and the checks read them)",
                f"GRANT SELECT ON {tables} TO {role};",
            )
        )
    partial = sorted(t for t, spec in f.specs.items() if spec != quote_table(t))
    if partial and f.version < 150000:
        out.append(
            Finding(
                f"{', '.join(partial)}: replicating part of a table (columns, exclude, where) needs PostgreSQL 15 or "
                "later at the source, whose publications carry column lists and row filters",
                "-- replicate the whole table (remove columns / exclude / where), or upgrade the server",
            )
        )
    pub = quote_ident(f.publication)
    named = ", ".join(f.specs.get(t, quote_table(t)) for t in f.unpublished)
    if not f.publication_exists and f.not_owned:
        out.append(
            Finding(
                f"publishing {', '.join(f.not_owned)} needs the tables' owner, which the role {f.role} is not "
                f"(run the statement as the owner or a superuser; mirrorline then uses publication {f.publication})",
                f"CREATE PUBLICATION {pub} FOR TABLE {named} WITH (publish_via_partition_root = true);",
            )
        )
    elif not f.publication_exists and not f.may_create:
        out.append(
            Finding(
                f"the role {f.role} may not create publication {f.publication} in database {f.database}",
                f"GRANT CREATE ON DATABASE {quote_ident(f.database)} TO {role};",
            )
        )
    elif f.publication_exists and f.unpublished and (f.not_owned or not f.publication_owned):
        whose = "the tables' owner" if f.not_owned else "the publication's owner"
        out.append(
            Finding(
                f"adding {', '.join(f.unpublished)} to publication {f.publication} needs {whose}, which the role "
                f"{f.role} is not (run the statement as the owner or a superuser)",
                f"ALTER PUBLICATION {pub} ADD TABLE {named};",
            )
        )
    room = not f.slot_exists or f.temporary_slot
    if room and f.slots_used >= f.max_slots:
        out.append(
            Finding(
                f"every replication slot is in use ({f.slots_used} of max_replication_slots = {f.max_slots}): "
                f"there is no room for {'a snapshot' if f.slot_exists else 'mirrorline'}'s slot",
                f"ALTER SYSTEM SET max_replication_slots = {f.slots_used + 2};  -- then restart the server "
                "(or drop a slot nothing uses: SELECT pg_drop_replication_slot('name');)",
            )
        )
    if room and f.senders_used >= f.max_senders:
        out.append(
            Finding(
                f"every WAL sender is in use ({f.senders_used} of max_wal_senders = {f.max_senders}): "
                f"{'a snapshot' if f.slot_exists else 'mirrorline'}'s replication connection would be refused",
                f"ALTER SYSTEM SET max_wal_senders = {f.senders_used + 2};  -- then restart the server",
            )
        )
    if f.wal_keep.strip() == "-1":
        out.append(
            Finding(
                "max_slot_wal_keep_size is unbounded: while mirrorline is stopped its slot keeps every WAL file "
                "since its position, until the source's disk fills (bounded, the slot is given up past the bound and "
                "the targets then need a reload, which mirrorline names)",
                "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();",
                blocking=False,
            )
        )
    return out


def _table_rights(conn: Any, tables: Mapping[str, Sequence[str]]) -> tuple[list[str], list[str], list[str]]:
    """The configured tables' schemas the role may not use, tables whose columns it may not all read, and tables
    it does not own (by rights, a member of the owner's role owns it)."""
    unusable: list[str] = []
    unreadable: list[str] = []
    not_owned: list[str] = []
    with conn.cursor() as cur:
        for name, columns in tables.items():
            schema, rel = split_table_name(name)
            cur.execute(
                "SELECT has_schema_privilege(n.oid, 'USAGE'), pg_has_role(c.relowner, 'USAGE'), "
                "(SELECT coalesce(bool_and(has_column_privilege(c.oid, a, 'SELECT')), "
                "has_table_privilege(c.oid, 'SELECT')) FROM unnest(%s::text[]) a) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                (list(columns), schema, rel),
            )
            row = cur.fetchone()
            if row is None:  # gone: describe_tables has said what happens to it
                continue
            usable, owned, readable = row
            if not usable and schema not in unusable:
                unusable.append(schema)
            if not readable:
                unreadable.append(name)
            if not owned:
                not_owned.append(name)
    return unusable, unreadable, not_owned


_SERVER_SQL = """
SELECT current_setting('server_version_num')::int, current_setting('wal_level'), current_user,
  r.rolsuper OR r.rolreplication OR EXISTS (
    SELECT 1 FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(r.oid, g.oid, 'MEMBER')),
  EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication'),
  r.rolsuper,
  EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s),
  (SELECT count(*) FROM pg_replication_slots)::int, current_setting('max_replication_slots')::int,
  (SELECT count(*) FROM pg_stat_replication)::int, current_setting('max_wal_senders')::int,
  current_setting('max_slot_wal_keep_size'),
  current_database(), has_database_privilege(current_database(), 'CREATE'),
  coalesce((SELECT pg_has_role(p.pubowner, 'USAGE') FROM pg_publication p WHERE p.pubname = %s), true)
FROM pg_roles r WHERE r.rolname = current_user
"""


def read_facts(
    conn: Any,
    slot: str,
    publication: str,
    tables: Mapping[str, Sequence[str]],
    published: Iterable[str] | None,
    specs: Mapping[str, str] | None = None,
    temporary_slot: bool = False,
) -> Facts:
    """The source's facts for :func:`findings`. ``tables``: each configured table with the columns replicated;
    ``published``: the publication's members (None: there is no such publication)."""
    with conn.cursor() as cur:
        cur.execute(_SERVER_SQL, (slot, publication))
        row = cur.fetchone()
    (
        version,
        level,
        role,
        may,
        rds,
        superuser,
        exists,
        slots,
        max_slots,
        senders,
        max_senders,
        keep,
        db,
        create,
        owned,
    ) = row
    unusable, unreadable, owned_not = _table_rights(conn, tables)
    members = set(published or ())
    unpublished = tuple(t for t in tables if t not in members)
    not_owned = () if superuser else tuple(t for t in unpublished if t in owned_not)
    return Facts(
        role=role,
        version=int(version),
        wal_level=str(level),
        may_replicate=bool(may),
        rds=bool(rds),
        slot=slot,
        slot_exists=bool(exists),
        slots_used=int(slots),
        max_slots=int(max_slots),
        senders_used=int(senders),
        max_senders=int(max_senders),
        wal_keep=str(keep),
        unusable_schemas=tuple(unusable),
        unreadable=tuple(unreadable),
        publication=publication,
        unpublished=unpublished,
        publication_exists=published is not None,
        publication_owned=bool(owned),
        may_create=bool(create),
        database=str(db),
        temporary_slot=temporary_slot,
        not_owned=not_owned,
        specs=dict(specs or {}),
    )


def report(found: Sequence[Finding]) -> str:
    """The blocking findings as the error's text: each thing missing, then its statement."""
    lines = [
        f"the source is not ready for replication ({len(found)} missing; run at the source as a superuser, "
        "then start mirrorline again):"
    ]
    for f in found:
        lines += [f"  - {f.what}:", f"      {f.statement}"]
    return "\n".join(lines)


def check_server(conn: Any) -> None:
    """The server's version and ``wal_level`` (:func:`findings`' first two), before the tables are looked at."""
    ((version, level, role),) = fetch(
        conn, "SELECT current_setting('server_version_num')::int, current_setting('wal_level'), current_user"
    )
    found = findings(Facts(role=str(role), version=int(version), wal_level=str(level)))
    if found:
        raise SourceError(report(found), missing=[f.statement for f in found])


def check_ready(
    conn: Any,
    slot: str,
    publication: str,
    tables: Mapping[str, Any],
    specs: Mapping[str, str],
    temporary_slot: bool = False,
) -> None:
    """:func:`check` of the source's facts for the described ``tables`` (name -> :class:`SourceTable`);
    ``temporary_slot``: a snapshot will open a slot and a WAL sender of its own beside the existing slot."""
    exists = bool(fetch(conn, "SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)))
    published = publication_members(conn, publication) if exists else None
    columns = {name: [c.name for c in t.columns] for name, t in tables.items()}
    check(read_facts(conn, slot, publication, columns, published, specs, temporary_slot))


def check(facts: Facts) -> None:
    """Raise for what blocks replication (every such finding at once); log the advice that does not."""
    found = findings(facts)
    for f in found:
        if not f.blocking:
            log.warning("%s; to bound it: %s", f.what, f.statement)
    blocking = [f for f in found if f.blocking]
    if blocking:
        raise SourceError(report(blocking), missing=[f.statement for f in blocking])
