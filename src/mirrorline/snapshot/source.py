"""The source side of a snapshot: a consistent point (a replication slot created with an exported snapshot, on a
replication connection kept open while the snapshot is read), and the configured tables described under it.

- The main slot does not exist yet: it is created here (``CREATE_REPLICATION_SLOT ... LOGICAL pgoutput
  EXPORT_SNAPSHOT``), so the log starts exactly where the snapshot ends. The publication is reconciled first, since a
  slot only decodes publications that existed at its start.
- The main slot exists (replication runs, or ran): a TEMPORARY slot of our own gives a fresh consistent point; the main
  slot and every other target go on untouched (creating a slot waits for running transactions to end, it takes no
  lock anyone waits on). The temporary slot goes away with the connection.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mirrorline.apply.canonical import SESSION_SETTINGS
from mirrorline.capture.prerequisites import check_ready, check_server
from mirrorline.capture.provision import check_failover, reconcile_publication
from mirrorline.capture.selection import publication_specs
from mirrorline.capture.source import connect, describe_tables, source_error
from mirrorline.config import Config
from mirrorline.errors import ConfigError, SnapshotError, SourceError
from mirrorline.log.layout import Layout
from mirrorline.log.schemas import SchemaStore
from mirrorline.position import Position, format_lsn, parse_lsn
from mirrorline.snapshot.plan import TableStat, consistent_position, is_bag, table_key


@dataclass(frozen=True)
class ConsistentPoint:
    lsn: int  # the slot's consistent point P
    snapshot: str  # the exported snapshot's name, for SET TRANSACTION SNAPSHOT
    slot: str
    temporary: bool  # True: our own temporary slot; False: the main slot was created by this snapshot
    # the log's marks of tables whose rows changed without a change logged (TableSchema.resync), as read before the
    # point was taken: what a table loaded here has caught up with
    resync: Mapping[str, str] = field(default_factory=dict)

    @property
    def position(self) -> Position:
        """Every change at or before this position is in the snapshot; every later one comes from the log."""
        return consistent_position(self.lsn)

    def __str__(self) -> str:
        return format_lsn(self.lsn)


def require_source(config: Config) -> Any:
    if config.source is None:
        raise ConfigError(
            str(config.file),
            "source",
            "is required for a snapshot",
            hint="add a [source] section with the dsn of the database to copy",
        )
    return config.source


def _slot_exists(conn: Any, slot: str) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        return cur.fetchone() is not None


@contextlib.contextmanager
def consistent_point(config: Config, *, reconcile: bool = True, create_main: bool = True) -> Iterator[ConsistentPoint]:
    """Yield a consistent point whose exported snapshot stays importable until the block ends. ``create_main``:
    create the main slot when it is missing (else that is an error: nothing replicates yet)."""
    import psycopg2

    src = require_source(config)
    conn = connect(src.dsn, doing="cannot connect to the source")
    try:
        try:
            check_server(conn)
            check_failover(conn, src.failover)
            if reconcile and config.tables:
                described = describe_tables(conn, config)
                specs = publication_specs(config, described)
                check_ready(conn, src.slot, src.publication, described, specs, _slot_exists(conn, src.slot))
                reconcile_publication(conn, src.publication, described, str(config.log.path), specs)
            main_exists = _slot_exists(conn, src.slot)
        except psycopg2.Error as e:
            raise source_error(e, src.dsn, "source check failed") from None
    finally:
        conn.close()
    resync = _resync_marks(config)  # read before the point: a mark recorded after it may be of a later event
    if not main_exists and not create_main:
        raise SnapshotError(
            f"the source has no replication slot {src.slot}: nothing replicates from it yet",
            hint="load a target first (mirrorline snapshot), or start mirrorline run",
        )
    rconn = connect(src.dsn, replication=True, doing="cannot open a replication connection to the source")
    try:
        slot = src.slot if not main_exists else f"mirrorline_snap_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        kind = "TEMPORARY LOGICAL" if main_exists else "LOGICAL"
        # (the option list: PostgreSQL 15 and later; a failover slot: 17 and later, checked above)
        options = "(SNAPSHOT 'export', FAILOVER true)" if src.failover and not main_exists else "EXPORT_SNAPSHOT"
        try:
            with rconn.cursor() as cur:
                cur.execute(f'CREATE_REPLICATION_SLOT "{slot}" {kind} pgoutput {options}')
                _name, point, snapshot, _plugin = cur.fetchone()
        except psycopg2.Error as e:
            raise source_error(e, src.dsn, f"cannot create replication slot {slot} with an exported snapshot") from None
        yield ConsistentPoint(parse_lsn(point), snapshot, slot, main_exists, resync)
    finally:
        with contextlib.suppress(Exception):
            rconn.close()


def _resync_marks(config: Config) -> dict[str, str]:

    folder = Layout(config.log.path).schemas
    if not folder.is_dir():
        return {}
    store = SchemaStore(folder)
    store.refresh()
    return {t: s.resync for t in config.tables if (s := store.latest(t)) is not None and s.resync}


def snapshot_connection(
    dsn: str, snapshot: str | None, application_name: str = "mirrorline snapshot", utc: bool = False
) -> Any:
    """A connection in a REPEATABLE READ, READ ONLY transaction that sees exactly the exported ``snapshot`` (or its
    own, when None), with the canonical session settings (and ``TimeZone = UTC`` when ``utc``: verify's form; a
    snapshot keeps the server's zone, in which pgoutput sends its values too)."""
    import psycopg2

    try:
        conn = psycopg2.connect(dsn, connect_timeout=10, application_name=application_name)
    except psycopg2.Error as e:
        raise source_error(e, dsn, "cannot connect to the source") from None
    try:
        with conn.cursor() as cur:
            for s in (*SESSION_SETTINGS, *(["SET TimeZone = 'UTC'"] if utc else [])):
                cur.execute(s)
            conn.commit()
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if snapshot is not None:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
    except psycopg2.Error as e:
        conn.close()
        raise source_error(e, dsn, f"cannot read under snapshot {snapshot}") from None
    return conn


_STATS_SQL = """
SELECT c.relkind, (pg_relation_size(c.oid) / current_setting('block_size')::int)::bigint,
       greatest(c.reltuples, 0)::bigint
FROM pg_class c WHERE c.oid = %s
"""


def sized_tables(conn: Any, config: Config, keyless_ok: bool = False) -> dict[str, TableStat]:
    """The configured tables as capture describes them (:func:`~mirrorline.capture.source.describe_tables`, every
    one, or an error naming it) with what a snapshot adds: each one's size and place in the load order.
    ``keyless_ok``: see :func:`~mirrorline.capture.source.describe_tables`."""
    import psycopg2

    order = {t.name: (i, t.sequence) for i, t in enumerate(config.tables_in_load_order())}
    try:
        found = describe_tables(conn, config, keyless_ok=keyless_ok)
        out: dict[str, TableStat] = {}
        for name, st in found.items():
            with conn.cursor() as cur:
                cur.execute(_STATS_SQL, (st.oid,))
                relkind, blocks, rows = cur.fetchone()
            tcfg = config.table(name)
            key = table_key(st.columns, st.replica_identity, st.primary_key, st.identity, tcfg.key)
            bag = is_bag(st.columns, st.replica_identity, st.primary_key, st.identity, tcfg.key)
            from mirrorline.model import TableSchema

            schema = TableSchema(name, st.columns, key, bag=bag, relid=st.oid)
            idx, seq = order[name]
            out[name] = TableStat(schema, relkind, int(blocks), int(rows), seq, idx, tcfg.where)
    except psycopg2.Error as e:
        raise SourceError(f"cannot describe the configured tables: {str(e).strip().splitlines()[0]}") from None
    return dict(sorted(out.items(), key=lambda kv: kv[1].index))


def current_wal_lsn(dsn: str) -> int:
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_lsn()::text")
            return parse_lsn(cur.fetchone()[0])
    finally:
        conn.close()
