"""What ``verify`` found: per target and table, the row counts and checksums of both sides at the verification
position, with ``--diff`` the differing rows; and how it is shown (text for a person, JSON for a script).

Pure data: :mod:`mirrorline.verify.run` fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mirrorline.position import Position, format_lsn
from mirrorline.verify.diff import RowDiff


@dataclass
class TableCheck:
    table: str
    source_rows: int | None  # None: the table is gone from the source (renamed, dropped): not compared
    source_sum: int | None
    target_rows: int | None  # None: the target lacks the table (or, gone from the source, it was not read)
    target_sum: int | None
    note: str = ""
    key: list[str] = field(default_factory=list)  # the columns rows are matched on (--diff)
    diffs: list[RowDiff] | None = None  # --diff: the first differing rows, in key order
    differing_rows: int = 0  # --diff: how many rows differ (at least, when not ``exact``)
    exact: bool = True
    # why the table is not compared row for row (its ``actions`` let the target keep what the source changed), when
    # its rows differ: reported, never a difference
    not_comparable: str = ""
    compared: str = ""  # what of the target's table was compared, when not all of it ("current versions")

    @property
    def same(self) -> bool:
        if self.source_rows is None:
            return False
        return (self.source_rows, self.source_sum) == (self.target_rows, self.target_sum) and not self.note

    @property
    def equal(self) -> bool:
        return self.same or bool(self.not_comparable and (self.target_rows is not None or self.source_rows is None))

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "equal": self.equal,
            "source_rows": self.source_rows,
            "source_checksum": f"{self.source_sum:016x}" if self.source_sum is not None else None,
            "target_rows": self.target_rows,
            "target_checksum": f"{self.target_sum:016x}" if self.target_sum is not None else None,
            "note": self.note or None,
            **({"compared": self.compared} if self.compared else {}),
            **({"not_comparable": self.not_comparable} if self.not_comparable and not self.same else {}),
            **(
                {
                    "differing_rows": self.differing_rows,
                    "differing_rows_exact": self.exact,
                    "key": self.key,
                    "rows": [d.to_json() for d in self.diffs],
                }
                if self.diffs is not None
                else {}
            ),
        }


@dataclass
class TargetCheck:
    target: str
    position: Position
    tables: list[TableCheck] = field(default_factory=list)
    error: str = ""  # the target could not be compared (not loaded...)

    @property
    def differing(self) -> list[str]:
        return [t.table for t in self.tables if not t.equal]

    @property
    def ok(self) -> bool:
        return not self.error and not self.differing

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "position": str(self.position),
            "equal": self.ok,
            "differing": self.differing,
            "error": self.error or None,
            "tables": [t.to_json() for t in self.tables],
        }


@dataclass
class VerifyReport:
    consistent_lsn: int
    position: Position
    targets: list[TargetCheck]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_json(self) -> dict[str, Any]:
        return {
            "equal": self.ok,
            "consistent_lsn": format_lsn(self.consistent_lsn),
            "position": str(self.position),
            "seconds": round(self.seconds, 3),
            "targets": [t.to_json() for t in self.targets],
        }

    def text(self) -> str:
        lines = [f"verify at {self.position} (consistent point {format_lsn(self.consistent_lsn)}):"]
        for t in self.targets:
            if t.error:
                lines.append(f"  {t.target}: NOT COMPARED: {t.error}")
                continue
            lines.append(f"  {t.target}: {'equal' if t.ok else 'DIFFERS: ' + ', '.join(t.differing)}")
            for c in t.tables:
                if c.source_rows is None:
                    lines.append(f"    {c.table}: not comparable: {c.not_comparable}")
                    continue
                mark = "ok" if c.same else f"not comparable: {c.not_comparable}" if c.equal else "DIFFERS"
                tgt = "missing" if c.target_rows is None else f"{c.target_rows:,} rows {c.target_sum or 0:016x}"
                if c.compared:
                    tgt += f" ({c.compared})"
                note = f" ({c.note})" if c.note else ""
                lines.append(
                    f"    {c.table}: {mark}: source {c.source_rows:,} rows {c.source_sum:016x}, target {tgt}{note}"
                )
                if c.diffs is not None and not c.equal:
                    more = "" if c.exact else "at least "
                    lines.append(f"      {more}{c.differing_rows:,} row(s) differ; the first {len(c.diffs)}:")
                    lines.extend(f"      {d.text(c.key)}" for d in c.diffs)
        return "\n".join(lines)
