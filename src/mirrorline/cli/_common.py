"""Helpers shared by the command modules."""

from __future__ import annotations

import _thread
import argparse
import threading
from typing import TYPE_CHECKING, NoReturn

from mirrorline import config, sparkenv
from mirrorline.config import Config

if TYPE_CHECKING:
    from mirrorline.pipeline import UnitReport


def load_config(args: argparse.Namespace) -> Config:
    """The configuration file, its ``[spark]`` section in force for the session this process makes."""
    cfg = config.load(args.config)
    sparkenv.configure(cfg.spark)
    return cfg


def print_unit(r: UnitReport) -> None:
    """One stderr line per applied unit, ending with when it was applied (local time, as the log lines); a target's
    apply of a second or more is split by phase, e.g. ``pg 12.72s [insert 12.10, commit 0.40]``."""
    import sys
    import time

    secs = ", ".join(f"{n} {s:.2f}s{_phases(r, n, s)}" for n, s in r.apply_seconds.items())
    if r.table is not None:  # a table stopped alone, catching up on its own
        secs += f" (table {r.table} only)"
    how = "compiled" if r.compiled else "reused"
    print(
        f"unit {r.start}..{r.end}: {r.changes} changes, {how} in {r.compile_seconds:.2f}s, applied: {secs}; "
        f"at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        file=sys.stderr,
    )


def _phases(r: UnitReport, target: str, seconds: float) -> str:
    """`` [phase seconds, ...]`` of a target's apply of at least a second, its phases of at least 0.05 s."""
    res = r.results.get(target)
    if seconds < 1.0 or res is None:
        return ""
    phases = {**res.phases, "other": seconds - sum(res.phases.values())}  # connect, lock, schema, registry
    shown = [f"{p} {s:.2f}" for p, s in sorted(phases.items(), key=lambda x: -x[1]) if s >= 0.05]
    return f" [{', '.join(shown)}]" if shown else ""


class Interrupt:
    """A stop at once: KeyboardInterrupt in the main thread, from a signal handler. Python drops one raised while the
    main thread runs a finaliser or a weakref callback (an import's module lock, say): so once raised, it is raised
    again every ``every`` seconds (``_thread.interrupt_main``: the SIGINT handler runs again) until :meth:`taken`."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def raise_now(self) -> NoReturn:
        if self._thread is None:
            self._thread = threading.Thread(target=self._again, name="mirrorline-interrupt", daemon=True)
            self._thread.start()
        raise KeyboardInterrupt

    @property
    def raised(self) -> bool:
        """A stop at once was asked for: an error the main thread meets from now on may be a library's form of it
        (DuckDB ends the query it runs with ``Query interrupted``; py4j a call to the JVM with its own error)."""
        return self._thread is not None

    def taken(self) -> None:
        """The main thread has it (or is ending anyway): no more."""
        self.done.set()

    def _again(self) -> None:
        while not self.done.wait(self.every):
            _thread.interrupt_main()
