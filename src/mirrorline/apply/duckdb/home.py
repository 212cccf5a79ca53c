"""Where a DuckDB database file is opened in this process: an in-memory database of its own (its *home*), to which
the file is attached (``ATTACH``, as :data:`~mirrorline.apply.duckdb.dialect.CATALOG`) while anyone here uses it,
and detached (``DETACH``, which writes what the file's WAL holds into it, as a close does) once the last one is done,
so that another process can open it between units.

A new DuckDB database costs about 10 ms of CPU to set up (its catalog of functions), an attach half a millisecond,
and a target lets go of its file after every unit (bench/live --phases r300: CPU per 1,000 changes). One home per
file and process, shared by every target object of that file and by :func:`reading`, as DuckDB shares one database
among the connections of a process that open the same file: a second attach of one file in one process is refused
("Unique file handle conflict"). A home no target refers to any more goes with its last reference, and its DuckDB
connection with it (the registry holds homes weakly).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Iterator

import duckdb

from mirrorline import limits
from mirrorline.apply.duckdb.dialect import CATALOG
from mirrorline.apply.sql import lit
from mirrorline.model import quote_ident

log = logging.getLogger(__name__)

# DuckDB's default memory_limit is 80% of the machine's memory, taken inside run's own process (DuckDB alone, 250,000
# rows of 2 kB inserted in one transaction: 792 MB resident; 475 MB at 256 MiB, as fast; limits.DUCKDB_MEMORY says
# what its size bought); bounded, it writes blocks out as it goes. Set on the home, for the file attached to it
SET_MEMORY = f"SET memory_limit = '{limits.DUCKDB_MEMORY >> 20}MiB'"

_homes: weakref.WeakValueDictionary[str, Home] = weakref.WeakValueDictionary()
_homes_lock = threading.Lock()


class Home:
    """The in-memory database one file is attached to while :meth:`enter` has more users than :meth:`leave`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db: duckdb.DuckDBPyConnection | None = None
        self._users = 0
        self._lock = threading.Lock()
        self._no_vacuum = False

    @staticmethod
    def of(path: str) -> Home:
        """The home of the file at ``path`` (made when there is none)."""
        key = os.path.realpath(path)
        with _homes_lock:
            home = _homes.get(key)
            if home is None:
                home = _homes[key] = Home(key)
            return home

    def enter(self) -> duckdb.DuckDBPyConnection:
        """One more user: the file attached if it was not (the home's DuckDB errors as they are: a file another
        process holds, one that is not a database). Returns the home's connection; its cursors name the file's
        tables ``CATALOG.schema.table``, or as usual after ``USE CATALOG``."""
        with self._lock:
            if self._users == 0:
                if self._db is None:
                    db = duckdb.connect(":memory:")
                    try:
                        db.execute(SET_MEMORY)
                    except BaseException:
                        db.close()
                        raise
                    self._db = db
                self._db.execute(f"ATTACH {lit(self.path)} AS {quote_ident(CATALOG)}")
            self._users += 1
            assert self._db is not None
            return self._db

    def leave(self, no_vacuum: bool = False) -> None:
        """One user less; the last one detaches the file. ``no_vacuum``: the checkpoint as it is detached skips
        DuckDB's vacuum (``max_vacuum_tasks = 0``: see ``APPENDED_NO_VACUUM``)."""
        with self._lock:
            self._no_vacuum |= no_vacuum
            self._users -= 1
            if self._users > 0 or self._db is None:
                return
            db, novac, self._no_vacuum = self._db, self._no_vacuum, False
            try:
                if novac:
                    db.execute("SET max_vacuum_tasks = 0")
                db.execute(f"DETACH {quote_ident(CATALOG)}")
                if novac:
                    db.execute("RESET max_vacuum_tasks")
            except duckdb.Error as e:  # the file let go of with the whole home (the next enter makes one)
                log.warning("DuckDB %s: detaching it failed (%s); closing its database", self.path, e)
                self._db = None
                with contextlib.suppress(duckdb.Error):
                    db.close()

    def close_idle(self) -> None:
        """Close the home's in-memory database (its DuckDB threads and memory) when nobody uses the file; the next
        :meth:`enter` makes another."""
        with self._lock:
            db = self._db if self._users == 0 else None
            if db is not None:
                self._db = None
                with contextlib.suppress(duckdb.Error):
                    db.close()


@contextlib.contextmanager
def reading(path: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the DuckDB file at ``path``, its names those of the file (``USE``), in this process's home of that
    file: what a reader in a process with a DuckDB target of that file opens (a second open of the file would be
    refused while the target holds it)."""
    home = Home.of(path)
    db = home.enter()
    try:
        cur = db.cursor()
        try:
            cur.execute(f"USE {quote_ident(CATALOG)}")
            yield cur
        finally:
            cur.close()
    finally:
        home.leave()
