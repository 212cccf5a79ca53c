"""The types that cross stages: operations, changes, table schemas.

Values travel as PostgreSQL sent them: text (or ``None`` for SQL NULL). A column whose unchanged TOASTed value was not
sent is *absent* from the new image and listed in ``unchanged``: never a null.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from mirrorline.position import Position

Value = str | None
Key = tuple[Value, ...]


class Op(StrEnum):
    INSERT = "I"
    UPDATE = "U"
    DELETE = "D"
    TRUNCATE = "T"

    def __str__(self) -> str:
        return self.value


def kept_kinds(acts: Collection[str]) -> frozenset[str]:
    """The kinds of op a table whose ``actions`` are ``acts`` keeps, a key change counted as a D of its old key and
    an I of its new key: those kinds, and T with D (a TRUNCATE deletes every row). The one statement of the rule: the
    fold (:mod:`mirrorline.compile.reference`, whose ``kept_changes`` feeds apply's failure path), the Spark compile
    and the log's statistics all read it."""
    a = frozenset(x.upper() for x in acts)
    return a | {"T"} if "D" in a else a


@dataclass(frozen=True, slots=True)
class Change:
    """One row change (or a TRUNCATE) at its log position.

    - ``key``: the row's key values in key-column order; for a DELETE the deleted row's key; for an UPDATE the new key;
      ``()`` for TRUNCATE.
    - ``new``: the new image for INSERT/UPDATE (column -> text value), ``None`` for DELETE and TRUNCATE. Columns whose
      unchanged TOAST value was not sent are absent from it and named in ``unchanged``.
    - ``old_key``: for an UPDATE that changed the key, the key before it; ``None`` otherwise.
    - ``schema_version``: the version of the table's schema (see :class:`TableSchema`) the change was captured with.
    """

    pos: Position
    commit_ts: int  # microseconds since the Unix epoch, UTC
    xid: int
    table: str  # "schema.name"
    op: Op
    key: Key = ()
    new: Mapping[str, Value] | None = None
    unchanged: frozenset[str] = frozenset()
    old_key: Key | None = None
    schema_version: int = 1


# Types whose values are large objects: left out of the index a target builds for a table without a key (a btree
# entry has a size limit); they still identify its rows (DESIGN §5).
LOB_TYPES = frozenset({"text", "bytea", "json", "jsonb", "xml"})
FIRST_USER_OID = 16384  # PostgreSQL's FirstNormalObjectId: types from here on were created in the database
# Types without an equality operator in PostgreSQL (nor a btree index): compared as their text where rows are matched
NO_EQUALITY_TYPES = frozenset({"json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle"})


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_name: str  # PostgreSQL's format_type() text: "integer", "numeric(10,2)", "character varying(20)", "text"
    type_oid: int = 0
    typmod: int = -1
    nullable: bool = True
    # from the source's catalog when capture saw the column (0 / None / False where unknown): its attnum, which a
    # rename keeps (how a rename is told from a drop and an add), the value rows that existed before the column was
    # added hold (PostgreSQL's attmissingval, as text; the rows are not rewritten, so the log never sees it), and
    # whether it has a default that PostgreSQL wrote into existing rows by rewriting the table (not in the log)
    attnum: int = 0
    missing_value: str | None = None
    default_unlogged: bool = False

    @property
    def is_lob(self) -> bool:
        base = self.type_name.split("(")[0].strip().lower()
        return base in LOB_TYPES

    @property
    def has_equality(self) -> bool:
        """Does PostgreSQL compare (and index) values of this type with ``=``? (An array compares as its elements.)
        A type defined in the database (an oid from ``FIRST_USER_OID``) may have neither ``=`` nor a btree operator
        class: it is compared as its text, which its output function writes the same way everywhere."""
        base = self.type_name.split("(")[0].strip().lower().removesuffix("[]").strip()
        return base not in NO_EQUALITY_TYPES and self.type_oid < FIRST_USER_OID


@dataclass(frozen=True, slots=True)
class TableSchema:
    """One version of a table's schema, as recorded in the log."""

    table: str  # "schema.name"
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    version: int = 1
    since: Position = field(default_factory=lambda: Position(0, 0))
    # no primary key (REPLICA IDENTITY FULL): a bag of rows, every column identifies a row, duplicates allowed
    bag: bool = False
    relid: int = 0  # the source's oid of the table (0: not recorded), which a rename keeps
    # what made the targets' rows of it untrustworthy without a change logged (a partition attached with rows,
    # detached, dropped or truncated: capture/partitions.py), and where; kept by every later version
    resync: str = ""

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


def default_key(
    columns: Sequence[Column], flagged: Sequence[str] = (), configured: Sequence[str] = ()
) -> tuple[str, ...]:
    """The key of a table (DESIGN §5): the configured key, else the primary key / replica identity columns, else
    every column (the table is a bag of rows: :attr:`TableSchema.bag`)."""
    if configured:
        return tuple(configured)
    if flagged:
        return tuple(flagged)
    return tuple(c.name for c in columns)


def index_columns(s: TableSchema) -> tuple[str, ...]:
    """The columns a target indexes for a bag table's joins: every column but the large objects and the types
    without an ordering."""
    return tuple(c.name for c in s.columns if not c.is_lob and c.has_equality and not c.type_name.endswith("]"))


def split_table_name(table: str) -> tuple[str, str]:
    """``"public.orders"`` -> ``("public", "orders")``; an unqualified name is in ``public``."""
    if "." in table:
        schema, _, name = table.partition(".")
        return schema, name
    return "public", table


def quote_ident(name: str) -> str:
    """Quote one SQL identifier (works for PostgreSQL, SQLite and DuckDB)."""
    return '"' + name.replace('"', '""') + '"'


def quote_table(table: str) -> str:
    schema, name = split_table_name(table)
    return f"{quote_ident(schema)}.{quote_ident(name)}"
