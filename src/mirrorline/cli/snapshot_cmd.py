"""Consistent initial load of a target: over the wire (snapshot --target NAME), or through files
(snapshot export DIR, then snapshot load --target NAME DIR)."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--target", help="the target to load over the wire")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    exp = sub.add_parser("export", help="write a consistent snapshot of the source as a folder of chunk files")
    add_config_argument(exp)
    exp.add_argument("dir", help="where to create the uniquely named snapshot folder")
    load = sub.add_parser("load", help="check an exported snapshot folder and load it into a target")
    add_config_argument(load)
    load.add_argument("--target", required=True, help="the target to load")
    load.add_argument("dir", help="the exported snapshot folder")


def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("snapshot", "the snapshot issue (#5)")
