"""Compile the change log into net row changes ahead of apply: the units the targets will apply next are compiled on
Spark and kept in the log's compiled/ folder, where every target's apply reuses them."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--once", action="store_true", help="compile what the log holds now, then stop (the default)")


def run(args: argparse.Namespace) -> int:
    import sys

    from mirrorline.pipeline import Applier

    config = load_config(args)
    applier = Applier(config)
    try:
        n = applier.compile_ahead(
            on_unit=lambda b: print(
                f"compiled {b.start}..{b.end}: {b.changes} changes, tables {', '.join(b.tables)}", file=sys.stderr
            )
        )
    finally:
        applier.close()
    print(f"compiled {n} units", file=sys.stderr)
    return 0
