"""The replication session: source checks, publication and slot, then pgoutput streamed into the change log.

Watermarks (DESIGN §2), kept apart and named:

- *received*: the end LSN of the last transaction received whole (or the server's WAL end when nothing is open);
  it is in capture's memory only.
- *durable*: in the log, fsynced (``LogWriter.durable``). Only the end LSN of a durable transaction is reported to
  PostgreSQL as flushed (``confirmed_flush_lsn`` of the slot), so a restart resends exactly what the log lacks;
  transactions resent with a commit LSN at or below the log's last one are skipped.

A dropped connection is retried (with back-off) from the slot, after making what was received whole durable and
discarding open stream spills (PostgreSQL streams those transactions again from their start).

The session's loop and everything that must run between two of its messages (keepalives, reconnects, the looks at
the catalog) share the session's watermarks; what the looks at partitioned tables' leaves find is kept by
:mod:`mirrorline.capture.partition_watch` until the session marks the table.
"""

from __future__ import annotations

import logging
import select
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mirrorline import limits, stopped
from mirrorline.capture import identity
from mirrorline.capture.batching import BatchAssembler
from mirrorline.capture.events import (
    Committed,
    Event,
    SkippedTxn,
    SpillAbort,
    SpillBlockEnd,
    SpillChanges,
    SpillCommit,
    TableInfo,
)
from mirrorline.capture.partition_watch import PartitionWatch
from mirrorline.capture.prerequisites import check_ready, check_server
from mirrorline.capture.provision import PublicationReport, check_failover, ensure_slot, reconcile_publication
from mirrorline.capture.selection import changed_parts, publication_specs, read_parts, write_parts
from mirrorline.capture.source import (
    TypeNames,
    connect,
    current_wal_lsn,
    describe_tables,
    is_transient,
    source_error,
    whereabouts,
)
from mirrorline.config import Config
from mirrorline.errors import ConfigError, LogError, SourceError, TransientSourceError
from mirrorline.log.interchange import imported_mark
from mirrorline.log.layout import Layout
from mirrorline.log.reader import ChangeLog
from mirrorline.log.retention import readers
from mirrorline.log.schemas import SchemaStore
from mirrorline.log.stream import StreamSpill, StreamWatcher
from mirrorline.log.writer import LogWriter
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import Position, format_lsn

log = logging.getLogger("mirrorline.capture")


def _fetch_one(conn: Any, sql: str, *args: Any) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchone()


TAKE_ROWS = 20_000  # hand committed rows to the writer in batches of about this many
IDLE_WAIT = 0.1  # seconds to wait for the server when it has nothing for us
DROP_CHECK_SECONDS = 5.0  # how often capture looks for configured tables dropped at the source


@dataclass
class CaptureStats:
    """What a capture run did; the watermarks as LSNs (0: none yet)."""

    publication: PublicationReport | None = None
    slot_created: bool = False
    target_lsn: int = 0  # --once: pg_current_wal_lsn() at start
    received_lsn: int = 0
    durable_lsn: int = 0  # end LSN of the last durable transaction (what was reported as flushed)
    durable: Position | None = None
    transactions: int = 0
    streamed: int = 0
    skipped: int = 0
    aborted: int = 0  # streamed transactions aborted (whole)
    aborted_subxacts: int = 0  # subtransactions of streamed transactions aborted
    changes: int = 0
    messages: int = 0
    reconnects: int = 0
    slot_lost: list[str] = field(default_factory=list)  # targets marked needs reload because the slot was lost
    schema_versions: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # configured tables found dropped or renamed at the source


class Capture:
    """``mirrorline capture``: run until stopped (or, with ``once``, until everything the source had committed at
    start is durable in the log)."""

    def __init__(
        self,
        config: Config,
        *,
        once: bool = False,
        max_retry_seconds: float = 300.0,
        on_ready: Callable[[CaptureStats], None] | None = None,
    ) -> None:
        if config.source is None:
            raise ConfigError(
                str(config.file),
                "source",
                "is required for capture",
                hint="add a [source] section with the dsn of the database to capture",
            )
        self.config = config
        self.source = config.source
        self.once = once
        self.max_retry_seconds = max_retry_seconds
        self.on_ready = on_ready
        self.stats = CaptureStats()
        self._stop = False
        self._writer: LogWriter | None = None
        self.stream_watcher: StreamWatcher | None = None  # told of streamed transactions' cuts (log/stream.py)
        self._types: TypeNames | None = None
        self._spills: dict[int, StreamSpill] = {}
        self._ends: deque[tuple[int, int, int]] = deque()  # (commit_lsn, end_lsn, rows) not reported flushed yet
        self._wal_end = 0  # highest WAL end the server told us it has sent up to
        self._started = False  # replication was started once in this run
        self._streaming = False  # the current connection got as far as streaming
        self._oids: dict[int, str] = {}  # configured tables' relids (until found dropped)
        self._gone_infos: dict[str, TableInfo] = {}  # configured tables no longer at the source, as the log knew them
        self._next_drop_check = 0.0
        self._partitions = PartitionWatch(config)

    def stop(self) -> None:
        """Ask the run to end at the next message or idle tick (signal-handler safe)."""
        self._stop = True

    # ------------------------------------------------------------------------------------------------- start

    def prepare(self) -> dict[str, Any]:
        """Check the source and the configured tables, reconcile the publication, create the slot if missing."""
        self._check_not_imported()
        dsn = self.source.dsn
        conn = connect(dsn)
        try:
            try:
                check_server(conn)
                check_failover(conn, self.source.failover)
                replicated = self._replicated()
                tables = describe_tables(conn, self.config, replicated)
                self._gone_infos = {}
                for name in tables:  # there under its name again: a relation other than the one replicated is
                    if stopped.clear_table(self.config.log.path, name):  # stopped at the targets (apply/reshape.py)
                        log.info("table %s exists at the source again: it is captured again", name)
                for name in sorted(set(self.config.tables) - set(tables)):
                    self._gone(name, whereabouts(conn, replicated[name].relid), current_wal_lsn(conn))
                    # its changes still in the WAL (before the rename or drop) are captured under its old name
                    s = replicated[name]
                    self._gone_infos[name] = TableInfo(
                        name,
                        self.config.tables[name].key,
                        () if s.bag else s.key,
                        frozenset(c.name for c in s.columns if not c.nullable),
                    )
                specs = publication_specs(self.config, tables)
                check_ready(conn, self.source.slot, self.source.publication, tables, specs)
                self.stats.publication = reconcile_publication(
                    conn, self.source.publication, tables, str(self.config.log.path), specs
                )
                log.debug("%s", self.stats.publication.summary())
                self._check_source(conn)
                self.stats.slot_created = ensure_slot(conn, self.source.slot, self.source.failover)
                if self.stats.slot_created:
                    log.info("replication slot %s created", self.source.slot)
                if self.once:
                    self.stats.target_lsn = current_wal_lsn(conn)
            except Exception as e:
                import psycopg2

                if isinstance(e, psycopg2.Error):
                    raise source_error(e, dsn, "source check failed") from None
                raise
        finally:
            conn.close()
        self._types = TypeNames(dsn)
        self._types.add_tables(tables.values())
        return tables

    def _check_not_imported(self) -> None:
        """A log holding changes imported from files is not one capture adds to (refused before the source is
        touched): their positions are not the source's."""

        root = self.config.log.path
        cl = ChangeLog(root)
        if cl.layout.exists() and imported_mark(cl) is not None:
            raise LogError(
                f"the change log at {root} holds changes imported from daystream files: capture cannot add the "
                "source's changes to it (their positions would not be after the imported ones)",
                hint="give capture a log of its own (another [log] path)",
                root=str(root),
            )

    def _check_source(self, conn: Any) -> None:
        """The log knows its source (:mod:`mirrorline.capture.identity`): another system, WAL gone back, or the slot
        lost while the log holds positions is found here, before the slot is created."""

        root = self.config.log.path
        now, current = identity.query(self.source.dsn, self.source.slot)
        exists = bool(_fetch_one(conn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", self.source.slot))
        cl = ChangeLog(root)
        durable = cl.durable() if cl.layout.exists() else None
        has_positions = durable is not None or (cl.layout.exists() and bool(readers(cl)))
        verdict = identity.judge(
            identity.read(root),
            now,
            slot_exists=exists,
            log_has_positions=has_positions,
            durable=durable,
            current_lsn=current,
        )
        if verdict.slot_lost:
            self.stats.slot_lost = identity.mark_lost(root, self.source.slot, durable)
        if verdict.record:
            identity.write(root, now)

    def run(self) -> CaptureStats:
        log.debug("capture: starting up")
        tables = self.prepare()
        lcfg = self.config.log
        self._writer = writer = LogWriter(lcfg.path, lcfg.segment_changes, lcfg.segment_seconds)
        writer.stream_watcher = self.stream_watcher
        try:
            assert self._types is not None
            asm = BatchAssembler(
                self._types,
                self._record_schema,
                {**self._gone_infos, **{n: t.info for n, t in tables.items()}},
                attributes=self._types.attributes,
            )
            asm.oids = self._oids = {t.oid: n for n, t in tables.items()}
            asm.on_renamed = lambda was, now, lsn: self._gone(was, f"renamed to {now} at the source", lsn)
            self._parts_changed(asm, tables)
            self._loop(asm, writer)
        finally:
            self._spills.clear()
            writer.close()
            if self._types is not None:
                self._types.close()
        self.stats.durable = writer.durable
        return self.stats

    def _replicated(self) -> dict[str, TableSchema]:
        """The tables the log holds changes of (it has their schemas), with their latest schema."""
        store = SchemaStore(Layout(self.config.log.path).schemas)
        store.refresh()
        return {t: s for t in store.tables() if (s := store.latest(t)) is not None}

    def _gone(self, table: str, reason: str, lsn: int) -> None:
        """A configured table no longer exists at the source under its name: recorded for ``status``; its changes
        end here, the other tables go on. Said once per table (a Relation message and the look at the catalog may
        both find it)."""
        if table in self.stats.gone:
            return
        log.warning("table %s %s (at %s): it is no longer replicated", table, reason, format_lsn(lsn))
        stopped.record_table(self.config.log.path, table, reason, format_lsn(lsn))
        self.stats.gone.append(table)

    def _check_catalog(self, asm: BatchAssembler) -> None:
        """Every few seconds: configured tables dropped at the source (pgoutput sends nothing for a DROP TABLE), or
        renamed where no Relation message says so (``ALTER SCHEMA ... RENAME`` leaves the name pgoutput sent last in
        force): either stops the table, and no change of its relation is captured any more."""
        now = time.monotonic()
        if now < self._next_drop_check or not self._oids or self._types is None:
            return
        self._next_drop_check = now + DROP_CHECK_SECONDS
        for oid, name_now in self._types.moved(self._oids).items():
            name = self._oids.pop(oid)
            asm.forget(oid)
            if name_now is None:
                self._gone(name, "dropped at the source", self._wal_end)
            else:
                self._gone(name, f"renamed to {name_now} at the source", self._wal_end)
        self._partitions.check(self._types, self._oids)

    # ------------------------------------------------------------------------------------------------- marks

    def _mark(self, asm: BatchAssembler) -> None:
        """Tables the partition looks found changed, marked between transactions (:meth:`_resync`)."""
        for relid, what in self._partitions.due(self._oids, self.stats.durable_lsn, asm.in_transaction):
            self._resync(asm, relid, what)

    def _parts_changed(self, asm: BatchAssembler, tables: Mapping[str, Any]) -> None:
        """A table whose replicated part (``columns`` / ``exclude`` / ``where``) is not the one its logged changes
        were captured with: its rows at the targets are another part than the one configured now, so it is marked
        to be loaded again (:meth:`_resync`). The parts are kept in the log (``parts.json``) for the next start."""

        assert self._writer is not None
        root = self.config.log.path
        now = {
            n: ([c.name for c in t.columns] if t.left_out else None, self.config.table(n).where)
            for n, t in tables.items()
        }
        for name, what in changed_parts(read_parts(root), now, set(self._writer.schemas.tables())).items():
            self._resync(asm, tables[name].oid, what)
        write_parts(root, now)

    def _resync(self, asm: BatchAssembler, relid: int, what: str) -> None:
        """Mark ``relid``'s table: a schema version like its latest with ``resync`` set, which its later changes
        carry, and which stops the table at every target that loaded it before (apply/reshape.py)."""
        assert self._writer is not None
        table = self._oids.get(relid)
        latest = self._writer.schemas.latest(table) if table is not None else None
        if table is None or latest is None:  # no change of it logged yet: nothing at the targets to mark
            log.warning("table %s: %s at the source", table or relid, what)
            return
        durable = self._writer.durable
        at = Position(max(self._wal_end, durable.lsn if durable is not None else 0))
        mark = f"{what} at {format_lsn(at.lsn)}"
        s = self._record_schema(replace(latest, resync=mark, since=at))
        asm.set_version(relid, s.version)
        log.warning(
            "table %s: %s at the source; its rows at the targets are not the source's: every target stops it "
            "until it is loaded again (a live run does so; else mirrorline snapshot --target NAME --table %s)",
            table,
            mark,
            table,
        )

    def _record_schema(self, schema: Any) -> Any:
        assert self._writer is not None
        s = self._writer.record_schema(schema)
        label = f"{s.table}@{s.version}"
        if label not in self.stats.schema_versions:
            self.stats.schema_versions.append(label)
        return s

    # ------------------------------------------------------------------------------------------------- streaming

    def _loop(self, asm: BatchAssembler, writer: LogWriter) -> None:
        down_since: float | None = None
        delay = 0.2
        while not self._stop:
            try:
                self._stream(asm, writer)
            except TransientSourceError as e:
                busy = str(e.context.get("sqlstate", "")) == "55006"  # slot still held by a dying walsender
                if not self._started and not busy:
                    raise
                self._after_connection(asm, writer)
                now = time.monotonic()
                if self._streaming:
                    down_since, delay = None, 0.2
                down_since = down_since or now
                if now - down_since > self.max_retry_seconds:
                    raise SourceError(
                        f"{e.message}; gave up after {self.max_retry_seconds:.0f} s of retries", hint=e.hint
                    ) from None
                if self._streaming:
                    self.stats.reconnects += 1
                if busy and not self._streaming:
                    log.warning(
                        "replication slot %s is still in use (%s); retrying in %.1f s",
                        self.source.slot,
                        e.message,
                        delay,
                    )
                else:
                    log.warning("replication connection lost (%s); reconnecting in %.1f s", e.message, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._after_connection(asm, writer)
            return

    def _after_connection(self, asm: BatchAssembler, writer: LogWriter) -> None:
        """The connection ended: what was received whole becomes durable; open spills are dropped (resent)."""
        self._handle(asm.reset(), asm, writer, None)
        self._take(asm, writer)
        writer.flush()
        for spill in self._spills.values():
            spill.abort()
        self._spills.clear()
        self._ends.clear()
        durable = writer.durable
        self.stats.durable = durable

    def _stream(self, asm: BatchAssembler, writer: LogWriter) -> None:
        import psycopg2

        dsn = self.source.dsn
        self._streaming = False
        conn = connect(dsn, replication=True, doing="cannot open the replication connection")
        try:
            cur = conn.cursor()
            try:
                # this walsender streams a large transaction once its decoded changes pass this much (never raised
                # above the server's setting): blocks come sooner, so run applies them ahead of the commit sooner
                cur.execute(
                    "SELECT set_config('logical_decoding_work_mem', CASE WHEN "
                    "pg_size_bytes(current_setting('logical_decoding_work_mem')) > %s THEN %s "
                    "ELSE current_setting('logical_decoding_work_mem') END, false)",
                    (limits.DECODING_MEMORY, f"{limits.DECODING_MEMORY >> 10}kB"),
                )
                cur.start_replication(
                    slot_name=self.source.slot,
                    decode=False,
                    status_interval=5,
                    options={
                        "proto_version": "2",
                        "publication_names": quote_ident(self.source.publication),  # a list of names
                        "streaming": "on",
                        "messages": "true",
                    },
                )
            except psycopg2.Error as e:
                raise source_error(e, dsn, f"cannot start replication from slot {self.source.slot}") from None
            asm.skip_through = writer.last_lsn
            self._streaming = True
            log.debug("capture: streaming from slot %s", self.source.slot)
            if not self._started:
                self._started = True
                if self.on_ready is not None:
                    self.on_ready(self.stats)
            self._consume(cur, asm, writer)
        except psycopg2.Error as e:
            if is_transient(e):
                raise source_error(e, dsn, "replication connection failed") from None
            raise source_error(e, dsn, "replication failed") from None
        finally:
            try:
                conn.close()
            except Exception:  # the connection may be dead already
                log.debug("closing the replication connection failed", exc_info=True)

    def _consume(self, cur: Any, asm: BatchAssembler, writer: LogWriter) -> None:
        stats = self.stats
        pull = asm.pull
        read = cur.read_message
        handle = self._handle
        once = self.once
        target = stats.target_lsn
        next_check = time.monotonic() + 0.2
        last_ask = 0.0
        n = 0
        while not self._stop:
            taken, events, dry = pull(read, 1024)  # (at most 1,024 messages between two looks at the clock)
            n += taken
            if events:
                handle(events, asm, writer, cur)
            if not dry:
                stats.messages = n
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + 0.2
                    self._periodic(cur, asm, writer)
                continue
            # nothing waiting from the server
            stats.messages = n
            wal_end = cur.wal_end
            if wal_end > self._wal_end:
                self._wal_end = wal_end
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.2
                self._periodic(cur, asm, writer)
            if once:
                if self._wal_end >= target and not asm.in_transaction:
                    self._check_catalog(asm)  # (at least one look in a run, however short)
                    self._mark(asm)
                    self._take(asm, writer)
                    writer.flush()
                    self._feedback(cur, asm, writer)
                    if self._once_done(asm, writer):
                        self._feedback(cur, asm, writer, force=True)
                        return
                if now - last_ask >= 0.2:  # ask for a keepalive: it tells how far the server has sent
                    cur.send_feedback(reply=True, force=True)
                    last_ask = now
            select.select([cur], [], [], IDLE_WAIT)
        self._take(asm, writer)
        writer.flush()
        self._feedback(cur, asm, writer, force=True)

    def _periodic(self, cur: Any, asm: BatchAssembler, writer: LogWriter) -> None:
        """Every ~0.2 s: committed rows to the writer, segments flushed by its time limit, feedback; every few
        seconds, a look for configured tables dropped at the source."""
        self._check_catalog(asm)
        self._mark(asm)
        if asm.buffered:
            self._take(asm, writer)
        writer.tick()
        self._feedback(cur, asm, writer)

    def _once_done(self, asm: BatchAssembler, writer: LogWriter) -> bool:
        """Everything the source had committed when we started is durable: the server has sent past that point and
        nothing received is waiting."""
        if asm.in_transaction or asm.buffered or writer.pending or self._ends:
            return False
        if self._partitions.waiting:  # (settled as the log passes them)
            return False
        return max(self._wal_end, self.stats.durable_lsn) >= self.stats.target_lsn

    # ------------------------------------------------------------------------------------------------- events

    def _handle(self, events: Sequence[Event], asm: BatchAssembler, writer: LogWriter, cur: Any) -> None:
        stats = self.stats
        for ev in events:
            cls = type(ev)
            if cls is Committed:
                assert isinstance(ev, Committed)
                stats.transactions += 1
                stats.received_lsn = ev.end_lsn
                self._ends.append((ev.commit_lsn, ev.end_lsn, ev.rows))
                if asm.buffered >= TAKE_ROWS:
                    self._take(asm, writer)
                    self._feedback(cur, asm, writer)
            elif cls is SpillChanges:
                assert isinstance(ev, SpillChanges)
                spill = self._spills.get(ev.xid)
                if spill is None:
                    spill = self._spills[ev.xid] = writer.open_stream(ev.xid)
                spill.add(ev.subxid, ev.rows)
            elif cls is SpillBlockEnd:
                assert isinstance(ev, SpillBlockEnd)
                spill = self._spills.get(ev.xid)
                if spill is not None:
                    spill.end_block()
            elif cls is SpillCommit:
                assert isinstance(ev, SpillCommit)
                self._take(asm, writer)  # the log holds whole transactions in commit order
                spill = self._spills.pop(ev.xid, None)
                stats.transactions += 1
                stats.streamed += 1
                stats.received_lsn = ev.end_lsn
                rows = 0
                if spill is not None:
                    rows = spill.changes
                    spill.commit(ev.commit_lsn, ev.commit_ts)
                stats.changes += rows
                self._ends.append((ev.commit_lsn, ev.end_lsn, rows))
                self._feedback(cur, asm, writer)
            elif cls is SpillAbort:
                assert isinstance(ev, SpillAbort)
                spill = self._spills.get(ev.xid)
                if ev.subxid == ev.xid:
                    stats.aborted += cur is not None
                    if spill is not None:
                        self._spills.pop(ev.xid)
                        spill.abort()
                else:
                    stats.aborted_subxacts += 1
                    if spill is not None:
                        spill.abort_subxact(ev.subxid)
            elif cls is SkippedTxn:
                assert isinstance(ev, SkippedTxn)
                stats.skipped += 1
                stats.received_lsn = ev.end_lsn
                self._ends.append((ev.commit_lsn, ev.end_lsn, 0))

    def _take(self, asm: BatchAssembler, writer: LogWriter) -> None:
        rows = asm.take()
        if rows is not None:
            writer.add_transactions(rows)
            self.stats.changes += rows.num_rows

    def _feedback(self, cur: Any, asm: BatchAssembler, writer: LogWriter, force: bool = False) -> None:
        """Report as flushed the end of the last transaction that is durable (and everything before it is)."""
        if cur is None:
            return
        durable = writer.durable
        durable_lsn = durable.lsn if durable is not None else 0
        ends = self._ends
        flushed = self.stats.durable_lsn
        settled = not asm.buffered and not writer.pending  # every transaction received whole is in the log
        while ends and (settled or ends[0][2] == 0 or ends[0][0] <= durable_lsn):
            flushed = max(flushed, ends.popleft()[1])
        if not ends and not asm.in_transaction and settled:
            # nothing received is waiting: the server's WAL end is a transaction boundary for us
            flushed = max(flushed, self._wal_end)
        if flushed > self.stats.durable_lsn or force:
            self.stats.durable_lsn = flushed
            log.debug("durable through %s (received %s)", format_lsn(flushed), format_lsn(self.stats.received_lsn))
            cur.send_feedback(
                write_lsn=max(flushed, self.stats.received_lsn), flush_lsn=flushed, apply_lsn=flushed, force=force
            )
