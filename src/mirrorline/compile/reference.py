"""The net-change rules of DESIGN §5 in plain Python: the oracle for the Spark compiler, small and obviously right.

One unit of work's changes fold, per table and key, in log order, into one net change:

=====================================  ==========================================================================
ops on one key (log order)             net change
=====================================  ==========================================================================
I, then any U                          I with the last image
I … D (row ends absent)                nothing
U, U, …                                U with the last image (unchanged columns: see below)
U … D                                  D
D, I (then any U)                      D then I with the last image ("replace")
I after I or U, U after D, D after D   :class:`~mirrorline.errors.InvalidSequenceError` naming both positions
=====================================  ==========================================================================

The fold is a small state machine per key: the first op tells whether the row existed before the unit (I: absent; U
or D: present), each op moves it between present and absent, and the net change is read from (before, after, was the
row replaced on the way). Details:

- **Key changes.** An update whose ``old_key`` is set and differs from ``key`` is D(old_key) then I(key, image), both
  at the update's position (the D first).
- **Unchanged columns.** A U's image is its sent columns; each column it marks unchanged takes the value the row had
  just before it in the unit (the latest value seen), and stays marked when the unit never saw one. The running image
  restarts at every I.
- **Key changes with unchanged columns.** The I of a key change takes, for each column it marks unchanged, the latest
  value the old key's row had in the unit before the change; the columns the unit never saw stay marked, and the net
  I names in ``moved_from`` the key whose row *at the target, before the unit* holds them: the old key, or, when the
  old key's row itself came from a key change in the unit (a chain a->b->c), that change's source (resolved in log
  order). Apply reads them from there before the table's deletes. A plain I that marks columns (not something
  pgoutput sends) has no source: they stay marked, ``moved_from`` None.
- **TRUNCATE** discards the table's earlier net changes in the unit, marks the table truncated (applied first, before
  its deletes, updates and inserts) and folding restarts from an *empty* table: the first op on a key after it must be
  an I (a U or D names the TRUNCATE as the op it cannot follow). Ops before the last TRUNCATE are still checked.
- **Positions.** Each net row carries the position of the last change folded into it; the D of a replace carries the
  position of the change that removed the old row (the D right before the last I, or that I itself when it replaced
  the row without a D, see below).
- **Per-table actions** (any of ``I``, ``U``, ``D``; default all) keep only those kinds, after key changes are split
  (so with ``"IU"`` a key change only inserts the new key, with ``"UD"`` it only deletes the old one). A TRUNCATE is a
  delete of every row: it is kept only when ``D`` is. Dropping kinds turns valid histories into sequences the table
  above calls invalid; the fold then follows what the replica the user asked for holds:

  * without ``D`` the replica keeps rows the source deleted, so an I may meet a row that is still there: an I after
    I or U *replaces* the row (D then I, like D, I), and an I that starts the key's ops in the unit is emitted as a
    replace too (the row may survive from an earlier unit), unless a TRUNCATE emptied the table before it;
  * without ``I`` the replica never gets rows inserted at the source, so a U or D after the row is gone (a D, or the
    TRUNCATE) is a no-op and is skipped, as the set-based apply of a missing key would be.

  With all three kinds the table above is strict, errors included.
- **Tables without a key** (``bags``: a table's key is then every column, :attr:`TableSchema.bag`) are bags of
  rows: duplicates are allowed, an I adds one copy of its image, a D removes one, a key-changing update does both,
  and order does not matter. The net change per distinct image is a count: ``count`` copies to delete (kind D) or
  to insert (kind I, its image the key's values), at the position of the image's last change. After a TRUNCATE a
  count below zero is invalid (the TRUNCATE and the first D are named).
- **Output.** Tables in the order of their first (kept) change in the unit; per table net deletes, updates and
  inserts, each keyed by the row key.

:func:`replay` and :func:`apply_net` give the invariant that the property tests check: for any valid state before the
unit, ``apply_net(state, fold(changes)) == replay(state, changes)``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mirrorline.errors import InvalidSequenceError
from mirrorline.model import Change, Key, Op, Value, kept_kinds
from mirrorline.position import Position

ALL_ACTIONS = frozenset("IUD")
Actions = Mapping[str, Collection[str]]
State = dict[str, dict[Key, dict[str, Value]]]


@dataclass(frozen=True)
class NetRow:
    kind: str  # "D", "U" or "I"
    key: Key
    new: Mapping[str, Value] | None  # None for D
    unchanged: frozenset[str]  # for U (and an I from a key change): columns still to keep from the target
    pos: Position
    moved_from: Key | None = None  # for an I with unchanged columns: the key whose row at the target supplies them
    count: int = 1  # a bag table's D or I: how many copies of the image to delete or insert


@dataclass
class TableNet:
    deletes: dict[Key, NetRow] = field(default_factory=dict)
    updates: dict[Key, NetRow] = field(default_factory=dict)
    inserts: dict[Key, NetRow] = field(default_factory=dict)

    def of(self, kind: str) -> dict[Key, NetRow]:
        return {"D": self.deletes, "U": self.updates, "I": self.inserts}[kind]


@dataclass
class NetResult:
    tables: list[str]
    truncated: dict[str, Position]
    nets: dict[str, TableNet]

    def operations(self) -> list[tuple[str, str, Key | None, dict[str, Value] | None]]:
        """The apply order: per table in ``tables`` order its TRUNCATE, then deletes, updates and inserts, each kind
        in the order of its rows' positions. ``(table, kind, key, image)``; TRUNCATE has kind "T" and key None."""
        out: list[tuple[str, str, Key | None, dict[str, Value] | None]] = []
        for t in self.tables:
            if t in self.truncated:
                out.append((t, "T", None, None))
            net = self.nets.get(t, TableNet())
            for kind in "DUI":
                for r in sorted(net.of(kind).values(), key=lambda r: r.pos):
                    out.append((t, kind, r.key, dict(r.new) if r.new is not None else None))
        return out

    def rows(
        self,
    ) -> set[tuple[str, str, Key, tuple[tuple[str, Value], ...] | None, frozenset[str], Position, Key | None, int]]:
        """Every net row as a hashable tuple (for comparisons)."""
        return {
            (
                t,
                r.kind,
                r.key,
                tuple(sorted(r.new.items())) if r.new is not None else None,
                r.unchanged,
                r.pos,
                r.moved_from,
                r.count,
            )
            for t, net in self.nets.items()
            for kind in "DUI"
            for r in net.of(kind).values()
        }


def actions_of(actions: Actions | None, table: str) -> frozenset[str]:
    """The kinds of change ``table`` replicates (every kind unless ``actions`` names it)."""
    if actions is None or table not in actions:
        return ALL_ACTIONS
    return frozenset(a.upper() for a in actions[table])


def normalised(actions: Actions | None) -> dict[str, frozenset[str]]:
    """``actions`` as upper-case sets, only the tables that do not replicate every kind."""
    out: dict[str, frozenset[str]] = {}
    for table in actions or {}:
        a = actions_of(actions, table)
        if a != ALL_ACTIONS:
            out[table] = a
    return out


def kept_changes(changes: Iterable[Change], actions: Actions | None) -> Iterator[Change]:
    """The changes as the replica the tables' actions describe goes through them, one by one (apply's failure path
    re-applies these): a change whose effective ops are all dropped is left out; a key change whose D is dropped
    becomes an INSERT of the new key (``old_key`` kept: columns it does not send come from the old key's row), one
    whose I is dropped a DELETE of the old key."""
    for c in changes:
        kept = kept_kinds(actions_of(actions, c.table))
        if c.op is Op.TRUNCATE:
            if "T" in kept:
                yield c
            continue
        ops = split_ops(c)
        kinds = [kind for kind, _, _ in ops if kind in kept]
        if len(kinds) == len(ops):
            yield c
        elif kinds == ["I"]:
            yield replace(c, op=Op.INSERT)
        elif kinds == ["D"]:
            yield replace(c, op=Op.DELETE, key=ops[0][1], new=None, unchanged=frozenset(), old_key=None)


def split_ops(c: Change) -> list[tuple[str, Key, Change]]:
    """The effective ops of one change: ``(kind, key, change)``; a key-changing update is D(old key), I(new key)."""
    if c.op is Op.UPDATE and c.old_key is not None and tuple(c.old_key) != tuple(c.key):
        return [("D", tuple(c.old_key), c), ("I", tuple(c.key), c)]
    return [(c.op.value, tuple(c.key), c)]


def marks(c: Change) -> frozenset[str]:
    """The columns a change marks unchanged; one that is also sent (not something pgoutput does) counts as sent."""
    return c.unchanged - frozenset(c.new or ()) if c.unchanged else c.unchanged


Handoff = tuple[dict[str, Value], frozenset[str], Key | None]  # values found, columns left, their source key


@dataclass
class _KeyFold:
    before: str | None = None  # "absent", "present" or "maybe" (only without D: the row may survive on the replica)
    present: bool | None = None  # None until the first op when nothing is known
    prev: tuple[str, Position] | None = None  # the last effective op (or the TRUNCATE), for errors
    removed_at: Position | None = None  # for the D of a replace
    image: dict[str, Value] | None = None
    unchanged: frozenset[str] = frozenset()
    source: Key | None = None  # the key whose row at the target (before the unit) holds the unchanged columns
    pos: Position | None = None

    def handoff(self, key: Key, cols: frozenset[str]) -> Handoff:
        """What a key change moving this row away gives the new key for ``cols``: the latest values seen, the
        columns left, and the key at the target that holds those."""
        if not self.present:  # nothing seen in the unit (or a row the unit removed: the change is invalid anyway)
            return {}, cols, key
        image = self.image or {}
        found = {col: image[col] for col in cols if col in image}
        rest = cols - frozenset(found)
        return found, rest, self.source if rest else None

    def step(
        self, table: str, key: Key, kind: str, c: Change, acts: frozenset[str], hand: Handoff | None = None
    ) -> None:
        strict_insert = "D" in acts  # an I on a present row is an error (else it replaces the row)
        strict_update = "I" in acts  # a U or D on an absent row is an error (else it is skipped)
        if self.present is None:  # first op, nothing known: the op tells what was there before the unit
            if kind == "I":
                self.before = "absent" if strict_insert else "maybe"
                self.present = not strict_insert
            else:
                self.before, self.present, self.source = "present", True, key
        if kind == "I":
            if self.present and strict_insert:
                self._fail(table, key, kind, c)
            if self.prev is not None and self.prev[0] == "D":
                self.removed_at = self.prev[1]
            elif self.present:
                self.removed_at = c.pos
            self.present = True
            self.image = dict(c.new or {})
            self.unchanged = marks(c)
            self.source = None
            if hand is not None:  # a key change: the old key's row supplies the columns not sent
                found, self.unchanged, self.source = hand
                self.image.update(found)
        elif not self.present:  # U or D on an absent row
            if strict_update:
                self._fail(table, key, kind, c)
            return
        elif kind == "U":
            old = self.image or {}
            image = dict(c.new or {})
            for col in marks(c):
                if col in old:
                    image[col] = old[col]
            self.unchanged = frozenset(col for col in marks(c) if col not in old)  # never seen: stays marked
            self.image = image
        else:  # D
            self.present = False
            self.image = None
            self.unchanged = frozenset()
        self.prev = (kind, c.pos)
        self.pos = c.pos

    def _fail(self, table: str, key: Key, kind: str, c: Change) -> None:
        first_op, first_pos = self.prev if self.prev is not None else ("?", None)
        raise InvalidSequenceError(table, key, first_op, first_pos, kind, c.pos)

    def net(self, key: Key) -> list[NetRow]:
        if self.pos is None:  # every op was skipped
            return []
        if not self.present:
            return [] if self.before == "absent" else [NetRow("D", key, None, frozenset(), self.pos)]
        moved_from = self.source if self.unchanged else None
        insert = NetRow("I", key, dict(self.image or {}), self.unchanged, self.pos, moved_from)
        if self.before == "absent":
            return [insert]
        if self.before == "present" and self.removed_at is None:
            return [NetRow("U", key, dict(self.image or {}), self.unchanged, self.pos)]
        assert self.removed_at is not None
        return [NetRow("D", key, None, frozenset(), self.removed_at), insert]


Bags = Mapping[str, Sequence[str]]  # the tables without a key: table -> its columns (the key's names, in order)


@dataclass
class _BagFold:
    count: int = 0
    pos: Position | None = None
    first_d: Position | None = None  # after a TRUNCATE: the first D, for the error


def fold(changes: Iterable[Change], actions: Actions | None = None, bags: Bags | None = None) -> NetResult:
    """Fold one unit's changes (in log order) into net row changes per table. Raises InvalidSequenceError."""
    tables: list[str] = []
    truncated: dict[str, Position] = {}
    keys: dict[str, dict[Key, _KeyFold]] = {}
    counts: dict[str, dict[Key, _BagFold]] = {}
    bags = bags or {}
    for c in sorted(changes, key=lambda c: c.pos):
        acts = actions_of(actions, c.table)
        if c.op is Op.TRUNCATE:
            if "T" not in kept_kinds(acts):
                continue
            truncated[c.table] = c.pos
            keys[c.table] = {}
            counts[c.table] = {}
            if c.table not in tables:
                tables.append(c.table)
            continue
        ops = split_ops(c)
        if c.table in bags:
            for kind, key, _ in ops:
                if kind not in acts:
                    continue
                if c.table not in tables:
                    tables.append(c.table)
                bf = counts.setdefault(c.table, {}).setdefault(key, _BagFold())
                bf.count += {"I": 1, "D": -1}.get(kind, 0)
                bf.pos = c.pos
                if kind == "D" and bf.first_d is None:
                    bf.first_d = c.pos
            continue
        hand: Handoff | None = None
        if len(ops) == 2 and marks(c):  # a key change not sending some columns: the old key's row holds them
            old = ops[0][1]
            old_st = keys.get(c.table, {}).get(old)
            hand = old_st.handoff(old, marks(c)) if old_st is not None else ({}, marks(c), old)
        for kind, key, ch in ops:
            if kind not in acts:
                continue
            if c.table not in tables:
                tables.append(c.table)
            per_key = keys.setdefault(c.table, {})
            st = per_key.get(key)
            if st is None:
                st = per_key[key] = _KeyFold()
                if c.table in truncated:  # the table was emptied: the row is known absent
                    st.before, st.present, st.prev = "absent", False, ("T", truncated[c.table])
            st.step(c.table, key, kind, ch, acts, hand if kind == "I" else None)
    nets: dict[str, TableNet] = {}
    for t in tables:
        net = nets[t] = TableNet()
        for key, st in keys.get(t, {}).items():
            for r in st.net(key):
                net.of(r.kind)[key] = r
        for key, bf in counts.get(t, {}).items():
            if bf.count < 0 and t in truncated:
                raise InvalidSequenceError(t, key, "T", truncated[t], "D", bf.first_d)
            if bf.count and bf.pos is not None:
                image = dict(zip(bags[t], key, strict=True)) if bf.count > 0 else None
                net.of("I" if bf.count > 0 else "D")[key] = NetRow(
                    "I" if bf.count > 0 else "D", key, image, frozenset(), bf.pos, None, abs(bf.count)
                )
    return NetResult(tables, truncated, nets)


def replay(state: State, changes: Iterable[Change], actions: Actions | None = None) -> State:
    """Apply the changes one by one to a copy of ``state`` (table -> {key: row}), as the source (or, with actions, the
    replica that keeps only those kinds) went through them. Raises InvalidSequenceError on an op the state refuses."""
    out: State = {t: {k: dict(v) for k, v in rows.items()} for t, rows in state.items()}
    last: dict[tuple[str, Key], tuple[str, Position]] = {}  # the last op on each key, for errors
    truncated_at: dict[str, Position] = {}
    for c in sorted(changes, key=lambda c: c.pos):
        acts = actions_of(actions, c.table)
        rows = out.setdefault(c.table, {})
        if c.op is Op.TRUNCATE:
            if "T" in kept_kinds(acts):
                rows.clear()
                truncated_at[c.table] = c.pos
                for tk in [tk for tk in last if tk[0] == c.table]:
                    del last[tk]
            continue
        moved_from: dict[str, Value] = {}
        for kind, key, ch in split_ops(c):
            if kind not in acts:
                if kind == "D":  # a key change whose delete is dropped: the new row still takes the old values
                    moved_from = rows.get(key, {})
                continue
            if kind == "I":
                if key in rows and "D" in acts:
                    _refuse(c, key, kind, last, truncated_at)
                image = dict(ch.new or {})
                for col in marks(ch):
                    if col in moved_from:
                        image[col] = moved_from[col]
                rows[key] = image
            elif key not in rows:
                if "I" in acts:
                    _refuse(c, key, kind, last, truncated_at)
                continue
            elif kind == "U":
                image = dict(ch.new or {})
                for col in marks(ch):
                    if col in rows[key]:
                        image[col] = rows[key][col]
                rows[key] = image
            else:
                moved_from = rows.pop(key)
            last[(c.table, key)] = (kind, c.pos)
    return out


def _refuse(
    c: Change,
    key: Key,
    kind: str,
    last: Mapping[tuple[str, Key], tuple[str, Position]],
    truncated: Mapping[str, Position],
) -> None:
    before = ("T", truncated[c.table]) if c.table in truncated else ("state", None)
    first_op, first_pos = last.get((c.table, key), before)
    raise InvalidSequenceError(c.table, key, first_op, first_pos, kind, c.pos)


def apply_net(state: State, result: NetResult) -> State:
    """Apply a net result to a copy of ``state`` the way a set-based apply does: per table the inserts' unchanged
    columns read from the rows at their ``moved_from`` (a missing row is a KeyError), TRUNCATE, then deletes (missing
    keys: nothing), updates (missing keys: nothing; unchanged columns keep the row's value), inserts (a key that is
    present is a duplicate-key error, raised as KeyError)."""
    out: State = {t: {k: dict(v) for k, v in rows.items()} for t, rows in state.items()}
    for t in result.tables:
        rows = out.setdefault(t, {})
        images: dict[Key, dict[str, Value]] = {}
        for key, r in result.nets.get(t, TableNet()).inserts.items():
            images[key] = dict(r.new or {})
            if r.unchanged and r.moved_from is not None:
                src = rows.get(r.moved_from)
                if src is None:
                    raise KeyError(f"no row {r.moved_from} in {t} to take {sorted(r.unchanged)} of {key} from")
                images[key].update({col: src[col] for col in r.unchanged if col in src})
        if t in result.truncated:
            rows.clear()
        net = result.nets.get(t, TableNet())
        for key in net.deletes:
            rows.pop(key, None)
        for key, r in net.updates.items():
            if key in rows:
                image = dict(r.new or {})
                for col in r.unchanged:
                    if col in rows[key]:
                        image[col] = rows[key][col]
                rows[key] = image
        for key in net.inserts:
            if key in rows:
                raise KeyError(f"duplicate key {key} inserted into {t}")
            rows[key] = images[key]
    return out


def from_rows(
    tables: list[str], truncated: Mapping[str, Position], rows: Iterable[Mapping[str, Any]], bags: Bags | None = None
) -> NetResult:
    """A NetResult from net rows in the NetBatch layout (table, kind, key, new, unchanged, lsn, seq, moved_from);
    a bag table's rows repeated for each copy become one row with its ``count``."""
    nets: dict[str, TableNet] = {t: TableNet() for t in tables}
    for r in rows:
        new = r["new"]
        if new is not None and not isinstance(new, dict):
            new = dict(new)
        key: Key = tuple(r["key"])
        moved = r.get("moved_from")
        row = NetRow(
            str(r["kind"]),
            key,
            new,
            frozenset(r["unchanged"] or ()),
            Position(int(r["lsn"]), int(r["seq"])),
            tuple(moved) if moved is not None else None,
        )
        table = nets.setdefault(str(r["table"]), TableNet()).of(row.kind)
        if key in table:
            if r["table"] in (bags or {}) and table[key].count and table[key].pos == row.pos:
                table[key] = replace(row, count=table[key].count + 1)
                continue
            raise ValueError(f"two net {row.kind} rows for {r['table']} key {key}")
        table[key] = row
    return NetResult(list(tables), dict(truncated), nets)


def mirror(result: NetResult) -> NetResult:
    """The "mirror" form (DESIGN §6, 003_adea54c4fb31f98f.txt): every update becomes a delete and an insert (whose
    unchanged columns come from the row's own key at the target: ``moved_from``)."""
    nets: dict[str, TableNet] = {}
    for t, net in result.nets.items():
        out = nets[t] = TableNet(dict(net.deletes), {}, dict(net.inserts))
        for key, r in net.updates.items():
            out.deletes[key] = NetRow("D", key, None, frozenset(), r.pos)
            out.inserts[key] = NetRow("I", key, r.new, r.unchanged, r.pos, key if r.unchanged else None)
    return NetResult(list(result.tables), dict(result.truncated), nets)
