"""A SQLite target: one file, one writer at a time."""

from __future__ import annotations

import threading
from typing import Any

from mirrorline import limits
from mirrorline.apply.engine import SqlTarget
from mirrorline.apply.session import Session
from mirrorline.apply.sqlite.checkpoint import Checkpointer
from mirrorline.apply.sqlite.dialect import SQLITE
from mirrorline.apply.sqlite.session import SqliteSession


class SqliteTarget(SqlTarget):
    kind = "sqlite"
    dialect = SQLITE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checkpoints_lock = threading.Lock()
        self._checkpointer: Checkpointer | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        """What checkpoints this target's database after its commits (made at first use, and again after close)."""
        with self._checkpoints_lock:
            if self._checkpointer is None:
                self._checkpointer = Checkpointer(self.location)
            return self._checkpointer

    def connect(self) -> Session:
        return SqliteSession(self.location, self.checkpointer, limits.SQLITE_PAGE_SIZE)

    def close(self) -> None:
        super().close()
        with self._checkpoints_lock:
            c, self._checkpointer = self._checkpointer, None
        if c is not None:
            c.stop()
