"""The target kinds, as data: the one place that lists them. Each kind names its target class (imported only when a
target of the kind is opened), the URL schemes that select it, and what it can do; the rest of mirrorline asks these
rather than the kind's name. Adding a kind: its module under ``apply/`` (a :class:`~mirrorline.apply.target.Target`)
and a row here; the kind-parametrized tests (tests/support/apply_support.py ``KINDS``) then cover it.

Nothing here imports the kinds' modules (nor :mod:`mirrorline.config`, which reads this to parse target URLs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    target: str  # "module:Class": the kind's Target class
    schemes: tuple[str, ...]  # URL schemes selecting it
    path: bool  # the URL names a local path ("scheme:///relative", "scheme:////absolute"), else a server
    compacts: bool = False  # has files to compact and clean up (maintain, compact_every, vacuum_retention)
    what: str = ""  # what a target of this kind is, for messages


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "postgresql",
            "mirrorline.apply.postgresql:PostgresTarget",
            ("postgresql", "postgres"),
            False,
            what="a PostgreSQL database",
        ),
        Kind("sqlite", "mirrorline.apply.sqlite:SqliteTarget", ("sqlite",), True, what="a SQLite database file"),
        Kind("duckdb", "mirrorline.apply.duckdb:DuckdbTarget", ("duckdb",), True, what="a DuckDB database file"),
        Kind(
            "delta",
            "mirrorline.apply.delta:DeltaTarget",
            ("delta",),
            True,
            compacts=True,
            what="a folder of Delta Lake tables",
        ),
    )
}


def by_scheme(scheme: str) -> Kind | None:
    """The kind a URL scheme selects (None: no kind)."""
    scheme = scheme.lower()
    return next((k for k in KINDS.values() if scheme in k.schemes), None)


def compacting() -> list[str]:
    """The kinds with files to compact and clean up."""
    return [k.name for k in KINDS.values() if k.compacts]
