"""Show each target's state, applied position and lag, and the slot's retained WAL."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")

def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("status", "the snapshot issue (#5)")
