"""Following a source table's schema change at a target: what the target must do to go from the logged
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
from dataclasses import dataclass, replace

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
    # a rebuild's new shape (the unit's schema plus the columns the target keeps) and, per column, the column of the
    # table today its values come from (None: a new column, its rows set to ``missing_value``)
    shape: TableSchema | None = None
    sources: tuple[tuple[str, str | None], ...] = ()

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
            return f"{self.old} (the table built again)"
        return f"column {c.name} changed from {self.old} to {c.type_name}"


class SchemaChangeStop(ApplyError):
    """A schema change the target does not follow: the target stops before the unit, nothing of it applied."""


class ResyncStop(SchemaChangeStop):
    """The table's rows changed at the source with nothing logged (``TableSchema.resync``): only loading it again
    brings the target back to the source (``run`` does so by itself)."""


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
    rebuild: bool = False,
) -> list[Step]:
    """The steps that take the target's table (its columns ``have``) from ``old`` (the shape it has; None: unknown,
    so only columns it lacks are added) to ``new``. Raises :class:`SchemaChangeStop` for a change the target does not
    follow. A table without a key (indexed on its columns), and every table with ``rebuild`` (a kind that cannot
    alter a column an index depends on), is built again in one step for any change but added columns."""
    missing = [c for c in new.columns if c.name not in have]
    if old is not None and old.relid and new.relid and old.relid != new.relid:
        raise stop(
            new,
            target,
            f"{new.table} is another table at the source now (relation {old.relid}, then {new.relid}: dropped and "
            "created again, or another table renamed to its name), whose rows the target does not have",
        )
    if old is not None and new.resync and old.resync != new.resync:
        raise ResyncStop(
            f"target {target}: {new.table} at the source changed without a change logged ({new.resync}): the "
            "target's rows of it are not the source's any more",
            hint=_reload(new.table, target),
            target=target,
            table=new.table,
        )
    if (
        old is None
        or old == new
        or (old.columns == new.columns and set(old.key) == set(new.key) and old.bag == new.bag)
    ):
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
    # (a key is a set of columns: the snapshot reads the primary key's order, pgoutput the columns' order)
    if not (old.bag and new.bag) and ({renamed.get(k, k) for k in old.key} != set(new.key) or old.bag != new.bag):
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
    # drops first, then renames, then adds (``DROP b, ADD b`` in one statement is a new column b), then the rest;
    # a step the target's columns already reflect (made before a crash, by an older mirrorline) needs nothing
    order = {"drop": 0, "rename": 1, "add": 2}
    steps.sort(key=lambda s: order.get(s.kind, 3))
    cur = set(have)
    out = []
    for s in steps:
        if s.kind == "drop":
            if s.old not in cur:
                continue
            cur.discard(s.old)
        elif s.kind == "rename":
            if s.old not in cur or s.column.name in cur:
                continue
            cur.discard(s.old)
            cur.add(s.column.name)
        elif s.kind == "add":
            if s.column.name in cur:
                continue
            cur.add(s.column.name)
        out.append(s)
    # a column the target lacks that no step makes (a table created by an older version): added, before a rebuild
    extra = [Step("add", c) for c in new.columns if c.name not in cur]
    at = next((i for i, s in enumerate(out) if s.kind == "rekey"), len(out))
    out = out[:at] + extra + out[at:]
    if any(s.kind != "add" for s in out) and (rebuild or (old.bag and new.bag)):
        return [as_rebuild(old, new, out, have)]
    return out


def as_rebuild(old: TableSchema, new: TableSchema, steps: Sequence[Step], have: Sequence[str]) -> Step:
    """``steps`` (from :func:`plan`) made as one rebuild: a table of the new shape (plus the columns the target keeps
    that the source dropped), each column filled from the one it was (renamed, retyped) or as a new column."""
    origin: dict[str, str | None] = {h: h for h in have}
    for s in steps:
        if s.kind == "drop":
            origin.pop(s.old, None)
        elif s.kind == "rename":
            origin[s.column.name] = origin.pop(s.old, s.old)
        elif s.kind == "add":
            origin[s.column.name] = None
    names = set(new.column_names)
    kept = tuple(o for o in old.columns if o.name in origin and o.name not in names and origin[o.name] is not None)
    shape = replace(new, columns=new.columns + kept)
    what = "; ".join(s.describe() for s in steps)
    return Step(
        "rebuild",
        Column(", ".join(new.key) if not new.bag else "every column", ""),
        what,
        shape=shape,
        sources=tuple((c.name, origin.get(c.name)) for c in shape.columns),
    )


def stop(new: TableSchema, target: str, what: str) -> SchemaChangeStop:
    """The error that stops ``target`` before a unit: ``new.table``'s schema changed (``what``)."""
    return SchemaChangeStop(
        f"target {target}: the schema of {new.table} changed at the source: {what}",
        hint=_reload(new.table, target),
        target=target,
        table=new.table,
    )
