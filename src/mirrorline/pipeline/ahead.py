"""A streamed transaction applied ahead of its commit (``run``): a big transaction's rows reach ``run`` while the
source's statement runs (pgoutput streams it in blocks), so the targets apply them meanwhile, each in one target
transaction kept open (:class:`~mirrorline.apply.target.Ahead`), and at the commit only the rest is left to apply
before that transaction commits with the transaction's end as the target's position.

Capture tells this watcher (in its own thread, :class:`~mirrorline.log.stream.StreamWatcher`) of each cut of the
stream (the rows since the last cut, whole in closed part files) and of the transaction's commit or abort. A thread of
its own compiles each cut once (:meth:`~mirrorline.compile.compiler.Compiler.compile_part`) and applies it to every
target that takes part. The first cut starts the transaction ahead at the targets that are live and have applied
the whole log (its end then is the transaction's start): a target behind, held or loading applies the transaction
after its commit, as any other unit.

The applier's loop asks :meth:`AheadApplier.settle` before each step: while the log's end is the transaction's start,
nothing else is to be applied to its targets; once something is committed after the start, either it is the
transaction (its segment comes first: the rest is applied and each target commits it) or another transaction
committed first (every target's transaction is rolled back, and the units apply both after their commits). Anything
that stands in the way (a whole or subtransaction abort of rows applied, a schema change, a part no route takes, a
target's error, a stop) rolls back what was applied ahead; nothing of it is ever committed before the source's
commit, so a kill at any moment leaves each target at the position it had, and a restart applies the transaction
from the log.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from mirrorline import limits
from mirrorline.apply.target import NotAhead
from mirrorline.compile.small import unit_rows
from mirrorline.errors import first_line
from mirrorline.log.segments import merge_parts
from mirrorline.log.stream import StreamCut, iter_cut
from mirrorline.pipeline.roster import Phase
from mirrorline.pipeline.units import UnitReport
from mirrorline.position import ZERO, Position

# a target's lane may hold parts compiled and waiting (each holds its net rows until every lane applied it) while
# they weigh at most this many bytes of the log's rows, or one part: a faster target is not held to the pace of the
# slowest (bench/bigtxn --tables wide --shapes update: SQLite rewrites each 2 kB row), and what waits stays bounded.
# Runs of 2026-12-07, one each: at 96 MB DuckDB and PostgreSQL had the wide update 7.3 and 7.9 s after the commit,
# at 32 MB 11.9 and 11.8 s (SQLite 14.0 and 14.4 s, beside a subscriber of 13.3-13.7 s); the wide insert's peak PSS
# of run's tree 1,345-1,353 MB at 32 MB against 1,430-1,464 at 96 (two and three runs), the ratio 0.87-0.91 against
# 0.90-1.00
LANE_BYTES = 96 << 20
# the cuts waiting for this thread carry their rows in memory while they weigh at most this many bytes (a cut past
# it is read back from its part files when its turn comes)
HELD_BYTES = 64 << 20

if TYPE_CHECKING:
    from mirrorline.apply.target import Ahead, ApplyResult, Target
    from mirrorline.compile.batch import NetBatch
    from mirrorline.compile.compiler import Compiler
    from mirrorline.config import Config
    from mirrorline.log.layout import SegmentInfo
    from mirrorline.log.reader import ChangeLog
    from mirrorline.model import TableSchema

log = logging.getLogger(__name__)


class Applier(Protocol):
    """What this needs of the pipeline's :class:`~mirrorline.pipeline.applier.Applier`."""

    log: ChangeLog
    config: Config
    compiler: Compiler

    @property
    def targets(self) -> dict[str, Target]: ...

    @property
    def lock_wait(self) -> float: ...

    def phases(self) -> dict[str, Phase]: ...

    def registered(self, name: str) -> None: ...


def _subxid(part: str) -> int:
    """The subtransaction of a part file (``part-<n>-<subxid>.parquet``)."""
    return int(part.rsplit("-", 1)[1].split(".", 1)[0])


@dataclass
class _Txn:
    """One streamed transaction being applied ahead."""

    xid: int
    start: Position  # the log's end when it started: every target of it had applied the log up to there
    targets: dict[str, Ahead]
    last_seq: int = -1  # the last row of the cuts applied
    subxids: set[int] = field(default_factory=set)  # (sub)transactions with rows applied
    applied_parts: set[str] = field(default_factory=set)  # part files whose every row is applied (whole cuts)
    compile_seconds: float = 0.0
    apply_seconds: dict[str, float] = field(default_factory=dict)
    results: dict[str, ApplyResult] = field(default_factory=dict)
    cancel: str | None = None  # the applier's loop asked for it to be abandoned, for this reason
    done: threading.Event = field(default_factory=threading.Event)
    report: UnitReport | None = None
    # each target's lane: its parts applied in order, in a thread of its own, not waiting for the other targets
    lanes: dict[str, ThreadPoolExecutor] = field(default_factory=dict)
    queued: dict[str, list[tuple[Future[None], int]]] = field(default_factory=dict)  # each part and its weight
    given_up: bool = False  # abandoned: a lane's part still queued does nothing

    def lane(self, n: str, job: Callable[[], None], weight: int = 0) -> None:
        if n not in self.lanes:
            self.lanes[n] = ThreadPoolExecutor(1, thread_name_prefix=f"mirrorline-ahead-{n}")
        q = self.queued.setdefault(n, [])
        q[:] = [(f, w) for f, w in q if not f.done()]
        q.append((self.lanes[n].submit(job), weight))

    def wait(self, most: int) -> None:
        """Until each lane has one part at most queued or running, or parts weighing at most ``most`` bytes."""
        for q in self.queued.values():
            while len(q) > 1 and sum(w for _, w in q) > most:
                q.pop(0)[0].result()

    def close(self) -> None:
        """Every lane's parts done (what one raised is the caller's to have seen), its thread ended."""
        for q in self.queued.values():
            for f, _ in q:
                f.exception()
            q.clear()
        for pool in self.lanes.values():
            pool.shutdown()
        self.lanes.clear()


class AheadApplier:
    """Applies streamed transactions ahead of their commit for one :class:`Applier` (see the module's docstring).
    Attach it to capture's log writer (``stream_watcher``); :meth:`start` once the applier exists."""

    def __init__(self, cut_rows: int | None = None) -> None:
        self.cut_rows = limits.AHEAD_ROWS if cut_rows is None else cut_rows
        self.cut_bytes = limits.AHEAD_BYTES
        self._events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._applier: Applier | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._tx: _Txn | None = None  # the transaction being applied ahead (its targets may be none)
        self._skip: set[int] = set()  # transactions not applied ahead (their later cuts are passed over)
        self._guard = threading.Lock()
        self._settled: UnitReport | None = None  # committed ahead while :meth:`leave` waited: for the next settle
        self._held = 0  # bytes of rows the cuts waiting carry
        self._held_lock = threading.Lock()
        self.parts = 0  # parts applied ahead, transactions committed ahead, and given up (for tests and logs)
        self.finished = 0
        self.abandoned = 0

    # -- capture's thread ------------------------------------------------------------------------------------------
    def cut(self, cut: StreamCut) -> None:
        if self._applier is None:
            return
        held = 0
        if cut.rows is not None:
            held = cut.rows.nbytes
            with self._held_lock:
                if self._held + held > HELD_BYTES:
                    cut, held = dataclasses.replace(cut, rows=None), 0
                else:
                    self._held += held
        self._events.put(("cut", cut, held))

    def committed(self, xid: int, info: SegmentInfo) -> None:
        if self._applier is not None:
            self._events.put(("commit", xid, info))

    def aborted(self, xid: int, subxid: int) -> None:
        if self._applier is not None:
            self._events.put(("abort", xid, subxid))

    # -- life ------------------------------------------------------------------------------------------------------
    def start(self, applier: Applier) -> None:
        self._applier = applier
        self._thread = threading.Thread(target=self._main, name="mirrorline-ahead", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop: a transaction being applied ahead is rolled back at every target."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        tx = self._tx
        if tx is not None:
            self._abandon(tx, "run stops")
        self._applier = None

    # -- the applier's loop ----------------------------------------------------------------------------------------
    def settle(self, durable: Position) -> UnitReport | None:
        """Before a step, the log's end being ``durable``: a transaction applied ahead whose start the log has
        passed is committed at its targets if it is what follows the start (returns its report), else rolled
        back."""
        report, self._settled = self._settled, None
        if report is not None:
            return report
        tx = self._tx
        if tx is None or durable <= tx.start:
            return None
        assert self._applier is not None
        following = self._applier.log.select(tx.start, durable)
        if not (
            following and following[0].stream and following[0].xid == tx.xid and (following[0].prev or ZERO) == tx.start
        ):
            tx.cancel = "another transaction committed before it"
        # (capture tells the commit after publishing it: the thread finishes the transaction, or gives it up)
        return self._wait(tx)

    def leave(self, why: str) -> None:
        """The applier's targets or tables change (``why``: a reload of the configuration, a target paused to load
        tables or removed): a transaction being applied ahead is rolled back at every target (applied after its
        commit), unless it committed meanwhile (then the next :meth:`settle` returns its report)."""
        tx = self._tx
        if tx is None:
            return
        tx.cancel = why
        self._settled = self._wait(tx)

    def _wait(self, tx: _Txn) -> UnitReport | None:
        while not tx.done.wait(0.2):
            if self._stop.is_set() or self._thread is None or not self._thread.is_alive():
                self._abandon(tx, "run stops")
        return tx.report

    # -- the thread ------------------------------------------------------------------------------------------------
    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                event = self._events.get(timeout=0.2)
            except queue.Empty:
                tx = self._tx
                if tx is not None and tx.cancel:
                    self._abandon(tx, tx.cancel)
                continue
            try:
                self._event(event)
            except Exception as e:  # (a bug: nothing is committed ahead, so the units apply it after its commit)
                log.exception("applying ahead of the commit failed: %s", e)
                tx = self._tx
                if tx is not None:
                    self._abandon(tx, first_line(e))
            finally:
                if event[0] == "cut" and event[2]:
                    with self._held_lock:
                        self._held -= event[2]

    def _event(self, event: tuple[Any, ...]) -> None:
        what, xid = event[0], event[1].xid if event[0] == "cut" else event[1]
        tx = self._tx
        if tx is not None and tx.cancel:
            self._abandon(tx, tx.cancel)
            tx = None
        if what == "cut":
            if xid in self._skip:
                return
            if tx is None:
                if event[1].first_seq != 0:  # its first rows came before this applier was there: after its commit
                    self._skip.add(xid)
                    return
                tx = self._begin(xid)
                if tx is None:
                    return
            elif tx.xid != xid:
                self._skip.add(xid)  # one transaction at a time
                return
            self._part(tx, event[1])
        elif what == "commit":
            self._skip.discard(xid)
            if tx is not None and tx.xid == xid:
                self._finish(tx, event[2])
        elif what == "abort":
            subxid = event[2]
            if subxid == xid:
                self._skip.discard(xid)
            if tx is not None and tx.xid == xid and (subxid == xid or subxid in tx.subxids):
                self._abandon(tx, "the transaction aborted" if subxid == xid else "a subtransaction aborted")

    def _begin(self, xid: int) -> _Txn | None:
        """The transaction ahead at every live target that has applied the whole log; None where none has."""
        applier = self._applier
        assert applier is not None
        start = applier.log.durable() or ZERO
        phases = applier.phases()
        targets: dict[str, Ahead] = {}
        why: list[str] = []
        for n, t in list(applier.targets.items()):
            if phases.get(n) is not Phase.LIVE:
                why.append(f"target {n} is {phases.get(n, Phase.REMOVED).value}")
                continue
            try:
                ahead = t.ahead(start, applier.lock_wait)
            except Exception as e:  # NotAhead; else the unit's path meets it again and stops the target
                why.append(first_line(e))
                continue
            if ahead is None:
                why.append(f"target {n} is a {t.kind} target")
            else:
                targets[n] = ahead
        if why:
            log.info("transaction %d is being streamed; applied after its commit where %s", xid, "; ".join(why))
        if not targets:
            self._skip.add(xid)
            return None
        tx = self._tx = _Txn(xid, start, targets)
        log.info(
            "transaction %d is being streamed: applying it ahead of its commit at %s", xid, ", ".join(sorted(targets))
        )
        return tx

    def _schemas(self, rows: pa.Table) -> dict[str, TableSchema]:
        """The schema each table's rows carry; NotAhead where one table's rows carry two."""
        assert self._applier is not None
        out = {}
        pairs = pa.table({"table": rows["table"], "v": rows["schema_version"]})
        versions = pairs.group_by(["table", "v"]).aggregate([])
        for table, v in zip(versions["table"].to_pylist(), versions["v"].to_pylist(), strict=True):
            if table in out:
                raise NotAhead(f"the schema of {table} changed inside the transaction")
            out[table] = self._applier.log.schemas.get(table, v)
        return out

    def _compile(self, tx: _Txn, rows: pa.Table, end: Position) -> tuple[NetBatch, dict[str, TableSchema]]:
        assert self._applier is not None
        t0 = time.monotonic()
        rows = unit_rows(list(self._applier.config.tables), [rows])  # (copied only where other tables' rows are)
        schemas = self._schemas(rows)
        batch = self._applier.compiler.compile_part(rows, tx.start, end)
        if batch is None:
            raise NotAhead("a part that only the general route compiles (a TRUNCATE, a key change of unsent columns)")
        tx.compile_seconds += time.monotonic() - t0
        return batch, schemas

    def _apply(self, tx: _Txn, batch: NetBatch, schemas: dict[str, TableSchema], weight: int) -> None:
        """One part (of ``weight`` bytes of the log's rows) queued in every target's lane (each applies its parts in
        order, side by side with the others); a target that fails leaves the transaction (rolled back). The next
        part is compiled once every lane has room for it (``LANE_BYTES``)."""
        names = list(tx.targets)
        left = [len(names)]
        guard = threading.Lock()

        def one(n: str) -> None:
            try:
                ahead = tx.targets.get(n)
                if ahead is None or tx.given_up:
                    return
                t0 = time.monotonic()
                try:
                    ahead.part(batch, schemas)
                except NotAhead as e:
                    log.info("%s: transaction %d is applied after its commit", e, tx.xid)
                    tx.targets.pop(n, None)
                tx.apply_seconds[n] = tx.apply_seconds.get(n, 0.0) + time.monotonic() - t0
            finally:
                with guard:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    batch.release()

        for n in names:
            tx.lane(n, functools.partial(one, n), weight)
        tx.wait(LANE_BYTES)

    def _compile_apply(self, tx: _Txn, rows: pa.Table, end: Position) -> bool:
        """``rows`` compiled and queued at every target; False where no route takes them (``tx`` abandoned)."""
        try:
            batch, schemas = self._compile(tx, rows, end)
        except NotAhead as e:
            self._abandon(tx, str(e))
            return False
        self._apply(tx, batch, schemas, rows.nbytes)
        return True

    def _part(self, tx: _Txn, cut: StreamCut) -> None:
        """A cut applied, a slice of about ``limits.SLICE_BYTES`` at a time (each a part of its own)."""
        if cut.first_seq != tx.last_seq + 1:  # a cut not read (moved by the commit): the rest is read at the commit
            return
        tx.subxids.update(_subxid(p) for p in cut.parts)  # (before any of their rows is applied)
        try:
            for rows in iter_cut(cut):
                if not self._compile_apply(tx, rows, tx.start):
                    return
                tx.last_seq = rows["seq"][-1].as_py()
                if not tx.targets:
                    break
        except FileNotFoundError:
            return  # committed or aborted meanwhile: the rows after the last slice are read from the log at the commit
        tx.last_seq = cut.last_seq  # (seqs of a subtransaction aborted meanwhile are in the cut's range)
        tx.applied_parts.update(cut.parts)
        self.parts += 1
        if not tx.targets:
            self._abandon(tx, "no target took its part")

    def _finish(self, tx: _Txn, info: SegmentInfo) -> None:
        """The transaction committed: its rows after the last cut applied, then each target's transaction
        committed with the transaction's end."""
        if tx.cancel or (info.prev or ZERO) != tx.start:
            self._abandon(tx, tx.cancel or "another transaction committed before it")
            return
        assert self._applier is not None
        # the rows after the last cut applied: those of the parts no whole cut held (a cut not read before the commit
        # moved it, or read in part, is read again past its last row applied), a slice of about limits.SLICE_BYTES
        # at a time, each a part of its own; the parts applied are not read again
        rest = [info.path / p for p in info.parts if p not in tx.applied_parts]
        for rows in merge_parts(rest, info.first.lsn, info.min_ts, limits.AHEAD_ROWS, limits.SLICE_BYTES):
            if tx.last_seq >= 0:
                rows = rows.filter(pc.greater(rows["seq"], tx.last_seq))
            if rows.num_rows and not self._compile_apply(tx, rows, info.last):
                return
        done: list[str] = []

        def commit(n: str) -> None:
            ahead = tx.targets.get(n)
            if ahead is None or tx.given_up:
                return
            t0 = time.monotonic()
            try:
                tx.results[n] = ahead.finish(info.last)
            except NotAhead as e:
                log.info("%s: transaction %d is applied after its commit", e, tx.xid)
                tx.targets.pop(n, None)
                return
            tx.apply_seconds[n] = tx.apply_seconds.get(n, 0.0) + time.monotonic() - t0
            done.append(n)
            assert self._applier is not None
            self._applier.registered(n)

        for n in list(tx.targets):  # each target commits once its own parts are in
            tx.lane(n, functools.partial(commit, n))
        tx.close()
        tx.targets.clear()
        if done:
            tx.report = UnitReport(
                tx.start,
                info.last,
                info.count,
                done,
                True,
                tx.compile_seconds,
                {n: tx.apply_seconds[n] for n in done},
                {n: tx.results[n] for n in done},
            )
            self.finished += 1
            log.info(
                "transaction %d (%d changes) applied ahead of its commit, committed at %s",
                tx.xid,
                info.count,
                ", ".join(done),
            )
        self._tx = None
        tx.done.set()

    def _abandon(self, tx: _Txn, why: str) -> None:
        with self._guard:
            if tx.done.is_set():
                return
            tx.given_up = True
            tx.close()  # (the parts queued do nothing now; one being applied ends first)
            for ahead in tx.targets.values():
                ahead.abandon()
            if tx.targets:
                log.info("transaction %d: what was applied of it ahead of its commit is rolled back (%s)", tx.xid, why)
            tx.targets.clear()
            self._skip.add(tx.xid)
            self.abandoned += 1
            if self._tx is tx:
                self._tx = None
            tx.done.set()
