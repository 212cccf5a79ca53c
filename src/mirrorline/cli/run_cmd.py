"""Capture, compile and apply for every configured target, continuously. With --once, stop when every target has
applied everything the source had committed when the command started."""

from __future__ import annotations

import argparse

from mirrorline.cli._common import load_config, not_built
from mirrorline.cli.main import add_config_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_argument(p)
    p.add_argument("--once", action="store_true", help="stop once every target has caught up with the source")

def run(args: argparse.Namespace) -> int:
    load_config(args)
    raise not_built("run", "the apply issue (#4)")
