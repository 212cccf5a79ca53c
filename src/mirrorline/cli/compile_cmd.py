"""Compile the change log into net row changes, one unit of work at a time, for the targets to apply."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--once", action="store_true", help="compile what the log holds now, then stop")

def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("compile", "the apply issue (#4)")
