"""The source database seen through a normal SQL connection: connecting (and the errors a user reads), the checks
of the server, the configured tables as the catalog describes them (their keys, their columns), and the catalog
lookups capture makes while it streams (type names, added columns, renamed tables, partitions).

The checks run before streaming starts, so that a missing table or a table without a usable key is a clear error
before anything streams. Errors never show a password (:func:`mirrorline.config.redact_dsn`). What capture creates at
the source (the publication, the slot) is :mod:`mirrorline.capture.provision`'s.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mirrorline.capture.assembler import TableInfo
from mirrorline.capture.partitions import Leaf
from mirrorline.capture.selection import check_filter, selected
from mirrorline.config import Config, redact_dsn
from mirrorline.errors import ConfigError, SourceError, TransientSourceError
from mirrorline.model import Column, default_key, quote_ident, quote_table, split_table_name
from mirrorline.position import parse_lsn

log = logging.getLogger(__name__)

# SQLSTATEs after which trying again can help: connection failures, shutdowns, the slot still held by a walsender
# that has not yet noticed its client died.
_TRANSIENT_STATES = ("08", "57P01", "57P02", "57P03", "55006", "53300")
# Connection failures carry no SQLSTATE in the driver: these texts mean the credentials were refused.
_AUTH_RE = re.compile(
    r"password authentication failed|no password supplied|no pg_hba\.conf entry|"
    r'role ".*" does not exist|authentication failed|must be superuser or replication role|'
    r"permission denied to start WAL sender|is not permitted to log in"
)


def is_transient(e: Exception) -> bool:
    import psycopg2

    if isinstance(e, psycopg2.InterfaceError):
        return True
    if not isinstance(e, psycopg2.Error):
        return False
    code = e.pgcode
    if code is None:  # no SQLSTATE: the connection itself failed or dropped
        return isinstance(e, psycopg2.OperationalError | psycopg2.DatabaseError)
    return any(code.startswith(s) for s in _TRANSIENT_STATES)


def source_error(e: Exception, dsn: str, doing: str) -> SourceError:
    """A driver exception -> one clear line, no password; transient ones as :class:`TransientSourceError`."""
    import psycopg2

    text = str(e).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    first = re.sub(r"\b(FATAL|ERROR):\s+", "", first)
    where = redact_dsn(dsn)
    code = getattr(e, "pgcode", None)
    if (code and code.startswith("28")) or _AUTH_RE.search(text):
        return SourceError(
            f"{doing}: {first}", hint="check the user in [source] dsn and PGPASSWORD / ~/.pgpass", dsn=where
        )
    if code == "3D000" or ("database" in text and "does not exist" in text):
        return SourceError(f"{doing}: {first}", hint="check the database name in [source] dsn", dsn=where)
    if is_transient(e):
        hint = "is the server running and reachable?" if isinstance(e, psycopg2.OperationalError) else None
        return TransientSourceError(f"{doing}: {first}", hint=hint, dsn=where, sqlstate=code)
    return SourceError(f"{doing}: {first}", dsn=where, sqlstate=code)


def connect(dsn: str, *, replication: bool = False, doing: str = "cannot connect to the source") -> Any:
    import psycopg2
    import psycopg2.extras

    try:
        if replication:
            return psycopg2.connect(
                dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, connect_timeout=10
            )
        conn = psycopg2.connect(dsn, connect_timeout=10, application_name="mirrorline capture")
        conn.autocommit = True
        return conn
    except psycopg2.Error as e:
        raise source_error(e, dsn, doing) from None


def fetch(conn: Any, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    """The rows of one statement on a normal SQL connection (none for a statement that returns no rows)."""
    with conn.cursor() as cur:
        cur.execute(sql, tuple(args))
        return list(cur.fetchall()) if cur.description else []


# --------------------------------------------------------------------------------------------------------- checks


def current_wal_lsn(conn: Any) -> int:
    ((lsn,),) = fetch(conn, "SELECT pg_current_wal_lsn()::text")
    return parse_lsn(lsn)


_TABLE_SQL = """
SELECT c.oid, c.relkind, c.relreplident,
  ARRAY(SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)),
  ARRAY(SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = c.oid AND i.indisreplident ORDER BY array_position(i.indkey::int2[], a.attnum))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
_COLUMNS_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attnum
FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY a.attnum
"""


@dataclass
class SourceTable:
    """A configured table as the catalog describes it."""

    name: str
    oid: int
    replica_identity: str  # d n f i
    primary_key: tuple[str, ...]
    identity: tuple[str, ...]  # replica identity columns ('d': the primary key, 'i': the index's; 'f': every one)
    columns: tuple[Column, ...]
    info: TableInfo = field(default_factory=lambda: TableInfo(""))
    left_out: tuple[str, ...] = ()  # columns not replicated (the table's ``columns`` / ``exclude``)


_UNIQUE_INDEX_SQL = """
SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = %s AND i.indisunique AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL
  AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                  AND NOT a.attnotnull)
ORDER BY i.indnatts, c.relname LIMIT 1
"""


def describe_tables(
    conn: Any, config: Config, replicated: Collection[str] = (), keyless_ok: bool = False
) -> dict[str, SourceTable]:
    """Every configured table, checked: it exists, is a table, and has a usable key (primary key, replica identity
    index, or REPLICA IDENTITY FULL). Raises :class:`ConfigError` naming the table otherwise (every table lacking
    a replica identity at once), except that a table in ``replicated`` (the log holds its changes) that no longer
    exists is left out: dropped or renamed at the source, it stops alone (the caller records it) while the others go
    on; one replicated already (the log holds it, or the publication) that lost its replica identity is described
    as below, with a warning. ``keyless_ok``: a table without
    a replica identity is described as if it were REPLICA IDENTITY FULL (a bag of rows: ``verify`` compares it so)."""
    file = str(config.file)
    lacking: dict[str, str] = {}  # table -> what it lacks
    published = set(publication_members(conn, config.source.publication)) if config.source is not None else set()
    advice: list[str] = []
    if not config.tables:
        raise ConfigError(
            file, "tables", "no tables configured", hint='add at least one [tables."schema.name"] section'
        )
    out: dict[str, SourceTable] = {}
    for name, tcfg in config.tables.items():
        key_name = f'tables."{name}"'
        schema, rel = split_table_name(name)
        rows = fetch(conn, _TABLE_SQL, (schema, rel))
        if not rows and name in replicated:
            continue
        if not rows:
            raise ConfigError(
                file,
                key_name,
                f"no table {name} in the source database",
                hint="create it there, or remove it from the configuration",
            )
        oid, relkind, ident, pk, ri = rows[0]
        if relkind not in ("r", "p"):
            kinds = {"v": "a view", "m": "a materialized view", "f": "a foreign table", "S": "a sequence"}
            raise ConfigError(
                file,
                key_name,
                f"{name} is {kinds.get(relkind, 'not a table')}, which logical replication cannot publish",
            )
        columns = tuple(
            Column(n, t, int(o), int(m), not nn, attnum=int(num))
            for n, o, m, t, nn, num in fetch(conn, _COLUMNS_SQL, (oid,))
        )
        names = [c.name for c in columns]
        pk = tuple(pk or ())
        identity: tuple[str, ...] = {"d": pk, "i": tuple(ri or ()), "f": tuple(names), "n": ()}.get(ident, ())
        if not identity and (keyless_ok or name in replicated or name in published):
            if not keyless_ok:  # (PostgreSQL refuses its updates and deletes meanwhile: nothing is lost)
                log.warning(
                    "%s lost its replica identity at the source: PostgreSQL refuses its updates and deletes until it "
                    "has one again (ALTER TABLE %s REPLICA IDENTITY FULL, or a primary key)",
                    name,
                    quote_table(name),
                )
            ident, identity = "f", tuple(names)
        if not identity:
            what = "has no primary key" if ident == "d" else "has REPLICA IDENTITY NOTHING"
            lacking[name] = f"{name} {what} and no REPLICA IDENTITY FULL or USING INDEX"
            unique = fetch(conn, _UNIQUE_INDEX_SQL, (oid,))
            if unique:
                advice.append(
                    f"ALTER TABLE {quote_table(name)} REPLICA IDENTITY USING INDEX {quote_ident(unique[0][0])}"
                )
            else:
                advice.append(f"ALTER TABLE {quote_table(name)} REPLICA IDENTITY FULL (or add a primary key)")
            continue
        if tcfg.key:
            unknown = [k for k in tcfg.key if k not in names]
            if unknown:
                raise ConfigError(file, f"{key_name}.key", f"{name} has no column(s) {', '.join(unknown)}")
            outside = [k for k in tcfg.key if k not in identity]
            if outside:
                raise ConfigError(
                    file,
                    f"{key_name}.key",
                    f"key column(s) {', '.join(outside)} are not in {name}'s replica identity "
                    f"({', '.join(identity)}), so deletes would not carry them",
                    hint=f"configure a key among those columns, or ALTER TABLE {quote_table(name)} "
                    "REPLICA IDENTITY FULL",
                )
        elif ident == "f" and not pk and not default_key(columns):
            raise ConfigError(
                file,
                key_name,
                f"{name} has no primary key and no columns, so it has no usable key",
                hint="add a primary key, or configure tables.key",
            )
        left_out: tuple[str, ...] = ()
        if tcfg.select or tcfg.exclude or tcfg.where is not None:
            if tcfg.where is not None:
                check_filter(conn, file, name, tcfg.where)
            kept = selected(file, name, tcfg, columns, identity)
            left_out = tuple(c.name for c in columns if c not in kept)
            columns = kept
        info = TableInfo(name, tuple(tcfg.key), pk, frozenset(c.name for c in columns if not c.nullable))
        out[name] = SourceTable(name, int(oid), ident, pk, identity, columns, info, left_out)
    if lacking:
        raise ConfigError(
            file,
            f'tables."{next(iter(lacking))}"',
            f"{'; '.join(lacking.values())}: updates and deletes cannot be captured with a key",
            hint="run " + "; ".join(advice),
        )
    return out


# --------------------------------------------------------------------------------------------------------- publication


def publication_members(conn: Any, publication: str) -> list[str]:
    """The tables named in ``publication`` (pg_publication_tables lists a partitioned table's partitions instead)."""
    return sorted(
        f"{s}.{t}"
        for s, t in fetch(
            conn,
            "SELECT n.nspname, c.relname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
            "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE p.pubname = %s",
            (publication,),
        )
    )


# --------------------------------------------------------------------------------------------------------- types


class TypeNames:
    """``format_type(oid, typmod)`` text, cached; looked up on a normal SQL connection, once per (oid, typmod)."""

    def __init__(self, dsn: str, known: Mapping[tuple[int, int], str] | None = None) -> None:
        self.dsn = dsn
        self.cache: dict[tuple[int, int], str] = dict(known or {})
        self._conn: Any = None

    def add_tables(self, tables: Iterable[SourceTable]) -> None:
        for t in tables:
            for c in t.columns:
                self.cache[(c.type_oid, c.typmod)] = c.type_name

    def __call__(self, oid: int, typmod: int) -> str | None:
        name = self.cache.get((oid, typmod))
        if name is not None:
            return name
        import psycopg2

        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, doing="cannot look up a type name on the source")
            rows = fetch(self._conn, "SELECT format_type(%s, %s)", (oid, typmod))
        except psycopg2.Error as e:
            log.warning("cannot look up type %s(%s) on the source: %s", oid, typmod, str(e).strip())
            self.close()
            return None
        name = rows[0][0] if rows and rows[0][0] else None
        if name is not None and name != "???":
            self.cache[(oid, typmod)] = name
            return str(name)
        return None

    def attributes(self, relid: int) -> dict[str, tuple[int, str | None, bool]]:
        """The table's columns as its catalog holds them now: name -> (attnum, the value rows that existed before
        the column was added hold, or None; whether a default was written into existing rows by a table rewrite).
        Empty when the lookup fails (the schema then carries no attnums: a later rename cannot be told apart from a
        drop and an add, and stops that table's apply rather than guess)."""
        import psycopg2

        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, doing="cannot look up a table's columns on the source")
            rows = fetch(self._conn, _ATTRIBUTES_SQL, (relid, relid, relid))
        except psycopg2.Error as e:
            log.warning("cannot look up the columns of relation %s on the source: %s", relid, str(e).strip())
            self.close()
            return {}
        try:
            return {
                name: (int(num), first_array_element(missing) if missing is not None else None, bool(rewritten))
                for name, num, missing, rewritten in rows
            }
        except ValueError as e:
            raise SourceError(
                f"cannot read the value existing rows of relation {relid} get for an added column: {e}",
                hint="report this with the column's type; meanwhile reload the table after the change "
                "(mirrorline snapshot --target NAME --table SCHEMA.NAME)",
            ) from e

    def moved(self, names: Mapping[int, str]) -> dict[int, str | None]:
        """Which of these relations (relid -> the name configured) no longer exist at the source under that name:
        relid -> the name it has now (a schema or the table renamed), or None (dropped). Empty when the lookup fails
        (asked again later)."""
        import psycopg2

        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.dsn, doing="cannot look up tables on the source")
            rows = fetch(
                self._conn,
                "SELECT o, n.nspname, c.relname FROM unnest(%s::oid[]) o LEFT JOIN pg_class c ON c.oid = o "
                "LEFT JOIN pg_namespace n ON n.oid = c.relnamespace",
                (list(names),),
            )
        except psycopg2.Error as e:
            log.warning("cannot look up the configured tables on the source: %s", str(e).strip())
            self.close()
            return {}
        out: dict[int, str | None] = {}
        for oid, nsp, rel in rows:
            now = f"{nsp}.{rel}" if rel is not None else None
            if now != names[int(oid)]:
                out[int(oid)] = now
        return out

    def _sql(self, doing: str) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.dsn, doing=doing)
        return self._conn

    def leaves(self, roots: Iterable[int]) -> tuple[int, int, dict[int, dict[int, Leaf]]] | None:
        """Each of these relations that is a partitioned table, with its leaf partitions (every level), and the
        source's WAL positions before and after the look (every change it saw was committed before the second).
        None when the lookup fails (asked again later)."""
        import psycopg2

        try:
            conn = self._sql("cannot look up partitions on the source")
            ((before,),) = fetch(conn, "SELECT pg_current_wal_lsn()::text")
            rows = fetch(conn, _LEAVES_SQL, (list(roots),))
            ((lsn,),) = fetch(conn, "SELECT pg_current_wal_lsn()::text")
        except psycopg2.Error as e:
            log.warning("cannot look up the partitions of the configured tables on the source: %s", str(e).strip())
            self.close()
            return None
        out: dict[int, dict[int, Leaf]] = {}
        for root, relid, nsp, rel, filenode, size, columns in rows:
            leaves = out.setdefault(int(root), {})
            if relid is not None and rel is not None:
                leaves[int(relid)] = Leaf(int(relid), f"{nsp}.{rel}", int(filenode), int(size or 0), columns or "")
        return parse_lsn(before), parse_lsn(lsn), out

    def rows_before(self, leaf: Leaf) -> bool | None:
        """Does the table ``leaf`` hold a row written before its catalog row was last written (by ``ATTACH``,
        ``CREATE`` or ``TRUNCATE``)? None when it cannot be read, or is gone."""
        return self._ask_table(
            leaf.relid,
            "SELECT EXISTS (SELECT 1 FROM ONLY {} WHERE age(xmin) > (SELECT age(xmin) FROM pg_class WHERE oid = %s))",
        )

    def holds_rows(self, relid: int) -> bool | None:
        """Does relation ``relid`` hold a row? None when it is gone, or cannot be read."""
        return self._ask_table(relid, "SELECT EXISTS (SELECT 1 FROM ONLY {})")

    def _ask_table(self, relid: int, sql: str) -> bool | None:
        import psycopg2

        try:
            conn = self._sql("cannot read a table on the source")
            found = fetch(
                conn,
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = %s",
                (relid,),
            )
            if not found:
                return None
            nsp, rel = found[0]
            args = (relid,) if "%s" in sql else ()
            ((answer,),) = fetch(conn, sql.format(f"{quote_ident(nsp)}.{quote_ident(rel)}"), args)
        except psycopg2.Error as e:
            log.warning("cannot read relation %s on the source: %s", relid, str(e).strip().splitlines()[0])
            self.close()
            return None
        return bool(answer)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


# each configured relation that is a partitioned table, with its leaves (a partitioned table without partitions: one
# row of NULLs): capture/partitions.py
_LEAVES_SQL = """
SELECT r.root, c.oid, n.nspname, c.relname, c.relfilenode, pg_relation_size(c.oid),
  (SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
   FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
FROM unnest(%s::oid[]) AS r(root)
JOIN pg_class p ON p.oid = r.root AND p.relkind = 'p'
LEFT JOIN LATERAL (SELECT relid FROM pg_partition_tree(r.root::regclass) WHERE isleaf) t ON true
LEFT JOIN pg_class c ON c.oid = t.relid
LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
"""

# a partitioned table holds no rows: the value its existing rows got for an added column is its leaves' (the
# relation itself, and its leaf partitions when it is partitioned; pg_partition_tree of a plain table is empty)
_ATTRIBUTES_SQL = """
WITH rels AS (SELECT %s::oid AS relid UNION SELECT relid FROM pg_partition_tree(%s::oid::regclass) WHERE isleaf)
SELECT a.attname, a.attnum,
  (SELECT l.attmissingval::text FROM rels JOIN pg_attribute l ON l.attrelid = rels.relid AND l.attname = a.attname
   WHERE l.atthasmissing LIMIT 1),
  d.adbin IS NOT NULL AND NOT EXISTS (SELECT 1 FROM rels JOIN pg_attribute l ON l.attrelid = rels.relid
                                      AND l.attname = a.attname WHERE l.atthasmissing)
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


def first_array_element(text: str) -> str | None:
    """The one element of a PostgreSQL array literal (``attmissingval``'s text: ``{5}``, ``{"a b"}``, ``{NULL}``,
    ``{{1,2}}`` for an array column) as the element's own text; None for NULL."""
    inner = text.strip()
    if not (inner.startswith("{") and inner.endswith("}")):
        raise ValueError(f"not an array literal: {text!r}")
    inner = inner[1:-1]
    if inner.startswith('"'):
        out, i = [], 1
        while i < len(inner) and inner[i] != '"':
            if inner[i] == "\\":
                i += 1
            out.append(inner[i])
            i += 1
        return "".join(out)
    return None if inner.upper() == "NULL" else inner


def whereabouts(conn: Any, relid: int) -> str:
    """What became of a configured table that no longer exists under its name: renamed (its oid has another name
    now), or dropped."""
    rows = (
        fetch(
            conn,
            "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = %s",
            (relid,),
        )
        if relid
        else []
    )
    if rows:
        return f"renamed to {rows[0][0]} at the source"
    return "dropped at the source" if relid else "no longer exists at the source (dropped or renamed)"
