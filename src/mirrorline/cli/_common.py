"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse

from mirrorline.config import Config
from mirrorline.errors import NotBuiltError


def load_config(args: argparse.Namespace) -> Config:
    from mirrorline import config

    return config.load(args.config)


def not_built(command: str, issue: str) -> NotBuiltError:
    return NotBuiltError(f"'{command}' is not built yet", hint=f"it arrives with {issue}")


def print_unit(report: object) -> None:
    """One stderr line per applied unit."""
    import sys

    r = report  # a mirrorline.pipeline.UnitReport
    secs = ", ".join(f"{n} {s:.2f}s" for n, s in r.apply_seconds.items())  # type: ignore[attr-defined]
    how = "compiled" if r.compiled else "reused"  # type: ignore[attr-defined]
    print(f"unit {r.start}..{r.end}: {r.changes} changes, {how} in {r.compile_seconds:.2f}s, "  # type: ignore[attr-defined]
          f"applied: {secs}", file=sys.stderr)
