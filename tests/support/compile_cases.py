"""Named units of work and their expected net changes, shared by the reference tests and the Spark tests.

A unit is written one change per line: ``[table:] OP KEY [col=value ...] [~col ...]``; OP is I, U, D or T (TRUNCATE,
no key); KEY is ``1`` or ``1,2`` (composite) or ``OLD>NEW`` for an update that changes the key; ``col=NULL`` is SQL
NULL; ``~col`` marks the column unchanged (not sent). The change on line i is at position ``0/(base + i):0``. The
expected net changes are written the same way, per table in apply order (TRUNCATE first, then deletes, updates,
inserts by position), images without the key column, and ``<KEY`` for an insert's ``moved_from``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mirrorline.compile.reference import NetResult
from mirrorline.model import Change, Op
from mirrorline.position import Position

DEFAULT_TABLE = "public.t"


def pos(i: int, base: int = 0) -> Position:
    return Position(base + i, 0)


def unit(*lines: str, base: int = 0) -> list[Change]:
    out = []
    for i, line in enumerate(lines, start=1):
        table = DEFAULT_TABLE
        if ":" in line.split()[0]:
            table, _, line = line.partition(":")
            table = table if "." in table else f"public.{table}"
        words = line.split()
        op = Op(words[0])
        if op is Op.TRUNCATE:
            out.append(Change(pos(i, base), 0, 1, table, op))
            continue
        old_key = None
        spec = words[1]
        if ">" in spec:
            old, _, spec = spec.partition(">")
            old_key = tuple(None if v == "NULL" else v for v in old.split(","))
        key = tuple(None if v == "NULL" else v for v in spec.split(","))
        new: dict[str, str | None] | None = None
        unchanged = set()
        if op is not Op.DELETE:
            new = {f"k{j}" if j else "k": v for j, v in enumerate(key)}
            for w in words[2:]:
                if w.startswith("~"):
                    unchanged.add(w[1:])
                else:
                    col, _, val = w.partition("=")
                    new[col] = None if val == "NULL" else val
        out.append(Change(pos(i, base), 0, 1, table, op, key, new, frozenset(unchanged), old_key))
    return out


def render(result: NetResult) -> list[str]:
    """A result in the notation of the expected lines (images without the key columns)."""
    out = []
    for t in result.tables:
        short = t.removeprefix("public.")
        if t in result.truncated:
            out.append(f"{short}: T")
        net = result.nets[t]
        for kind in "DUI":
            for r in sorted(net.of(kind).values(), key=lambda r: r.pos):
                words = [f"{short}:", kind, ",".join("NULL" if v is None else v for v in r.key)]
                for col, val in sorted((r.new or {}).items()):
                    if col == "k" or (col.startswith("k") and col[1:].isdigit()):
                        continue
                    words.append(f"{col}={'NULL' if val is None else val}")
                words += [f"~{c}" for c in sorted(r.unchanged)]
                if r.moved_from is not None:
                    words.append("<" + ",".join("NULL" if v is None else v for v in r.moved_from))
                out.append(" ".join(words))
    return out


@dataclass
class Case:
    lines: tuple[str, ...]
    expected: list[str] | None = None  # None: an error is expected
    # the expected error: first op, its line, second op, its line, key, table
    error: tuple[str, int, str, int, tuple[str | None, ...], str] | None = None
    actions: Mapping[str, str] = field(default_factory=dict)

    def changes(self, base: int = 0) -> list[Change]:
        return unit(*self.lines, base=base)


def t(name: str) -> str:
    return f"public.{name}"


# fmt: off
CASES: dict[str, Case] = {
    # 000_1dffd1b17bf1086b.txt, Example 1: create table T(k int, c int), six ops on k = 1
    "seed000_example1": Case(
        ("I 1 c=10", "U 1 c=11", "D 1", "I 1 c=12", "D 1", "I 1 c=13"),
        ["t: I 1 c=13"],
    ),
    # 000_1dffd1b17bf1086b.txt, Example 2: three updates of k = 1 reduce to the last one
    "seed000_example2": Case(("U 1 c=14", "U 1 c=15", "U 1 c=16"), ["t: U 1 c=16"]),
    # 003_adea54c4fb31f98f.txt (the document's "keycolva13"/"keycolva11" are keycolval3/keycolval1, and its
    # truncated "VALUES (keycolval1;" is (keycolval1, othercolval1)): keys 1..4 stand for keycolval1..4.
    "seed003_net_effect": Case(
        (
            "TABLE1: I 1 othercol=othercolval1",
            "TABLE1: D 2",
            "TABLE2: D 1",
            "TABLE2: I 1 othercol=othercolval1",
            "TABLE1: U 3 othercol=othercolval3",
            "TABLE3: I 1 othercol=othercolval1",
            "TABLE2: I 2 othercol=othercolval2",
            "TABLE3: I 2 othercol=othercolval2",
            "TABLE2: I 3 othercol=othercolval3",
            "TABLE2: D 3",
            "TABLE1: I 4 othercol=othercolval4",
        ),
        [
            "TABLE1: D 2", "TABLE1: U 3 othercol=othercolval3",
            "TABLE1: I 1 othercol=othercolval1", "TABLE1: I 4 othercol=othercolval4",
            "TABLE2: D 1", "TABLE2: I 1 othercol=othercolval1", "TABLE2: I 2 othercol=othercolval2",
            "TABLE3: I 1 othercol=othercolval1", "TABLE3: I 2 othercol=othercolval2",
        ],
    ),
    # DESIGN §5, one rule each
    "insert_then_updates_is_insert_of_last_image": Case(("I 1 c=1", "U 1 c=2", "U 1 c=3"), ["t: I 1 c=3"]),
    "insert_then_delete_is_nothing": Case(("I 1 c=1", "U 1 c=2", "D 1"), []),
    "updates_are_last_update": Case(("U 1 c=1 d=x", "U 1 c=2 d=y"), ["t: U 1 c=2 d=y"]),
    "update_then_delete_is_delete": Case(("U 1 c=1", "U 1 c=2", "D 1"), ["t: D 1"]),
    "delete_then_insert_is_replace": Case(("D 1", "I 1 c=5"), ["t: D 1", "t: I 1 c=5"]),
    "delete_insert_updates_is_replace_with_last_image": Case(
        ("D 1", "I 1 c=5", "U 1 c=6"), ["t: D 1", "t: I 1 c=6"]
    ),
    "update_delete_insert_is_replace": Case(("U 1 c=1", "D 1", "I 1 c=2"), ["t: D 1", "t: I 1 c=2"]),
    "delete_insert_delete_is_delete": Case(("D 1", "I 1 c=2", "D 1"), ["t: D 1"]),
    "insert_delete_insert_is_insert": Case(("I 1 c=1", "D 1", "I 1 c=2"), ["t: I 1 c=2"]),
    "single_ops_pass_through": Case(("I 1 c=1", "U 2 c=2", "D 3"), ["t: D 3", "t: U 2 c=2", "t: I 1 c=1"]),
    "invalid_insert_after_insert": Case(("I 1 c=1", "U 2 c=1", "I 1 c=2"), error=("I", 1, "I", 3, ("1",), "public.t")),
    "invalid_insert_after_update": Case(("U 1 c=1", "I 1 c=2"), error=("U", 1, "I", 2, ("1",), "public.t")),
    "invalid_update_after_delete": Case(("D 1", "U 1 c=2"), error=("D", 1, "U", 2, ("1",), "public.t")),
    "invalid_delete_after_delete": Case(("U 1 c=0", "D 1", "D 1"), error=("D", 2, "D", 3, ("1",), "public.t")),
    "invalid_reports_the_earliest": Case(
        ("a: D 1", "b: I 7", "b: I 7", "a: D 1"), error=("I", 2, "I", 3, ("7",), "public.b")
    ),
    # unchanged (TOASTed, not sent) columns
    "unchanged_takes_earlier_value": Case(("U 1 c=1 d=x", "U 1 c=2 ~d"), ["t: U 1 c=2 d=x"]),
    "unchanged_takes_latest_value": Case(
        ("U 1 d=a", "U 1 d=b", "U 1 c=1 ~d", "U 1 c=2 ~d"), ["t: U 1 c=2 d=b"]
    ),
    "unchanged_never_seen_stays_marked": Case(("U 1 c=1 ~d", "U 1 c=2 ~d"), ["t: U 1 c=2 ~d"]),
    "unchanged_single_update_stays_marked": Case(("U 1 c=1 ~d ~e",), ["t: U 1 c=1 ~d ~e"]),
    "unchanged_partly_seen": Case(("U 1 c=1 d=x ~e", "U 1 c=2 ~d ~e"), ["t: U 1 c=2 d=x ~e"]),
    "unchanged_after_insert_takes_inserted_value": Case(("I 1 c=1 d=x", "U 1 c=2 ~d"), ["t: I 1 c=2 d=x"]),
    "unchanged_restarts_at_insert": Case(
        ("U 1 d=old", "D 1", "I 1 c=1 d=new", "U 1 c=2 ~d"), ["t: D 1", "t: I 1 c=2 d=new"]
    ),
    "unchanged_null_value_is_a_value": Case(("U 1 d=NULL", "U 1 c=2 ~d"), ["t: U 1 c=2 d=NULL"]),
    # key changes: D(old key), I(new key)
    "key_change_is_delete_and_insert": Case(("U 1>2 c=1",), ["t: D 1", "t: I 2 c=1"]),
    "key_change_then_update": Case(("U 1>2 c=1", "U 2 c=2"), ["t: D 1", "t: I 2 c=2"]),
    "key_change_of_inserted_row": Case(("I 1 c=1", "U 1>2 c=1"), ["t: I 2 c=1"]),
    "key_change_there_and_back": Case(("U 1>2 c=1", "U 2>1 c=2"), ["t: D 1", "t: I 1 c=2"]),
    "key_change_with_same_key_is_update": Case(("U 1>1 c=1",), ["t: U 1 c=1"]),
    # key changes whose TOASTed columns were not sent (~d): the new key takes the old row's values
    "key_change_unchanged_from_target": Case(("U 1>2 c=1 ~d",), ["t: D 1", "t: I 2 c=1 ~d <1"]),
    "key_change_unchanged_resolved_from_insert": Case(("I 1 c=0 d=x", "U 1>2 c=1 ~d"), ["t: I 2 c=1 d=x"]),
    "key_change_unchanged_resolved_from_update": Case(
        ("U 1 c=0 d=x", "U 1>2 c=1 ~d"), ["t: D 1", "t: I 2 c=1 d=x"]
    ),
    "key_change_unchanged_partly_seen": Case(
        ("U 1 d=x ~e", "U 1>2 c=1 ~d ~e"), ["t: D 1", "t: I 2 c=1 d=x ~e <1"]
    ),
    "key_change_unchanged_latest_value": Case(
        ("U 1 d=x", "U 1 d=y", "U 1 c=0 ~d", "U 1>2 c=1 ~d"), ["t: D 1", "t: I 2 c=1 d=y"]
    ),
    "key_change_unchanged_then_update_sends_it": Case(
        ("U 1>2 c=1 ~d", "U 2 c=2 d=y"), ["t: D 1", "t: I 2 c=2 d=y"]
    ),
    "key_change_unchanged_then_update_marks_it": Case(
        ("U 1>2 c=1 ~d", "U 2 c=2 ~d"), ["t: D 1", "t: I 2 c=2 ~d <1"]
    ),
    "key_change_chain_from_target": Case(("U 1>2 c=1 ~d", "U 2>3 c=2 ~d"), ["t: D 1", "t: I 3 c=2 ~d <1"]),
    "key_change_chain_of_three": Case(
        ("U 1>2 ~d", "U 2>3 ~d", "U 3>4 c=3 ~d"), ["t: D 1", "t: I 4 c=3 ~d <1"]
    ),
    "key_change_chain_resolved": Case(
        ("U 1 d=x", "U 1>2 c=1 ~d", "U 2>3 c=2 ~d"), ["t: D 1", "t: I 3 c=2 d=x"]
    ),
    "key_change_chain_resolved_midway": Case(
        ("U 1>2 c=1 ~d", "U 2 d=y", "U 2>3 c=2 ~d"), ["t: D 1", "t: I 3 c=2 d=y"]
    ),
    "key_change_unchanged_there_and_back": Case(
        ("U 1>2 c=1 ~d", "U 2>1 c=2 ~d"), ["t: D 1", "t: I 1 c=2 ~d <1"]
    ),
    "key_change_unchanged_swap": Case(
        ("U 1>9 ~d", "U 2>1 ~d", "U 9>2 ~d"), ["t: D 1", "t: D 2", "t: I 1 ~d <2", "t: I 2 ~d <1"]
    ),
    "key_change_unchanged_onto_deleted_key_is_replace": Case(
        ("D 2", "U 1>2 c=1 ~d"), ["t: D 2", "t: D 1", "t: I 2 c=1 ~d <1"]
    ),
    "key_change_unchanged_then_old_key_reinserted": Case(
        ("U 1 d=x", "U 1>2 c=1 ~d", "I 1 c=5 d=z"), ["t: D 1", "t: I 2 c=1 d=x", "t: I 1 c=5 d=z"]
    ),
    "key_change_unchanged_after_insert_marking_it_has_no_source": Case(
        ("I 1 c=1 ~d", "U 1>2 c=2 ~d"), ["t: I 2 c=2 ~d"]
    ),
    "key_change_unchanged_after_truncate": Case(
        ("T", "I 1 c=1 d=x", "U 1>2 c=2 ~d"), ["t: T", "t: I 2 c=2 d=x"]
    ),
    "key_change_onto_present_key_is_invalid": Case(
        ("U 2 c=0", "U 1>2 c=1"), error=("U", 1, "I", 2, ("2",), "public.t")
    ),
    # TRUNCATE
    "truncate_discards_earlier_changes": Case(
        ("I 1 c=1", "U 2 c=2", "D 3", "T", "I 4 c=4"), ["t: T", "t: I 4 c=4"]
    ),
    "truncate_then_insert_of_earlier_key_is_insert": Case(("U 1 c=1", "T", "I 1 c=2"), ["t: T", "t: I 1 c=2"]),
    "truncate_alone": Case(("T",), ["t: T"]),
    "truncate_twice_keeps_last": Case(("I 1 c=1", "T", "I 2 c=2", "T", "I 3 c=3"), ["t: T", "t: I 3 c=3"]),
    "truncate_only_its_table": Case(("a: I 1 c=1", "b: I 1 c=1", "b: T"), ["a: I 1 c=1", "b: T"]),
    "update_after_truncate_is_invalid": Case(("T", "U 1 c=1"), error=("T", 1, "U", 2, ("1",), "public.t")),
    "delete_after_truncate_is_invalid": Case(("I 1 c=1", "T", "D 1"), error=("T", 2, "D", 3, ("1",), "public.t")),
    "invalid_before_last_truncate_is_still_invalid": Case(
        ("T", "U 1 c=1", "T"), error=("T", 1, "U", 2, ("1",), "public.t")
    ),
    # order and keys
    "tables_in_first_seen_order": Case(
        ("b: I 1 c=1", "a: U 1 c=1", "c: D 1", "a: I 2 c=2", "b: U 1 c=2"),
        ["b: I 1 c=2", "a: U 1 c=1", "a: I 2 c=2", "c: D 1"],
    ),
    "deletes_then_updates_then_inserts_by_position": Case(
        ("I 3 c=1", "U 2 c=1", "D 1", "I 9 c=1", "D 5", "U 4 c=1"),
        ["t: D 1", "t: D 5", "t: U 2 c=1", "t: U 4 c=1", "t: I 3 c=1", "t: I 9 c=1"],
    ),
    "composite_key_with_null": Case(
        ("I 1,NULL c=1", "U 1,NULL c=2", "I 1,2 c=3"), ["t: I 1,NULL c=2", "t: I 1,2 c=3"]
    ),
    "null_values": Case(("I 1 c=NULL", "U 2 c=NULL"), ["t: U 2 c=NULL", "t: I 1 c=NULL"]),
    "empty_unit": Case((), []),
    # per-table actions
    "actions_without_delete_insert_after_insert_replaces": Case(
        ("I 1 c=1", "D 1", "I 1 c=2"), ["t: D 1", "t: I 1 c=2"], actions={"public.t": "IU"}
    ),
    "actions_without_delete_insert_is_replace": Case(
        ("I 1 c=1",), ["t: D 1", "t: I 1 c=1"], actions={"public.t": "IU"}
    ),
    "actions_without_delete_update_then_insert_replaces": Case(
        ("U 1 c=1", "D 1", "I 1 c=2", "U 1 c=3"), ["t: D 1", "t: I 1 c=3"], actions={"public.t": "IU"}
    ),
    "actions_without_delete_ignore_truncate": Case(
        ("U 1 c=1", "T", "I 2 c=2"), ["t: D 2", "t: U 1 c=1", "t: I 2 c=2"], actions={"public.t": "IU"}
    ),
    "actions_without_delete_key_change_only_inserts": Case(
        ("U 1>2 c=1",), ["t: D 2", "t: I 2 c=1"], actions={"public.t": "IU"}
    ),
    "actions_without_delete_key_change_unchanged": Case(
        ("U 1 d=x", "U 1>2 c=1 ~d", "U 3>4 c=1 ~d"),
        ["t: D 2", "t: D 4", "t: U 1 d=x", "t: I 2 c=1 d=x", "t: I 4 c=1 ~d <3"],
        actions={"public.t": "IU"},
    ),
    "actions_without_update_key_change_unchanged": Case(
        ("U 1 d=x", "U 1>2 c=1 ~d"), ["t: D 1", "t: I 2 c=1 ~d <1"], actions={"public.t": "ID"}
    ),
    "actions_without_insert_skip_after_delete": Case(
        ("U 1 c=1", "D 1", "I 1 c=2", "U 1 c=3", "D 1"), ["t: D 1"], actions={"public.t": "UD"}
    ),
    "actions_without_insert_skip_after_truncate": Case(
        ("U 1 c=1", "T", "I 1 c=2", "U 1 c=3"), ["t: T"], actions={"public.t": "UD"}
    ),
    "actions_without_insert_key_change_only_deletes": Case(("U 1>2 c=1",), ["t: D 1"], actions={"public.t": "UD"}),
    "actions_without_update": Case(("I 1 c=1", "U 1 c=2", "U 2 c=2"), ["t: I 1 c=1"], actions={"public.t": "ID"}),
    "actions_without_update_keep_key_changes": Case(
        ("U 1>2 c=1",), ["t: D 1", "t: I 2 c=1"], actions={"public.t": "ID"}
    ),
    "actions_updates_only": Case(
        ("I 1 c=1", "U 1 c=2", "D 1", "U 3 c=1"), ["t: U 1 c=2", "t: U 3 c=1"], actions={"public.t": "U"}
    ),
    "actions_drop_table_without_kept_changes": Case(
        ("a: I 1 c=1", "b: D 1", "a: D 2"), ["a: D 2", "a: I 1 c=1"], actions={"public.b": "I"}
    ),
    "actions_other_tables_stay_strict": Case(
        ("a: I 1 c=1", "b: I 1 c=1", "b: I 1 c=2"), error=("I", 2, "I", 3, ("1",), "public.b"),
        actions={"public.a": "IU"},
    ),
}
# fmt: on
