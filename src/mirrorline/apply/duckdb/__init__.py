"""The DuckDB target kind: its dialect, session and target."""

from mirrorline.apply.duckdb.dialect import DUCKDB, DuckdbDialect
from mirrorline.apply.duckdb.session import DuckdbSession
from mirrorline.apply.duckdb.target import DuckdbTarget

__all__ = ["DUCKDB", "DuckdbDialect", "DuckdbSession", "DuckdbTarget"]
