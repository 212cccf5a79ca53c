"""The SQLite target kind: its dialect, session and target."""

from mirrorline.apply.sqlite.dialect import SQLITE, SqliteDialect
from mirrorline.apply.sqlite.session import SqliteSession, sqlite_values
from mirrorline.apply.sqlite.target import SqliteTarget

__all__ = ["SQLITE", "SqliteDialect", "SqliteSession", "SqliteTarget", "sqlite_values"]
