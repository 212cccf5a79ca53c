"""The PostgreSQL target kind: its dialect, session, target and the direct load of a snapshot's chunks."""

from mirrorline.apply.postgresql.dialect import POSTGRESQL, PostgresDialect
from mirrorline.apply.postgresql.session import PgSession, to_csv
from mirrorline.apply.postgresql.target import PostgresTarget

__all__ = ["POSTGRESQL", "PgSession", "PostgresDialect", "PostgresTarget", "to_csv"]
