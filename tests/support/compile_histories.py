"""Hypothesis strategies for generated histories: a state before the unit and a valid sequence of changes on a few
tables, with every op kind, key changes, unchanged marks and TRUNCATEs; plus helpers to inject an invalid op and to
pack many independent histories into one unit (each under its own table names) so that one Spark job checks them all.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from hypothesis import strategies as st

from mirrorline.compile.reference import NetResult, State
from mirrorline.model import Change, Key, Op
from mirrorline.position import Position

KEYS = tuple(str(i) for i in range(5))
VALUES = ("x", "y", "z", None, "")
ACTION_SETS = ("IUD", "IUD", "IU", "UD", "ID", "I", "U", "D")
T = TypeVar("T")


@dataclass
class History:
    tables: list[str]
    state: State  # the source's state before the unit
    changes: list[Change]
    actions: dict[str, str] = field(default_factory=dict)
    replica: State | None = None  # the replica's state before the unit, when actions drop kinds

    @property
    def before(self) -> State:
        return self.replica if self.replica is not None else self.state


def _image(key: Key, a: str | None, b: str | None) -> dict[str, str | None]:
    return {"k": key[0], "a": a, "b": b}


class Picker:
    """Where the choices of a generated history come from: hypothesis (shrinks) or a seeded Random (cheap, for
    packing a hundred histories into one Spark job)."""

    def __init__(self, draw: st.DrawFn | None = None, rnd: random.Random | None = None) -> None:
        self.draw, self.rnd = draw, rnd

    def int(self, lo: int, hi: int) -> int:
        if self.draw is not None:
            return self.draw(st.integers(lo, hi))
        assert self.rnd is not None
        return self.rnd.randint(lo, hi)

    def choice(self, seq: Sequence[T]) -> T:
        return seq[self.int(0, len(seq) - 1)]

    def subset(self, seq: Sequence[T], max_size: int) -> list[T]:
        out: list[T] = []
        for _ in range(self.int(0, max_size)):
            x = self.choice(seq)
            if x not in out:
                out.append(x)
        return out


def build_history(pick: Picker, max_ops: int = 24, with_actions: bool = False) -> History:
    n_tables = pick.int(1, 3)
    tables = [f"public.t{i}" for i in range(n_tables)]
    state: State = {}
    for t in tables:
        present = pick.subset(KEYS, 4)
        state[t] = {(k,): _image((k,), pick.choice(VALUES), pick.choice(VALUES)) for k in present}
    cur = {t: dict(rows) for t, rows in state.items()}
    changes: list[Change] = []
    lsn, seq = 100, 0
    for _ in range(pick.int(0, max_ops)):
        t = tables[pick.int(0, n_tables - 1)]
        kind = pick.choice("IIIUUUUDDKT")
        pick_key, a, b = pick.int(0, 9), pick.choice(VALUES), pick.choice(VALUES)
        mark, txn = pick.int(0, 1), pick.int(1, 3)  # mark b unchanged; changes left in the transaction
        rows = cur[t]
        present = sorted(rows)
        absent = [(k,) for k in KEYS if (k,) not in rows]
        if kind == "T" and pick.int(0, 3) > 0:  # keep TRUNCATE rare
            kind = "U"
        if kind in "UDK" and not present:
            kind = "I"
        if kind in "IK" and not absent:
            kind = "U"
        p = Position(lsn, seq)
        if kind == "I":
            key = absent[pick_key % len(absent)]
            c = Change(p, 0, 1, t, Op.INSERT, key, _image(key, a, b))
            rows[key] = _image(key, a, b)
        elif kind == "U":
            key = present[pick_key % len(present)]
            new = {"k": key[0], "a": a} if mark else _image(key, a, b)
            c = Change(p, 0, 1, t, Op.UPDATE, key, new, frozenset({"b"}) if mark else frozenset())
            rows[key] = {**new, "b": rows[key].get("b")} if mark else new
        elif kind == "D":
            key = present[pick_key % len(present)]
            c = Change(p, 0, 1, t, Op.DELETE, key)
            del rows[key]
        elif kind == "K":  # a key change; with mark, b (TOASTed) not sent: the new row keeps the old row's b
            old, key = present[pick_key % len(present)], absent[pick_key % len(absent)]
            new = {"k": key[0], "a": a} if mark else _image(key, a, b)
            c = Change(p, 0, 1, t, Op.UPDATE, key, new, frozenset({"b"}) if mark else frozenset(), old_key=old)
            moved = rows.pop(old)
            rows[key] = {**new, "b": moved.get("b")} if mark else new
        else:
            c = Change(p, 0, 1, t, Op.TRUNCATE)
            rows.clear()
        changes.append(c)
        seq += 1
        if seq >= txn:
            lsn, seq = lsn + 1, 0
    h = History(tables, state, changes)
    if with_actions:
        h.actions = {t: pick.choice(ACTION_SETS) for t in tables}
        replica: State = {}
        for t in tables:
            rows = {k: dict(v) for k, v in state[t].items()}
            if "D" not in h.actions[t]:  # the replica may keep rows the source deleted before
                for k in pick.subset(KEYS, 3):
                    rows.setdefault((k,), _image((k,), "old", "old"))
            if "I" not in h.actions[t] and rows:  # the replica may lack rows the source inserted before
                for key in pick.subset(sorted(rows), 3):
                    rows.pop(key, None)
            replica[t] = rows
        h.replica = replica
    return h


@st.composite
def histories(draw: st.DrawFn, max_ops: int = 24, with_actions: bool = False) -> History:
    return build_history(Picker(draw=draw), max_ops, with_actions)


def random_histories(seed: int, n: int, with_actions: bool = False) -> list[History]:
    rnd = random.Random(seed)
    return [build_history(Picker(rnd=rnd), with_actions=with_actions) for _ in range(n)]


@dataclass
class Injected:
    history: History
    table: str
    key: Key
    first: tuple[str, Position]
    second: tuple[str, Position]


def inject(pick: Picker, h: History) -> Injected | None:
    """Inject one invalid op right after an op on the same key (I after I or U; U or D after D): the earliest error
    is exactly there. None when the history has no plain op to inject after."""
    candidates = [
        i for i, c in enumerate(h.changes) if c.op is not Op.TRUNCATE and not (c.op is Op.UPDATE and c.old_key)
    ]
    if not candidates:
        return None
    j = pick.choice(candidates)
    target = h.changes[j]
    op = pick.choice([Op.UPDATE, Op.DELETE]) if target.op is Op.DELETE else Op.INSERT
    new = _image(target.key, "bad", "bad") if op is not Op.DELETE else None
    bad = Change(target.pos, 0, 1, target.table, op, target.key, new)
    changes = [*h.changes[: j + 1], bad, *h.changes[j + 1 :]]
    changes = [replace(c, pos=Position(100 + i, 0)) for i, c in enumerate(changes)]  # one change per position
    return Injected(
        History(h.tables, h.state, changes),
        target.table,
        target.key,
        (target.op.value, Position(100 + j, 0)),
        (op.value, Position(101 + j, 0)),
    )


@st.composite
def invalid_histories(draw: st.DrawFn) -> Injected:
    pick = Picker(draw=draw)
    inj = inject(pick, build_history(pick, max_ops=16))
    if inj is None:
        inj = inject(pick, History(["public.t0"], {}, [Change(Position(100, 0), 0, 1, "public.t0", Op.DELETE, ("0",))]))
    assert inj is not None
    return inj


def prefixed(i: int, table: str) -> str:
    return f"h{i}.{table.partition('.')[2]}"


def pack(hs: list[History]) -> tuple[list[Change], dict[str, str]]:
    """Many histories as one unit: history i's tables become ``h<i>.<name>``, its positions shifted by i * 10^6."""
    changes: list[Change] = []
    actions: dict[str, str] = {}
    for i, h in enumerate(hs):
        for c in h.changes:
            changes.append(replace(c, table=prefixed(i, c.table), pos=Position(c.pos.lsn + i * 1_000_000, c.pos.seq)))
        for t, a in h.actions.items():
            actions[prefixed(i, t)] = a
    return changes, actions


def unpack(result: NetResult, i: int, hs: list[History]) -> NetResult:
    """History i's part of a packed result, with its own table names and positions."""
    names = {prefixed(i, t): t for t in hs[i].tables}
    shift = i * 1_000_000
    nets = {}
    for pt, net in result.nets.items():
        if pt in names:
            for kind in "DUI":
                rows = net.of(kind)
                for k, r in list(rows.items()):
                    rows[k] = replace(r, pos=Position(r.pos.lsn - shift, r.pos.seq))
            nets[names[pt]] = net
    return NetResult(
        [names[t] for t in result.tables if t in names],
        {names[t]: Position(p.lsn - shift, p.seq) for t, p in result.truncated.items() if t in names},
        nets,
    )


def normalized(state: Mapping[str, Mapping[Key, Mapping[str, str | None]]]) -> dict[str, dict[Key, dict]]:
    """Drop empty tables (a table the replay touched but left empty equals an absent one)."""
    return {t: {k: dict(v) for k, v in rows.items()} for t, rows in state.items() if rows}
