"""DuckDB target: one file; every session (apply thread) is a cursor of the target's one open database. Worktables
are TEMP tables created straight from the Arrow rows (DuckDB scans a registered Arrow table without copying it through
Python).

DuckDB lets one process at a time open a database file to write it, and a process that has it open for reading keeps
writers out. So the target holds the file only while it is used: from the first session to the last one's end, and
for a whole :meth:`apply`, attached to the process's in-memory database of that file (:mod:`.home`). Between units any
DuckDB client can open it (``duckdb.connect(path, read_only=True)``),
``status`` and ``verify`` too; while one holds it, applying waits for it (:attr:`open_wait`, then the target waits its
turn). The applied positions read between units come from memory while the file is as this target left it (its
size and time unchanged), so an idle ``run`` does not open the file at all.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import duckdb

from mirrorline.apply import lock
from mirrorline.apply.duckdb.dialect import CATALOG, DUCKDB
from mirrorline.apply.duckdb.home import Home
from mirrorline.apply.duckdb.session import DuckdbSession
from mirrorline.apply.engine import SqlTarget
from mirrorline.apply.lock import TargetBusy
from mirrorline.apply.session import Session
from mirrorline.apply.state import AppliedState
from mirrorline.apply.target import ApplyResult
from mirrorline.errors import TargetError

# DuckDB appends a big insert as whole row groups written as they fill, after the table's last row group; the
# checkpoint as the file is detached then vacuums, merging that partial last row group with the new ones: every
# appended row is compressed and written a second time (250,000 rows of 2 kB appended to a table of 20,000: closing
# took 7 s, 0.02 s without the vacuum). After a unit that appended at least this many rows (DuckDB's row group), the
# detach skips the vacuum (``max_vacuum_tasks = 0``; the next one vacuums again): one partial row group stays
# unmerged before the appended ones. Deletes and updates leave it as it is (their row groups need the vacuum to
# give back space). bench/bigtxn --tables wide --shapes insert.
APPENDED_NO_VACUUM = 122_880


class DuckdbTarget(SqlTarget):
    kind = "duckdb"
    dialect = DUCKDB

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._home = Home.of(self.location)
        self._db: duckdb.DuckDBPyConnection | None = None  # the home's connection while this target holds the file
        self._lock = threading.Lock()
        self._users = 0  # sessions handed out and not closed, plus applies running: the file is held while > 0
        self._appended = 0  # rows the sessions appended since the database was opened (APPENDED_NO_VACUUM)
        self._known: tuple[tuple[int, ...], AppliedState] | None = None  # the state read, and the file's stamp then

    def _stamp(self) -> tuple[int, ...]:
        """The database file's (and its WAL's) identity, size and time: unchanged while nobody wrote it."""
        out: list[int] = []
        for path in (self.location, self.location + ".wal"):
            try:
                st = os.stat(path)
                out += [st.st_ino, st.st_size, st.st_mtime_ns]
            except OSError:
                out += [0, 0, 0]
        return tuple(out)

    def _use(self, n: int, known: AppliedState | None = None) -> None:
        """Count a user in (1) or out (-1); the last one out lets go of the file (under the same lock as an open, so
        a session being opened meanwhile is counted first), and ``known``, the state it read last, is what
        :meth:`applied_positions` returns while the file stays as it leaves it."""
        with self._lock:
            self._users += n
            if self._users == 0:
                self._close()
                if known is not None:
                    self._known = (self._stamp(), known)

    def session(self) -> Session:
        self._use(1)
        try:
            return super().session()
        except BaseException:
            self._use(-1)
            raise

    def _release(self, s: Session) -> None:
        if isinstance(s, DuckdbSession):
            with self._lock:
                self._appended += s.appended
            s.appended = 0
        try:
            super()._release(s)
        finally:
            self._use(-1)

    def apply(self, *args: Any, **kwargs: Any) -> ApplyResult:
        """As every kind's, the file held for the whole unit and let go of after it (phase ``close``). The state the
        unit committed is read before the file is let go of, so the applier's look at it after the unit (and until
        the file changes) opens nothing, and neither does the next unit's look before it writes (bench/live
        --phases r300: CPU per 1,000 changes)."""
        self._use(1)
        result: ApplyResult | None = None
        state: AppliedState | None = None
        try:
            result = super().apply(*args, **kwargs)  # (its look at the positions first: from memory, as above)
            with contextlib.suppress(Exception):  # (the unit is committed; a read that fails: the next look opens it)
                state = super().applied_positions()
            return result
        finally:
            self._known = None
            t0 = time.monotonic()
            self._use(-1, state)
            if result is not None:  # (DuckDB writes what its WAL holds into the file as it lets go)
                result.seconds += result.timed("close", t0) - t0

    def connect(self) -> Session:
        with self._lock:
            deadline = time.monotonic() + self.open_wait
            while self._db is None:
                try:
                    self._db = self._home.enter()
                except duckdb.Error as e:
                    busy = any(w in str(e).lower() for w in ("lock", "already attached", "file handle conflict"))
                    if busy and time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    if busy:
                        raise TargetBusy(
                            f"target {self.name}: another process, or another connection of this one, holds the "
                            f"DuckDB database {self.location} open "
                            f"({str(e).strip().splitlines()[0]})",
                            hint="DuckDB lets one process open a database to write it: stop that process, or let it "
                            "finish",
                            target=self.name,
                        ) from e
                    raise TargetError(
                        f"cannot open DuckDB database {self.location}: {e}",
                        hint="check the path and the file",
                        target=self.name,
                    ) from e
            return DuckdbSession(self._db, CATALOG)

    def try_lock(self) -> Any:
        handle = super().try_lock()
        if handle is None:  # another mirrorline process applies to it, or reads it: it needs the file
            self._let_go()
        return handle

    def applied_positions(self) -> AppliedState:
        """As every kind's; and, looked at while another mirrorline process holds the applier lock (``verify``), the
        database let go of (:class:`TargetBusy`), so that process can open it."""
        if not lock.held_here(self):
            handle = super().try_lock()
            if handle is None:
                self._let_go()
                raise TargetBusy(
                    f"target {self.name}: another process holds its applier lock ({self.lock_holder()})",
                    target=self.name,
                )
            self.unlock(handle)
        known, stamp = self._known, self._stamp()
        if known is not None and known[0] == stamp and self._db is None:  # (not attached: nothing of ours open)
            return known[1]
        self._use(1)
        try:
            state = super().applied_positions()
        finally:
            self._use(-1)
        self._known = (self._stamp(), state) if self._users == 0 else None
        return state

    def _let_go(self) -> None:
        """Let go of the file (its idle sessions first), so that another process can open it (DuckDB writes what its
        WAL holds into the file as it detaches it)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        """:meth:`_let_go`, the caller holding ``_lock``."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for sess in idle:
            with contextlib.suppress(Exception):
                sess.disconnect()
        if self._db is not None:
            no_vacuum = self._appended >= APPENDED_NO_VACUUM
            self._appended = 0
            self._db = None
            self._home.leave(no_vacuum)

    def close(self) -> None:
        super().close()
        self._let_go()
        self._home.close_idle()
