"""A SQLite target: one file, one writer at a time."""

from __future__ import annotations

from mirrorline.apply.engine import Target
from mirrorline.apply.session import Session
from mirrorline.apply.sqlite.dialect import SQLITE
from mirrorline.apply.sqlite.session import SqliteSession


class SqliteTarget(Target):
    kind = "sqlite"
    dialect = SQLITE
    direct_inserts = True  # INSERTs of many rows of parameters, converted as by a worktable's insert-select

    def connect(self) -> Session:
        return SqliteSession(self.location)
