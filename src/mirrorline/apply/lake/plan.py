"""One table's net rows of a unit, planned against the table's current rows with DuckDB: the checks a database's
constraints make elsewhere (the row to delete or update is there, the key to insert is not), then the rows to write
(every column typed, each marked D / U / I / R), which the table's format commits as one commit."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from mirrorline.apply.lake.dialect import GROUP_COL, OP_COL, id_list
from mirrorline.apply.lake.session import Failure
from mirrorline.apply.sql import MASK_COL, MASK_SEP, key_col, lit, moved_col, parse_mask
from mirrorline.model import TableSchema, quote_ident
from mirrorline.position import Position

if TYPE_CHECKING:
    from mirrorline.apply.lake.target import LakeTarget

log = logging.getLogger(__name__)


class Plan:
    """One table's net rows of a unit against its current rows (``tgt``): the checks, then the rows to write (every
    column typed, ``_ml_op`` D / U / I / R (a delete and an insert of one key: the row replaced), ``_ml_group`` the
    U row's set of unsent columns, named in :attr:`masks`)."""

    def __init__(self, target: LakeTarget, ts: TableSchema, truncated: bool) -> None:
        self.target, self.ts, self.truncated = target, ts, truncated
        self.dialect = target.dialect
        self.mirror = target.mode == "mirror"
        self.rejected: dict[str, set[int]] = {"d": set(), "u": set(), "i": set()}  # row ids per worktable
        self.failures: list[Failure] = []  # what was set aside, in the order found
        self.masks: list[str] = []

    def _typed_key(self, alias: str, names: Sequence[str]) -> list[str]:
        return [
            self.dialect.convert(f"{alias}.{quote_ident(n)}", self.ts, self.ts.column(k))
            for k, n in zip(self.ts.key, names, strict=True)
        ]

    def _match(self, t: str, exprs: Sequence[str]) -> str:
        parts = []
        for k, e in zip(self.ts.key, exprs, strict=True):
            op = "IS NOT DISTINCT FROM" if self.ts.column(k).nullable else "="
            parts.append(f"{t}.{quote_ident(k)} {op} {e}")
        return " AND ".join(parts) or "TRUE"

    def _exists(self, exprs: Sequence[str]) -> str:
        if self.truncated:
            return "FALSE"
        return f"EXISTS (SELECT 1 FROM tgt t WHERE {self._match('t', exprs)})"

    def _fail(self, kind: str, row_id: int, failure: Failure) -> None:
        self.rejected[kind].add(row_id)
        self.failures.append(failure)

    def _pending(self, kind: str, alias: str = "w") -> str:
        """Not set aside already (a re-run after :meth:`bad_values` looks at the other rows only)."""
        return f"{alias}._ml_row NOT IN ({id_list(self.rejected[kind])})"

    def check(self, con: duckdb.DuckDBPyConnection) -> list[Failure]:
        """Set aside the net changes the table's current version cannot take; every failure so far."""
        ts, nk = self.ts, len(self.ts.key)
        wk = [key_col(i) for i in range(nk)]
        dkey = self._typed_key("w", wk)

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return con.sql(sql).fetchall()

        # a delete with an insert of the same key is a replace: the row is written whether it was there or not (a
        # table whose actions drop D sends every first insert of a key so, the row maybe kept at the target)
        replaced = (
            f"EXISTS (SELECT 1 FROM w_i i WHERE {self._pending('i', 'i')} AND "
            + " AND ".join(
                f"{self.dialect.convert('i.' + quote_ident(k), ts, ts.column(k))} IS NOT DISTINCT FROM {e}"
                for k, e in zip(ts.key, dkey, strict=True)
            )
            + ")"
        )
        for row in rows(
            f"SELECT _ml_row, {', '.join(wk)} FROM w_d w WHERE {self._pending('d')} AND NOT {replaced} "
            f"AND NOT {self._exists(dkey)} ORDER BY 1"
        ):
            self._fail(
                "d", row[0], Failure("D", list(row[1:]), "", "no row with this key at the target to delete", None)
            )
        need_u = "TRUE" if not self.mirror else f"w.{MASK_COL} <> ''"
        for row in rows(
            f"SELECT _ml_row, {', '.join(wk)} FROM w_u w WHERE {self._pending('u')} AND {need_u} "
            f"AND NOT {self._exists(dkey)} ORDER BY 1"
        ):
            self._fail(
                "u", row[0], Failure("U", list(row[1:]), "", "no row with this key at the target to update", None)
            )
        icols = [quote_ident(k) for k in ts.key]
        ikey = self._typed_key("w", list(ts.key))
        deleted = (
            f"EXISTS (SELECT 1 FROM w_d d WHERE {self._pending('d', 'd')} AND "
            + " AND ".join(
                f"{e} IS NOT DISTINCT FROM {self.dialect.convert('d.' + quote_ident(key_col(i)), ts, ts.column(k))}"
                for i, (k, e) in enumerate(zip(ts.key, ikey, strict=True))
            )
            + ")"
        )
        self._deleted = deleted
        pos = "w._ml_lsn, w._ml_seq"
        for row in rows(
            f"SELECT _ml_row, {pos}, {', '.join('w.' + c for c in icols)} FROM w_i w "
            f"WHERE {self._pending('i')} AND {self._exists(ikey)} AND NOT {deleted} ORDER BY 1"
        ):
            where = str(Position(int(row[1]), int(row[2])))
            self._fail(
                "i", row[0], Failure("I", list(row[3:]), where, "a row with this key is at the target already", None)
            )
        mk = self._typed_key("w", [moved_col(i) for i in range(nk)])
        moved_exists = f"EXISTS (SELECT 1 FROM tgt t WHERE {self._match('t', mk)})"
        moved = ", ".join(f"w.{quote_ident(moved_col(i))}" for i in range(nk))
        for row in rows(
            f"SELECT _ml_row, {', '.join('w.' + c for c in icols)}, {moved}, {pos}, w.{MASK_COL} FROM w_i w "
            f"WHERE {self._pending('i')} AND w.{MASK_COL} <> '' AND NOT {moved_exists} ORDER BY 1"
        ):
            err = self.target._moved_error(ts, row[1:-1], parse_mask(row[-1]))
            p = Position(int(row[1 + 2 * nk]), int(row[2 + 2 * nk]))
            self._fail("i", row[0], Failure("M", list(row[1 : 1 + nk]), str(p), err.message, None, err))
        return self.failures

    def bad_values(self, con: duckdb.DuckDBPyConnection) -> list[Failure]:
        """The rows holding a value that does not convert to its column's type (looked for once a conversion has
        failed), set aside like the rows that fail a check."""
        ts, nk = self.ts, len(self.ts.key)
        wk = [key_col(i) for i in range(nk)]
        value_cols = [c for c in ts.column_names if c not in ts.key]
        plans = [
            ("D", list(zip(wk, ts.key, strict=True)), wk, None),
            ("U", list(zip(wk, ts.key, strict=True)) + [(c, c) for c in value_cols], wk, None),
            (
                "I",
                [(c, c) for c in ts.column_names] + [(moved_col(i), k) for i, k in enumerate(ts.key)],
                list(ts.key),
                "w._ml_lsn, w._ml_seq",
            ),
        ]
        found = len(self.failures)
        for kind, cols, keys, pos in plans:
            rejected = self.rejected[kind.lower()]
            for name, column in cols:
                col = ts.column(column)
                info = self.dialect.type_info(ts.table, col)
                bad = self.dialect.bad_value(f"w.{quote_ident(name)}", info)
                if bad is None:
                    continue
                sql = (
                    f"SELECT _ml_row, {pos or 'NULL, NULL'}, w.{quote_ident(name)}, "
                    f"{', '.join('w.' + quote_ident(k) for k in keys)} FROM w_{kind.lower()} w "
                    f"WHERE {bad} AND _ml_row NOT IN ({id_list(rejected)}) ORDER BY 1"
                )
                for row in con.sql(sql).fetchall():
                    where = str(Position(int(row[1]), int(row[2]))) if row[1] is not None else ""
                    what = (
                        f"{ts.table}.{column}: {row[3]!r} is not a valid {col.type_name} value for a "
                        f"{self.dialect.title} {info.target_type} column"
                    )
                    self._fail(kind.lower(), row[0], Failure(kind, list(row[4:]), where, what, None))
        return self.failures[found:]

    def source(self, con: duckdb.DuckDBPyConnection) -> pa.Table:
        """The rows to write (rejected rows left out)."""
        ts, nk = self.ts, len(self.ts.key)
        cols = list(ts.column_names)
        wk = [key_col(i) for i in range(nk)]
        dkey = self._typed_key("w", wk)

        def conv(alias: str, c: str) -> str:
            return self.dialect.convert(f"{alias}.{quote_ident(c)}", ts, ts.column(c))

        not_in = {k: f"_ml_row NOT IN ({id_list(v)})" for k, v in self.rejected.items()}
        replaced = (
            f"EXISTS (SELECT 1 FROM w_i i WHERE i._ml_row NOT IN ({id_list(self.rejected['i'])}) AND "
            + " AND ".join(f"{conv('i', k)} IS NOT DISTINCT FROM {e}" for k, e in zip(ts.key, dkey, strict=True))
            + ")"
        )
        # UNION ALL matches columns by position: every part lists them in the table's order, the key where it is
        keys_as = {k: f"{e} AS {quote_ident(k)}" for k, e in zip(ts.key, dkey, strict=True)}
        deleted = [keys_as.get(c) or f"NULL AS {quote_ident(c)}" for c in cols]
        updated = [keys_as.get(c) or f"{conv('w', c)} AS {quote_ident(c)}" for c in cols]
        parts = [
            f"SELECT {', '.join(deleted)}, 'D' AS {OP_COL}, '' AS {MASK_COL} FROM w_d w "
            f"WHERE {not_in['d']} AND NOT {replaced}",
            f"SELECT {', '.join(updated)}, 'U' AS {OP_COL}, w.{MASK_COL} AS {MASK_COL} FROM w_u w WHERE {not_in['u']}",
        ]
        op = f"CASE WHEN {self._deleted} THEN 'R' ELSE 'I' END AS {OP_COL}"
        plain = [conv("w", c) + " AS " + quote_ident(c) for c in cols]
        parts.append(
            f"SELECT {', '.join(plain)}, {op}, '' AS {MASK_COL} FROM w_i w WHERE {not_in['i']} AND w.{MASK_COL} = ''"
        )
        mk = self._typed_key("w", [moved_col(i) for i in range(nk)])
        completed = [
            f"CASE WHEN list_contains(string_split(w.{MASK_COL}, {lit(MASK_SEP)}), {lit(c)}) THEN m.{quote_ident(c)} "
            f"ELSE {conv('w', c)} END AS {quote_ident(c)}"
            for c in cols
        ]
        parts.append(
            f"SELECT {', '.join(completed)}, {op}, '' AS {MASK_COL} FROM w_i w JOIN tgt m ON {self._match('m', mk)} "
            f"WHERE {not_in['i']} AND w.{MASK_COL} <> ''"
        )
        sql = " UNION ALL ".join(f"({p})" for p in parts)
        src = con.sql(sql).to_arrow_table()
        schema = self.dialect.arrow_schema(ts)
        src = pa.table(
            {**{c: src[c].cast(schema.field(c).type) for c in cols}, OP_COL: src[OP_COL], MASK_COL: src[MASK_COL]}
        )
        self.masks = sorted(set(pc.unique(pc.fill_null(src[MASK_COL], "")).to_pylist()))
        group = pc.index_in(pc.fill_null(src[MASK_COL], ""), value_set=pa.array(self.masks, pa.string()))
        return src.drop_columns([MASK_COL]).append_column(GROUP_COL, group)


class BagPlan(Plan):
    """A table without a key (a bag of rows): the unit's net rows are copies of images to delete (``w_d``, one row
    per copy) and to insert (``w_i``). A delete by the image removes every row holding it, so each image that loses
    copies is deleted whole and the copies it keeps are inserted again, in the same commit."""

    def _images(self) -> str:
        wk = ", ".join(key_col(i) for i in range(len(self.ts.key)))
        return (
            f"(SELECT {wk}, count(*) AS ml_n, min(_ml_row) AS ml_r, row_number() OVER () AS ml_g FROM w_d w "
            f"WHERE {self._pending('d')} GROUP BY {wk})"
        )

    def _copies(self) -> str:
        """Each target row holding an image the unit deletes copies of: its image's ``ml_r``, ``ml_n`` and its rank
        ``ml_rn`` among the image's copies."""
        ikey = self._typed_key("i", [key_col(i) for i in range(len(self.ts.key))])
        cols = ", ".join(f"t.{quote_ident(c)}" for c in self.ts.column_names)
        return (
            f"SELECT {cols}, i.ml_r, i.ml_n, row_number() OVER (PARTITION BY i.ml_g) AS ml_rn "
            f"FROM {self._images()} AS i JOIN tgt t ON {self._match('t', ikey)}"
        )

    def check(self, con: duckdb.DuckDBPyConnection) -> list[Failure]:
        if self.truncated:  # nothing is there to delete: the unit's deletes were of copies it inserted itself
            return self.failures
        wk = [key_col(i) for i in range(len(self.ts.key))]
        sql = (
            f"SELECT i.ml_r, i.ml_n, coalesce(c.have, 0), {', '.join('i.' + k for k in wk)} FROM {self._images()} i "
            f"LEFT JOIN (SELECT ml_r, max(ml_rn) AS have FROM ({self._copies()}) GROUP BY ml_r) c ON c.ml_r = i.ml_r "
            "WHERE coalesce(c.have, 0) < i.ml_n ORDER BY 1"
        )
        for row in con.sql(sql).fetchall():
            what = f"the target holds {row[2]} copies of this row, the unit deletes {row[1]}"
            self._fail("d", row[0], Failure("D", list(row[3:]), "", what, None))
        return self.failures

    def source(self, con: duckdb.DuckDBPyConnection) -> pa.Table:
        ts = self.ts
        cols = list(ts.column_names)
        ikey = self._typed_key("i", [key_col(i) for i in range(len(ts.key))])
        parts = [
            f"SELECT {', '.join(f'{e} AS {quote_ident(k)}' for k, e in zip(ts.key, ikey, strict=True))}, "
            f"'D' AS {OP_COL} FROM {self._images()} AS i"
        ]
        if not self.truncated:  # the copies each image keeps go back
            parts.append(
                f"SELECT {', '.join(quote_ident(c) for c in cols)}, 'I' AS {OP_COL} FROM ({self._copies()}) "
                "WHERE ml_rn > ml_n"
            )
        plain = ", ".join(
            f"{self.dialect.convert('w.' + quote_ident(c), ts, ts.column(c))} AS {quote_ident(c)}" for c in cols
        )
        parts.append(f"SELECT {plain}, 'I' AS {OP_COL} FROM w_i w WHERE {self._pending('i')}")
        src = con.sql(" UNION ALL ".join(f"({p})" for p in parts)).to_arrow_table()
        schema = self.dialect.arrow_schema(ts)
        self.masks = [""]
        return pa.table(
            {
                **{c: src[c].cast(schema.field(c).type) for c in cols},
                OP_COL: src[OP_COL],
                GROUP_COL: pa.array([0] * src.num_rows, pa.int32()),
            }
        )
