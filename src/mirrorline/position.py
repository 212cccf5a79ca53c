"""Positions in the change log (DESIGN §2).

A change's position is ``(commit_lsn, seq)``: the commit LSN of its transaction and its index inside that
transaction. Positions are totally ordered (commit order, then sequence) and print as PostgreSQL prints LSNs plus the
sequence: ``16/B374D848:3``. The position after every change of a transaction (a unit's end, a snapshot's point)
has the largest sequence, :data:`SEQ_MAX`, and prints as ``16/B374D848:end``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_POS_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})(?::(\d+|end))?$")
SEQ_MAX = (1 << 63) - 1  # the sequence of the position after a transaction's last change


def format_lsn(lsn: int) -> str:
    """``0x16B374D848`` -> ``16/B374D848``, as PostgreSQL prints an LSN."""
    if lsn < 0 or lsn >= 1 << 64:
        raise ValueError(f"LSN out of range: {lsn}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``16/B374D848`` -> ``0x16B374D848``."""
    m = _LSN_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an LSN: {text!r} (expected the form 16/B374D848)")
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """``(lsn, seq)``: commit LSN of the transaction and the change's index inside it."""

    lsn: int
    seq: int = 0

    def __str__(self) -> str:
        return f"{format_lsn(self.lsn)}:{'end' if self.seq == SEQ_MAX else self.seq}"

    def __repr__(self) -> str:
        return f"Position({self})"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Accept ``16/B374D848:3``, ``16/B374D848:end`` (:data:`SEQ_MAX`) or a bare LSN ``16/B374D848``
        (sequence 0)."""
        m = _POS_RE.match(text.strip())
        if not m:
            raise ValueError(f"not a position: {text!r} (expected 16/B374D848, 16/B374D848:3 or 16/B374D848:end)")
        lsn = (int(m.group(1), 16) << 32) | int(m.group(2), 16)
        seq = m.group(3) or "0"
        return cls(lsn, SEQ_MAX if seq == "end" else int(seq))


ZERO = Position(0, 0)
