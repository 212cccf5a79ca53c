"""DuckDB target: one file, opened once per target; every session (apply thread) is a cursor of that database.
Worktables are TEMP tables created straight from the Arrow rows (DuckDB scans a registered Arrow table without
copying it through Python)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import duckdb

from mirrorline.apply import lock
from mirrorline.apply.duckdb.dialect import DUCKDB
from mirrorline.apply.duckdb.session import DuckdbSession
from mirrorline.apply.engine import Target
from mirrorline.apply.lock import TargetBusy
from mirrorline.apply.session import Session
from mirrorline.apply.state import AppliedState
from mirrorline.errors import TargetError


class DuckdbTarget(Target):
    kind = "duckdb"
    dialect = DUCKDB

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._db: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    # DuckDB lets one process open a database file to write it. This target keeps it open between units, and lets
    # go of it when another mirrorline process takes its applier lock (verify, apply), so that one can open it.

    open_wait = 10.0  # seconds a connection waits for another process to close the database (a status, a reader)

    def connect(self) -> Session:
        with self._lock:
            deadline = time.monotonic() + self.open_wait
            while self._db is None:
                try:
                    self._db = duckdb.connect(self.location)
                except duckdb.Error as e:
                    if "lock" in str(e).lower() and time.monotonic() < deadline:
                        time.sleep(0.05)
                        continue
                    if "lock" in str(e).lower():
                        raise TargetBusy(
                            f"target {self.name}: another process holds the DuckDB database {self.location} open "
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
            return DuckdbSession(self._db)

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
        return super().applied_positions()

    def _let_go(self) -> None:
        """Close the database (its idle sessions first), so that another process can open it."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for sess in idle:
            with contextlib.suppress(Exception):
                sess.disconnect()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def close(self) -> None:
        super().close()
        self._let_go()
