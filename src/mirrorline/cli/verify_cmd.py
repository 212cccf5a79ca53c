"""Compare source and target tables at the same position: row counts and order-independent checksums. Exit status
1 when any table differs."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--target", help="only this target (default: every target)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")

def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("verify", "the snapshot issue (#5)")
