"""A long load's progress: a bar (tqdm) on a terminal, plain lines when stderr is not one."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import configs
import pytest

from mirrorline.snapshot.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _load(stream: io.StringIO) -> str:
    with Progress("snapshot t", 4, 400, stream=stream, every=0.05) as p:
        for _ in range(4):
            p.update(rows=100, chunks=1, table="public.items")
            time.sleep(0.08)
    return stream.getvalue()


def test_plain_lines_when_not_a_terminal() -> None:
    out = _load(io.StringIO())
    lines = out.splitlines()
    assert len(lines) >= 3 and "\r" not in out and "\x1b" not in out
    assert lines[-1].startswith("snapshot t: public.items 4/4 chunks (100%), 400 rows, ")


def test_a_bar_on_a_terminal() -> None:
    out = _load(Terminal())
    assert "\r" in out and "%|" in out and "chunk" in out  # tqdm's bar, redrawn in place
    assert "public.items, 400 rows" in out
    assert out.rstrip().splitlines()[-1].endswith(" s") and "4/4 chunks (100%)" in out


@pytest.mark.spark
def test_catching_up_draws_a_bar_on_a_terminal(spark: Any, tmp_path: Path) -> None:
    """A real catch-up (a log of 3,000 inserts applied to a new SQLite target in units of 1,000) with a bar on a
    terminal; none when the stream is not one."""
    from mirrorline.log import LogWriter
    from mirrorline.model import Change, Column, Op, TableSchema
    from mirrorline.pipeline import Applier
    from mirrorline.position import ZERO

    cfg = configs.load(
        tmp_path / "m.toml",
        log="log",
        apply={"max_changes": 1000},
        tables=["public.t"],
        targets={"cache": f"sqlite:///{tmp_path / 'c.db'}"},
    )
    with LogWriter(cfg.log.path) as w:
        w.record_schema(TableSchema("public.t", (Column("id", "integer", nullable=False),), ("id",)))
        for i in range(1, 301):
            ids = [str(10 * i + k) for k in range(10)]
            w.add_transaction(
                0x100 + i,
                1_700_000_000_000_000 + i,
                [Change(ZERO, 0, i, "public.t", Op.INSERT, (k,), {"id": k}) for k in ids],
            )
    applier = Applier(cfg, spark=spark)
    try:
        term = Terminal()
        reports = applier.catch_up(progress=term)
        assert len(reports) >= 3 and sum(r.changes for r in reports) == 3000
        out = term.getvalue()
        assert "catching up" in out and "1000/3000" in out and "%|" in out, out[-300:]
        assert applier.catch_up(progress=term) == []
    finally:
        applier.close()
