"""Following a source table's schema change at a target (issue 14): what the target must do to go from the logged
schema version it follows to the unit's, or why it must stop. Pure: schemas in, steps or an error out.

A rename is told from a drop and an add by the column's attnum, which capture reads from the source's catalog when it
sees the Relation message (pgoutput sends only names). A type change is followed when it widens (every value of the
old type is a value of the new one, with the same text): integers to larger integers or numeric, real to double,
varchar(n) to a longer varchar or text, numeric(p,s) to a numeric that holds as many digits on both sides of the
point, or to unconstrained numeric. A changed key (primary key or replica identity) is followed by building the
table again with the new key, its rows copied; if they cannot be told apart by it, that fails and stops.

Anything else stops the target, naming what changed and the command that reloads the table: a narrowing or other
type change, an added column whose existing values PostgreSQL wrote by rewriting the table (they are not in the
log), and, with ``on_schema_change = "stop"``, every change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mirrorline.errors import ApplyError
from mirrorline.model import Column, TableSchema


@dataclass(frozen=True)
class Step:
    """One change to the target's table: ``add`` (``column``, its existing rows set to ``column.missing_value``),
    ``drop`` (``old``), ``rename`` (``old`` to ``column.name``), ``retype`` (``column`` to its new type, ``old``:
    the old type), ``rekey`` (the table built again with the new schema's key; ``old`` and ``column.name`` describe
    the keys), ``rebuild`` (a table without a key built again without the dropped columns ``old``)."""

    kind: str
    column: Column
    old: str = ""

    def describe(self) -> str:
        c = self.column
        if self.kind == "add":
            return f"column {c.name} ({c.type_name}) added"
        if self.kind == "drop":
            return f"column {self.old} dropped"
        if self.kind == "rename":
            return f"column {self.old} renamed to {c.name}"
        if self.kind == "rekey":
            return f"key changed from ({self.old}) to ({c.name})"
        if self.kind == "rebuild":
            return f"column(s) {self.old} dropped (the table built again without them)"
        return f"column {c.name} changed from {self.old} to {c.type_name}"


class SchemaChangeStop(ApplyError):
    """A schema change the target does not follow: the target stops before the unit, nothing of it applied."""


_INTS = {"smallint": 1, "integer": 2, "bigint": 3}
_NUMERIC = re.compile(r"^numeric(?:\((\d+)(?:,(\d+))?\))?$")
_VARCHAR = re.compile(r"^character varying(?:\((\d+)\))?$")


def widens(old: str, new: str) -> bool:
    """Does every value of the PostgreSQL type ``old`` keep its text as a value of ``new``?"""
    if old == new:
        return True
    if old in _INTS and new in _INTS:
        return _INTS[new] >= _INTS[old]
    n = _NUMERIC.match(new)
    if old in _INTS and n is not None:
        return n.group(1) is None or int(n.group(1)) - int(n.group(2) or 0) >= {1: 5, 2: 10, 3: 19}[_INTS[old]]
    if old == "real" and new == "double precision":
        return True
    o = _VARCHAR.match(old)
    if o is not None:
        v = _VARCHAR.match(new)
        return new == "text" or (
            v is not None and (v.group(1) is None or (o.group(1) is not None and int(v.group(1)) >= int(o.group(1))))
        )
    o = _NUMERIC.match(old)
    if o is not None and n is not None:
        if n.group(1) is None:
            return True
        if o.group(1) is None:
            return False
        p, s, p2, s2 = int(o.group(1)), int(o.group(2) or 0), int(n.group(1)), int(n.group(2) or 0)
        return s2 >= s and p2 - s2 >= p - s
    return False


def _key_text(s: TableSchema) -> str:
    return "every column" if s.bag else ", ".join(s.key)


def _reload(table: str, target: str) -> str:
    return f"reload the table: mirrorline snapshot --target {target} --table {table}"


def plan(
    old: TableSchema | None,
    new: TableSchema,
    have: Sequence[str],
    *,
    target: str,
    keep_dropped: bool = False,
    follow: bool = True,
) -> list[Step]:
    """The steps that take the target's table (its columns ``have``) from ``old`` (the version it follows; None:
    unknown, so only columns it lacks are added) to ``new``. Raises :class:`SchemaChangeStop` for a change the
    target does not follow."""
    missing = [c for c in new.columns if c.name not in have]
    if old is None or old == new or (old.columns == new.columns and old.key == new.key and old.bag == new.bag):
        return [Step("add", c) for c in missing]
    steps: list[Step] = []
    by_num = {c.attnum: c for c in old.columns if c.attnum}
    matched: set[str] = set()
    for c in new.columns:
        o = by_num.get(c.attnum) if c.attnum else None
        if o is None and c.name in old.column_names and not (c.attnum and old.column(c.name).attnum):
            o = old.column(c.name)  # one side has no attnum (a log written before they were recorded): by name
        if o is None:
            if c.default_unlogged:
                raise stop(
                    new,
                    target,
                    f"column {c.name} was added with a default PostgreSQL computed for every "
                    "existing row (a table rewrite, which logical decoding does not send)",
                )
            steps.append(Step("add", c))
            continue
        matched.add(o.name)
        if o.name != c.name:
            steps.append(Step("rename", c, o.name))
        if o.type_name != c.type_name:
            if not widens(o.type_name, c.type_name):
                raise stop(
                    new,
                    target,
                    f"column {c.name} changed type from {o.type_name} to {c.type_name}, which "
                    "does not hold every value of the old type as it was",
                )
            steps.append(Step("retype", c, o.type_name))
    gone = [o for o in old.columns if o.name not in matched]
    added = [s for s in steps if s.kind == "add"]
    if gone and added and not all(c.attnum for c in (*gone, *(s.column for s in added))):
        raise stop(
            new,
            target,
            f"columns {', '.join(o.name for o in gone)} left and "
            f"{', '.join(s.column.name for s in added)} arrived, and the log does not say whether they were "
            "renamed (no attnum recorded)",
        )
    steps += [Step("drop", o, o.name) for o in gone]
    if not follow and steps:
        raise stop(new, target, "; ".join(s.describe() for s in steps) + ' (on_schema_change = "stop")')
    if keep_dropped:
        steps = [s for s in steps if s.kind != "drop"]
    renamed = {s.old: s.column.name for s in steps if s.kind == "rename"}
    dropped = [s.old for s in steps if s.kind == "drop" and s.old in have]
    if old.bag and new.bag and dropped:
        # a table without a key is indexed on its columns, which some kinds refuse to drop a column from: built again
        steps = [s for s in steps if s.kind != "drop"]
        steps.append(Step("rebuild", Column(", ".join(dropped), ""), ", ".join(dropped)))
    elif not (old.bag and new.bag) and (tuple(renamed.get(k, k) for k in old.key) != new.key or old.bag != new.bag):
        # the rows are matched by the new key from here on: the table is built again with it (its rows copied,
        # which fails, and stops, if they cannot be told apart by it)
        rekey = Step("rekey", Column(", ".join(new.key) if not new.bag else "every column", ""), _key_text(old))
        if not follow:
            raise stop(new, target, rekey.describe() + ' (on_schema_change = "stop")')
        if keep_dropped and any(o.name not in matched for o in old.columns):
            raise stop(
                new,
                target,
                f"{rekey.describe()} while its dropped columns are kept (dropped_columns = "
                '"keep"): building it again with the new key would lose them',
            )
        steps.append(rekey)
    # a column the target already reflects (the step was done before a crash) needs nothing
    out = []
    for s in steps:
        if s.kind == "add" and s.column.name in have:
            continue
        if s.kind in ("rename", "drop") and s.old not in have:
            continue
        out.append(s)
    # a column the target lacks that no step makes (a table created by an older version): added, before a rebuild
    made = {s.column.name for s in out if s.kind in ("add", "rename")}
    extra = [Step("add", c) for c in missing if c.name not in made and not any(s.old == c.name for s in out)]
    at = next((i for i, s in enumerate(out) if s.kind in ("rekey", "rebuild")), len(out))
    return out[:at] + extra + out[at:]


def stop(new: TableSchema, target: str, what: str) -> SchemaChangeStop:
    """The error that stops ``target`` before a unit: ``new.table``'s schema changed (``what``)."""
    return SchemaChangeStop(
        f"target {target}: the schema of {new.table} changed at the source: {what}",
        hint=_reload(new.table, target),
        target=target,
        table=new.table,
    )
