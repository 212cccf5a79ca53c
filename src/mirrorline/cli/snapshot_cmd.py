"""Consistent initial load of a target: over the wire (snapshot --target NAME), or through files (snapshot export DIR, then snapshot load --target NAME DIR)."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("action", nargs="?", choices=["export", "load"], help="export to / load from a folder of files")
    p.add_argument("dir", nargs="?", help="the folder (export: where to create it; load: the exported folder)")
    p.add_argument("--target", help="the target to load")

def run(args: argparse.Namespace) -> int:
    raise not_built("snapshot", "the snapshot issue (#5)")
