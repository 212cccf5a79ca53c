"""SQL text for the apply stage: :class:`Dialect`, which each target kind's module subclasses where its engine differs
(PostgreSQL, SQLite, DuckDB). Pure functions over names and schemas; every identifier quoted.

Worktables hold text exactly as PostgreSQL sent it; the set-based statements convert it to the target's types
(:mod:`mirrorline.apply.types`). Their layout:

- deletes ``D``: the key, as ``_ml_k0 .. _ml_kN`` (the table's key-column order);
- updates ``U``: the key as above, then every non-key column by its own name, then ``_ml_unchanged``: the names of the
  columns marked unchanged, joined by :data:`MASK_SEP` ('' when none);
- inserts ``I``: every column by its own name, then ``_ml_unchanged`` (as above: the columns to take from the target's
  row at ``moved_from``), ``moved_from`` as ``_ml_m0 .. _ml_mN`` and the net row's position as ``_ml_lsn``,
  ``_ml_seq`` (for the error when that row is missing).

Rows with different unchanged sets are updated one statement per distinct set (in practice one or two sets per
table), each statement writing only the columns that changed.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

from mirrorline.apply import types as type_map
from mirrorline.apply.history import HistoryShape
from mirrorline.apply.reshape import Step
from mirrorline.model import Column, TableSchema, index_columns, quote_ident, split_table_name

MASK_SEP = "\x1f"
MASK_COL = "_ml_unchanged"
OWN_PREFIX = "mirrorline_"
STATE_TABLE = "mirrorline_applied"
REJECTS_TABLE = "mirrorline_rejects"
GLOBAL_SCOPE = ""  # the state row holding the unit end every table has reached


POS_COLS = ("_ml_lsn", "_ml_seq")


def key_col(i: int) -> str:
    return f"_ml_k{i}"


def moved_col(i: int) -> str:
    return f"_ml_m{i}"


def lit(text: str) -> str:
    """A SQL string literal (standard quoting, valid in all three dialects)."""
    return "'" + text.replace("'", "''") + "'"


def mask_of(columns: Iterable[str]) -> str:
    return MASK_SEP.join(sorted(columns))


def parse_mask(mask: str | None) -> frozenset[str]:
    return frozenset(x for x in (mask or "").split(MASK_SEP) if x)


OWN_INDEX = "mirrorline_key_"  # the prefix of the index mirrorline makes on a table without a usable key


class Dialect(ABC):
    """The SQL of one target kind: statements in the form most engines take (PostgreSQL's and DuckDB's), each kind's
    ``dialect.py`` (``apply/postgresql/``, ``sqlite/``, ``duckdb/``, ``delta/``) subclassing it where its engine
    differs."""

    name: ClassVar[str]  # the target kind: "postgresql", "sqlite", "duckdb"
    default_schema: ClassVar[str | None] = None  # where a table of the source's "public" schema goes (None: no schemas)
    text_type: ClassVar[str] = "TEXT"
    param: ClassVar[str] = "?"  # the driver's placeholder
    ordered_inserts: ClassVar[bool] = False  # insert_select(key_order=True) sorts: the engine gains by it
    # changes a column an index depends on (drop, rename, retype) only by building the table again (DuckDB)
    rebuilds_to_alter: ClassVar[bool] = False
    row_id: ClassVar[str] = "rowid"  # the engine's physical row address (a bag table's copies are told apart by it)
    prefix: str = OWN_PREFIX  # of mirrorline's own tables at the target (see own_name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # -- names ------------------------------------------------------------------------------------------------------
    def names(self, table: str) -> tuple[str | None, str]:
        """The target's (schema, name) for a source table "schema.name"."""
        schema, name = split_table_name(table)
        return (self.default_schema if schema == "public" else schema), name

    def table(self, table: str) -> str:
        """The target's (quoted) name for a source table "schema.name"."""
        schema, name = self.names(table)
        return quote_ident(name) if schema is None else f"{quote_ident(schema)}.{quote_ident(name)}"

    def schema(self, table: str) -> str | None:
        """The schema to create for a table, if the dialect has schemas and it is not the default one."""
        schema, _ = split_table_name(table)
        return None if schema == "public" else schema

    def own_name(self, name: str) -> str:
        """The name at this target of one of mirrorline's own tables (``mirrorline_applied``, ...): the target's
        ``state_prefix`` in place of ``mirrorline_`` (seed 001's replication prefix: two instances share a
        database)."""
        return self.prefix + name.removeprefix(OWN_PREFIX) if name.startswith(OWN_PREFIX) else name

    def own(self, name: str) -> str:
        """mirrorline's own tables (state, rejects) live in the default schema."""
        if self.default_schema is None:
            return quote_ident(self.own_name(name))
        return f"{quote_ident(self.default_schema)}.{quote_ident(self.own_name(name))}"

    def with_prefix(self, prefix: str) -> Dialect:
        """This dialect with mirrorline's own tables named ``prefix...`` (a copy; the shared one is unchanged)."""
        if prefix == self.prefix:
            return self
        other = copy.copy(self)
        other.prefix = prefix
        return other

    def text_param(self) -> str:
        """A parameter typed as text (so NULL stays a text NULL)."""
        return f"CAST({self.param} AS {self.text_type})"

    # -- types ------------------------------------------------------------------------------------------------------
    @abstractmethod
    def type_info(self, table: str, col: Column) -> type_map.TypeInfo:
        """The column's type at the target and how text converts to it (:mod:`mirrorline.apply.types`)."""

    def conv(self, expr: str, info: type_map.TypeInfo, table: str = "", column: str = "") -> str:
        """The SQL expression turning the text ``expr`` into the column's target value; a bad value is an error."""
        if info.conv == "text":
            return expr
        return f"CAST({expr} AS {info.target_type})"

    def eq(self, a: str, b: str, nullable: bool) -> str:
        return f"{a} = {b}" if not nullable else f"{a} IS NOT DISTINCT FROM {b}"

    def read_expr(self, column: str, info: type_map.TypeInfo) -> str:
        """How ``verify`` reads a column (``column`` already quoted) through the engine's client: as it is, or as
        text where the client's own values cannot hold what the column can."""
        return column

    # -- DDL --------------------------------------------------------------------------------------------------------
    def create_table(self, s: TableSchema) -> list[str]:
        out = []
        schema = self.schema(s.table)
        if schema is not None:
            out.append(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        defaults = {c: f" DEFAULT {v}" for c, v in s.defaults.items()} if isinstance(s, HistoryShape) else {}
        cols = [
            f"{quote_ident(c.name)} {self.type_info(s.table, c).target_type}"
            + ("" if c.nullable else " NOT NULL")
            + defaults.get(c.name, "")
            for c in s.columns
        ]
        key_nullable = any(s.column(k).nullable for k in s.key)
        if isinstance(s, HistoryShape) and not key_nullable:
            cols.append("PRIMARY KEY (" + ", ".join(quote_ident(k) for k in s.primary) + ")")
        elif s.key and not key_nullable and not s.bag:
            cols.append("PRIMARY KEY (" + ", ".join(quote_ident(k) for k in s.key) + ")")
        out.append(f"CREATE TABLE IF NOT EXISTS {self.table(s.table)} (" + ", ".join(cols) + ")")
        # a key that may hold NULLs, or a table without one (duplicates allowed): an index for the joins, on every
        # column but the large objects (an index entry has a size limit)
        index = index_columns(s) if s.bag else (s.key if key_nullable else ())
        if index:
            _, name = split_table_name(s.table)
            idx = quote_ident(f"{OWN_INDEX}{name}"[:63])
            out.append(
                f"CREATE INDEX IF NOT EXISTS {idx} ON {self.table(s.table)} ("
                + ", ".join(quote_ident(k) for k in index)
                + ")"
            )
        return out

    def add_column(self, table: str, col: Column) -> str:
        return (
            f"ALTER TABLE {self.table(table)} ADD COLUMN {quote_ident(col.name)} "
            f"{self.type_info(table, col).target_type}"
        )

    def reshape(self, table: str, step: Step, s: TableSchema) -> list[str] | None:
        """The statements that make one schema change at the target's table ``table`` (its new schema ``s``), or
        None when this kind cannot make it in place."""
        t, c = self.table(table), step.column
        if step.kind == "rename":
            return [f"ALTER TABLE {t} RENAME COLUMN {quote_ident(step.old)} TO {quote_ident(c.name)}"]
        if step.kind == "drop":
            return [f"ALTER TABLE {t} DROP COLUMN {quote_ident(step.old)}"]
        if step.kind == "add":
            out = [self.add_column(table, c)]
            if c.missing_value is not None:  # the rows that existed when the column was added hold this value
                value = "'" + c.missing_value.replace("'", "''") + "'"
                conv = self.conv(value, self.type_info(table, c), table, c.name)
                out.append(f"UPDATE {t} SET {quote_ident(c.name)} = {conv}")
            return out
        if step.kind == "rekey":
            return self.rebuild(table, s)
        if step.kind == "rebuild" and step.shape is not None:
            return self.rebuild(table, step.shape, dict(step.sources))
        old = Column(c.name, step.old)
        if self.type_info(table, old).target_type == self.type_info(table, c).target_type:
            return []  # the target holds both types the same way
        return self.retype(table, c)

    def rebuild(self, table: str, s: TableSchema, sources: Mapping[str, str | None] | None = None) -> list[str]:
        """Build the table again as ``s`` says (its columns, types, key), its rows copied: create a new table, copy,
        drop the old one, give the new one its name, and its index the old one's name. ``sources``: the column of
        today's table each column's values come from (None: a new column, set to its ``missing_value``); default:
        the same name."""
        schema, name = split_table_name(table)
        work = replace(s, table=f"{schema}.{name}_mirrorline_rebuild")
        cols, exprs = [], []
        for c in s.columns:
            src = sources.get(c.name) if sources is not None else c.name
            cols.append(quote_ident(c.name))
            if src is not None:
                exprs.append(quote_ident(src))
            elif c.missing_value is not None:
                value = "'" + c.missing_value.replace("'", "''") + "'"
                exprs.append(self.conv(value, self.type_info(table, c), table, c.name))
            else:
                exprs.append("NULL")
        create = self.create_table(work)
        index = [x for x in create if x.startswith("CREATE INDEX")]
        return [
            *[x for x in create if not x.startswith("CREATE INDEX")],
            f"INSERT INTO {self.table(work.table)} ({', '.join(cols)}) SELECT {', '.join(exprs)} "
            f"FROM {self.table(table)}",
            f"DROP TABLE {self.table(table)}",
            self.rename_table(work.table, table),
            *([x for x in self.create_table(s) if x.startswith("CREATE INDEX")] if index else []),
        ]

    def rename_table(self, old: str, new: str) -> str:
        return f"ALTER TABLE {self.table(old)} RENAME TO {quote_ident(self.names(new)[1])}"

    def retype(self, table: str, c: Column) -> list[str] | None:
        """Change a column's type in place, its values converted (None: this kind cannot)."""
        target_type = self.type_info(table, c).target_type
        return [f"ALTER TABLE {self.table(table)} ALTER COLUMN {quote_ident(c.name)} TYPE {target_type}"]

    def create_worktable(self, name: str, columns: Sequence[str], kind: str = "temp") -> str:
        """``kind``: "temp" (dropped with the session) or "unlogged" (PostgreSQL, visible to other sessions)."""
        cols = ", ".join(f"{quote_ident(c)} {self.text_type}" for c in columns)
        prefix = {"temp": "CREATE TEMP TABLE", "unlogged": "CREATE UNLOGGED TABLE"}[kind]
        return f"{prefix} {name} ({cols})"

    def drop_table(self, name: str) -> str:
        return f"DROP TABLE IF EXISTS {name}"

    def truncate(self, table: str) -> str:
        return f"DELETE FROM {self.table(table)}"

    # -- set-based statements ---------------------------------------------------------------------------------------
    def _key_match(self, s: TableSchema, t: str, w: str, moved: bool = False) -> str:
        """``t``'s key equals the worktable ``w``'s key (or, ``moved``, its ``moved_from`` key)."""
        parts = []
        for i, k in enumerate(s.key):
            col = s.column(k)
            info = self.type_info(s.table, col)
            src = moved_col(i) if moved else key_col(i)
            parts.append(
                self.eq(*self.key_operands(f"{t}.{quote_ident(k)}", f"{w}.{src}", info, s.table, col), col.nullable)
            )
        if isinstance(s, HistoryShape) and s.open_column is not None:  # a key's current version
            parts.append(f"{t}.{quote_ident(s.open_column)} IS NULL")
        return " AND ".join(parts)

    def close_open(self, s: HistoryShape, end_lsn: int, end_at: str) -> str:
        """History mode's TRUNCATE: every current row ends, deleted (in versions: its version closed; soft
        deletes: marked)."""
        lsn_col, at_col = (s.end_lsn, s.end_at) if s.versions else (s.deleted_lsn, s.deleted_at)
        info = self.type_info(s.table, s.column(at_col))
        yes = self.conv(lit("t"), self.type_info(s.table, s.column(s.deleted)), s.table, s.deleted)
        return (
            f"UPDATE {self.table(s.table)} SET {quote_ident(lsn_col)} = {int(end_lsn)}, "
            f"{quote_ident(at_col)} = {self.conv(lit(end_at), info, s.table, at_col)}, "
            f"{quote_ident(s.deleted)} = {yes} WHERE {s.current}"
        )

    def open_versions(self, s: HistoryShape, start_lsn: int, start_at: str) -> str:
        """The rows a snapshot loaded (their version columns at their defaults) become versions opened at the
        snapshot's position."""
        info = self.type_info(s.table, s.column(s.start_at))
        return (
            f"UPDATE {self.table(s.table)} SET {quote_ident(s.start_lsn)} = {int(start_lsn)}, "
            f"{quote_ident(s.start_at)} = {self.conv(lit(start_at), info, s.table, s.start_at)} "
            f"WHERE {quote_ident(s.start_lsn)} = 0"
        )

    def key_operands(self, target: str, text: str, info: type_map.TypeInfo, table: str, col: Column) -> tuple[str, str]:
        """What a match on a key column compares: the target's column and the text value converted to its type."""
        return target, self.conv(text, info, table, col.name)

    def _mask_filter(self, w: str, masks: Sequence[str] | None) -> str:
        if masks is None:
            return ""
        return f" AND COALESCE({w}.{MASK_COL}, '') IN (" + ", ".join(lit(m) for m in masks) + ")"

    def join_delete(self, s: TableSchema, work: str, masks: Sequence[str] | None = None) -> str:
        """Delete the target rows whose key is in the worktable (deletes, or updates in mirror mode)."""
        tgt = self.table(s.table)
        match = self._key_match(s, "t", "w") + self._mask_filter("w", masks)
        return f"DELETE FROM {tgt} AS t USING {work} AS w WHERE {match}"

    def bag_delete(self, s: TableSchema, work: str) -> str:
        """A table without a key (a bag of rows): per distinct image in the worktable, delete as many of its copies
        at the target as the worktable holds rows for it (never more; fewer when the target has fewer)."""
        tgt, rid = self.table(s.table), self.row_id
        keys = ", ".join(key_col(i) for i in range(len(s.key)))
        images = f"(SELECT {keys}, count(*) AS ml_n, row_number() OVER () AS ml_g FROM {work} AS ml_w GROUP BY {keys})"
        copies = (
            f"SELECT t.{rid} AS ml_rid, w.ml_n AS ml_n, row_number() OVER (PARTITION BY w.ml_g) AS ml_rn "
            f"FROM {images} AS w JOIN {tgt} AS t ON {self._key_match(s, 't', 'w')}"
        )
        return f"DELETE FROM {tgt} WHERE {rid} IN (SELECT x.ml_rid FROM ({copies}) AS x WHERE x.ml_rn <= x.ml_n)"

    def join_update(
        self, s: TableSchema, work: str, set_cols: Sequence[str], masks: Sequence[str] | None, key_set: bool = False
    ) -> str:
        """Update the target rows whose key is in the worktable, writing only ``set_cols``. ``key_set``: the
        worktable also carries new key values by column name (a key-changing update, serial path)."""
        tgt = self.table(s.table)
        sets = ", ".join(
            f"{quote_ident(c)} = {self.conv(f'w.{quote_ident(c)}', self.type_info(s.table, s.column(c)), s.table, c)}"
            for c in set_cols
        )
        match = self._key_match(s, "t", "w") + self._mask_filter("w", masks)
        return f"UPDATE {tgt} AS t SET {sets} FROM {work} AS w WHERE {match}"

    def insert_select(
        self,
        s: TableSchema,
        work: str,
        cols: Sequence[str],
        masks: Sequence[str] | None = None,
        src: Mapping[str, str] | None = None,
        key_order: bool = False,
    ) -> str:
        """Insert the worktable's rows, converted; ``src`` maps a column to the worktable column holding it (the
        key columns of an update worktable). ``key_order``: in key order, where the engine gains by it
        (:attr:`ordered_inserts`, PostgreSQL). Worktables hold net rows in
        the compiler's hash order; inserted so, every row lands on a random page of the key's index (1M rows:
        3.2 s, against 2.1 s sorted first)."""
        tgt = self.table(s.table)
        src = src or {}
        exprs = ", ".join(
            self.conv(f"w.{quote_ident(src.get(c, c))}", self.type_info(s.table, s.column(c)), s.table, c) for c in cols
        )
        where = f" WHERE 1 = 1{self._mask_filter('w', masks)}" if masks is not None else ""
        names = ", ".join(quote_ident(c) for c in cols)
        order = ""
        if key_order and self.ordered_inserts and all(k in cols for k in s.key):
            order = " ORDER BY " + ", ".join(str(list(cols).index(k) + 1) for k in s.key)
        return f"INSERT INTO {tgt} ({names}) SELECT {exprs} FROM {work} AS w{where}{order}"

    def mirror_image(
        self,
        s: TableSchema,
        work: str,
        into: str,
        value_cols: Sequence[str],
        kept: frozenset[str],
        masks: Sequence[str],
    ) -> str:
        """Mirror mode, updates with unchanged columns: the full new images into a typed temp table ``into``, the
        unchanged columns taken from the target's existing row (read before it is deleted)."""
        exprs = [
            f"{self.conv(f'w.{key_col(i)}', self.type_info(s.table, s.column(k)), s.table, k)} AS {quote_ident(k)}"
            for i, k in enumerate(s.key)
        ]
        for c in value_cols:
            if c in kept:
                exprs.append(f"t.{quote_ident(c)} AS {quote_ident(c)}")
            else:
                info = self.type_info(s.table, s.column(c))
                exprs.append(f"{self.conv(f'w.{quote_ident(c)}', info, s.table, c)} AS {quote_ident(c)}")
        match = self._key_match(s, "t", "w") + self._mask_filter("w", masks)
        return (
            f"CREATE TEMP TABLE {into} AS SELECT {', '.join(exprs)} FROM {work} AS w "
            f"JOIN {self.table(s.table)} AS t ON {match}"
        )

    def moved_image(self, s: TableSchema, work: str, into: str, kept: frozenset[str], masks: Sequence[str]) -> str:
        """Inserts whose ``kept`` columns were not sent (a key-changing update): the full images into a typed temp
        table ``into``, those columns read from the target's row at ``moved_from`` (before the table's deletes)."""
        exprs = []
        for c in s.column_names:
            if c in kept:
                exprs.append(f"t.{quote_ident(c)} AS {quote_ident(c)}")
            else:
                info = self.type_info(s.table, s.column(c))
                exprs.append(f"{self.conv(f'w.{quote_ident(c)}', info, s.table, c)} AS {quote_ident(c)}")
        match = self._key_match(s, "t", "w", moved=True) + self._mask_filter("w", masks)
        return (
            f"CREATE TEMP TABLE {into} AS SELECT {', '.join(exprs)} FROM {work} AS w "
            f"JOIN {self.table(s.table)} AS t ON {match}"
        )

    def moved_missing(self, s: TableSchema, work: str, masks: Sequence[str]) -> str:
        """The first insert (by position) whose ``moved_from`` row is not at the target: key, moved_from, lsn, seq."""
        match = self._key_match(s, "t", "w", moved=True)
        keys = ", ".join(f"w.{quote_ident(k)}" for k in s.key)
        moved = ", ".join(f"w.{moved_col(i)}" for i in range(len(s.key)))
        order = ", ".join(f"CAST(w.{c} AS BIGINT)" for c in POS_COLS)
        return (
            f"SELECT {keys}, {moved}, w.{POS_COLS[0]}, w.{POS_COLS[1]} FROM {work} AS w "
            f"WHERE 1 = 1{self._mask_filter('w', masks)} AND NOT EXISTS "
            f"(SELECT 1 FROM {self.table(s.table)} AS t WHERE {match}) ORDER BY {order} LIMIT 1"
        )

    def has_masks(self, work: str) -> str:
        return f"SELECT 1 FROM {work} WHERE COALESCE({MASK_COL}, '') <> '' LIMIT 1"

    def insert_typed(self, s: TableSchema, work: str, cols: Sequence[str]) -> str:
        names = ", ".join(quote_ident(c) for c in cols)
        return f"INSERT INTO {self.table(s.table)} ({names}) SELECT {names} FROM {work}"

    def count_matches(self, s: TableSchema, work: str, masks: Sequence[str] | None) -> str:
        match = self._key_match(s, "t", "w") + self._mask_filter("w", masks)
        return f"SELECT count(*) FROM {work} AS w JOIN {self.table(s.table)} AS t ON {match}"

    def mask_counts(self, work: str) -> str:
        return f"SELECT COALESCE({MASK_COL}, ''), count(*) FROM {work} GROUP BY COALESCE({MASK_COL}, '')"

    def count(self, work: str) -> str:
        return f"SELECT count(*) FROM {work}"

    def one_row(self, columns: Sequence[str]) -> str:
        """A one-row 'worktable' of text parameters, for the serial path: ``(SELECT ? AS "a", ...)``."""
        return "(SELECT " + ", ".join(f"{self.text_param()} AS {quote_ident(c)}" for c in columns) + ")"

    # -- mirrorline's own tables ------------------------------------------------------------------------------------
    def create_state(self) -> str:
        t = self.text_type
        return (
            f"CREATE TABLE IF NOT EXISTS {self.own(STATE_TABLE)} (scope {t} PRIMARY KEY, lsn BIGINT NOT NULL, "
            f"seq BIGINT NOT NULL, end_lsn BIGINT NOT NULL, end_seq BIGINT NOT NULL, position {t}, "
            f"updated_at {t})"
        )

    def read_state(self) -> str:
        return f"SELECT scope, lsn, seq, end_lsn, end_seq, position FROM {self.own(STATE_TABLE)}"

    def upsert_state(self, rows: int = 1) -> str:
        """Set ``rows`` scopes (distinct) of the state table, 7 parameters each: scope, lsn, seq, end_lsn, end_seq,
        position, updated_at."""
        p = self.param
        values = ", ".join([f"({p}, {p}, {p}, {p}, {p}, {p}, {p})"] * rows)
        return (
            f"INSERT INTO {self.own(STATE_TABLE)} (scope, lsn, seq, end_lsn, end_seq, position, updated_at) "
            f"VALUES {values} ON CONFLICT (scope) DO UPDATE SET lsn = excluded.lsn, "
            f"seq = excluded.seq, end_lsn = excluded.end_lsn, end_seq = excluded.end_seq, "
            f"position = excluded.position, updated_at = excluded.updated_at"
        )

    def move_state(self) -> str:
        p = self.param
        return (
            f"UPDATE {self.own(STATE_TABLE)} SET lsn = {p}, seq = {p}, end_lsn = {p}, end_seq = {p}, updated_at = {p} "
            f"WHERE scope = {p}"
        )

    def delete_state(self) -> str:
        return f"DELETE FROM {self.own(STATE_TABLE)} WHERE scope = {self.param}"

    def insert_state_if_missing(self) -> str:
        p = self.param
        return (
            f"INSERT INTO {self.own(STATE_TABLE)} (scope, lsn, seq, end_lsn, end_seq, position, updated_at) "
            f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (scope) DO NOTHING"
        )

    def create_rejects(self) -> str:
        t = self.text_type
        return (
            f"CREATE TABLE IF NOT EXISTS {self.own(REJECTS_TABLE)} (lsn BIGINT NOT NULL, seq BIGINT NOT NULL, "
            f"position {t} NOT NULL, {quote_ident('table')} {t} NOT NULL, {quote_ident('key')} {t} NOT NULL, "
            f"op {t} NOT NULL, image {t}, error {t} NOT NULL, rejected_at {t} NOT NULL)"
        )

    def insert_reject(self) -> str:
        p = self.param
        return (
            f"INSERT INTO {self.own(REJECTS_TABLE)} (lsn, seq, position, {quote_ident('table')}, "
            f"{quote_ident('key')}, op, image, error, rejected_at) VALUES ({', '.join([p] * 9)})"
        )
