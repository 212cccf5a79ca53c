"""Helpers of the SIGKILL tests (test_pipeline_crash.py, test_pipeline_crash_run.py): start ``mirrorline`` as a child
process, kill it at random moments, finish the work with a last uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KILLS = 10


def mirrorline_process(*args: str, log_file: Path) -> subprocess.Popen[bytes]:
    out = open(log_file, "ab")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(
        [sys.executable, "-m", "mirrorline.cli.main", *args],
        stdout=out,
        stderr=out,
        env={**os.environ, "MIRRORLINE_SPARK_DRIVER_MEMORY": "1g"},
    )


def units_logged(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text(errors="replace").splitlines() if line.startswith("unit "))
    except FileNotFoundError:
        return 0


def kill_loop(
    args: list[str],
    tmp_path: Path,
    rng: random.Random,
    between: Callable[[], None] | None = None,
    start_up: tuple[float, float] = (0.2, 6.0),
    after_unit: tuple[float, float] = (0.0, 2.0),
) -> tuple[int, int]:
    """Start ``mirrorline ARGS`` and SIGKILL it, KILLS times: one kill in four at a random moment of its start-up
    (``start_up`` seconds), the others a random moment (``after_unit`` seconds) after it applied a unit, so they land
    between and inside units. Returns (kills that landed on a running process, of which after a unit was applied)."""
    landed = mid_apply = attempts = 0
    child_log = tmp_path / "child.log"
    while landed < KILLS:
        attempts += 1
        assert attempts < KILLS * 3, "the process kept finishing before it could be killed"
        before = units_logged(child_log)
        proc = mirrorline_process(*args, log_file=child_log)
        if rng.random() < 0.25:
            time.sleep(rng.uniform(*start_up))
        else:
            deadline = time.monotonic() + 180
            while proc.poll() is None and units_logged(child_log) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(*after_unit))
            mid_apply += units_logged(child_log) > before and proc.poll() is None
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            landed += 1
        proc.wait()
        if between is not None:
            between()
    return landed, mid_apply


class SourceLoad:
    """A workload run a few transactions at a time in a thread while the kills go on; :meth:`stop` raises what the
    thread met."""

    def __init__(self, work: Any, transactions: int = 3, pause: float = 0.3) -> None:
        self.work, self.transactions, self.pause = work, transactions, pause
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="source-load", daemon=True)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.work.run(transactions=self.transactions)
                time.sleep(self.pause)
        except BaseException as e:  # pragma: no cover - raised by stop()
            self.errors.append(e)

    def start(self) -> SourceLoad:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        assert not self.errors, self.errors


def finish(args: list[str], tmp_path: Path) -> None:
    proc = mirrorline_process(*args, log_file=tmp_path / "final.log")
    assert proc.wait(timeout=600) == 0, (tmp_path / "final.log").read_text()[-3000:]
