"""How the pipeline cuts units (no server, no Spark): sized by how far behind the targets are."""

from __future__ import annotations

from pathlib import Path

from mirrorline.config import parse
from mirrorline.log import LogWriter
from mirrorline.model import Change, Op
from mirrorline.pipeline import Applier
from mirrorline.position import ZERO, Position


def _applier(tmp_path: Path, txns: int, max_changes: int = 1_000_000) -> Applier:
    """A log of ``txns`` transactions of 10 changes each (LSN 10, 20, ...)."""
    with LogWriter(tmp_path / "log", segment_changes=5_000) as w:
        for k in range(1, txns + 1):
            w.add_transaction(k * 10, k, [Change(ZERO, 0, 0, "public.t", Op.INSERT, (f"{k}.{i}",), {"id": "x"})
                                          for i in range(10)])
    conf = parse({"source": {"dsn": "postgresql://nobody@127.0.0.1:1/x"}, "log": {"path": str(tmp_path / "log")},
                  "apply": {"max_changes": max_changes},
                  "targets": {"t": {"url": f"sqlite:///{tmp_path / 't.db'}"}}}, tmp_path / "m.toml")
    a = Applier(conf, open_targets=False)
    a.small_unit, a.catch_up_changes = 1_000, 4_000
    return a


def test_a_small_backlog_is_applied_in_small_units(tmp_path: Path) -> None:
    a = _applier(tmp_path, 350)  # 3,500 changes behind: less than catch_up_changes
    end, n, size = a._advance(ZERO, a.log.durable() or ZERO)
    assert (end, n, size) == (Position(1000, 9), 1_000, 1_000)


def test_a_large_backlog_is_caught_up_in_large_units(tmp_path: Path) -> None:
    a = _applier(tmp_path, 600)  # 6,000 changes behind
    end, n, size = a._advance(ZERO, a.log.durable() or ZERO)
    assert (end, n, size) == (Position(6000, 9), 6_000, 1_000_000)
    # once it is no further behind than catch_up_changes, small units again
    end, n, size = a._advance(Position(2500, 9), a.log.durable() or ZERO)
    assert (end, n, size) == (Position(3500, 9), 1_000, 1_000)


def test_max_changes_bounds_every_unit(tmp_path: Path) -> None:
    a = _applier(tmp_path, 600, max_changes=500)
    assert a._advance(ZERO, a.log.durable() or ZERO) == (Position(500, 9), 500, 500)
    a = _applier(tmp_path / "b", 600, max_changes=2_000)
    assert a._advance(ZERO, a.log.durable() or ZERO) == (Position(2000, 9), 2_000, 2_000)


def test_a_unit_never_passes_upto(tmp_path: Path) -> None:
    a = _applier(tmp_path, 350)
    assert a._advance(ZERO, Position(300, 9)) == (Position(300, 9), 300, 1_000)
