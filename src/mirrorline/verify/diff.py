"""``verify --diff``: narrowing a table's difference down to its rows, as data-diff tools do. Pure.

Each side's rows (canonical text, :mod:`mirrorline.apply.canonical`) are summed into buckets chosen by a hash of
the row's key: a row changed, missing or extra on one side changes only its key's bucket. The buckets whose (count,
checksum) differ are read again from both sides, and their rows are matched by key: a key on the source only is
*missing* at the target, on the target only *extra*, on both with other values *changed* (the columns that differ,
with both values). Tables without a key are matched on every column (as multisets: a row twice on one side and once
on the other is one row missing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mirrorline.apply.canonical import row_hash

BUCKETS = 4096


def bucket_of(key: Sequence[str | None], buckets: int = BUCKETS) -> int:
    return row_hash(key) % buckets


@dataclass
class Buckets:
    """Per bucket, the row count and the sum of row hashes (mod 2^64)."""

    count: np.ndarray = field(default_factory=lambda: np.zeros(BUCKETS, np.int64))
    total: np.ndarray = field(default_factory=lambda: np.zeros(BUCKETS, np.uint64))

    def add(self, rows: Iterable[Sequence[str | None]], key: Sequence[int]) -> None:
        n = len(self.count)
        ids, hashes = [], []
        for r in rows:
            ids.append(bucket_of([r[i] for i in key], n))
            hashes.append(row_hash(r))
        if ids:
            at = np.array(ids, np.int64)
            np.add.at(self.count, at, 1)
            np.add.at(self.total, at, np.array(hashes, np.uint64))  # wraps modulo 2^64

    def merge(self, other: Buckets) -> None:
        self.count += other.count
        self.total += other.total

    def to_json(self) -> dict[str, list[int]]:
        return {"count": self.count.tolist(), "total": [int(x) for x in self.total]}

    @classmethod
    def from_json(cls, d: dict[str, list[int]]) -> Buckets:
        return cls(np.array(d["count"], np.int64), np.array(d["total"], np.uint64))

    def differing(self, other: Buckets) -> set[int]:
        diff = (self.count != other.count) | (self.total != other.total)
        return {int(i) for i in np.nonzero(diff)[0]}


def in_buckets(rows: Iterable[Sequence[str | None]], key: Sequence[int], wanted: set[int]) -> list[tuple[Any, ...]]:
    """The rows whose key falls in one of the ``wanted`` buckets."""
    return [tuple(r) for r in rows if bucket_of([r[i] for i in key]) in wanted]


@dataclass(frozen=True)
class RowDiff:
    kind: str  # "missing" (at the target), "extra" (at the target), "changed"
    key: tuple[str | None, ...]
    columns: dict[str, tuple[str | None, str | None]]  # the columns that differ: (source value, target value)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": list(self.key), "columns": {c: list(v) for c, v in self.columns.items()}}

    def text(self, key_names: Sequence[str]) -> str:
        key = ", ".join(f"{k}={_show(v)}" for k, v in zip(key_names, self.key, strict=True))
        if self.kind == "changed":
            vals = "; ".join(
                f"{c} {_show(s)} at the source, {_show(t)} at the target" for c, (s, t) in self.columns.items()
            )
        else:
            side = 0 if self.kind == "missing" else 1
            vals = ", ".join(f"{c}={_show(v[side])}" for c, v in self.columns.items())
        return f"{self.kind} {key}{': ' + vals if vals else ''}"


def _show(v: str | None, width: int = 60) -> str:
    if v is None:
        return "NULL"
    return repr(v if len(v) <= width else v[: width - 3] + "...")


def compare(
    source: Iterable[Sequence[str | None]],
    target: Iterable[Sequence[str | None]],
    columns: Sequence[str],
    key: Sequence[int],
    limit: int,
    shown: Iterable[Sequence[str | None]] | None = None,
) -> tuple[list[RowDiff], int]:
    """The rows that differ (up to ``limit`` of them, in key order) and how many differ in all. ``source`` is
    compared as the target holds it; ``shown`` (its rows in the same order): the source's values to report."""
    held = [tuple(r) for r in source]
    show: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    if shown is not None:
        show = {r: tuple(o) for r, o in zip(held, shown, strict=True)}
    src: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    tgt: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for rows, out in ((held, src), (target, tgt)):
        for r in rows:
            out.setdefault(tuple(r[i] for i in key), []).append(tuple(r))
    found: list[RowDiff] = []
    for k in sorted(set(src) | set(tgt), key=lambda k: tuple((v is None, v or "") for v in k)):
        a, b = Counter(src.get(k, [])), Counter(tgt.get(k, []))
        only_a, only_b = list((a - b).elements()), list((b - a).elements())
        while only_a and only_b:  # the same key on both sides with other values
            ra, rb = only_a.pop(0), only_b.pop(0)
            sa = show.get(ra, ra)
            cols = {c: (s, y) for c, x, s, y in zip(columns, ra, sa, rb, strict=True) if x != y}
            found.append(RowDiff("changed", k, cols))
        keyed = set(key)  # a missing or extra row shows its other columns' values
        found.extend(
            RowDiff(
                "missing",
                k,
                {c: (v, None) for i, (c, v) in enumerate(zip(columns, show.get(r, r), strict=True)) if i not in keyed},
            )
            for r in only_a
        )
        found.extend(
            RowDiff(
                "extra", k, {c: (None, v) for i, (c, v) in enumerate(zip(columns, r, strict=True)) if i not in keyed}
            )
            for r in only_b
        )
    return found[:limit], len(found)
