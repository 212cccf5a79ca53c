"""Apply the change log to the target(s), compiling units of work as needed."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--target", help="only this target (default: every target)")
    p.add_argument("--once", action="store_true", help="stop once the target(s) applied everything in the log")

def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("apply", "the apply issue (#4)")
