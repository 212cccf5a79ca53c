"""A SQLite target's checkpoints, off the commit path.

In WAL mode a commit appends the unit's pages to the ``-wal`` file; a checkpoint copies them into the database file.
SQLite's default runs it in the committing connection once the WAL passes 1,000 pages, which makes a big unit's
commit wait for its whole copy (11-16 s of a big transaction's apply: ``bench/bigtxn.py``'s SQLite ``commit`` phase
with ``wal_autocheckpoint`` left on). mirrorline's sessions turn that off (``wal_autocheckpoint = 0``) and
:class:`Checkpointer` runs a ``PASSIVE`` checkpoint in a thread of its own, on its own connection, after each
commit: readers see a unit as soon as it commits (they read the WAL), and the copy happens while the target waits
for its next unit. A passive checkpoint never blocks a writer or a reader; it copies
what no reader still needs and the next one copies the rest. A crash meanwhile loses nothing: the WAL is the
database's journal, replayed by the next connection.

The WAL starts again from its beginning only when a unit begins after a complete checkpoint; so that units that
follow one another closely do not grow it without end, a unit waits for the checkpoint under way once the WAL holds
more than ``limits.SQLITE_WAL_BYTES`` (:meth:`Checkpointer.settle`)."""

from __future__ import annotations

import logging
import sqlite3
import threading

from mirrorline import limits

log = logging.getLogger(__name__)


class Checkpointer:
    """Checkpoints of one database file, run by a daemon thread when :meth:`due` says a commit happened."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._due = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.runs = 0  # checkpoints run (the tests read it)
        self.failed: str | None = None  # the last checkpoint's error, None once one succeeds
        self.pages = 0  # the WAL's pages when the last checkpoint ran
        self.page_size = 4096  # the database's, read by the first checkpoint

    def due(self) -> None:
        """A commit happened: checkpoint soon (the thread starts with the first)."""
        with self._lock:
            if self._stopping:
                return
            self._idle.clear()
            self._due.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"sqlite-checkpoint {self.path}", daemon=True)
                self._thread.start()

    def settle(self) -> None:
        """Before a unit writes: wait for the checkpoint under way when the WAL holds more than its bound."""
        if self.pages * self.page_size > limits.SQLITE_WAL_BYTES:
            self.wait_idle()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every checkpoint asked for has run; False on timeout."""
        return self._idle.wait(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the thread once the checkpoint it runs (if any) ends; it is not interrupted, since an interrupt left
        pending would cut short the checkpoint its connection's close runs. The database's last connection to close
        checkpoints what is left and removes the WAL."""
        with self._lock:
            self._stopping = True
            thread, self._thread = self._thread, None
            self._due.set()
        if thread is not None:
            thread.join(timeout)
        self._idle.set()

    def _loop(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                self._due.wait()
                with self._lock:
                    if self._stopping:
                        return
                    self._due.clear()
                try:
                    if conn is None:
                        conn = sqlite3.connect(self.path, timeout=5, isolation_level=None, check_same_thread=False)
                        ((self.page_size,),) = conn.execute("PRAGMA page_size").fetchall()
                    (_, pages, done), *_ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.pages = 0 if pages == done else pages
                    self.runs += 1
                    self.failed = None
                except sqlite3.Error as e:  # the next commit asks again; the WAL keeps every page meanwhile
                    if self.failed is None:
                        log.warning("SQLite %s: a checkpoint failed (%s); the next commit retries", self.path, e)
                    self.failed = str(e)
                with self._lock:
                    if not self._due.is_set():
                        self._idle.set()
        finally:
            if conn is not None:
                conn.close()
            self._idle.set()
