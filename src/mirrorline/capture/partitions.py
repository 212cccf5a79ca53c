"""What happens to a partitioned table's partitions that logical decoding does not send.

A configured partitioned table is published through its root (``publish_via_partition_root``): its rows' changes
come as the root's. Four events change which rows the root holds and send nothing:

- ``ATTACH PARTITION`` of a table that holds rows: the root gains them;
- ``DETACH PARTITION`` of a partition that holds rows, or ``DROP TABLE`` of a partition: the root loses them;
- ``TRUNCATE`` of a partition alone (a TRUNCATE of the root is sent): the root loses that partition's rows.

Capture looks at each configured partitioned table's leaves every few seconds (:func:`changes` compares two looks)
and decides, with a few reads at the source, which of the changes found lost rows or brought rows the targets do not
have (:class:`Finding`). Such a table's rows at the targets are then not the source's; the targets stop it until it
is loaded again (``TableSchema.resync``). A partition created empty (``CREATE TABLE ... PARTITION OF``), a detached
partition that held no rows, or a partition rewritten by ``VACUUM FULL`` or ``CLUSTER`` (its rows keep their
``xmin``) is nothing to stop for.

How a change is told:

- attached or created: the leaf holds a row whose ``xmin`` is older than its ``pg_class`` row (which ``ATTACH``
  updates, and ``CREATE`` writes): rows from before it became a partition;
- its storage replaced (``relfilenode``) with its columns unchanged, while it held pages at the last look, and no row
  older than its ``pg_class`` row (which ``TRUNCATE`` updates; ``VACUUM FULL`` keeps its rows' ``xmin``): truncated,
  unless the log holds a TRUNCATE of the root committed between the two looks (:class:`Suspect`, settled once the
  log has everything up to the later look).

Pure: the reads are :class:`~mirrorline.capture.source.TypeNames`'; the state kept between runs is
:func:`to_json` / :func:`from_json`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["added", "removed", "refilled"]


@dataclass(frozen=True)
class Leaf:
    """One leaf partition as a look found it."""

    relid: int
    name: str  # "schema.name" when looked at
    filenode: int  # pg_class.relfilenode: replaced by TRUNCATE, VACUUM FULL, CLUSTER and rewriting ALTERs
    size: int  # bytes of its heap: 0 when it held no row since the last look
    columns: str  # its columns and their types: a change means an ALTER rewrote it


# a partitioned table's leaves by relid; a look: every configured partitioned table's, by the root's relid
Leaves = Mapping[int, Leaf]
Tree = Mapping[int, Leaves]


@dataclass(frozen=True)
class Change:
    """A leaf that appeared, went or had its storage replaced between two looks."""

    kind: Kind
    root: int
    leaf: Leaf  # as seen last (removed), or now

    def describe(self, how: str = "") -> str:
        what = {"added": "attached with rows", "removed": how or "detached", "refilled": "truncated"}[self.kind]
        return f"partition {self.leaf.name} {what}"


def changes(before: Tree, now: Tree) -> list[Change]:
    """What differs between two looks, for the roots both looks found (a root the last look lacks is new to capture:
    nothing is known of it). A refilled leaf that held no pages at the last look is left out: the targets hold no row
    of it (but what came in the seconds between; README, "Partitioned tables")."""
    out: list[Change] = []
    for root in sorted(set(before) & set(now)):
        b, n = before[root], now[root]
        for relid in sorted(set(n) - set(b)):
            out.append(Change("added", root, n[relid]))
        for relid in sorted(set(b) - set(n)):
            out.append(Change("removed", root, b[relid]))
        for relid in sorted(set(b) & set(n)):
            was, leaf = b[relid], n[relid]
            if leaf.filenode != was.filenode and leaf.columns == was.columns and was.size > 0:
                out.append(Change("refilled", root, leaf))
    return out


@dataclass(frozen=True)
class Suspect:
    """A partition whose storage was replaced between two looks: truncated alone, unless the log holds a TRUNCATE of
    its root committed between ``since`` (before the earlier look) and ``lsn`` (after the later one)."""

    root: int
    leaf: Leaf
    since: int
    lsn: int


@dataclass(frozen=True)
class Look:
    """The last look, kept between runs: the source's positions before and after it, the leaves it found, and the
    suspects not settled yet."""

    since: int
    lsn: int
    tree: Tree
    suspects: tuple[Suspect, ...] = ()


def _leaf_json(x: Leaf) -> list[Any]:
    return [x.relid, x.name, x.filenode, x.size, x.columns]


def _leaf(r: Any) -> Leaf:
    return Leaf(int(r[0]), str(r[1]), int(r[2]), int(r[3]), str(r[4]))


def to_json(look: Look) -> dict[str, Any]:
    return {
        "since": look.since,
        "lsn": look.lsn,
        "roots": {str(root): [_leaf_json(x) for x in leaves.values()] for root, leaves in look.tree.items()},
        "suspects": [[s.root, _leaf_json(s.leaf), s.since, s.lsn] for s in look.suspects],
    }


def from_json(d: Mapping[str, Any]) -> Look:
    """ValueError when ``d`` is not a look."""
    try:
        tree = {int(root): {int(r[0]): _leaf(r) for r in rows} for root, rows in d["roots"].items()}
        sus = tuple(Suspect(int(s[0]), _leaf(s[1]), int(s[2]), int(s[3])) for s in d.get("suspects", ()))
        return Look(int(d["since"]), int(d["lsn"]), tree, sus)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        raise ValueError(f"not a look at partitions: {e}") from None
