"""The target kinds, as data: the one place that lists them. Each kind names its target class (imported only when a
target of the kind is opened), the URL schemes that select it, and what it can do (its capabilities); the rest of
mirrorline asks these rather than the kind's name. Adding a kind: its folder under ``apply/`` (a
:class:`~mirrorline.apply.target.Target`) and a row here; the kind-parametrized tests (tests/support/apply_support.py
``KINDS``) then cover it.

Nothing here imports the kinds' modules (nor :mod:`mirrorline.config`, which reads this to parse target URLs).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    name: str
    target: str  # "module:Class": the kind's Target class
    schemes: tuple[str, ...]  # URL schemes selecting it
    path: bool  # the URL names a local path ("scheme:///relative", "scheme:////absolute"), else a server
    compacts: bool = False  # has files to compact and clean up (maintain, compact_every, vacuum_retention)
    direct_inserts: bool = False  # a SQL kind: a unit's net inserts go straight into the table, not via a worktable
    chunk_loader: str = ""  # "module:Class": a snapshot's chunks loaded by the Spark tasks; "": the driver loads them
    catalog: bool = False  # its tables are in a catalog: a [targets.X.catalog] table names one (else its embedded one)
    open_wait: float = 0.0  # seconds a connection waits while another process holds the database
    what: str = ""  # what a target of this kind is, for messages


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "postgresql",
            "mirrorline.apply.postgresql:PostgresTarget",
            ("postgresql", "postgres"),
            False,
            direct_inserts=True,  # COPY parses text with the column's input function, exactly as CAST(text AS type)
            chunk_loader="mirrorline.apply.postgresql.load:PgChunkLoader",  # COPY piped into COPY, from each task
            what="a PostgreSQL database",
        ),
        Kind(
            "sqlite",
            "mirrorline.apply.sqlite:SqliteTarget",
            ("sqlite",),
            True,
            direct_inserts=True,  # INSERTs of many rows of parameters, converted as by a worktable's insert-select
            what="a SQLite database file",
        ),
        Kind(
            "duckdb",
            "mirrorline.apply.duckdb:DuckdbTarget",
            ("duckdb",),
            True,
            direct_inserts=True,  # each chunk as it comes, by the conversions of the worktables' insert-select
            open_wait=10.0,  # one process at a time holds the file: wait for a status or a reader to close it
            what="a DuckDB database file",
        ),
        Kind(
            "delta",
            "mirrorline.apply.delta:DeltaTarget",
            ("delta",),
            True,
            compacts=True,
            what="a folder of Delta Lake tables",
        ),
        Kind(
            "iceberg",
            "mirrorline.apply.iceberg:IcebergTarget",
            ("iceberg",),
            True,
            compacts=True,
            catalog=True,
            what="Apache Iceberg tables (an embedded catalog in a folder, or the catalog its [catalog] table names)",
        ),
    )
}


def by_scheme(scheme: str) -> Kind | None:
    """The kind a URL scheme selects (None: no kind)."""
    scheme = scheme.lower()
    return next((k for k in KINDS.values() if scheme in k.schemes), None)


def load(ref: str) -> Any:
    """The class a ``"module:Class"`` reference of a kind names (its module imported now)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def compacting() -> list[str]:
    """The kinds with files to compact and clean up."""
    return [k.name for k in KINDS.values() if k.compacts]
