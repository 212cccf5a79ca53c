"""A long load's progress (issue 16): a bar (tqdm) on a terminal, plain lines when stderr is not one."""

from __future__ import annotations

import io
import time

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
