"""mirrorline: change-data-capture replication of PostgreSQL tables, compiled into net row changes on Spark."""

__version__ = "0.1.0"
